"""portable: the portable edition (docs/portable.md) next to the native one and
the hand-written baselines, interleaved like the matrix, in two databases of
one cluster (their key locks differ, so they cannot share one); and I3's WAL
and xids in each, as the wal section measures them."""
import lib
from lib import table

PARAMS = {
    "pt_rounds": (1, 3, 5, "rounds per client count of the portable section"),
    "pt_clients": ([2], [1, 2, 4], [1, 2, 4], "client counts of the portable section"),
    "pt_prefill": (100, 1000, 1000, "committed keys per store before each of its runs"),
    "pt_wal_txns": (100, 1000, 2000, "I3 transactions per WAL/xid measurement"),
}
NATIVE_DB, PORTABLE_DB = "bench_native", "bench_portable"
VARIANTS = [("P-I1", PORTABLE_DB, "i1.sql"), ("P-I2", PORTABLE_DB, "i2.sql"), ("P-I3", PORTABLE_DB, "i3.sql"),
            ("N-I1", NATIVE_DB, "i1.sql"), ("N-I2", NATIVE_DB, "i2.sql"), ("N-I3", NATIVE_DB, "i3.sql"),
            ("B1", PORTABLE_DB, "b1.sql"), ("B1r", PORTABLE_DB, "b1r.sql")]
RATIOS = [("P-I1", "B1", 0.8), ("P-I2", "B1r", None), ("P-I1", "N-I1", None), ("P-I2", "N-I2", None),
          ("P-I3", "N-I3", None), ("N-I1", "B1", None)]


def estimate(p):
    return 30 + len(VARIANTS) * len(p["pt_clients"]) * p["pt_rounds"] * (p["duration"] + 2.5) + p["pt_wal_txns"] / 125


def reset(b, db, prefill):
    b.psql(db, f"""
        TRUNCATE orders, dedup, dedup_r; TRUNCATE idem.claims;
        INSERT INTO dedup (key) SELECT md5('p' || g::text) FROM generate_series(1, {prefill}) g;
        INSERT INTO dedup_r (key, result) SELECT md5('p' || g::text), '{{"ok": true}}' FROM generate_series(1, {prefill}) g;
        SELECT bench_claim('p', 1, {prefill});
        VACUUM ANALYZE orders, dedup, dedup_r, idem.claims;
        {b.ckpt}""")


def run(b):
    p = b.p
    raw = b.raw["portable"] = {"runs": [], "wal": {}}
    b.create_db(NATIVE_DB)
    b.create_db(PORTABLE_DB, edition="portable")
    if b.val(PORTABLE_DB, "SELECT idem.key_hash('bench', 'abc')") != b.val(NATIVE_DB, "SELECT idem.key_hash('bench', 'abc')"):
        raise lib.BenchError("portable: the two editions give different digests")
    b.set_autovacuum(False)
    try:
        for label, db in (("portable", PORTABLE_DB), ("native", NATIVE_DB)):
            reset(b, db, p["pt_prefill"])
            raw["wal"][label] = w = lib.wal_and_xids(b, db, "i3.sql", p["pt_wal_txns"], p["pt_prefill"], f"pt-wal-{label}")
            b.log(f"portable: I3 {label}: {w['wal_per_txn']:.1f} B WAL/call, {w['xids_per_txn']:.2f} xid/call")
    finally:
        b.set_autovacuum(True)
    k, total = 0, len(p["pt_clients"]) * p["pt_rounds"] * len(VARIANTS)
    for clients in p["pt_clients"]:
        for r in range(p["pt_rounds"]):
            for label, db, script in lib.rotated(VARIANTS, r, p["pt_rounds"]):
                k += 1
                res = b.measured(lambda: reset(b, db, p["pt_prefill"]),
                                 lambda: b.pgbench(db, script, clients, "off", duration=p["duration"],
                                                   prefill=p["pt_prefill"], tag=f"pt-{label}"))
                res.update(variant=label, clients=clients, round=r)
                raw["runs"].append(res)
                b.log(f"portable {k}/{total}: c={clients} round={r} {label:5s} tps={res['tps']:9.1f}")
            b.save()
    b.drop_db(NATIVE_DB)
    b.drop_db(PORTABLE_DB)


def report(R):
    raw = R.raw.get("portable") or {}
    runs = raw.get("runs") or []
    if not runs:
        return
    clients = sorted(set(x["clients"] for x in runs))
    at = lambda c: [x for x in runs if x["clients"] == c]
    ratios = {f"{n}/{d}": {c: lib.ratio(at(c), n, d) for c in clients} for n, d, _ in RATIOS}
    R.md += ["## Portable edition", "", "P- = portable, N- = native; B1 and B1r run in the portable edition's "
             "database. Median TPS (min–max over rounds), then ratios of medians (same-round range).", ""] + \
        table(["variant"] + [f"c={c}" for c in clients],
              [[v] + [lib.spread([x["tps"] for x in at(c) if x["variant"] == v]) for c in clients] for v, _, _ in VARIANTS]) + \
        table(["ratio"] + [f"c={c}" for c in clients] + ["target"],
              [[f"{n}/{d}"] + [lib.fmt_ratio(ratios[f"{n}/{d}"][c]) for c in clients] + [f"≥ {t}" if t else ""]
               for n, d, t in RATIOS])
    wal = raw.get("wal") or {}
    R.md += ["I3 (a duplicate claim), 1 client, autovacuum off, background records taken off:", ""] + \
        table(["edition", "calls", "WAL B/call", "xids/call"],
              [[e, w["txns"], f"{w['wal_per_txn']:.1f}", f"{w['xids_per_txn']:.3f}"] for e, w in wal.items()])
    for x in runs:
        R.csv.append(("portable", x["variant"], "off", x["clients"], x["round"], "tps", x["tps"], "tx/s"))
    R.summary["portable"] = {k: {c: r[0] for c, r in v.items()} for k, v in ratios.items()}
    p1 = ratios["P-I1/B1"]
    if all(r[0] is not None for r in p1.values()):
        R.target("portable: P-I1 ≥ 0.8 × B1 (each client count)", "; ".join(f"c={c}: {r[0]:.2f}" for c, r in p1.items()),
                 all(r[0] >= 0.8 for r in p1.values()))
    pw = wal.get("portable")
    if pw:
        R.target("portable: I3 writes 0 WAL bytes and takes 0 xids",
                 f"{pw['wal_per_txn']:.1f} B/call, {pw['xids_per_txn']:.3f} xid/call", pw["wal_per_txn"] == 0 and pw["xids"] == 0)
