-- claim_nowrite: reading a key never writes. A duplicate claim, a lookup and a
-- refused call assign no transaction id, whatever state the session's caches
-- are in (a fresh connection, after idem_configure, a READ ONLY transaction).
-- Business types used here: nowrite, nowrite.other, nowrite.unknown (never claimed).
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idem;
RESET client_min_messages;
\set SHOW_CONTEXT never
\set VERBOSITY sqlstate

-- Setup: a completed claim, and a claim with a fingerprint.
BEGIN;
SELECT claimed, state FROM idem_claim('nw-1', 'nowrite');
SELECT idem_complete('nw-1', 'nowrite', '{"n": 1}');
COMMIT;
SELECT claimed, state FROM idem_claim('nw-fp', 'nowrite', fingerprint => 'fp-a');

-- With warm caches: duplicate (waiting and not), lookup of a completed and of an absent key.
BEGIN;
SELECT claimed, state, result FROM idem_claim('nw-1', 'nowrite');
SELECT claimed, state, result FROM idem_claim('nw-1', 'nowrite', wait => false);
SELECT claimed, state, result FROM idem_lookup('nw-1', 'nowrite');
SELECT claimed, state, result FROM idem_lookup('nw-absent', 'nowrite');
SELECT claimed, state FROM idem_claim('nw-fp', 'nowrite', fingerprint => 'fp-a');
SELECT pg_current_xact_id_if_assigned() IS NULL AS no_xid;
COMMIT;

-- A duplicate claim as the first idem call of a new session writes nothing.
\c -
BEGIN;
SELECT claimed, state, result FROM idem_claim('nw-1', 'nowrite');
SELECT pg_current_xact_id_if_assigned() IS NULL AS no_xid;
COMMIT;

-- A lookup as the first idem call of a new session writes nothing.
\c -
BEGIN;
SELECT claimed, state, result FROM idem_lookup('nw-1', 'nowrite');
SELECT pg_current_xact_id_if_assigned() IS NULL AS no_xid;
COMMIT;

-- Lookups work in a READ ONLY transaction of a new session, without a
-- transaction id. A claim there is refused (25006) like any INSERT, even
-- one that would be a duplicate (as INSERT ... ON CONFLICT DO NOTHING is).
\c -
BEGIN READ ONLY;
SELECT claimed, state, result FROM idem_lookup('nw-1', 'nowrite');
SELECT claimed, state, result FROM idem_lookup('nw-absent', 'nowrite');
SELECT pg_current_xact_id_if_assigned() IS NULL AS no_xid;
SAVEPOINT s;
SELECT claimed, state, result FROM idem_claim('nw-1', 'nowrite');
ROLLBACK TO SAVEPOINT s;
COMMIT;

-- After idem_configure (which invalidates every session's business-type cache) a duplicate still writes nothing.
SELECT idem_configure('nowrite.other', '1 hour');
BEGIN;
SELECT claimed, state, result FROM idem_claim('nw-1', 'nowrite');
SELECT pg_current_xact_id_if_assigned() IS NULL AS no_xid;
COMMIT;

-- A lookup of a business type never used writes nothing (and registers nothing).
BEGIN;
SELECT claimed, state, result FROM idem_lookup('x', 'nowrite.unknown');
SELECT pg_current_xact_id_if_assigned() IS NULL AS no_xid;
COMMIT;

-- Refused calls write nothing: after rolling back to the savepoint no transaction id is left.
BEGIN;
-- ID001: different fingerprint.
SAVEPOINT a;
SELECT claimed FROM idem_claim('nw-fp', 'nowrite', fingerprint => 'fp-b');
ROLLBACK TO SAVEPOINT a;
-- ID003: a key another transaction claimed and committed.
SAVEPOINT a;
SELECT idem_complete('nw-1', 'nowrite', '{"n": 2}');
ROLLBACK TO SAVEPOINT a;
-- 22023 / 22004: bad input, naming a business type never used.
SAVEPOINT a;
SELECT idem_claim('', 'nowrite.unknown');
ROLLBACK TO SAVEPOINT a;
SAVEPOINT a;
SELECT idem_claim('k', 'nowrite.unknown', ttl => '0 seconds');
ROLLBACK TO SAVEPOINT a;
SAVEPOINT a;
SELECT idem_fail('k', 'nowrite.unknown', NULL);
ROLLBACK TO SAVEPOINT a;
SELECT pg_current_xact_id_if_assigned() IS NULL AS no_xid;
COMMIT;

-- ID003 from idem_complete / idem_fail on a business type never used writes nothing either.
BEGIN;
SAVEPOINT a;
SELECT idem_complete('x', 'nowrite.unknown');
ROLLBACK TO SAVEPOINT a;
SAVEPOINT a;
SELECT idem_fail('x', 'nowrite.unknown', '{}');
ROLLBACK TO SAVEPOINT a;
SELECT pg_current_xact_id_if_assigned() IS NULL AS no_xid;
COMMIT;
SELECT count(*) AS registered FROM idem.biz_types WHERE biz_type = 'nowrite.unknown';

-- For contrast: a first claim does write.
BEGIN;
SELECT claimed, state FROM idem_claim('nw-2', 'nowrite');
SELECT pg_current_xact_id_if_assigned() IS NULL AS no_xid;
ROLLBACK;
