-- What an operator watches: counters of the claim protocol's outcomes
-- (src/metrics.rs; they need shared_preload_libraries = 'idem'), the record
-- of maintenance runs, and the health checks to alert on. A dashboard and a
-- postgres_exporter queries file built on these are in monitoring/.

-- The counters of this database, one row per business type used since the
-- server started (or the counters were reset); without preloading, one row
-- that says so.
CREATE FUNCTION idem.metrics(
    OUT biz_type text,
    OUT claims bigint,
    OUT takeovers bigint,
    OUT duplicates_completed bigint,
    OUT duplicates_failed bigint,
    OUT in_progress bigint,
    OUT waits bigint,
    OUT wait_seconds double precision,
    OUT fingerprint_mismatches bigint,
    OUT not_held bigint,
    OUT serialization_failures bigint,
    OUT completes bigint,
    OUT fails bigint,
    OUT checkpoints bigint,
    OUT stats_since timestamptz,
    OUT note text)
    RETURNS SETOF record
    VOLATILE ROWS 10
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_metrics';
COMMENT ON FUNCTION idem.metrics() IS 'The counters in shared memory of this database (read by the view idem_metrics).';

CREATE FUNCTION idem.metrics_info(OUT counting boolean, OUT slots_used int, OUT slots int, OUT overflowed boolean)
    RETURNS SETOF record
    VOLATILE ROWS 1
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_metrics_info';
COMMENT ON FUNCTION idem.metrics_info() IS 'Whether the counters run (idem preloaded), how many of their (database, biz_type) slots are used, of how many, and whether some pair found no room.';

-- This database's share of the slots (sql/metrics.sql's idem_health reads
-- it): slots it holds, its (other types) row included, of how many it may
-- hold, and how many times an existing type found them all taken.
CREATE FUNCTION idem.metrics_database(OUT slots_used int, OUT share int, OUT no_room bigint)
    RETURNS SETOF record
    VOLATILE ROWS 1
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_metrics_database';
COMMENT ON FUNCTION idem.metrics_database() IS 'This database''s share of the counters'' slots: how many it holds ((other types) included), how many it may hold, and how many times a type that exists found no room (NULLs when the counters are off).';

-- Reclaiming slots (idem.metrics_reclaim, run by idem_maintain).
CREATE FUNCTION idem.metrics_types(OUT biz_type text, OUT stats_since timestamptz) RETURNS SETOF record
    VOLATILE ROWS 100
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_metrics_types';
COMMENT ON FUNCTION idem.metrics_types() IS 'The business types of this database that hold a slot of the counters, and since when their row counts.';
REVOKE EXECUTE ON FUNCTION idem.metrics_types() FROM PUBLIC;

CREATE FUNCTION idem.metrics_release(biz_type text) RETURNS boolean
    VOLATILE STRICT PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_metrics_release';
COMMENT ON FUNCTION idem.metrics_release(text) IS 'Free this database''s slot of biz_type; its counts are added to the (other types) row. Whether it had one.';
REVOKE EXECUTE ON FUNCTION idem.metrics_release(text) FROM PUBLIC;

CREATE FUNCTION idem.metrics_release_dropped() RETURNS int
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_metrics_release_dropped';
COMMENT ON FUNCTION idem.metrics_release_dropped() IS 'Free the slots of databases that were dropped; how many.';
REVOKE EXECUTE ON FUNCTION idem.metrics_release_dropped() FROM PUBLIC;

-- Give back the slots of types that are gone: those of dropped databases
-- (always: no scan), and this database's types that have no claim left and
-- no row in idem.biz_types. Finding the latter reads idem.claims once, so
-- it is done only when this database holds more than half its share (or
-- with every_type => true). Their counts move to the (other types) row.
-- A type that claims again gets a new row (a new stats_since).
CREATE FUNCTION idem.metrics_reclaim(every_type boolean DEFAULT false) RETURNS int
    VOLATILE PARALLEL UNSAFE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    freed int := idem.metrics_release_dropped();
    db    record;
    held  text[];
BEGIN
    SELECT * INTO db FROM idem.metrics_database();
    IF db.slots_used IS NULL OR NOT (every_type OR db.slots_used > db.share / 2) THEN
        RETURN freed;
    END IF;
    held := ARRAY(SELECT m.biz_type FROM idem.metrics_types() m);
    SELECT freed + count(*) FILTER (WHERE idem.metrics_release(t)) INTO freed
      FROM unnest(held) t
     WHERE t <> ALL (ARRAY(SELECT DISTINCT c.biz_type FROM idem.claims c WHERE c.biz_type = ANY (held)))
       AND t <> ALL (ARRAY(SELECT b.biz_type FROM idem.biz_types b WHERE b.biz_type = ANY (held)));
    RETURN freed;
