-- The portable edition's round trip and views, run by
-- tests/portable/steps.sh environments once under the server's default settings
-- and once in each session environment; every output must equal the
-- default run's. What it prints cannot depend on how the session renders
-- values: states, results (lease tokens and times reduced to their shape),
-- TTLs as seconds. The views are compared within one transaction (one
-- now()): read under the session's settings into temp tables, then again
-- under default settings, and the rows that differ counted.
\set ON_ERROR_STOP 1
\pset footer off
\pset null '(null)'
\set rc 'BEGIN ISOLATION LEVEL READ COMMITTED;'
SET client_min_messages = warning;

-- claim, complete, duplicate, lookup
:rc
SELECT claimed, state, result, extract(epoch FROM expires_at - first_claimed_at) AS ttl_s FROM idem_claim('rt-1', 'env.pay');
-- (an escape string: this file's own literals must mean the same under
-- every standard_conforming_strings)
SELECT idem_complete('rt-1', 'env.pay', E'{"amount": 12.50, "note": "\\u00fcn\\u00efcode \\\\ back", "at": 1.5e3}');
COMMIT;
:rc
SELECT claimed, state, result, extract(epoch FROM expires_at - first_claimed_at) AS ttl_s FROM idem_claim('rt-1', 'env.pay');
COMMIT;
SELECT state, result, expires_at > first_claimed_at AS expires_later FROM idem_lookup('rt-1', 'env.pay');

-- fail, fingerprints
:rc
SELECT claimed, state FROM idem_claim('rt-2', 'env.pay', ttl => '90 minutes', fingerprint => 'fp');
SELECT idem_fail('rt-2', 'env.pay', '{"error": "declined"}');
COMMIT;
:rc
SELECT claimed, state, result, extract(epoch FROM expires_at - first_claimed_at) AS ttl_s
  FROM idem_claim('rt-2', 'env.pay', fingerprint => 'fp');
COMMIT;
\set ON_ERROR_STOP 0
\set VERBOSITY sqlstate
:rc
SELECT claimed FROM idem_claim('rt-2', 'env.pay', fingerprint => 'other');
ROLLBACK;
\echo fingerprint mismatch: :LAST_ERROR_SQLSTATE
\set ON_ERROR_STOP 1

-- TTLs: arguments, configured types, idem.default_ttl (read by idem from
-- text), and the class each falls in
:rc
SELECT extract(epoch FROM expires_at - first_claimed_at) AS ttl_s FROM idem_claim('rt-3', 'env.pay', ttl => '1 day 02:03:04');
SELECT extract(epoch FROM expires_at - first_claimed_at) AS ttl_s FROM idem_claim('rt-3b', 'env.pay', ttl => 'P2DT3H');
SELECT idem_configure('env.conf', '36 hours');
COMMIT;
:rc
SELECT extract(epoch FROM expires_at - first_claimed_at) AS ttl_s FROM idem_claim('rt-4', 'env.conf');
SET LOCAL idem.default_ttl = '2 hours 30 minutes';
SELECT extract(epoch FROM expires_at - first_claimed_at) AS ttl_s FROM idem_claim('rt-5', 'env.ttl');
SET LOCAL idem.default_ttl = '3 days';
SELECT extract(epoch FROM expires_at - first_claimed_at) AS ttl_s FROM idem_claim('rt-5b', 'env.ttl');
COMMIT;
SELECT idem.ttl_class(i) AS class FROM (VALUES (interval '1 second'), ('90 minutes'), ('36 hours'), ('400 days')) v(i);

-- a lease: token, checkpoint, complete with the token
:rc
SELECT claimed, state, result->>'attempt' AS attempt, result->>'lease_token' AS token,
       length(result->>'lease_token') AS token_length,
       regexp_replace(result->>'lease_until', '[0-9]', 'N', 'g') AS lease_until_shape,
       extract(epoch FROM (result->>'lease_until')::timestamptz - first_claimed_at) AS lease_s
  FROM idem_claim('rt-6', 'env.job', lease => '5 minutes') \gset
COMMIT;
\echo lease: :claimed :state :attempt :token_length :lease_until_shape :lease_s
:rc
SELECT idem_checkpoint('rt-6', 'env.job', 'charged', '{"charge": 7}', :'token');
COMMIT;
SELECT state, result - 'lease_token' - 'lease_until' AS result FROM idem_lookup('rt-6', 'env.job');
:rc
SELECT idem_complete('rt-6', 'env.job', '{"done": true}', :'token');
COMMIT;
SELECT state, result FROM idem_lookup('rt-6', 'env.job');

-- forget, then the key is new again
:rc
SELECT idem_forget('rt-1', 'env.pay') AS forgotten, idem_forget('never', 'env.pay') AS forgotten_nothing;
COMMIT;
:rc
SELECT claimed, state FROM idem_claim('rt-1', 'env.pay');
ROLLBACK;

-- tokens and transitions
SELECT idem_consume_token(t, 'env.form') AS first, idem_consume_token(t, 'env.form') AS second, length(t) AS length
  FROM idem_issue_token('env.form') t;
