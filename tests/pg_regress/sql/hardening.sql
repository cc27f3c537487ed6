-- hardening: the promise outside the environment the suite was written in.
-- Session settings that print timestamps differently, read-only
-- transactions, business types reserved for a role, damaged stored
-- documents (storage changed by hand: storage_drift). Each case failed on
-- 0.2.0. Business types used here: env, ro, own.*, dmg.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idem;
DROP ROLE IF EXISTS regress_idem_payments, regress_idem_alice, regress_idem_mallory;
RESET client_min_messages;
\set SHOW_CONTEXT never
\set VERBOSITY sqlstate
-- "SQLSTATE: message", or "ok".
CREATE FUNCTION pg_temp.try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- 1. Session settings never reach storage. Hourly partitions, made from a
--    plain session; then sessions whose DateStyle and TimeZone print
--    timestamps with abbreviations that read back as other offsets (IST is
--    Israel in the Default set, EST is Australia's in the Australia set)
--    or not at all (WIB).
SET idem.partition_width = '1 hour';
-- (idem_maintain runs in READ COMMITTED only, whatever the session's default.)
BEGIN ISOLATION LEVEL READ COMMITTED;
CREATE TEMPORARY TABLE made_here AS SELECT jsonb_array_elements_text(idem_maintain()->'partitions_created') AS name;
SELECT count(*) > 0 AS maintained FROM made_here;
COMMIT;
SET DateStyle = 'Postgres, MDY';
SET TimeZone = 'Asia/Kolkata';
SELECT claimed, state FROM idem_claim('env-1', 'env', ttl => '90 minutes');
SELECT claimed, state FROM idem_claim('env-1', 'env', ttl => '90 minutes');
SET DateStyle = 'SQL, DMY';
SET TimeZone = 'Australia/Sydney';
SET timezone_abbreviations = 'Australia';
SELECT claimed, state FROM idem_claim('env-1', 'env');
SELECT claimed, state FROM idem_claim('env-2', 'env', ttl => '5 hours');
-- Maintenance run from such a session drops nothing live and makes whole
-- hours (in UTC) only.
BEGIN ISOLATION LEVEL READ COMMITTED;
-- (What it drops depends on the time: partitions of earlier tests' short
-- TTLs that have ended. The duplicates below show the live claims kept.)
SELECT jsonb_typeof(idem_maintain()->'partitions_dropped') AS dropped;
COMMIT;
SET TimeZone = 'Asia/Jakarta';
SET timezone_abbreviations = 'Default';
SELECT claimed, state FROM idem_claim('env-3', 'env', ttl => '3 hours');
SELECT claimed, state FROM idem_claim('env-2', 'env');
SET DateStyle = 'German';
SET TimeZone = 'Pacific/Chatham';
SET IntervalStyle = 'iso_8601';
SELECT claimed, state FROM idem_claim('env-3', 'env');
RESET DateStyle; RESET TimeZone; RESET IntervalStyle; RESET timezone_abbreviations;
-- Every claim lies in the partition whose range holds its expiry, and every
-- partition made above ends on a multiple of its class's width (whole hours
-- times a power of the square root of 2, in UTC: a range that a session's
-- settings moved would not).
SELECT count(*) AS misplaced
  FROM idem.claims c JOIN idem.partition_bounds b ON b.partition = c.tableoid::regclass
 WHERE NOT b.is_default AND NOT (c.expires_at >= b.range_from AND c.expires_at < b.range_to);
SELECT count(*) > 0 AS ranges,
       count(*) FILTER (WHERE (extract(epoch FROM range_to) * 1000000)::numeric % (extract(epoch FROM idem.class_width(ttl_class)) * 1000000)::numeric <> 0) AS unaligned
  FROM idem.partition_bounds WHERE name IN (SELECT name FROM made_here);
SELECT count(*) AS env_claims, count(DISTINCT key) AS env_keys FROM idem.claims WHERE biz_type = 'env';
RESET idem.partition_width;

-- 3. Read-only transactions: writers refuse like INSERT (25006) before they
--    touch anything; lookups work.
SELECT claimed FROM idem_claim('ro-1', 'ro');
BEGIN READ ONLY;
SELECT pg_temp.try($$SELECT idem_claim('ro-2', 'ro')$$);
SELECT pg_temp.try($$SELECT idem_claim('ro-1', 'ro')$$);
SELECT pg_temp.try($$SELECT * FROM idem_claim_many(ARRAY['ro-1', 'ro-2'], 'ro')$$);
SELECT pg_temp.try($$SELECT idem_release('ro-1', 'ro')$$);
SELECT pg_temp.try($$SELECT idem_complete('ro-1', 'ro')$$);
SELECT pg_temp.try($$SELECT idem_fail('ro-1', 'ro', '{}')$$);
SELECT pg_temp.try($$SELECT idem_checkpoint('ro-1', 'ro', 'p')$$);
SELECT pg_temp.try($$SELECT idem_forget('ro-1', 'ro')$$);
SELECT pg_temp.try($$SELECT idem_configure('ro', '1 hour')$$);
SELECT pg_temp.try($$SELECT idem_set_owner('ro', NULL)$$);
SELECT claimed, state FROM idem_lookup('ro-1', 'ro');
COMMIT;
SET default_transaction_read_only = on;
SELECT pg_temp.try($$SELECT idem_claim('ro-3', 'ro')$$);
RESET default_transaction_read_only;
SELECT state FROM idem_lookup('ro-2', 'ro');
SELECT state FROM idem_lookup('ro-3', 'ro');

-- 11. Business types reserved for a role: only its members may claim,
--     finish, look up or forget keys of the type; TTL and owner are set
--     independently.
CREATE ROLE regress_idem_payments NOLOGIN;
CREATE ROLE regress_idem_alice NOLOGIN IN ROLE regress_idem_payments;
CREATE ROLE regress_idem_mallory NOLOGIN;
SELECT idem_configure('own.pay', '2 hours');
SELECT idem_set_owner('own.pay', 'regress_idem_payments');
SELECT biz_type, ttl = interval '2 hours' AS ttl_kept, owner FROM idem.biz_types WHERE biz_type = 'own.pay';
SET ROLE regress_idem_mallory;
SELECT pg_temp.try($$SELECT idem_claim('req-42', 'own.pay', ttl => '400 days')$$);
SELECT pg_temp.try($$SELECT idem_lookup('req-42', 'own.pay')$$);
SELECT pg_temp.try($$SELECT idem_complete('req-42', 'own.pay', '{"forged": true}')$$);
SELECT pg_temp.try($$SELECT idem_claim('req-42', 'own.other')$$);
RESET ROLE;
SET ROLE regress_idem_alice;
BEGIN;
SELECT claimed, state, expires_at - first_claimed_at = interval '2 hours' AS configured_ttl FROM idem_claim('req-42', 'own.pay');
SELECT idem_complete('req-42', 'own.pay', '{"charged": 1}');
COMMIT;
SELECT claimed, state, result FROM idem_claim('req-42', 'own.pay');
RESET ROLE;
SELECT claimed, state, result FROM idem_lookup('req-42', 'own.pay');
SELECT idem_configure('own.pay', '3 hours');
SELECT ttl = interval '3 hours' AS ttl_changed, owner FROM idem.biz_types WHERE biz_type = 'own.pay';
SELECT pg_temp.try($$SELECT idem_set_owner('own.pay', 'regress_idem_nobody')$$);
SELECT idem_set_owner('own.pay', NULL);
SET ROLE regress_idem_mallory;
SELECT claimed, state FROM idem_lookup('req-42', 'own.pay');
RESET ROLE;
SELECT pg_temp.try($$SELECT idem_set_owner(NULL, 'regress_idem_payments')$$);
SELECT pg_temp.try($$SELECT idem_set_owner('bad type', 'regress_idem_payments')$$);

-- 12. A damaged stored document is an internal error (XX000) naming what
--     is damaged, never an argument error; a lease document missing a field
--     does not silently read as an expired lease.
SELECT claimed FROM idem_claim('dmg-1', 'dmg', lease => '1 hour');
UPDATE idem.claims SET result = result - 'lease_until_us' WHERE biz_type = 'dmg';
SELECT regexp_replace(pg_temp.try($$SELECT idem_claim('dmg-1', 'dmg')$$), 'damaged: .*', 'damaged: ...') AS damaged;

-- 13. A reserved type is configured and handed on only by its owner's
--     members, even by a role granted idem_configure and idem_set_owner;
--     an owner role that is gone (dropped, or missing where a dump was
--     restored) admits superusers only and is named in the message.
SELECT idem_configure('own.res', '1 hour');
SELECT idem_set_owner('own.res', 'regress_idem_payments');
GRANT EXECUTE ON FUNCTION idem_configure(text, interval), idem_configure(text, interval, text), idem_set_owner(text, regrole) TO regress_idem_mallory, regress_idem_alice;
SET ROLE regress_idem_mallory;
SELECT pg_temp.try($$SELECT idem_configure('own.res', '1 second')$$);
SELECT pg_temp.try($$SELECT idem_configure('own.res', '1 hour', 'retry')$$);
SELECT pg_temp.try($$SELECT idem_set_owner('own.res', 'regress_idem_mallory')$$);
SELECT pg_temp.try($$SELECT idem_configure('own.open', '2 hours')$$);
RESET ROLE;
SELECT biz_type, to_char(ttl, 'HH24:MI:SS') AS ttl, owner, on_failure FROM idem.biz_types WHERE biz_type IN ('own.res', 'own.open') ORDER BY 1;
SET ROLE regress_idem_alice;
SELECT pg_temp.try($$SELECT idem_configure('own.res', '3 hours')$$);
RESET ROLE;
REVOKE EXECUTE ON FUNCTION idem_configure(text, interval), idem_configure(text, interval, text), idem_set_owner(text, regrole) FROM regress_idem_mallory, regress_idem_alice;
CREATE ROLE regress_idem_gone NOLOGIN;
GRANT regress_idem_gone TO regress_idem_alice;
SELECT idem_set_owner('own.gone', 'regress_idem_gone');
DROP ROLE regress_idem_gone;
SET ROLE regress_idem_alice;
SELECT pg_temp.try($$SELECT idem_claim('g-1', 'own.gone')$$);
RESET ROLE;
SELECT claimed, state FROM idem_claim('g-1', 'own.gone');
SELECT idem_set_owner('own.gone', NULL);
SET ROLE regress_idem_alice;
SELECT claimed, state FROM idem_claim('g-1', 'own.gone');
RESET ROLE;

-- 14. Parallel query: a writer reached from a parallel worker (through a
--     wrapper its author marked PARALLEL SAFE) refuses with 25000, as an
--     INSERT there does (0.3.0: XX000, "cannot assign XIDs during a
--     parallel operation"). idem's own functions carry the labels that
--     keep the planner from doing that: only pure readers are SAFE.
CREATE FUNCTION pg_temp.claim_in_worker(k text) RETURNS text PARALLEL SAFE LANGUAGE sql
    AS $$ SELECT state FROM idem_claim(k, 'par') $$;
CREATE FUNCTION pg_temp.complete_in_worker(k text) RETURNS text PARALLEL SAFE LANGUAGE sql
    AS $$ SELECT idem_complete(k, 'par')::text $$;
CREATE FUNCTION pg_temp.claim_many_in_worker(k text) RETURNS text PARALLEL SAFE LANGUAGE sql
    AS $$ SELECT state FROM idem_claim_many(ARRAY[k], 'par') $$;
SET max_parallel_workers_per_gather = 2;
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SELECT set_config(CASE WHEN current_setting('server_version_num')::int >= 160000
                       THEN 'debug_parallel_query' ELSE 'force_parallel_mode' END, 'on', false) AS forced;
SELECT pg_temp.try($$SELECT pg_temp.claim_in_worker('p-1')$$);
SELECT pg_temp.try($$SELECT pg_temp.complete_in_worker('p-1')$$);
SELECT pg_temp.try($$SELECT pg_temp.claim_many_in_worker('p-1')$$);
SELECT set_config(CASE WHEN current_setting('server_version_num')::int >= 160000
                       THEN 'debug_parallel_query' ELSE 'force_parallel_mode' END, 'off', false) AS unforced;
RESET max_parallel_workers_per_gather;
RESET parallel_setup_cost;
RESET parallel_tuple_cost;
SELECT count(*) AS rows_written FROM idem.claims WHERE biz_type = 'par';
SELECT p.oid::regprocedure AS function, p.proparallel
  FROM pg_proc p JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idem') AND p.proparallel <> 'u'
 ORDER BY p.oid::regprocedure::text;

DROP ROLE regress_idem_payments, regress_idem_alice, regress_idem_mallory;
