"""batch: the per-key cost of a consumer's batch of new keys in one
transaction, each with its business insert: M, one idem_claim_many call; S,
one idem_claim statement (and round trip) per key; H, the hand-written
INSERT ... SELECT unnest(...) ON CONFLICT DO NOTHING RETURNING. 1 client."""
import os

import lib
from lib import BenchError, table

PARAMS = {
    "bt_rounds": (1, 5, 7, "rounds of the batch section (each runs M, S and H once)"),
    "bt_batch": (50, 500, 500, "keys per transaction"),
    "bt_edition": ("native", "native", "native", "native (the extension) or portable (the plain script)"),
}
DB = "bench_batch"
VARIANTS = [("M", "many"), ("S", "single"), ("H", "handwritten")]


def estimate(p):
    return 20 + p["bt_rounds"] * 3 * (p["duration"] + 2.5)


def single_script(b, n):
    """S's pgbench script for n keys: one statement per claim and business insert."""
    path = os.path.join(b.out, f"batch_single_{n}.sql")
    with open(path, "w") as f:
        f.write("\\set n :n + 1\n\\set kid ((:run * 1000 + :client_id) * 1000000 + :n) * 10000\nBEGIN;\n" + "".join(
            f"INSERT INTO orders (key, amount) SELECT c.k, 1 FROM (SELECT md5((:kid::bigint + {g})::text) AS k) c "
            f"WHERE (idem_claim(c.k, 'bench')).claimed;\n" for g in range(1, n + 1)) + "END;\n")
    return path


def run(b):
    p, n = b.p, b.p["bt_batch"]
    if p["bt_edition"] not in ("native", "portable"):
        raise BenchError(f"batch: --bt-edition must be native or portable, not {p['bt_edition']!r}")
    raw = b.raw["batch"] = {"batch": n, "edition": p["bt_edition"], "runs": []}
    b.create_db(DB, edition=p["bt_edition"])
    scripts = {"M": "batch_many.sql", "S": single_script(b, n), "H": "batch_hw.sql"}
    for r in range(p["bt_rounds"]):
        for label, _ in lib.rotated(VARIANTS, r % 3, 3):
            res = b.measured(lambda: b.psql(DB, "TRUNCATE orders, dedup; TRUNCATE idem.claims; "
                                                "VACUUM ANALYZE orders, dedup, idem.claims;" + b.ckpt),
                             lambda: b.pgbench(DB, scripts[label], 1, "off", duration=p["duration"], tag=f"bt-{label}",
                                               defines={"batch": n}))
            rows = int(b.val(DB, "SELECT count(*) FROM orders"))   # every key new: all claimed, all inserted
            if res["txns"] and rows != res["txns"] * n:
                raise BenchError(f"batch {label}: {rows} business rows for {res['txns']} transactions of {n} new keys")
            res.update(variant=label, round=r, keys_per_s=res["tps"] * n)
            raw["runs"].append(res)
            b.log(f"batch round={r} {label} keys/s={res['keys_per_s']:10.0f}")
        b.save()
    b.drop_db(DB)


def report(R):
    raw = R.raw.get("batch") or {}
    runs = raw.get("runs") or []
    if not runs:
        return
    ks = lambda v: [x["keys_per_s"] for x in runs if x["variant"] == v]
    ms = {name: lib.ratio(runs, num, "S" if name == "M/S" else "H", "keys_per_s") for name, num in (("M/S", "M"), ("M/H", "M"))}
    R.md += [f"## Batch claims ({raw['edition']} edition)", "", f"{raw['batch']} new keys per transaction; keys/s median "
             "(min–max); ratios of medians (same-round range).", ""] + \
        table(["variant", "keys/s", "µs per key"],
              [[f"{v} ({what})", lib.spread(ks(v)), lib.fmt(1e6 / lib.median(ks(v)), 1) if ks(v) else "—"] for v, what in VARIANTS]) + \
        table(["ratio", "value", "target"], [["M/S", lib.fmt_ratio(ms["M/S"]), "≥ 5"], ["M/H", lib.fmt_ratio(ms["M/H"]), ""]])
    for x in runs:
        R.csv.append(("batch", x["variant"], "off", 1, x["round"], "keys_per_s", x["keys_per_s"], "key/s"))
    R.summary["batch"] = {k: v[0] for k, v in ms.items()}
    if ms["M/S"][0]:
        R.target(f"batch ({raw['edition']}): idem_claim_many ≥ 5 × the keys/s of single claims", f"{ms['M/S'][0]:.2f}",
                 ms["M/S"][0] >= 5)
