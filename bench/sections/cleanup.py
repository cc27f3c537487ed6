"""cleanup: idem_maintain() against the hand-written DELETE ... WHERE
expires_at < now(), at several numbers of expired rows (time, WAL, size).
What a cleanup does to the claims beside it is the handwritten section's."""
import re
import time

import lib
from lib import fmt, table

PARAMS = {
    "cleanup_rows": ([1000, 3000], [100000, 1000000], [100000, 1000000, 10000000], "expired row counts"),
    "cleanup_reps": (1, 3, 3, "warm idem_maintain() measurements per size (median)"),
    "cleanup_live": (500, 10000, 10000, "live rows beside the expired ones"),
}
DB = "bench_cleanup"
# The expired claims' partition gets the index idem's partitions have:
# inherited from the parent's partitioned index if there is one, else the
# default partition's definition. bench_class(): with a storage by TTL class,
# the class of type 'bench' (NULL with a storage by expiry only).
SETUP_SQL = r"""
CREATE FUNCTION public.bench_index_like_default(name text) RETURNS void LANGUAGE plpgsql AS $f$
DECLARE def text;
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_index WHERE indrelid = format('idem.%I', name)::regclass)
     AND NOT EXISTS (SELECT 1 FROM pg_index WHERE indrelid = 'idem.claims'::regclass) THEN
    SELECT pg_get_indexdef(indexrelid) INTO def FROM pg_index WHERE indrelid = 'idem.claims_default'::regclass LIMIT 1;
    EXECUTE regexp_replace(def, '^CREATE (UNIQUE )?INDEX \S+ ON (ONLY )?\S+', 'CREATE \1INDEX ON idem.' || quote_ident(name));
  END IF;
END $f$;
CREATE FUNCTION public.bench_class() RETURNS smallint LANGUAGE plpgsql AS $f$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'idem.claims'::regclass
                    AND attname = 'ttl_class' AND NOT attisdropped) THEN
    RETURN NULL;
  END IF;
  RETURN idem.ttl_class(coalesce((SELECT ttl FROM idem.biz_types WHERE biz_type = 'bench'),
                                 current_setting('idem.default_ttl')::interval));
END $f$;
"""


def estimate(p):
    rows = sum(p["cleanup_rows"])
    return 10 + rows / 60000 + (p["cleanup_reps"] + 1) * rows / 120000


def timed(b, sql, pre=""):
    """One statement after `pre` in the same session: (ms by psql's \\timing,
    WAL bytes, its output, pre's output)."""
    out = b.psql(DB, pre + "\n\\echo __TIMED__\nSELECT pg_current_wal_insert_lsn() AS l0 \\gset\n\\timing on\n"
                 + sql + ";\n\\timing off\nSELECT 'WAL=' || (pg_current_wal_insert_lsn() - :'l0'::pg_lsn);\n")
    before, _, out = out.rpartition("__TIMED__")
    ms = float(re.findall(r"^Time: ([\d.]+) ms", out, re.M)[-1])
    wal = int(re.search(r"^WAL=(\d+)", out, re.M).group(1))
    return ms, wal, out, before


def expired_idem_sql(b, rows, live):
    """idem.claims with `rows` claims that expired a month ago, in a partition
    whose upper bound has passed, and `live` current claims through idem_claim;
    ANALYZE, CHECKPOINT. The clock cannot be moved, so the benchmark makes that
    partition as maintenance would have a month ago: a table filled in the
    extension's row format, its index, a CHECK of its range (ATTACH scans
    nothing), ATTACH. Autovacuum off for it: a month-old partition has long
    been vacuumed, and an autovacuum of the fresh one would hold a lock the
    measured DROP waits for."""
    cols = b.psql(DB, "SELECT attname FROM pg_attribute WHERE attrelid = 'idem.claims'::regclass "
                      "AND attnum > 0 AND NOT attisdropped").split()
    tcol, tval, check, lo, hi = "biz_type", "'bench'", "", "(:'lo')", "(:'hi')"
    if "ttl_class" in cols:   # storage by TTL class: the 1-day class's range
        tcol, tval, check, lo, hi = "biz_type, ttl_class", "'bench', :cls", "ttl_class = :cls AND ", \
            "(:cls, :'lo')", "(:cls, :'hi')"
    return f"""
        TRUNCATE idem.claims;
        DROP TABLE IF EXISTS idem.bench_expired;
        SELECT date_trunc('hour', now()) - interval '31 days' AS lo, date_trunc('hour', now()) - interval '28 days' AS hi,
               bench_class() AS cls \gset
        CREATE TABLE idem.bench_expired (LIKE idem.claims INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
        INSERT INTO idem.bench_expired (expires_at, claimed_at, {tcol}, state, key)
          SELECT now() - interval '29 days' + g * interval '1 ms', now() - interval '30 days', {tval}, 'c', md5('x' || g::text)
            FROM generate_series(1, {rows}) g;
        SELECT bench_index_like_default('bench_expired');
        ALTER TABLE idem.bench_expired ADD CONSTRAINT bench_expired_range CHECK ({check}expires_at >= :'lo' AND expires_at < :'hi');
        ALTER TABLE idem.bench_expired SET (autovacuum_enabled = off);
        ALTER TABLE idem.claims ATTACH PARTITION idem.bench_expired FOR VALUES FROM {lo} TO {hi};
        SELECT bench_claim('l', 1, {live});
        ANALYZE idem.claims;
        {b.ckpt}
        SELECT 'SIZE=' || sum(pg_total_relation_size(relid)) || '/' || count(*) FROM pg_partition_tree('idem.claims') WHERE isleaf;"""


