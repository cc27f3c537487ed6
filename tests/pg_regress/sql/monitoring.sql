-- monitoring: the shapes of idem_metrics, idem_maintenance and idem_health,
-- and what they say on a server that does not preload idem (the suite's
-- cluster): counters off, and how to turn them on. Nothing printed here
-- depends on the time. The counters themselves, on a cluster that preloads
-- idem: tests/scenarios/monitoring.sh metrics.
-- A database of its own: what the suite's other tests leave behind
-- (partitions, claims, leases, maintenance reports) does not show here.
SET client_min_messages = warning;
DROP ROLE IF EXISTS regress_idem_watcher;
DROP DATABASE IF EXISTS regress_idem_monitoring;
CREATE DATABASE regress_idem_monitoring;
\set suite_db :DBNAME
\c regress_idem_monitoring
SET client_min_messages = warning;
CREATE EXTENSION idem;
RESET client_min_messages;
\set SHOW_CONTEXT never
\set VERBOSITY sqlstate

-- The columns of each view, in order, with their types.
SELECT c.relname AS view, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod) AS type
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
 WHERE c.relname IN ('idem_metrics', 'idem_maintenance', 'idem_health') AND a.attnum > 0
 ORDER BY c.relname, a.attnum;

-- Counters off: one row, every counter NULL, and a note that says how to
-- turn them on.
SELECT count(*) AS rows,
       bool_and(biz_type IS NULL AND claims IS NULL AND waits IS NULL AND wait_seconds IS NULL
                AND stats_since IS NULL) AS all_null
  FROM idem_metrics;
SELECT note FROM idem_metrics;
SELECT * FROM idem.metrics_info();
-- Claims work as ever, and count nothing.
SELECT claimed, state FROM idem_claim('mon-1', 'monitoring');
SELECT count(*) AS rows, min(note) IS NOT NULL AS still_off FROM idem_metrics;
-- Resetting counters that are off does nothing.
SELECT idem_metrics_reset();

-- Every function and view of the extension carries a COMMENT.
SELECT p.oid::regprocedure AS function_without_comment
  FROM pg_proc p
  JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idem'
 WHERE obj_description(p.oid, 'pg_proc') IS NULL;
SELECT c.oid::regclass AS view_without_comment
  FROM pg_class c
  JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'e'
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idem'
 WHERE c.relkind = 'v' AND obj_description(c.oid, 'pg_class') IS NULL;

-- Operators only: the reset is revoked from PUBLIC, and the views are not
-- granted to it.
CREATE ROLE regress_idem_watcher;
SET ROLE regress_idem_watcher;
SELECT idem_metrics_reset();
SELECT count(*) FROM idem_metrics;
SELECT count(*) FROM idem_health;
SELECT count(*) FROM idem_maintenance;
RESET ROLE;
-- A monitoring role needs SELECT on the views only.
GRANT SELECT ON idem_metrics, idem_health, idem_maintenance TO regress_idem_watcher;
SET ROLE regress_idem_watcher;
SELECT count(*) AS metric_rows FROM idem_metrics;
SELECT check_name, severity FROM idem_health WHERE check_name = 'metrics';
SELECT runs_recorded >= 0 AS readable FROM idem_maintenance;
RESET ROLE;

-- idem_maintenance, from the reports in idem.maintenance_runs: none, one
-- successful run, then three runs that gave up on the lock (reports as
-- idem_maintain writes them when it gives up).
TRUNCATE idem.maintenance_runs;
SELECT last_run_at, last_success_at, since_last_success, skipped_in_a_row, runs_recorded, runs_skipped
  FROM idem_maintenance;
SELECT check_name, severity, value, detail FROM idem_health WHERE check_name IN ('maintenance_overdue', 'maintenance_lock');
BEGIN ISOLATION LEVEL READ COMMITTED;  -- idem_maintain runs in READ COMMITTED only
SELECT idem_maintain() IS NOT NULL AS maintained;
COMMIT;
SELECT last_run_at = last_success_at AS last_run_succeeded, last_skipped, skipped_in_a_row,
       runs_recorded, runs_skipped, since_last_success < interval '1 hour' AS recent,
       last_duration_ms >= 0 AS timed, last_partitions_created >= 0 AS created_counted,
       last_partitions_dropped, last_rows_moved_from_default >= 0 AS moved_counted
  FROM idem_maintenance;
