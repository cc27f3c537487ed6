-- portable_edition: what only the portable edition does (docs/portable.md).
-- Business types: pe, pe.reserved.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idem;
RESET client_min_messages;
\set SHOW_CONTEXT never
\set VERBOSITY sqlstate

-- No library: always the SQL path.
SELECT idem_storage_path();
SELECT count(*) AS idem_libraries FROM pg_proc WHERE prolang = 13 AND probin LIKE '%idem%';

-- The digest of a stored key never changes (the native edition pins it too).
SELECT idem.key_hash('payment', 'req-42') = x'a92dbefcb3a3fdeb'::bigint AS pinned_digest;

-- The key lock: an advisory lock on the digest, held to the end of the
-- transaction, also by a call that wrote nothing.
BEGIN;
SELECT claimed FROM idem_claim('lock-1', 'pe');
SELECT count(*) AS key_locks FROM pg_locks
 WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND objsubid = 1
   AND classid::text::bigint = (idem.key_hash('pe', 'lock-1') >> 32) & 4294967295
   AND objid::text::bigint = idem.key_hash('pe', 'lock-1') & 4294967295;
COMMIT;
BEGIN;
SELECT idem_forget('never-claimed', 'pe');
SELECT count(*) AS key_locks_after_nothing FROM pg_locks
 WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND objsubid = 1
   AND objid::text::bigint = idem.key_hash('pe', 'never-claimed') & 4294967295;
COMMIT;

-- REPEATABLE READ and SERIALIZABLE are refused, as on the native SQL path.
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT claimed FROM idem_claim('rr-1', 'pe');
ROLLBACK;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT idem_forget('rr-1', 'pe');
ROLLBACK;

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

-- Citus needs the native edition.
SELECT idem_distribute('pg_class');
-- The counters are off, as without shared_preload_libraries.
SELECT biz_type, claims, left(note, 16) AS note FROM idem_metrics;

DELETE FROM idem.claims WHERE biz_type LIKE 'pe%';
DELETE FROM idem.biz_types WHERE biz_type LIKE 'pe%';