END
$fn$;
COMMENT ON FUNCTION idem.metrics_reclaim(boolean) IS 'Free the counters'' slots of dropped databases, and (when this database holds more than half its share, or every_type) of its types with no claim and no settings left, their counts moved to (other types). idem_maintain runs it. How many slots were freed.';
REVOKE EXECUTE ON FUNCTION idem.metrics_reclaim(boolean) FROM PUBLIC;

CREATE VIEW idem_metrics AS
SELECT m.biz_type,
       m.claims,
       m.takeovers,
       m.duplicates_completed,
       m.duplicates_failed,
       m.in_progress,
       m.waits,
       m.wait_seconds,
       m.fingerprint_mismatches,
       m.not_held,
       m.serialization_failures,
       m.completes,
       m.fails,
       m.checkpoints,
       m.stats_since,
       m.note
  FROM idem.metrics() m;
COMMENT ON VIEW idem_metrics IS
'Counters per business type of this database since stats_since (server start, first use, or idem_metrics_reset()): claims (new), takeovers (of leases that ran out), duplicates answered completed / failed, in_progress answers, waits for another transaction and their total time, ID001 fingerprint mismatches, ID003 refusals (not_held), 40001 raised, and idem_complete / idem_fail / idem_checkpoint calls. Counted when decided, committed or not; in shared memory, reset on restart like pg_stat_*. A type gets its row when a transaction that wrote or found a claim of it commits; the row biz_type = ''(other types)'' counts the calls on types that do not exist here, the types that found this database''s share of slots full, and the counts of rows reclaimed. Needs shared_preload_libraries = ''idem''; without it, one row whose note says so. A row with biz_type NULL counts what found the whole table full, all databases together.';

CREATE FUNCTION idem_metrics_reset() RETURNS void
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_metrics_reset';
COMMENT ON FUNCTION idem_metrics_reset() IS
'Zero the idem_metrics counters of this database (and the overflow row); their stats_since becomes now. Does nothing when the counters are off.';
REVOKE EXECUTE ON FUNCTION idem_metrics_reset() FROM PUBLIC;

-- One row: what the reports in idem.maintenance_runs (the last 100 runs)
-- say about maintenance.
CREATE VIEW idem_maintenance AS
WITH runs AS (
    SELECT r.run_id,
           r.finished_at,
           r.report,
           coalesce(jsonb_typeof(r.report->'skipped') = 'array', false) AS skipped
      FROM idem.maintenance_runs r
), last AS (
    SELECT * FROM runs ORDER BY run_id DESC LIMIT 1
), success AS (
    SELECT max(run_id) AS run_id, max(finished_at) AS finished_at FROM runs WHERE NOT skipped
)
SELECT last.finished_at AS last_run_at,
       (last.report->>'duration_ms')::numeric AS last_duration_ms,
       jsonb_array_length(coalesce(last.report->'partitions_created', '[]')) AS last_partitions_created,
       jsonb_array_length(coalesce(last.report->'partitions_dropped', '[]')) AS last_partitions_dropped,
       coalesce((last.report->>'rows_moved_from_default')::bigint, 0) AS last_rows_moved_from_default,
       last.skipped AS last_skipped,
       success.finished_at AS last_success_at,
       now() - success.finished_at AS since_last_success,
       (SELECT count(*) FROM runs WHERE run_id > coalesce(success.run_id, 0)) AS skipped_in_a_row,
       (SELECT count(*) FROM runs) AS runs_recorded,
       (SELECT count(*) FROM runs WHERE skipped) AS runs_skipped
  FROM success LEFT JOIN last ON true;
COMMENT ON VIEW idem_maintenance IS
'Maintenance at a glance, from the reports of the last 100 idem_maintain() runs (idem.maintenance_runs): the last run (when, how long, partitions created and dropped, claims moved out of the default partition, whether it gave up on its lock), the last successful run and how long ago, runs in a row that gave up on the lock, runs recorded and how many of them gave up.';

