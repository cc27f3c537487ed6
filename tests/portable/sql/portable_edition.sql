-- portable_edition: what only the portable edition does (docs/portable.md).
-- Business types: pe, pe.reserved, pe.batch.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idem;
RESET client_min_messages;
\set SHOW_CONTEXT never
\set VERBOSITY sqlstate

-- No library: always the SQL path.
SELECT idem_storage_path();
SELECT count(*) AS idem_libraries FROM pg_proc WHERE prolang = 13 AND probin LIKE '%idem%';

-- The digest of a stored key never changes (the native edition pins it too).
SELECT idem.key_hash('payment', 'req-42') = x'e8439040a94e8ecb'::bigint AS pinned_digest;

-- The key lock: the key's gate row (idem.key_gates), whose writer is this
-- transaction and which names the claim version it wrote; nothing in
-- pg_locks names the key (no advisory lock, no lock-table entry per key).
-- (The type's first claim, committed first: a claim that adds a TTL class
-- to its type locks its type gate, a row of idem.type_gates.)
SELECT claimed FROM idem_claim('lock-0', 'pe');
BEGIN;
SELECT claimed FROM idem_claim('lock-1', 'pe');
SELECT g.writer = pg_current_xact_id() AS gate_is_ours, g.part = c.tableoid AND g.tid = c.ctid AS gate_names_the_claim
  FROM idem.key_gates g, idem.claims c
 WHERE g.h = idem.key_hash('pe', 'lock-1') AND c.biz_type = 'pe' AND c.key = 'lock-1';
SELECT count(*) AS advisory_locks FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid();
-- A ROLLBACK TO SAVEPOINT takes back the gate's record with the claim
-- version: the completion undone, the claim is still this transaction's
-- own (a duplicate reads in_progress, idem_complete works); a claim made
-- and rolled back in a savepoint leaves neither a claim nor a gate.
SAVEPOINT s;
SELECT idem_complete('lock-1', 'pe', '{"n": 1}');
ROLLBACK TO s;
SELECT claimed, state FROM idem_claim('lock-1', 'pe');
SAVEPOINT s;
SELECT claimed FROM idem_claim('lock-2', 'pe');
ROLLBACK TO s;
SELECT (SELECT count(*) FROM idem.claims WHERE biz_type = 'pe' AND key = 'lock-2') AS claims_after_rollback,
       (SELECT count(*) FROM idem.key_gates WHERE h = idem.key_hash('pe', 'lock-2')) AS gates_after_rollback;
SELECT idem_complete('lock-1', 'pe', '{"n": 2}');
COMMIT;
SELECT state, result FROM idem_lookup('lock-1', 'pe');
-- The settings 0.4.0's first portable builds read to tell their own rows
-- are gone: set by hand, they change nothing.
BEGIN;
SELECT set_config('idem.xact_claimed_since_us', '0', true) IS NOT NULL AS forged,
       set_config('idem.xact_rewritten', (SELECT string_agg(tableoid::oid || ':' || ctid, ' ') FROM idem.claims WHERE biz_type = 'pe'), true) IS NOT NULL AS forged_too;
SELECT claimed, state FROM idem_claim('lock-1', 'pe');
SELECT idem_complete('lock-1', 'pe', '{"forged": true}');
ROLLBACK;
SELECT state, result FROM idem_lookup('lock-1', 'pe');

-- REPEATABLE READ and SERIALIZABLE work as in the native edition (their
-- 40001 is tested by the isolation specs).
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT claimed FROM idem_claim('rr-1', 'pe');
SELECT idem_complete('rr-1', 'pe', '{"rr": true}');
SELECT claimed, state, result FROM idem_claim('rr-1', 'pe');
COMMIT;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT claimed, state FROM idem_claim('rr-1', 'pe');
SELECT idem_forget('rr-1', 'pe');
SELECT state FROM idem_lookup('rr-1', 'pe');
COMMIT;

-- A call that writes nothing takes no key and no xid: a forget of a key
-- never claimed.
BEGIN;
SELECT idem_forget('never-claimed', 'pe');
SELECT pg_current_xact_id_if_assigned() IS NULL AS no_xid;
COMMIT;

-- Settings are checked where they are read: a bad value is accepted by SET
-- and refused (22023) by the first call that reads it.
SET idem.default_ttl = 'banana';
SELECT claimed FROM idem_claim('guc-1', 'pe');
SET idem.default_ttl = '0';
SELECT claimed FROM idem_claim('guc-1', 'pe');
RESET idem.default_ttl;
SET idem.partition_width = '10 milliseconds';
SELECT idem.ttl_class('1 day');
RESET idem.partition_width;
SELECT idem.ttl_class('1 day');

