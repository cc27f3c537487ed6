"""batch section: the per-key cost of a consumer's batch of N keys: one
idem_claim_many call (M), N idem_claim statements (S), a hand-written
unnest ... ON CONFLICT (H). --bt-edition portable runs M and S on the
portable edition's plain script. The method is bench/README.md's ("batch")."""
import os

from . import common, portable

DB = "bench_batch"
VARIANTS = [("M", "many"), ("S", "single"), ("H", "handwritten")]
TARGET_M_OVER_S = 5.0

PROFILES = {
    "smoke": dict(bt_rounds=1, bt_duration=1, bt_batch=50, bt_edition="native"),
    "default": dict(bt_rounds=5, bt_duration=5, bt_batch=500, bt_edition="native"),
    "full": dict(bt_rounds=7, bt_duration=6, bt_batch=500, bt_edition="native"),
}
EDITIONS = ("native", "portable")
OPTIONS = [("--bt-rounds", "bt_rounds", int, "batch section: rounds (each runs M, S and H once)"),
           ("--bt-duration", "bt_duration", int, "batch section: seconds per run"),
           ("--bt-batch", "bt_batch", int, "batch section: keys per transaction (500)"),
           ("--bt-edition", "bt_edition", str, "batch section: native (the extension) or portable (the plain script)")]


def estimate(p, rates):
    return 20 + p["bt_rounds"] * len(VARIANTS) * (p["bt_duration"] + rates["run_overhead_s"] + 1)


def single_script(b, n):
    """S's pgbench script for n keys: one statement per claim and insert."""
    path = os.path.join(b.out, f"batch_single_{n}.sql")
    lines = ["-- Batch S: n idem_claim calls, one statement (and round trip) each, each",
             "-- followed by the business insert, in one transaction.",
             r"\set n :n + 1",
             r"\set kid ((:run * 1000 + :client_id) * 1000000 + :n) * 10000",
             "BEGIN;"]
    for g in range(1, n + 1):
        lines.append(f"INSERT INTO orders (key, amount) SELECT c.k, 1 FROM (SELECT md5((:kid::bigint + {g})::text) AS k) c "
                     f"WHERE (idem_claim(c.k, 'bench')).claimed;")
    lines.append("END;")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def reset(b):
    b.psql(DB, "TRUNCATE orders, dedup; TRUNCATE idem.claims; VACUUM ANALYZE orders, dedup, idem.claims; "
               "CHECKPOINT")


def run(b):
    p = b.p
    n = p["bt_batch"]
    edition = p["bt_edition"]
    if edition not in EDITIONS:
        raise common.BenchError(f"batch: --bt-edition must be one of {', '.join(EDITIONS)}, not {edition!r}")
    raw = b.raw["batch"] = {"batch": n, "edition": edition, "runs": []}
    if edition == "portable":
        portable.install_portable(b, DB)
    else:
        common.create_db(b, DB)
    # the business type registered and its partitions made, as a deployment has them
    b.psql(DB, "SELECT idem_claim('bench-setup', 'bench')")
    b.psql(DB, "SELECT idem_maintain()")
    scripts = {"M": "batch_many.sql", "S": single_script(b, n), "H": "batch_hw.sql"}
    k, total = 0, p["bt_rounds"] * len(VARIANTS)
    for r in range(p["bt_rounds"]):
        off = r % len(VARIANTS)
        for label, _ in VARIANTS[off:] + VARIANTS[:off]:
            k += 1
            res = b.measured(lambda: reset(b),
                             lambda: b.pgbench(DB, scripts[label], 1, "off", duration=p["bt_duration"],
                                               tag=f"bt-{label}", defines={"batch": n}))
            # every key of every transaction was new: all claimed, all inserted
            rows = int(b.val(DB, "SELECT count(*) FROM orders"))
            if res["txns"] and rows != res["txns"] * n:
                raise common.BenchError(f"batch {label}: {rows} business rows for {res['txns']} "
                                        f"transactions of {n} new keys")
            res.update(section="batch", variant=label, round=r, clients=1, sync="off",
                       keys_per_s=res["tps"] * n, business_rows=rows)
            raw["runs"].append(res)
            b.log(f"batch {k}/{total}: round={r} {label} tps={res['tps']:8.2f} keys/s={res['tps'] * n:10.0f}")
        b.save()
    b.psql("postgres", f"DROP DATABASE {DB} WITH (FORCE)")
    b.save()


# ---- report ------------------------------------------------------------------
def report(R):
    raw = R.raw.get("batch") or {}
    runs = raw.get("runs") or []
    if not runs:
        return
    n = raw["batch"]
    edition = raw.get("edition", "native")
    for x in runs:
        R.csv.append(("batch", x["variant"], x["sync"], 1, x["round"], "keys_per_s", x["keys_per_s"], "key/s"))
    by_round = {}
    for x in runs:
        by_round.setdefault(x["round"], {})[x["variant"]] = x["keys_per_s"]
    lines = [f"## Batch claims (batch section, {edition} edition)", "",
             f"{n} new keys per transaction: M = one `idem_claim_many` call, S = {n} `idem_claim` "
             "statements, H = hand-written unnest ON CONFLICT (method: bench/README.md, batch).", "",
             "| variant | keys/s (median) | range | µs per key |", "|---|---|---|---|"]
    summ = {}
    for label, what in VARIANTS:
        xs = [x["keys_per_s"] for x in runs if x["variant"] == label]
        if not xs:
            continue
        m = common.median(xs)
        summ[label] = m
        lines.append(f"| {label} ({what}) | {m:,.0f} | {min(xs):,.0f}–{max(xs):,.0f} | {1e6 / m:.1f} |")
    lines += ["", "Ratios of the same round's runs (median, range):", "", "| ratio | median | range | target |",
              "|---|---|---|---|"]
    for name, num, den, target in (("M/S", "M", "S", TARGET_M_OVER_S), ("M/H", "M", "H", None)):
        rs = sorted(d[num] / d[den] for d in by_round.values() if num in d and den in d)
        if not rs:
            continue
        summ[name] = common.median(rs)
        lines.append(f"| {name} | {common.median(rs):.2f} | {rs[0]:.2f}–{rs[-1]:.2f} | "
                     + (f"≥ {target}" if target else "") + " |")
        if target:
            R.target("batch_m_over_s", f"batch ({edition}): idem_claim_many ≥ {target} × the keys/s of single claims",
                     f"{common.median(rs):.2f}", common.median(rs) >= target)
    lines.append("")
    R.md += lines
    R.summary["batch"] = summ