-- Intervals and times in idem_health's texts, the same whatever the
-- reading session's IntervalStyle, DateStyle and TimeZone (a text that
-- changes with them cannot be alerted on or compared): intervals in the
-- 'postgres' style ("3 days 00:15:00"), times in ISO 8601 UTC.
CREATE FUNCTION idem.interval_text(i interval) RETURNS text
    STABLE PARALLEL SAFE
    SET IntervalStyle = 'postgres'
    LANGUAGE sql AS $fn$ SELECT i::text $fn$;
COMMENT ON FUNCTION idem.interval_text(interval) IS 'An interval as text in the postgres IntervalStyle, whatever the session''s (idem_health''s texts).';

CREATE FUNCTION idem.time_text(t timestamptz) RETURNS text
    STABLE PARALLEL SAFE
    LANGUAGE sql AS $fn$ SELECT to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') $fn$;
COMMENT ON FUNCTION idem.time_text(timestamptz) IS 'A time as ISO 8601 text in UTC, whatever the session''s DateStyle and TimeZone (idem_health''s texts).';

-- Claims in the default partition, counted up to cap (NULL if the default
-- partition is missing). Named in dynamic SQL so that nothing depends on
-- the partition (maintenance recreates it if it is dropped), and SECURITY
-- DEFINER so that the view works for roles that may not read idem.claims.
CREATE FUNCTION idem.default_partition_rows(cap bigint) RETURNS bigint
    STABLE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    n bigint;
BEGIN
    IF to_regclass('idem.claims_default') IS NULL THEN
        RETURN NULL;
    END IF;
    EXECUTE 'SELECT count(*) FROM (SELECT 1 FROM idem.claims_default LIMIT $1) d' INTO n USING cap;
    RETURN n;
END
$fn$;
COMMENT ON FUNCTION idem.default_partition_rows(bigint) IS 'Rows in idem.claims_default, counted up to cap; NULL when it is missing.';

