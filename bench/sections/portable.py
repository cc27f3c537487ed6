"""portable section: the portable edition (docs/portable.md) next to the
native edition and the hand-written baselines, two databases of one
cluster, and I3's WAL and xids in each. The method is bench/README.md's
("portable")."""
import os
import subprocess

import measure

from . import common

NATIVE_DB, PORTABLE_DB = "bench_native", "bench_portable"
# label -> (database, pgbench script)
VARIANTS = [("P-I1", PORTABLE_DB, "i1.sql"), ("P-I2", PORTABLE_DB, "i2.sql"),
            ("P-I3", PORTABLE_DB, "i3.sql"), ("N-I1", NATIVE_DB, "i1.sql"),
            ("N-I2", NATIVE_DB, "i2.sql"), ("N-I3", NATIVE_DB, "i3.sql"),
            ("B1", PORTABLE_DB, "b1.sql"), ("B1r", PORTABLE_DB, "b1r.sql")]
# (ratio label, numerator, denominator, target or None)
RATIOS = [("P-I1/B1", "P-I1", "B1", 0.8), ("P-I2/B1r", "P-I2", "B1r", None),
          ("P-I1/N-I1", "P-I1", "N-I1", None), ("P-I2/N-I2", "P-I2", "N-I2", None),
          ("P-I3/N-I3", "P-I3", "N-I3", None), ("N-I1/B1", "N-I1", "B1", None)]
TARGET_I1 = 0.8

PROFILES = {
    "smoke": dict(pt_rounds=1, pt_duration=1, pt_clients=[2], pt_prefill=200, pt_wal_txns=100),
    "default": dict(pt_rounds=3, pt_duration=4, pt_clients=[1, 2, 4], pt_prefill=1000,
                    pt_wal_txns=1000),
    "full": dict(pt_rounds=5, pt_duration=5, pt_clients=[1, 2, 4], pt_prefill=1000, pt_wal_txns=2000),
}
OPTIONS = [("--pt-rounds", "pt_rounds", int, "portable section: rounds per client count"),
           ("--pt-duration", "pt_duration", int, "portable section: seconds per run"),
           ("--pt-clients", "pt_clients", lambda s: [int(x) for x in s.split(",")],
            "portable section: comma list of client counts (default 1,2,4)"),
           ("--pt-prefill", "pt_prefill", int,
            "portable section: committed keys per store before each run (I3 draws from them)"),
           ("--pt-wal-txns", "pt_wal_txns", int,
            "portable section: I3 transactions per WAL/xid measurement")]


def estimate(p, rates):
    n = len(VARIANTS) * len(p["pt_clients"]) * p["pt_rounds"]
    return 30 + n * (p["pt_duration"] + rates["run_overhead_s"] + 1.5) + 4 * p["pt_wal_txns"] / 500


