"""cleanup section: idem_maintain() against the hand-written DELETE ... WHERE
expires_at < now(), at several numbers of expired rows (time, WAL, size).
What a cleanup does to the claims running beside it is the handwritten
section's question (p99 of the transactions that overlap a cleanup)."""
import re
import time


def timed(b, db, sql, pre=""):
    """Run one statement, after `pre` in the same session (so that the
    session is warm); return (ms, wal_bytes, output of the statement)."""
    script = (
        (pre.rstrip() + "\n" if pre else "") +
        "\\echo __TIMED__\n"
        "SELECT pg_current_wal_insert_lsn() AS l0 \\gset\n"
        "\\timing on\n" + sql.rstrip(";") + ";\n\\timing off\n"
        "SELECT 'WAL=' || (pg_current_wal_insert_lsn() - :'l0'::pg_lsn);\n")
    b.last_pre, _, out = b.psql(db, script).rpartition("__TIMED__")
    ms = float(re.findall(r"^Time: ([\d.]+) ms", out, re.M)[-1])
    wal = int(re.search(r"^WAL=(\d+)", out, re.M).group(1))
    body = "\n".join(l for l in out.splitlines() if l.strip() and not re.match(r"^(Time:|WAL=)", l))
    return ms, wal, body


def load_expired_handwritten(b, db, rows, live):
    """dedup_ttl with `rows` expired rows (in expiry order, as a table
    fills) and `live` current ones. Loaded without its indexes, which are
    built afterwards: 10 M rows in a minute or two, not twenty."""
    t0 = time.time()
    b.psql(db, f"""
        TRUNCATE dedup_ttl;
        ALTER TABLE dedup_ttl DROP CONSTRAINT dedup_ttl_pkey;
        DROP INDEX dedup_ttl_expires_at;
        INSERT INTO dedup_ttl (key, created_at, expires_at)
          SELECT md5('x' || g::text), now() - interval '30 days',
                 now() - interval '29 days' + g * interval '1 ms'
            FROM generate_series(1, {rows}) g;
        INSERT INTO dedup_ttl (key) SELECT md5('l' || g::text) FROM generate_series(1, {live}) g;
        ALTER TABLE dedup_ttl ADD CONSTRAINT dedup_ttl_pkey PRIMARY KEY (key);
        CREATE INDEX dedup_ttl_expires_at ON dedup_ttl (expires_at);
        VACUUM ANALYZE dedup_ttl;
        CHECKPOINT;""")
    if rows >= 100000:
        b.load_rate("expired rows into dedup_ttl (+ indexes, VACUUM, CHECKPOINT)", rows,
                    time.time() - t0)


def expired_idem_sql(b, db, rows, live):
    """SQL that fills idem.claims with `rows` claims that expired long
    ago, in a partition whose upper bound is past, plus `live` current
    claims through idem_claim, then ANALYZE and CHECKPOINT. The clock
    cannot be moved, so the benchmark makes that partition itself (as
    maintenance would have, a month ago): a standalone table filled by
    INSERT ... SELECT in the extension's row format, then its index, a
    CHECK of its range (so that ATTACH scans nothing), then ATTACH.
    Autovacuum is off for that partition: a month-old partition has long
    been vacuumed, and an autovacuum of the freshly loaded one would hold
    a lock the measured DROP waits for (a full VACUUM pass instead would
    double the load's writes)."""
    # The row format follows whatever idem.claims looks like: the type is
    # a type_id (early versions) or the biz_type name.
    cols = b.psql(db, "SELECT attname FROM pg_attribute WHERE attrelid = 'idem.claims'::regclass "
                         "AND attnum > 0 AND NOT attisdropped").split()
    if "type_id" in cols:
        tcol, tval = "type_id", "(SELECT type_id FROM idem.biz_types WHERE biz_type = 'bench')"
    else:
        tcol, tval = "biz_type", "'bench'"
    # With a storage by TTL class, the rows (a 1-day TTL, the type's) go
    # into that class's range: (class, lo) to (class, hi).
    if "ttl_class" in cols:
        tcol, tval = tcol + ", ttl_class", tval + ", :cls"
        check, lo, hi = "ttl_class = :cls AND ", "(:cls, :'lo')", "(:cls, :'hi')"
    else:
        check, lo, hi = "", "(:'lo')", "(:'hi')"
    return f"""
        TRUNCATE idem.claims;
        DROP TABLE IF EXISTS idem.bench_expired;
        SELECT date_trunc('hour', now()) - interval '31 days' AS lo,
               date_trunc('hour', now()) - interval '28 days' AS hi,
               bench_class() AS cls \gset
        CREATE TABLE idem.bench_expired (LIKE idem.claims INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
        INSERT INTO idem.bench_expired (expires_at, claimed_at, {tcol}, state, key)
          SELECT now() - interval '29 days' + g * interval '1 ms', now() - interval '30 days',
                 {tval}, 'c', md5('x' || g::text)
            FROM generate_series(1, {rows}) g;
        SELECT bench_index_like_default('bench_expired');
        ALTER TABLE idem.bench_expired ADD CONSTRAINT bench_expired_range
          CHECK ({check}expires_at >= :'lo' AND expires_at < :'hi');
        ALTER TABLE idem.bench_expired SET (autovacuum_enabled = off);
        ALTER TABLE idem.claims ATTACH PARTITION idem.bench_expired FOR VALUES FROM {lo} TO {hi};
        SELECT bench_claim('l', 1, {live});
        ANALYZE idem.claims;
        CHECKPOINT;
    """