-- One row per check, always in this order, with its severity (ok, info,
-- warning, critical), a measured value, what was found, and what to do.
-- Alert on severity <> 'ok'. Reads idem.claims once for leased claims (a
-- scan, like idem_leases); everything else is small.
CREATE VIEW idem_health AS
WITH s AS (
    SELECT interval '1 day' AS critical_after,
           idem.setting_interval('idem.health_maintenance_after', '15 minutes') AS maintenance_after,
           idem.setting_interval('idem.health_lease_after', '15 minutes') AS lease_after
), m AS (
    SELECT * FROM idem_maintenance
), p AS (
    SELECT count(*) FILTER (WHERE NOT b.is_default AND b.range_to < now() - s.maintenance_after) AS expired_left
      FROM s LEFT JOIN idem.partition_bounds b ON true
     GROUP BY s.maintenance_after
), h AS (
    -- Per TTL class maintenance keeps partitions for: how far beyond the
    -- expiry of a claim made now with the class's longest TTL they reach.
    -- The shortest is reported.
    SELECT c.ttl_class, idem.class_max_ttl(c.ttl_class) AS longest_ttl,
           (SELECT max(b.range_to) FROM idem.partition_bounds b WHERE b.ttl_class = c.ttl_class)
             - (now() + idem.class_max_ttl(c.ttl_class)) AS margin
      FROM idem.classes_to_premake(now()) c
     ORDER BY 3 NULLS FIRST, 1
     LIMIT 1
), k AS (
    -- The relations one claim can lock, for the business type whose
    -- claims look into the most partitions: idem.claims, the default
    -- partition, idem.type_classes and idem.biz_types (with their indexes),
    -- and each partition of the type's classes that can hold a live claim,
    -- with its index (docs/design.md §1: at most 7 + 2 x 3 x 8 = 55 while
    -- maintenance keeps up).
    -- Under Citus a claim on a worker reads the registrations of its
    -- shard (docs/design.md §13) and locks one relation more (the logical
    -- idem.claims and the shard: 8 fixed); this takes the union of a
    -- type's classes over the shards, which is at least what one shard
    -- has. Without the distributed registry (not updated yet) a claim
    -- looks into every class's partitions that can hold a claim made
    -- until now (src/storage/direct.rs), counted in the coordinator's
    -- list, which every shard's partitions follow.
    -- The portable edition (its gate table, idem.key_gates, exists) locks
    -- 10 more: idem.key_gates and its key, idem.type_gates and its key (a
    -- claim that would add a TTL class to its type), and the catalogs its
    -- SQL reads (pg_roles, pg_authid with two indexes, pg_db_role_setting
    -- with one).
    SELECT CASE WHEN c.citus AND NOT c.registry THEN c.n ELSE coalesce(x.n, 0) END * 2
           + CASE WHEN e.portable THEN 17 WHEN c.citus THEN 8 ELSE 7 END AS locks,
           CASE WHEN c.citus AND NOT c.registry THEN 'any business type (under Citus every class is looked into)' ELSE x.biz_type END AS biz_type
      FROM (SELECT max(n) AS n, (array_agg(biz_type ORDER BY n DESC))[1] COLLATE "default" AS biz_type
              FROM (SELECT t.biz_type, count(DISTINCT b.partition) AS n
                      FROM (SELECT biz_type, ttl_class, max(until) AS until FROM idem.type_classes GROUP BY 1, 2) t
                      JOIN idem.partition_bounds b ON b.ttl_class = t.ttl_class AND b.range_from <= t.until
                     GROUP BY t.biz_type) y) x,
           (SELECT idem.is_distributed('idem.claims') AS citus, idem.is_distributed('idem.type_classes') AS registry,
                   count(*) FILTER (WHERE NOT b.is_default
                                      AND b.range_from <= now() + idem.class_max_ttl(b.ttl_class) + idem.class_width(b.ttl_class)) AS n
              FROM idem.partition_bounds b) c,
           -- (from the catalogs, which every role reads: to_regclass on
           -- schema idem needs USAGE; and in FROM, where Citus plans it)
           (SELECT count(*) > 0 AS portable
              FROM pg_class g JOIN pg_namespace n ON n.oid = g.relnamespace
             WHERE n.nspname = 'idem' AND g.relname = 'key_gates') e
), d AS (
    SELECT idem.default_partition_rows(10000) AS n
), l AS (
    SELECT count(*) AS n, min(x.lease_until) AS oldest
      FROM s JOIN idem_leases x ON x.lease_until < now() - s.lease_after
), mi AS (
    SELECT i.*, d.slots_used AS db_slots_used, d.share AS db_share, d.no_room AS db_no_room
      FROM idem.metrics_info() i LEFT JOIN idem.metrics_database() d ON true
)
SELECT 'maintenance_overdue'::text AS check_name,
       CASE WHEN m.last_success_at IS NULL OR m.last_success_at < now() - s.critical_after THEN 'critical'
            WHEN m.last_success_at < now() - s.maintenance_after THEN 'warning'
            ELSE 'ok' END AS severity,
       extract(epoch FROM now() - m.last_success_at)::double precision AS value,
       CASE WHEN m.last_success_at IS NULL THEN 'no successful idem_maintain() run is recorded'
            ELSE format('the last successful idem_maintain() run finished %s ago (warning after %s, critical after %s)',
                        idem.interval_text(date_trunc('second', now() - m.last_success_at)), idem.interval_text(s.maintenance_after), idem.interval_text(s.critical_after)) END AS detail,
       'Run SELECT idem_maintain(), and schedule it every few minutes: SELECT idem_schedule_maintenance() with pg_cron, or cron and psql.'::text AS action
  FROM s, m
UNION ALL
SELECT 'maintenance_lock',
       CASE WHEN m.skipped_in_a_row >= 3 THEN 'warning' ELSE 'ok' END,
       m.skipped_in_a_row,
       format('%s run(s) in a row did nothing (gave up on the lock on idem.claims, or found another idem_maintain() running)', m.skipped_in_a_row),
       'A long transaction keeps idem.claims locked, or one idem_maintain() runs for very long: find it in pg_stat_activity (oldest xact_start) and end it, or raise idem.maintenance_lock_retries.'
  FROM m
UNION ALL
SELECT 'default_partition',
       CASE WHEN d.n IS NULL THEN 'critical' WHEN d.n > 0 THEN 'warning' ELSE 'ok' END,
       d.n,
       CASE WHEN d.n IS NULL THEN 'idem.claims_default is missing: claims beyond the premade partitions fail'
            WHEN d.n >= 10000 THEN 'at least 10000 claims in the default partition'
            ELSE format('%s claims in the default partition', d.n) END,
       'Run SELECT idem_maintain() (it makes the partitions of their TTL classes and moves them there).'
  FROM d