SELECT idem_define_machine('env.order', '{"CREATED": ["PAID", "CANCELLED"], "PAID": ["SHIPPED"]}');
CREATE TABLE env_orders (id int PRIMARY KEY, status text);
INSERT INTO env_orders VALUES (1, 'CREATED'), (2, 'SHIPPED');
SELECT idem_transition('env_orders', 'id', '1', 'status', 'PAID', 'env.order') AS first,
       idem_transition('env_orders', 'id', '1', 'status', 'PAID', 'env.order') AS again,
       idem_classify_transition('env.order', 'PAID', 'CREATED') AS backwards;
SELECT idem_machine('env.order');
SELECT idem_guard('env_orders', 'status', 'env.order');
\set ON_ERROR_STOP 0
UPDATE env_orders SET status = 'CREATED' WHERE id = 2;
\echo guarded update: :LAST_ERROR_SQLSTATE
\set ON_ERROR_STOP 1
SELECT idem_unguard('env_orders', 'status');
UPDATE env_orders SET status = 'CREATED' WHERE id = 2;
SELECT status FROM env_orders WHERE id = 2;

-- maintenance and the views
:rc
SELECT idem_maintain() IS NOT NULL AS maintained, idem_storage_path() AS path;
COMMIT;
SELECT biz_type, count(*) FROM idem.claims GROUP BY 1 ORDER BY 1;
BEGIN;
CREATE TEMP TABLE v_stats AS SELECT * FROM idem_stats;
CREATE TEMP TABLE v_partitions AS SELECT * FROM idem_partitions;
CREATE TEMP TABLE v_health AS SELECT * FROM idem_health;
CREATE TEMP TABLE v_leases AS SELECT * FROM idem_leases;
CREATE TEMP TABLE v_maintenance AS SELECT * FROM idem_maintenance;
CREATE TEMP TABLE v_metrics AS SELECT * FROM idem_metrics;
CREATE TEMP TABLE v_publications AS SELECT * FROM idem_publications;
-- the server's defaults (the settings environments.sh varies)
SET LOCAL DateStyle = 'ISO, MDY';
SET LOCAL TimeZone = 'UTC';
SET LOCAL timezone_abbreviations = 'Default';
SET LOCAL IntervalStyle = 'postgres';
SET LOCAL extra_float_digits = 1;
SET LOCAL bytea_output = 'hex';
SET LOCAL standard_conforming_strings = on;
SET LOCAL transform_null_equals = off;
SET LOCAL lc_numeric = 'C.UTF-8';
SET LOCAL lc_time = 'C.UTF-8';
SET LOCAL lc_monetary = 'C.UTF-8';
SET LOCAL search_path = "$user", public;
SELECT v, n, differing FROM (
  SELECT 'idem_stats' AS v, (SELECT count(*) FROM v_stats) AS n,
         (SELECT count(*) FROM ((SELECT * FROM v_stats EXCEPT ALL SELECT * FROM idem_stats)
                                UNION ALL (SELECT * FROM idem_stats EXCEPT ALL SELECT * FROM v_stats)) d) AS differing
  UNION ALL SELECT 'idem_partitions (some)', ((SELECT count(*) FROM v_partitions) > 0)::int,
         (SELECT count(*) FROM ((SELECT * FROM v_partitions EXCEPT ALL SELECT * FROM idem_partitions)
                                UNION ALL (SELECT * FROM idem_partitions EXCEPT ALL SELECT * FROM v_partitions)) d)
  UNION ALL SELECT 'idem_health', (SELECT count(*) FROM v_health),
         (SELECT count(*) FROM ((SELECT * FROM v_health EXCEPT ALL SELECT * FROM idem_health)
                                UNION ALL (SELECT * FROM idem_health EXCEPT ALL SELECT * FROM v_health)) d)
  UNION ALL SELECT 'idem_leases', (SELECT count(*) FROM v_leases),
         (SELECT count(*) FROM ((SELECT * FROM v_leases EXCEPT ALL SELECT * FROM idem_leases)
                                UNION ALL (SELECT * FROM idem_leases EXCEPT ALL SELECT * FROM v_leases)) d)
  UNION ALL SELECT 'idem_maintenance', (SELECT count(*) FROM v_maintenance),
         (SELECT count(*) FROM ((SELECT * FROM v_maintenance EXCEPT ALL SELECT * FROM idem_maintenance)
                                UNION ALL (SELECT * FROM idem_maintenance EXCEPT ALL SELECT * FROM v_maintenance)) d)
  UNION ALL SELECT 'idem_metrics', (SELECT count(*) FROM v_metrics),
         (SELECT count(*) FROM ((SELECT * FROM v_metrics EXCEPT ALL SELECT * FROM idem_metrics)
                                UNION ALL (SELECT * FROM idem_metrics EXCEPT ALL SELECT * FROM v_metrics)) d)
  UNION ALL SELECT 'idem_publications', (SELECT count(*) FROM v_publications),
         (SELECT count(*) FROM ((SELECT * FROM v_publications EXCEPT ALL SELECT * FROM idem_publications)
                                UNION ALL (SELECT * FROM idem_publications EXCEPT ALL SELECT * FROM v_publications)) d)
) views ORDER BY v;
COMMIT;