def install_portable(b, db):
    """The plain script into a fresh database, as its owner would run it."""
    dist = os.path.join(b.out, "portable-dist")
    r = subprocess.run(["python3", os.path.join(os.path.dirname(common.BENCH), "scripts", "portable.py"),
                        "--out", dist], capture_output=True, text=True)
    if r.returncode != 0:
        raise common.BenchError(f"portable: scripts/portable.py failed: {r.stderr[-800:]}")
    b.psql("postgres", f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    b.psql("postgres", f"CREATE DATABASE {db}")
    with open(os.path.join(common.SQL, "schema.sql")) as f:
        b.psql(db, f.read())
    with open(os.path.join(dist, "idem_portable.sql")) as f:
        b.psql(db, f.read())


def setup(b, db):
    b.psql(db, "CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    # the business type registered and its partitions made, as a deployment has them
    b.psql(db, "SELECT idem_claim('bench-setup', 'bench')")
    b.psql(db, "SELECT idem_maintain()")
    b.psql(db, common.BENCH_CLAIM_SQL)


def reset(b, db, prefill):
    """The same state before every run: empty tables but `prefill`
    committed keys in each store (I3's duplicates), vacuumed, checkpointed."""
    b.psql(db, f"""
        TRUNCATE orders, dedup, dedup_r;
        TRUNCATE idem.claims;
        INSERT INTO dedup (key) SELECT md5('p' || g::text) FROM generate_series(1, {prefill}) g;
        INSERT INTO dedup_r (key, result)
          SELECT md5('p' || g::text), '{{"ok": true}}' FROM generate_series(1, {prefill}) g;
        SELECT bench_claim('p', 1, {prefill});
        VACUUM ANALYZE orders, dedup, dedup_r, idem.claims;
        CHECKPOINT;""")


def wal_of_duplicates(b, db, n, prefill):
    """WAL bytes (minus the background's Standby/XLOG records) and xids of n
    duplicate claims (I3), 1 client, autovacuum off: as the wal section."""
    reset(b, db, prefill)
    res, _, _, wal, background, xids = measure.wal_and_xids(
        b, db, lambda: b.pgbench(db, "i3.sql", 1, "off", txns=n, prefill=prefill, tag=f"pt-wal-{db}"))
    return {"txns": n, "wal_bytes": wal, "background_bytes": background,
            "wal_per_txn": (wal - background) / n, "xids": xids,
            "xids_per_txn": xids / n, "tps": res["tps"]}


def run(b):
    p = b.p
    raw = b.raw["portable"] = {"runs": [], "wal": {}}
    common.create_db(b, NATIVE_DB)
    install_portable(b, PORTABLE_DB)
    for db in (NATIVE_DB, PORTABLE_DB):
        setup(b, db)
    raw["portable_hash_check"] = b.val(PORTABLE_DB, "SELECT idem.key_hash('bench', 'abc')") == \
        b.val(NATIVE_DB, "SELECT idem.key_hash('bench', 'abc')")
    if not raw["portable_hash_check"]:
        raise common.BenchError("portable: the two editions give different digests")
    b.set_autovacuum(False)
    try:
        for label, db in (("portable", PORTABLE_DB), ("native", NATIVE_DB)):
            raw["wal"][label] = w = wal_of_duplicates(b, db, p["pt_wal_txns"], p["pt_prefill"])
            b.log(f"portable: I3 {label}: {w['wal_per_txn']:.1f} B WAL/call, {w['xids_per_txn']:.2f} xid/call")
    finally:
        b.set_autovacuum(True)
    b.save()
    total = len(p["pt_clients"]) * p["pt_rounds"] * len(VARIANTS)
    k = 0
    for clients in p["pt_clients"]:
        for r in range(p["pt_rounds"]):
            for label, db, script in common.rotated(VARIANTS, r, p["pt_rounds"]):
                k += 1
                res = b.measured(
                    lambda: reset(b, db, p["pt_prefill"]),
                    lambda: b.pgbench(db, script, clients, "off", duration=p["pt_duration"],
                                      prefill=p["pt_prefill"], tag=f"pt-{label}"))
                res.update(section="portable", variant=label, db=db, clients=clients, round=r, sync="off")
                raw["runs"].append(res)
                b.log(f"portable {k}/{total}: c={clients} round={r} {label:5s} tps={res['tps']:9.1f}")
            b.save()
    for db in (NATIVE_DB, PORTABLE_DB):
        b.psql("postgres", f"DROP DATABASE {db} WITH (FORCE)")
    b.save()


# ---- report ------------------------------------------------------------------
def report(R):
    raw = R.raw.get("portable") or {}
    runs = raw.get("runs") or []
    if not runs:
        return
    for x in runs:
        R.csv.append(("portable", x["variant"], x["sync"], x["clients"], x["round"], "tps", x["tps"], "tx/s"))
    for label, w in (raw.get("wal") or {}).items():
        R.csv.append(("portable", f"{label}-I3", "off", 1, 0, "wal_bytes_per_txn", w["wal_per_txn"], "B"))
        R.csv.append(("portable", f"{label}-I3", "off", 1, 0, "xids_per_txn", w["xids_per_txn"], "xid"))
    clients = sorted(set(x["clients"] for x in runs))
    lines = ["## Portable edition (portable section)", "",
             "P- = portable, N- = native; B1 and B1r run in the portable edition's database "
             "(method: bench/README.md, portable).", "",
             "| variant | " + " | ".join(f"c={c} TPS | range" for c in clients) + " |",
             "|---|" + "---|" * (2 * len(clients))]
    summ = {}
    for label, _, _ in VARIANTS:
        row = [label]
        for c in clients:
            xs = [x["tps"] for x in runs if x["variant"] == label and x["clients"] == c]
            if not xs:
                row += ["—", "—"]
                continue
            summ[f"{label}/{c}"] = {"median": common.median(xs), "min": min(xs), "max": max(xs)}
            row += [f"{common.median(xs):,.0f}", f"{min(xs):,.0f}–{max(xs):,.0f}"]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Ratios of medians (in brackets the range of the same-round ratios):", "",
              "| ratio | " + " | ".join(f"c={c}" for c in clients) + " | target |",
              "|---|" + "---|" * (len(clients) + 1)]
    worst = []
    for name, num, den, target in RATIOS:
        row = [name]
        for c in clients:
            m, lo, hi = common.ratio([x for x in runs if x["clients"] == c], num, den)
            if m is None:
                row.append("—")
                continue
            summ[f"{name}/{c}"] = m
            row.append(f"{m:.3f} ({lo:.2f}–{hi:.2f})")
            if target:
                worst.append((m, c))
        row.append(f"≥ {target}" if target else "")
        lines.append("| " + " | ".join(row) + " |")
    wal = raw.get("wal") or {}
    if wal:
        lines += ["", "I3 (duplicate claim of a committed key), 1 client, autovacuum off: WAL bytes per call "
                  "(the background's Standby/XLOG records taken off, as in the wal section) and xids per call:",
                  "", "| edition | calls | WAL B/call | xids/call | TPS |", "|---|---|---|---|---|"]
        for label, w in wal.items():
            lines.append(f"| {label} | {w['txns']} | {w['wal_per_txn']:.1f} | {w['xids_per_txn']:.3f} | "
                         f"{w['tps']:,.0f} |")
    lines.append("")
    R.md += lines
    R.summary["portable"] = summ
    if worst:
        w = min(worst)
        R.target("portable_i1", f"portable: P-I1 ≥ {TARGET_I1} × B1 (1, 2, 4 clients)",
                 "; ".join(f"c={c}: {m:.2f}" for m, c in sorted(worst, key=lambda t: t[1])),
                 w[0] >= TARGET_I1)
    pw = wal.get("portable")
    if pw:
        R.target("portable_i3", "portable: I3 writes 0 WAL bytes and takes 0 xids",
                 f"{pw['wal_per_txn']:.1f} B/call, {pw['xids_per_txn']:.3f} xid/call",
                 pw["wal_per_txn"] == 0 and pw["xids"] == 0)