UNION ALL
SELECT 'partition_horizon',
       CASE WHEN h.ttl_class IS NOT NULL AND (h.margin IS NULL OR h.margin < interval '0') THEN 'warning' ELSE 'ok' END,
       extract(epoch FROM h.margin)::double precision,
       CASE WHEN h.ttl_class IS NULL THEN 'no TTL class needs partitions'
            WHEN h.margin IS NULL THEN format('TTL class %s (TTLs up to %s) has no partition: its claims go to the default partition', h.ttl_class, idem.interval_text(h.longest_ttl))
            ELSE format('the partitions of TTL class %s end %s after the expiry of a claim made now with its longest TTL (%s); the other classes'' reach further',
                        h.ttl_class, idem.interval_text(date_trunc('second', h.margin)), idem.interval_text(h.longest_ttl)) END,
       'Run SELECT idem_maintain(); if the horizon stays short, raise idem.premake_limit (a run makes each class''s partitions up to now + the class''s longest TTL + idem.premake_ahead, at least one width and at most 16).'
  FROM (SELECT 1) one LEFT JOIN h ON true
UNION ALL
SELECT 'claim_locks',
       CASE WHEN k.locks > current_setting('max_locks_per_transaction')::int THEN 'critical'
            WHEN k.locks > 7 + 2 * 8 THEN 'warning' ELSE 'ok' END,
       k.locks,
       CASE WHEN k.biz_type IS NULL THEN 'no business type has claims in a TTL class yet'
            ELSE format('a claim of %s locks up to %s relations (max_locks_per_transaction = %s)', k.biz_type, k.locks, current_setting('max_locks_per_transaction')) END,
       'A type whose claims were made with TTLs of several classes (per-call ttl) looks into each, at most three: give the type one TTL with idem_configure; if expired partitions pile up, run SELECT idem_maintain().'
  FROM k
UNION ALL
SELECT 'stuck_leases',
       CASE WHEN l.n > 0 THEN 'warning' ELSE 'ok' END,
       l.n,
       CASE WHEN l.n = 0 THEN format('no lease ran out more than %s ago without a takeover', idem.interval_text(s.lease_after))
            ELSE format('%s lease(s) ran out more than %s ago and nobody took them over; the oldest ran out at %s',
                        l.n, idem.interval_text(s.lease_after), idem.time_text(l.oldest)) END,
       'The work they stand for stopped: rerun it (the next idem_claim of the key takes the lease over and is told the recovery point); idem_leases lists them.'
  FROM s, l
UNION ALL
SELECT 'expired_partitions',
       CASE WHEN p.expired_left > 0 THEN 'warning' ELSE 'ok' END,
       p.expired_left,
       format('%s partition(s) whose range ended more than %s ago are still there', p.expired_left, idem.interval_text(s.maintenance_after)),
       'Run SELECT idem_maintain() (it drops them); if they stay, a long transaction keeps idem.claims locked (see maintenance_lock).'
  FROM s, p
UNION ALL
SELECT 'metrics',
       CASE WHEN NOT mi.counting THEN 'info' WHEN mi.overflowed OR mi.db_no_room > 0 THEN 'warning' ELSE 'ok' END,
       mi.slots_used,
       CASE WHEN NOT mi.counting THEN 'counters are off (idem is not in shared_preload_libraries): idem_metrics has no counts'
            WHEN mi.overflowed THEN format('all %s (database, biz_type) slots of the counters are in use: idem_metrics counts what found no room in its overflow row (biz_type NULL), all databases together', mi.slots)
            WHEN mi.db_no_room > 0 THEN format('this database''s share of %s slots of the counters is full: idem_metrics counts the types that found no room in its (other types) row', mi.db_share)
            ELSE format('%s of %s (database, biz_type) slots of the counters in use, %s of this database''s share of %s', mi.slots_used, mi.slots, mi.db_slots_used, mi.db_share) END,
       CASE WHEN NOT mi.counting THEN 'To count claims, duplicates, waits and errors: add idem to shared_preload_libraries and restart the server.'
            WHEN mi.overflowed OR mi.db_no_room > 0 THEN 'Use fewer business types per database, or run SELECT idem_maintain() (it frees the slots of types with no claims left and of dropped databases); idem_metrics_reset() clears the warning.'
            ELSE 'None.' END
  FROM mi;
COMMENT ON VIEW idem_health IS
'Health checks, one row each, always in the same order: maintenance_overdue, maintenance_lock, default_partition, partition_horizon, claim_locks, stuck_leases, expired_partitions, metrics; each with severity (ok, info, warning, critical), a measured value, what was found (detail) and a one-line action. Alert on severity <> ''ok''. Thresholds: idem.health_maintenance_after and idem.health_lease_after. Scans the live claims for leases (as idem_leases does).';