INSERT INTO idem.maintenance_runs (started_at, finished_at, report)
SELECT now(), now(), jsonb_build_object('partitions_created', '[]'::jsonb, 'partitions_dropped', '[]'::jsonb,
                                       'rows_moved_from_default', 0, 'lock_attempts', 20,
                                       'skipped', jsonb_build_array('lock on idem.claims not available'),
                                       'duration_ms', 12.5)
  FROM generate_series(1, 3);
SELECT last_skipped, last_duration_ms, skipped_in_a_row, runs_recorded, runs_skipped,
       last_success_at < last_run_at AS success_before_last FROM idem_maintenance;

-- idem_health: every check, always in this order. The three runs above
-- that gave up make maintenance_lock a warning; the next successful run
-- ends the streak.
SELECT check_name, severity, action FROM idem_health;
BEGIN ISOLATION LEVEL READ COMMITTED;  -- idem_maintain runs in READ COMMITTED only
SELECT idem_maintain() IS NOT NULL AS maintained;
COMMIT;
SELECT check_name, severity FROM idem_health;
-- The details that do not depend on the time.
SELECT check_name, value, detail FROM idem_health
 WHERE check_name IN ('maintenance_lock', 'default_partition', 'stuck_leases', 'expired_partitions', 'metrics');

-- A claim beyond the premade partitions lands in the default partition.
SELECT claimed FROM idem_claim('mon-far', 'monitoring', ttl => '400 days');
SELECT check_name, severity, value, detail FROM idem_health WHERE check_name = 'default_partition';
SELECT idem_forget('mon-far', 'monitoring');
-- A longest TTL beyond the partitions: the horizon is short until the next
-- maintenance run.
SELECT idem_configure('monitoring', '20 days');
SELECT check_name, severity, coalesce(value < 0, true) AS short FROM idem_health WHERE check_name = 'partition_horizon';
BEGIN ISOLATION LEVEL READ COMMITTED;  -- idem_maintain runs in READ COMMITTED only
SELECT idem_maintain() IS NOT NULL AS maintained;
COMMIT;
SELECT check_name, severity, value > 0 AS covered FROM idem_health WHERE check_name = 'partition_horizon';
SELECT idem_configure('monitoring', NULL);

-- A lease that ran out long ago, with nobody taking it over: a stuck lease
-- (the lease end moved into the past by hand, so that nothing waits).
SELECT claimed FROM idem_claim('mon-lease', 'monitoring', lease => '1 hour');
UPDATE idem.claims SET result = jsonb_set(result, '{lease_until_us}',
         to_jsonb(((extract(epoch FROM now() - interval '2 hours') - 946684800) * 1000000)::bigint))
 WHERE biz_type = 'monitoring' AND key = 'mon-lease';
SELECT check_name, severity, value FROM idem_health WHERE check_name = 'stuck_leases';
SET idem.health_lease_after = '3 hours';
SELECT check_name, severity, value, detail FROM idem_health WHERE check_name = 'stuck_leases';
RESET idem.health_lease_after;
SET idem.health_lease_after = '1 millisecond';
SET idem.health_maintenance_after = '0';
RESET idem.health_maintenance_after;
SELECT idem_forget('mon-lease', 'monitoring');

\c :suite_db
DROP DATABASE regress_idem_monitoring;
DROP ROLE regress_idem_watcher;

-- CREATE EXTENSION where a publication FOR ALL TABLES already exists says
-- that idem's tables are published, and where to look (docs/design.md §12).
CREATE DATABASE regress_idem_publication;
\c regress_idem_publication
SET client_min_messages = error;
CREATE PUBLICATION regress_idem_all FOR ALL TABLES;
SET client_min_messages = warning;
\set VERBOSITY default
CREATE EXTENSION idem;
\set VERBOSITY terse
SELECT publication, all_tables, cardinality(problems) > 0 AS has_problems FROM idem_publications;
DROP PUBLICATION regress_idem_all;
-- Without one, nothing is said.
DROP EXTENSION idem;
CREATE EXTENSION idem;
\c :suite_db
DROP DATABASE regress_idem_publication;
