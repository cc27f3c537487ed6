"""wal: WAL bytes and xids per transaction of each variant, 1 client, a fixed
number of transactions after a CHECKPOINT and the reset, autovacuum off (it
writes WAL and takes xids); the background's Standby/XLOG records taken off."""
import lib
from lib import VARIANTS, table

PARAMS = {"wal_txns": (100, 10000, 20000, "transactions per WAL measurement")}
WAL_VARIANTS = ["B0", "B1", "B1d", "B1r", "B2", "I1", "I1c", "I2", "I3"]


def estimate(p):
    return len(WAL_VARIANTS) * (p["wal_txns"] / 3000 + 3)


def run(b):
    p, rows = b.p, b.raw.setdefault("wal", [])
    b.set_autovacuum(False)
    try:
        for v in WAL_VARIANTS:
            # the CHECKPOINT before the reset: the reset's writes pay the full-page
            # images, so the run's numbers are its record bytes
            b.checkpoint("bench")
            b.reset_main("bench", p["prefill"])
            row = dict(lib.wal_and_xids(b, "bench", VARIANTS[v][1], p["wal_txns"], p["prefill"], f"wal-{v}"), variant=v)
            rows.append(row)
            b.log(f"wal {v:4s}: {row['wal_per_txn']:7.1f} B/txn, {row['xids_per_txn']:.2f} xid/txn")
            b.save()
    finally:
        b.set_autovacuum(True)


def report(R):
    rows = R.raw.get("wal") or []
    if not rows:
        return
    out = []
    for r in rows:
        n = r["txns"]
        rm = ", ".join(f"{s['rmgr']} {s['combined'] / n:.0f}" for s in sorted(r["rmgr"], key=lambda s: -s["combined"])
                       if s["combined"] / n >= 0.5)
        out.append([f"**{r['variant']}** {VARIANTS[r['variant']][2]}", f"{r['wal_per_txn']:.1f}", f"{r['fpi_bytes'] / n:.1f}",
                    f"{r['wal_total_per_txn']:.1f}", f"{r['xids_per_txn']:.2f}", f"{r['tps']:,.0f}", rm])
        for k in ("wal_per_txn", "xids_per_txn"):
            R.csv.append(("wal", r["variant"], "off", 1, "", k, r[k], "B" if "wal" in k else "xid"))
    R.md += ["## WAL and transaction ids per transaction", "",
             f"1 client, synchronous_commit off, {rows[0]['txns']} transactions per variant; background records "
             "taken off.", ""] + table(["variant", "WAL B/txn", "of which FPI", "raw LSN delta B/txn", "xids/txn",
                                        "TPS", "WAL by resource manager (B/txn)"], out)
    R.summary["wal"] = rows
    i3 = next((r for r in rows if r["variant"] == "I3"), None)
    if i3:
        R.target("I3 (duplicate) writes 0 WAL bytes and takes 0 xids",
                 f"{i3['wal_bytes'] - i3['background_bytes']} B, {i3['xids']} xids over {i3['txns']:,} txns",
                 i3["wal_bytes"] == i3["background_bytes"] and i3["xids"] == 0)