-- A reservation is checked against the role of SET ROLE (the API runs as
-- the extension's owner).
CREATE ROLE regress_pe_owner;
CREATE ROLE regress_pe_member IN ROLE regress_pe_owner;
CREATE ROLE regress_pe_other;
SELECT idem_set_owner('pe.reserved', 'regress_pe_owner');
SET ROLE regress_pe_other;
SELECT claimed FROM idem_claim('r-1', 'pe.reserved');
SELECT state FROM idem_lookup('r-1', 'pe.reserved');
RESET ROLE;
SET ROLE regress_pe_member;
SELECT claimed FROM idem_claim('r-1', 'pe.reserved');
RESET ROLE;
SELECT idem_set_owner('pe.reserved', NULL);
DROP ROLE regress_pe_member, regress_pe_other, regress_pe_owner;

-- Partition bounds are parsed from pg_get_expr's text under pinned
-- settings: the session's DateStyle and TimeZone change nothing, and each
-- partition's name (made from its class and lower bound) agrees.
SELECT idem_maintain() IS NOT NULL AS maintained;
CREATE TEMP TABLE bounds AS
SELECT i.inhrelid::regclass AS part, idem.partition_class(i.inhrelid) AS c,
       idem.partition_from(i.inhrelid) AS lo, idem.partition_to(i.inhrelid) AS hi
  FROM pg_inherits i WHERE i.inhparent = 'idem.claims'::regclass;
SELECT count(*) > 0 AS some_partitions,
       count(*) FILTER (WHERE c IS NULL) AS defaults,
       count(*) FILTER (WHERE c IS NOT NULL AND (idem.partition_name(c, lo) <> (SELECT relname FROM pg_class WHERE oid = part)
                                                 OR hi <= lo)) AS misread
  FROM bounds;
SET DateStyle = 'SQL, DMY';
SET TimeZone = 'Asia/Kathmandu';
SET IntervalStyle = 'sql_standard';
SELECT count(*) AS differ_under_other_settings FROM bounds
 WHERE idem.partition_class(part) IS DISTINCT FROM c
    OR idem.partition_from(part) IS DISTINCT FROM lo OR idem.partition_to(part) IS DISTINCT FROM hi;
RESET DateStyle;
RESET TimeZone;
RESET IntervalStyle;
SELECT idem.partition_from('pg_class'), idem.partition_class('idem.claims_default');

-- idem_claim_many claims a batch's new keys with statements for the whole
-- batch (one insert of their gates, in the keys' order, then one of their
-- claims): each gate names this transaction and its key's claim. A key whose
-- gate outlived its claim (forgotten) is claimed by idem_claim under that
-- gate; a batch in a transaction that holds some of its keys goes key by key.
SELECT claimed FROM idem_claim('b1', 'pe.batch');
SELECT idem_forget('b1', 'pe.batch');
BEGIN;
SELECT key, claimed, state, first_claimed_at IS NOT NULL AS has_first
  FROM idem_claim_many(ARRAY['b2', 'b1', 'b2', 'b0'], 'pe.batch');
SELECT count(*) AS gates_naming_their_claims
  FROM idem.key_gates g JOIN idem.claims c ON c.tableoid = g.part AND c.ctid = g.tid
 WHERE g.writer = pg_current_xact_id() AND c.biz_type = 'pe.batch';
SELECT key, claimed, state FROM idem_claim_many(ARRAY['b0', 'b3'], 'pe.batch');
COMMIT;
SELECT key, count(*) AS claim_rows FROM idem.claims WHERE biz_type = 'pe.batch' GROUP BY key ORDER BY key;
-- A redelivered batch is answered from the committed claims: no key lock,
-- no xid, nothing written.
BEGIN;
SELECT state, count(*) AS elements FROM idem_claim_many(ARRAY['b0', 'b1', 'b2', 'b3', 'b0'], 'pe.batch') GROUP BY state;
SELECT pg_current_xact_id_if_assigned() IS NULL AS no_xid;
COMMIT;
-- A batch that mixes new keys with keys left to idem_claim (a lapsed
-- claim, a key given twice) and a committed one: every claim it wrote, in
-- statements or through idem_claim, is named by its key's gate.
SELECT claimed FROM idem_claim('b5', 'pe.batch', ttl => '1 second');
SELECT pg_sleep(1.1);
BEGIN;
SELECT key, claimed, state FROM idem_claim_many(ARRAY['b6', 'b5', 'b0', 'b7', 'b6'], 'pe.batch');
SELECT count(*) AS gates_naming_their_claims
  FROM idem.key_gates g JOIN idem.claims c ON c.tableoid = g.part AND c.ctid = g.tid
 WHERE g.writer = pg_current_xact_id() AND c.biz_type = 'pe.batch';
COMMIT;
-- A later element of a new key with another fingerprint than the first
-- element's, which claims it: ID001, nothing claimed.
SELECT key FROM idem_claim_many(ARRAY['b4', 'b4'], 'pe.batch', fingerprints => ARRAY['x', 'y']);
SELECT state FROM idem_lookup('b4', 'pe.batch');

-- Citus needs the native edition.
SELECT idem_distribute('pg_class');
-- The counters are off, as without shared_preload_libraries.
SELECT biz_type, claims, left(note, 16) AS note FROM idem_metrics;

DELETE FROM idem.claims WHERE biz_type LIKE 'pe%';
DELETE FROM idem.biz_types WHERE biz_type LIKE 'pe%';