def load_expired_idem(b, db, rows, live):
    t0 = time.time()
    b.psql(db, expired_idem_sql(b, db, rows, live))
    if rows >= 100000:
        b.load_rate("expired claims into a past partition (+ index, ANALYZE, CHECKPOINT)", rows,
                    time.time() - t0)


def maintain_result(b, db, rows, ms, wal, out, before, kind, rep):
    after = b.claims_size(db)
    left = int(b.val(db, "SELECT count(*) FROM idem.claims WHERE expires_at < now()"))
    live_after = int(b.val(db, "SELECT count(*) FROM idem.claims WHERE expires_at >= now()"))
    r = {"rows": rows, "session": kind, "rep": rep, "ms": ms, "wal": wal,
         "size_before": before["total"], "size_after": after["total"],
         "partitions_before": before["partitions"], "partitions_after": after["partitions"],
         "expired_left": left, "live_left": live_after, "report": out[-2000:]}
    m = re.search(r'"duration_ms": ([\d.]+)', out)
    if m:
        # what idem_maintain() measured itself: without its commit,
        # where DROP TABLE unlinks the files and drops the buffers
        r["own_duration_ms"] = float(m.group(1))
    m = re.search(r'"partitions_created": \[([^\]]*)\]', out)
    r["partitions_created"] = len([x for x in (m.group(1) if m else "").split(",") if x.strip()])
    b.log(f"cleanup idem_maintain ({kind} session) {rows} rows: {ms:.1f} ms, {wal} B WAL, "
          f"size {before['total'] / 1e6:.1f} -> {after['total'] / 1e6:.1f} MB, "
          f"{left} expired rows left")
    return r


def run(b):
    p = b.p
    db = "bench_cleanup"
    b.create_db(db)
    sizes = sorted(p["cleanup_rows"])
    live = p["cleanup_live"]
    res = {"rows": sizes, "live": live, "reps": p["cleanup_reps"], "delete": [], "idem": [], "idem_cold": []}
    b.raw["cleanup"] = res
    # hand-written: DELETE ... WHERE expires_at < now()
    for rows in sizes:
        load_expired_handwritten(b, db, rows, live)
        before = int(b.val(db, "SELECT pg_total_relation_size('dedup_ttl')"))
        ms, wal, _ = timed(b, db, "DELETE FROM dedup_ttl WHERE expires_at < now()")
        after = int(b.val(db, "SELECT pg_total_relation_size('dedup_ttl')"))
        t0 = time.time()
        b.psql(db, "VACUUM dedup_ttl")
        vac_s = time.time() - t0
        after_vac = int(b.val(db, "SELECT pg_total_relation_size('dedup_ttl')"))
        left = int(b.val(db, "SELECT count(*) FROM dedup_ttl WHERE expires_at < now()"))
        r = {"rows": rows, "ms": ms, "wal": wal, "size_before": before, "size_after": after,
             "size_after_vacuum": after_vac, "vacuum_s": vac_s, "expired_left": left}
        res["delete"].append(r)
        b.log(f"cleanup DELETE {rows} rows: {ms:.0f} ms, {wal / 1e6:.1f} MB WAL, "
              f"size {before / 1e6:.1f} -> {after / 1e6:.1f} MB "
              f"({after_vac / 1e6:.1f} MB after VACUUM, which took {vac_s:.1f}s)")
        b.save()
    b.psql(db, "TRUNCATE dedup_ttl")
    # Warm: one session per measurement, whose first idem_maintain()
    # call (nothing to drop yet: it compiles the function and fills the
    # caches) comes before the load; the measured call is its second.
    for rep in range(p["cleanup_reps"]):
        order = sizes[rep % len(sizes):] + sizes[:rep % len(sizes)]
        for rows in order:
            b.wait_quiet()
            t0 = time.time()
            ms, wal, out = timed(b, 
                db, "SELECT idem_maintain()",
                pre="SELECT idem_maintain();\n" + expired_idem_sql(b, db, rows, live) +
                    "SELECT 'SIZE=' || sum(pg_total_relation_size(relid)) || '/' || count(*)"
                    "  FROM pg_partition_tree('idem.claims') WHERE isleaf;")
            if rows >= 100000:
                b.load_rate("expired claims into a past partition (+ index, ANALYZE, CHECKPOINT)",
                            rows, time.time() - t0 - ms / 1000)
            m = re.search(r"^SIZE=(\d+)/(\d+)", b.last_pre, re.M)
            before = {"total": int(m.group(1)), "partitions": int(m.group(2))}
            res["idem"].append(maintain_result(b, db, rows, ms, wal, out, before, "warm", rep))
            b.save()
    # Cold: the first call of a fresh session (as a cron job's psql or a
    # pg_cron run makes it), once per size.
    for rows in sizes:
        b.wait_quiet()
        load_expired_idem(b, db, rows, live)
        before = b.claims_size(db)
        ms, wal, out = timed(b, db, "SELECT idem_maintain()")
        res["idem_cold"].append(maintain_result(b, db, rows, ms, wal, out, before, "cold", 0))
        b.save()
    b.psql("postgres", f"DROP DATABASE {db} WITH (FORCE)")

