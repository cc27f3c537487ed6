"""wal section: WAL bytes and transaction ids per transaction, per variant,
1 client, a fixed number of transactions, autovacuum off; the records no
transaction of the run wrote (Standby, XLOG) taken off."""

import measure
from variants import VARIANTS, WAL_VARIANTS


def run(b):
    """WAL bytes and xids per transaction, 1 client, a fixed number of
    transactions, autovacuum off (it writes WAL and takes xids)."""
    p = b.p
    db = "bench"
    variants = WAL_VARIANTS
    b.set_autovacuum(False)
    try:
        for v in variants:
            b.checkpoint(db)
            b.reset_main(db, p["prefill"])
            n = p["wal_txns"]
            res, l0, l1, wal, background, xids = measure.wal_and_xids(
                b, db, lambda: b.pgbench(db, VARIANTS[v][1], 1, "off", txns=n, prefill=p["prefill"],
                                         tag=f"wal-{v}"))
            stats = []
            for line in [] if wal == 0 else b.psql(db, f"""
                    SELECT "resource_manager/record_type", count, record_size, fpi_size, combined_size
                      FROM pg_get_wal_stats('{l0}', '{l1}', false) WHERE count > 0""").splitlines():
                rm, cnt, rs, fs, cs = line.split("|")
                stats.append({"rmgr": rm, "count": int(cnt), "record": int(rs),
                              "fpi": int(fs), "combined": int(cs)})
            fpi = sum(s["fpi"] for s in stats)
            row = {"variant": v, "txns": n, "wal_bytes": wal, "background_bytes": background,
                   "fpi_bytes": fpi, "xids": xids, "tps": res["tps"],
                   "wal_per_txn": (wal - background) / n, "wal_total_per_txn": wal / n,
                   "xids_per_txn": xids / n, "rmgr": stats}
            b.raw["wal"].append(row)
            b.log(f"wal {v:4s}: {row['wal_per_txn']:7.1f} B/txn, "
                  f"{row['xids_per_txn']:.2f} xid/txn")
            b.save()
    finally:
        b.set_autovacuum(True)
