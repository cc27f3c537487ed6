"""wal section: WAL bytes and transaction ids per transaction, per variant,
1 client, a fixed number of transactions, autovacuum off; the records no
transaction of the run wrote (Standby, XLOG) taken off."""
import time

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
            x0 = int(b.val(db, "SELECT txid_current()"))
            l0 = b.val(db, "SELECT pg_current_wal_insert_lsn()")
            res = b.pgbench(db, VARIANTS[v][1], 1, "off", txns=n, prefill=p["prefill"],
                            tag=f"wal-{v}")
            l1 = b.val(db, "SELECT pg_current_wal_insert_lsn()")
            x1 = int(b.val(db, "SELECT txid_current()"))
            # pg_walinspect reads only flushed WAL; with synchronous_commit
            # off (and txid_current()'s commit, which wrote nothing before
            # it, is asynchronous too) the WAL writer gets there within
            # wal_writer_delay.
            for _ in range(200):
                if b.val(db, f"SELECT pg_current_wal_flush_lsn() >= '{l1}'::pg_lsn") == "t":
                    break
                time.sleep(0.05)
            # txid_current() assigns an xid itself: x1 is its own, so the
            # transactions between took x1 - x0 - 1.
            wal = int(b.val(db, f"SELECT '{l1}'::pg_lsn - '{l0}'::pg_lsn"))
            stats = []
            for line in [] if wal == 0 else b.psql(db, f"""
                    SELECT "resource_manager/record_type", count, record_size, fpi_size, combined_size
                      FROM pg_get_wal_stats('{l0}', '{l1}', false) WHERE count > 0""").splitlines():
                rm, cnt, rs, fs, cs = line.split("|")
                stats.append({"rmgr": rm, "count": int(cnt), "record": int(rs),
                              "fpi": int(fs), "combined": int(cs)})
            # Records no transaction of the run wrote: the background
            # writer's running-xacts snapshot (Standby) and checkpoint
            # records (XLOG), so that "0 WAL" means 0 for the workload.
            # Their LSN span, not their size: each record is padded to 8
            # bytes (a 50-byte running-xacts record takes 56), and the
            # padding is no workload's either.
            background = 0 if wal == 0 else int(b.val(db, f"""
                    SELECT coalesce(sum(end_lsn - start_lsn), 0)
                      FROM pg_get_wal_records_info('{l0}', '{l1}')
                     WHERE resource_manager IN ('Standby', 'XLOG')"""))
            fpi = sum(s["fpi"] for s in stats)
            row = {"variant": v, "txns": n, "wal_bytes": wal, "background_bytes": background,
                   "fpi_bytes": fpi, "xids": x1 - x0 - 1, "tps": res["tps"],
                   "wal_per_txn": (wal - background) / n, "wal_total_per_txn": wal / n,
                   "xids_per_txn": (x1 - x0 - 1) / n, "rmgr": stats}
            b.raw["wal"].append(row)
            b.log(f"wal {v:4s}: {row['wal_per_txn']:7.1f} B/txn, "
                  f"{row['xids_per_txn']:.2f} xid/txn")
            b.save()
    finally:
        b.set_autovacuum(True)
