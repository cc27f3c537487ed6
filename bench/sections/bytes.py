"""bytes: bytes per claim after N claims without a result (bulk through
idem_claim), and heap bytes per completed claim: N transactions of I2's
pattern against N of B1r's, as pgbench runs them; the plain hand-written
tables for comparison. Autovacuum off: what the write pattern leaves behind
by itself (page pruning included), not what a later vacuum reclaims."""
from lib import BenchError, VARIANTS, fmt, table

PARAMS = {"claims": (2000, 1000000, 1000000, "claims in the bytes section")}
DB = "bench_bytes"


def estimate(p):
    return 10 + p["claims"] * (1 / 100000 + 2 / 7000 + 2 / 250000 + 15e-6)


def measure(b, store, **kw):
    row = dict(b.store(DB, store), **kw)
    rels = ("SELECT relid FROM pg_partition_tree('idem.claims') WHERE isleaf"
            if store == "idem.claims" else f"SELECT '{store}'::regclass")
    try:
        st = b.val(DB, f"""SELECT coalesce(sum(s.tuple_len), 0), coalesce(sum(s.dead_tuple_count), 0),
            coalesce(sum(s.free_space), 0) FROM pg_class c, LATERAL pgstattuple(c.oid) s WHERE c.oid IN ({rels})""")
        row.update(zip(("live_tuple_bytes", "dead_tuples", "free_bytes"), map(int, st.split("|"))))
    except BenchError:
        pass   # no pgstattuple (contrib)
    n = row["rows"] or None
    row.update(heap_per_row=n and row["heap"] / n, heap_index_per_row=n and (row["heap"] + row["indexes"]) / n,
               bytes_per_row=n and row["total"] / n)
    b.raw["bytes"].append(row)
    b.log(f"bytes {store} ({row['pattern']}): {row['rows']} rows, heap {fmt(row['heap_per_row'], 1)} B/row, "
          f"total {fmt(row['bytes_per_row'], 1)}; dead tuples {row.get('dead_tuples')}")
    b.save()


def run(b):
    n, b.raw["bytes"] = b.p["claims"], []
    b.create_db(DB, sql="CREATE EXTENSION IF NOT EXISTS pgstattuple;")
    b.set_autovacuum(False)
    try:
        b.psql(DB, "TRUNCATE idem.claims")
        b.claim_keys(DB, "b", n)
        measure(b, "idem.claims", pattern="bulk")
        for v, store in (("I2", "idem.claims"), ("B1r", "dedup_r")):   # one claim per transaction
            b.psql(DB, "TRUNCATE orders, dedup_r; TRUNCATE idem.claims;" + b.ckpt)
            res = b.pgbench(DB, VARIANTS[v][1], 2, "off", txns=max(1, n // 2), tag=f"bytes-{v}")
            measure(b, store, pattern=v, tps=res["tps"])
        b.psql(DB, "TRUNCATE orders, dedup_r; TRUNCATE idem.claims")
        for table_ in ("dedup", "dedup_ttl"):
            b.psql(DB, f"INSERT INTO {table_} (key) SELECT md5('b' || g::text) FROM generate_series(1, {n}) g")
            measure(b, table_, pattern="bulk")
            b.psql(DB, f"TRUNCATE {table_}")
    finally:
        b.set_autovacuum(True)
    b.drop_db(DB)


def report(R):
    rows = R.raw.get("bytes") or []
    if not rows:
        return
    mib = lambda x: fmt(x / 1048576, 1) if x is not None else "—"
    R.md += ["## Bytes per claim", "", "Autovacuum off, no VACUUM; heap summed over idem's leaf partitions.", ""] + \
        table(["store", "written by", "rows", "heap B/row", "heap+index B/row", "total B/row", "heap MiB", "index MiB",
               "dead tuples", "free space MiB"],
              [[r["store"], r["pattern"], f"{r['rows']:,}", fmt(r["heap_per_row"], 1), fmt(r["heap_index_per_row"], 1),
                f"**{fmt(r['bytes_per_row'], 1)}**", mib(r["heap"]), mib(r["indexes"]), fmt(r.get("dead_tuples")),
                mib(r.get("free_bytes"))] for r in rows])
    for r in rows:
        R.csv.append(("bytes", f"{r['store']}:{r['pattern']}", "", "", "", "bytes_per_row", r["bytes_per_row"], "B"))
    R.summary["bytes"] = rows
    i2, b1r = (next((r for r in rows if r["pattern"] == k), None) for k in ("I2", "B1r"))
    if i2 and b1r and i2["heap_per_row"] and b1r["heap_per_row"]:
        few = "" if i2["rows"] >= 1000000 else f" [after {i2['rows']:,} claims; the target is stated for 1 M]"
        R.target(f"heap bytes per completed claim (I2 pattern) ≤ the B1r table's{few}",
                 f"{i2['heap_per_row']:.1f} vs {b1r['heap_per_row']:.1f} B/row (heap+index {i2['heap_index_per_row']:.1f} "
                 f"vs {b1r['heap_index_per_row']:.1f}; dead tuples {fmt(i2.get('dead_tuples'))} vs "
                 f"{fmt(b1r.get('dead_tuples'))})", i2["heap_per_row"] <= b1r["heap_per_row"])
    bulk = rows[0]
    R.target(f"(0.1.0) ≤ 120 bytes per claim, 32-character keys, no result ({bulk['rows']:,} claims)",
             f"{fmt(bulk['bytes_per_row'], 1)} B", (bulk["bytes_per_row"] or 999) <= 120)