def maintain(b, rows, kind, rep):
    if kind == "warm":
        ms, wal, out, before = timed(b, "SELECT idem_maintain()",
                                     "SELECT idem_maintain();" + expired_idem_sql(b, rows, b.p["cleanup_live"]))
        size = int(re.search(r"^SIZE=(\d+)/", before, re.M).group(1))
    else:
        b.psql(DB, expired_idem_sql(b, rows, b.p["cleanup_live"]))
        size = int(b.val(DB, "SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('idem.claims') WHERE isleaf"))
        ms, wal, out, _ = timed(b, "SELECT idem_maintain()")
    made = re.search(r'"partitions_created": \[([^\]]*)\]', out)
    after = b.store(DB, "idem.claims")
    own = re.search(r'"duration_ms": ([\d.]+)', out)   # without its commit, which unlinks the files
    r = {"rows": rows, "session": kind, "rep": rep, "ms": ms, "wal": wal, "size_before": size, "size_after": after["total"],
         "expired_left": int(b.val(DB, "SELECT count(*) FROM idem.claims WHERE expires_at < now()")),
         "own_duration_ms": float(own.group(1)) if own else None, "created": bool(made and made.group(1).strip())}
    b.log(f"cleanup idem_maintain ({kind}) {rows} rows: {ms:.1f} ms, {wal} B WAL, {r['expired_left']} expired left")
    return r


def run(b):
    p = b.p
    sizes, live = sorted(p["cleanup_rows"]), p["cleanup_live"]
    res = b.raw["cleanup"] = {"rows": sizes, "live": live, "delete": [], "idem": [], "idem_cold": []}
    b.create_db(DB, sql=SETUP_SQL)
    for rows in sizes:   # hand-written: loaded without its indexes, built afterwards (10 M rows in minutes, not twenty)
        b.psql(DB, f"""
            TRUNCATE dedup_ttl;
            ALTER TABLE dedup_ttl DROP CONSTRAINT dedup_ttl_pkey;
            DROP INDEX dedup_ttl_expires_at;
            INSERT INTO dedup_ttl (key, created_at, expires_at)
              SELECT md5('x' || g::text), now() - interval '30 days', now() - interval '29 days' + g * interval '1 ms'
                FROM generate_series(1, {rows}) g;
            INSERT INTO dedup_ttl (key) SELECT md5('l' || g::text) FROM generate_series(1, {live}) g;
            ALTER TABLE dedup_ttl ADD CONSTRAINT dedup_ttl_pkey PRIMARY KEY (key);
            CREATE INDEX dedup_ttl_expires_at ON dedup_ttl (expires_at);
            VACUUM ANALYZE dedup_ttl;{b.ckpt}""")
        size = lambda: int(b.val(DB, "SELECT pg_total_relation_size('dedup_ttl')"))
        before = size()
        ms, wal, _, _ = timed(b, "DELETE FROM dedup_ttl WHERE expires_at < now()")
        after, t0 = size(), time.time()
        b.psql(DB, "VACUUM dedup_ttl")
        r = {"rows": rows, "ms": ms, "wal": wal, "size_before": before, "size_after": after, "size_after_vacuum": size(),
             "vacuum_s": time.time() - t0, "expired_left": int(b.val(DB, "SELECT count(*) FROM dedup_ttl WHERE expires_at < now()"))}
        res["delete"].append(r)
        b.log(f"cleanup DELETE {rows} rows: {ms:.0f} ms, {wal / 1e6:.1f} MB WAL")
    b.psql(DB, "TRUNCATE dedup_ttl")
    # warm: the session's first idem_maintain() (nothing to drop: it compiles
    # the function and fills the caches) before the load, the measured call second
    for rep in range(p["cleanup_reps"]):
        for rows in lib.rotated(sizes, rep, max(1, p["cleanup_reps"])):
            b.wait_quiet()
            res["idem"].append(maintain(b, rows, "warm", rep))
            b.save()
    for rows in sizes:   # cold: a fresh session's first call, as a cron job's psql or pg_cron makes it
        b.wait_quiet()
        res["idem_cold"].append(maintain(b, rows, "cold", 0))
        b.save()
    b.drop_db(DB)


