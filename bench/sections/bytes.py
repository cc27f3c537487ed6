"""bytes section: bytes per claim after N claims, and heap bytes per
completed claim (I2's write pattern) against the hand-written table with a
result (B1r's)."""
import time

from variants import VARIANTS

from .common import BenchError


def run(b):
    """Bytes per claim: N claims without a result (bulk through
    idem_claim); then N transactions of I2's pattern (claim + business
    insert + idem_complete with a small result, pgbench) against N of
    B1r's (ON CONFLICT + business insert + UPDATE of the result); the
    plain hand-written tables for comparison. Autovacuum is off for the
    section: what the write pattern itself leaves behind (page pruning
    included), not what a vacuum later reclaims."""
    p = b.p
    db = "bench_bytes"
    n = p["bytes_claims"]
    c = p["bytes_clients"]
    b.create_db(db)
    pgst = ensure_pgstattuple(b, db)
    b.set_autovacuum(False)
    try:
        b.psql(db, "TRUNCATE idem.claims")
        t0 = time.time()
        b.claim_keys(db, "b", n)
        el = time.time() - t0
        row = measure_store(b, db, "idem.claims", pgst)
        row.update(store="idem.claims", pattern="bulk", result=False, load_seconds=el,
                   load_per_s=n / el if el else None)
        add_bytes_row(b, row)
        # one transaction per claim, as the application writes them
        for v, store in (("I2", "idem.claims"), ("B1r", "dedup_r")):
            b.psql(db, "TRUNCATE orders, dedup_r; TRUNCATE idem.claims; CHECKPOINT")
            res = b.pgbench(db, VARIANTS[v][1], c, "off", txns=max(1, n // c),
                            tag=f"bytes-{v}")
            row = measure_store(b, db, store, pgst)
            row.update(store=store, pattern=v, result=True, tps=res["tps"], clients=c,
                       load_per_s=res["tps"])
            add_bytes_row(b, row)
            b.load_rate(f"pgbench {v} {c} clients", row["rows"], row["rows"] / res["tps"])
        b.psql(db, "TRUNCATE orders, dedup_r; TRUNCATE idem.claims")
        # The plain hand-written tables (INSERT ... SELECT, no result).
        for table in ("dedup", "dedup_ttl"):
            t0 = time.time()
            b.psql(db, f"TRUNCATE {table}; INSERT INTO {table} (key) "
                          f"SELECT md5('b' || g::text) FROM generate_series(1, {n}) g")
            if table == "dedup" and n >= 100000:
                b.load_rate("INSERT ... SELECT into dedup", n, time.time() - t0)
            row = measure_store(b, db, table, pgst)
            row.update(store=table, pattern="bulk", result=False)
            add_bytes_row(b, row)
            b.psql(db, f"TRUNCATE {table}")
    finally:
        b.set_autovacuum(True)
    b.save()
    b.psql("postgres", f"DROP DATABASE {db} WITH (FORCE)")


def measure_store(b, db, store, pgst):
    """Rows, heap (main fork), index and total bytes of a table (summed
    over the leaf partitions of idem.claims), with pgstattuple's live /
    dead tuples and free space."""
    rels = ("SELECT relid FROM pg_partition_tree('idem.claims') WHERE isleaf"
            if store == "idem.claims" else f"SELECT '{store}'::regclass")
    row = b.val(db, f"""
        SELECT (SELECT count(*) FROM {store}), count(*),
               coalesce(sum(pg_relation_size(oid)), 0), coalesce(sum(pg_indexes_size(oid)), 0),
               coalesce(sum(pg_total_relation_size(oid)), 0)
          FROM pg_class WHERE oid IN ({rels})""")
    rows, parts, heap, idx, total = [int(x) for x in row.split("|")]
    r = {"rows": rows, "partitions": parts, "heap": heap, "indexes": idx, "total": total,
         "bytes_per_row": total / rows if rows else None,
         "heap_per_row": heap / rows if rows else None,
         "heap_index_per_row": (heap + idx) / rows if rows else None}
    if pgst:
        st = b.val(db, f"""
            SELECT coalesce(sum(s.tuple_count), 0), coalesce(sum(s.tuple_len), 0),
                   coalesce(sum(s.dead_tuple_count), 0), coalesce(sum(s.dead_tuple_len), 0),
                   coalesce(sum(s.free_space), 0)
              FROM pg_class c, LATERAL pgstattuple(c.oid) s WHERE c.oid IN ({rels})""")
        tc, tl, dc, dl, fs = [int(x) for x in st.split("|")]
        r.update(live_tuples=tc, live_tuple_bytes=tl, dead_tuples=dc, dead_tuple_bytes=dl,
                 free_bytes=fs)
    return r


def add_bytes_row(b, row):
    b.raw["bytes"].append(row)
    b.log(f"bytes {row['store']} ({row['pattern']}): {row['rows']} rows, "
          f"heap {row['heap_per_row']:.1f} B/row, heap+index {row['heap_index_per_row']:.1f}, "
          f"total {row['bytes_per_row']:.1f}; dead tuples {row.get('dead_tuples')}")
    b.save()


def ensure_pgstattuple(b, db):
    try:
        b.psql(db, "CREATE EXTENSION IF NOT EXISTS pgstattuple")
        return True
    except BenchError:
        return False