def report(R):
    c = R.raw.get("cleanup")
    if not c:
        return
    mib = lambda x: f"{x / 1048576:,.1f}"
    rows, warm = [], {}
    for r in c["delete"]:
        rows.append(["DELETE", f"{r['rows']:,}", f"{r['ms']:,.0f}", "—", f"{r['wal'] / 1024:,.0f}", mib(r["size_before"]),
                     mib(r["size_after"]) + f" ({mib(r['size_after_vacuum'])} after VACUUM, {r['vacuum_s']:.1f} s)",
                     f"{r['expired_left']:,}"])
        R.csv.append(("cleanup", "DELETE", "", "", "", f"ms_{r['rows']}", r["ms"], "ms"))
    for n in c["rows"]:
        rs = [r for r in c["idem"] if r["rows"] == n]
        if rs:
            warm[n] = d = {k: lib.median([r[k] for r in rs]) for k in ("ms", "wal", "own_duration_ms")}
            d.update(left=max(r["expired_left"] for r in rs), created=any(r["created"] for r in rs))
            rows.append(["idem_maintain(), warm", f"{n:,}", f"{d['ms']:,.1f} (own {fmt(d['own_duration_ms'], 1)})",
                         f"{min(r['ms'] for r in rs):,.1f}–{max(r['ms'] for r in rs):,.1f}", f"{d['wal'] / 1024:,.1f}",
                         mib(rs[-1]["size_before"]), mib(rs[-1]["size_after"]), f"{d['left']:,}"])
            R.csv.append(("cleanup", "idem_maintain_warm", "", "", "", f"ms_{n}", d["ms"], "ms"))
    for r in c["idem_cold"]:
        rows.append(["idem_maintain(), cold", f"{r['rows']:,}", f"{r['ms']:,.1f} (own {fmt(r['own_duration_ms'], 1)})",
                     "—", f"{r['wal'] / 1024:,.1f}", mib(r["size_before"]), mib(r["size_after"]), f"{r['expired_left']:,}"])
    R.md += ["## Cleanup of expired claims", "", f"Plus {c['live']:,} live rows; *warm*: a session's second call "
             "(median of the repetitions, range), *cold*: a fresh session's first; *own*: idem_maintain()'s "
             "duration_ms, without the commit that unlinks the files.", ""] + \
        table(["method", "expired rows", "time ms", "range ms", "WAL KiB", "size before MiB", "after MiB",
               "expired left"], rows)
    if any(d["created"] for d in warm.values()):
        R.md += ["Some warm calls also created a partition (the premade horizon moved); their time and WAL include it.", ""]
    R.summary["cleanup"] = {"warm": warm}
    sizes = list(warm)
    if not sizes:
        return
    big = "" if sizes[-1] >= 10_000_000 else f" [measured up to {sizes[-1]:,} rows; stated for 100 k, 1 M, 10 M: --full]"
    left = [n for n, d in warm.items() if d["left"]]
    ms, wal = [d["ms"] for d in warm.values()], [d["wal"] for d in warm.values()]
    R.target(f"cleanup flat in rows: idem_maintain() time within 1.2× across {' / '.join(f'{n:,}' for n in sizes)} rows{big}",
             " / ".join(f"{x:,.1f}" for x in ms) + f" ms; cold: " + ", ".join(f"{r['ms']:,.1f}" for r in c["idem_cold"])
             + (f" — expired rows LEFT at {left}" if left else ""), max(ms) / max(min(ms), 0.001) <= 1.2 and not left)
    R.target(f"cleanup flat in rows: idem_maintain() WAL within 1.2×{big}", " / ".join(f"{x / 1024:,.1f}" for x in wal)
             + " KiB", max(wal) / max(min(wal), 1) <= 1.2)
    dl = {r["rows"]: r["ms"] for r in c["delete"]}
    n = sizes[-1]
    if n in dl:
        x = dl[n] / max(warm[n]["ms"], 0.001)
        R.target(f"cleanup ≥ 100× faster than DELETE of the same {n:,} rows{big}",
                 f"{x:,.0f}× ({dl[n]:,.0f} ms vs {warm[n]['ms']:,.1f} ms warm)", x >= 100 and not warm[n]["left"])
