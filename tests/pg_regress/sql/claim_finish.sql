-- claim_finish: finishing the claim this transaction just made takes a
-- shortcut (no probe); these cases make sure it never finds a wrong row.
CREATE EXTENSION IF NOT EXISTS idem;
\set VERBOSITY sqlstate
\set SHOW_CONTEXT never

-- Claim and complete in one statement (the row was written by the same command).
SELECT (idem_claim('f1', 'fin')).claimed, idem_complete('f1', 'fin', '{"one": "statement"}');
SELECT claimed, state, result FROM idem_claim('f1', 'fin');

-- Complete twice, fail after complete: the last call wins within the transaction.
BEGIN;
SELECT claimed FROM idem_claim('f2', 'fin');
SELECT idem_complete('f2', 'fin', '{"n": 1}');
SELECT idem_complete('f2', 'fin', '{"n": 2}');
SELECT idem_fail('f2', 'fin', '{"n": 3}');
COMMIT;
SELECT claimed, state, result FROM idem_claim('f2', 'fin');

-- A completion rolled back to a savepoint is undone; the claim stays.
BEGIN;
SELECT claimed FROM idem_claim('f3', 'fin');
SAVEPOINT s;
SELECT idem_complete('f3', 'fin', '{"undone": true}');
ROLLBACK TO s;
SELECT state, result FROM idem_lookup('f3', 'fin');
SELECT idem_complete('f3', 'fin', '{"kept": true}');
COMMIT;
SELECT claimed, state, result FROM idem_claim('f3', 'fin');

-- A claim rolled back to a savepoint cannot be completed (ID003).
BEGIN;
SAVEPOINT s;
SELECT claimed FROM idem_claim('f4', 'fin');
ROLLBACK TO s;
SELECT idem_complete('f4', 'fin');
ROLLBACK;

-- Interleaved keys: completing an earlier claim after a later one.
BEGIN;
SELECT claimed FROM idem_claim('f5', 'fin');
SELECT claimed FROM idem_claim('f6', 'fin');
SELECT idem_complete('f5', 'fin', '{"k": 5}');
SELECT idem_complete('f6', 'fin', '{"k": 6}');
COMMIT;
SELECT key, state, result FROM idem.claims WHERE biz_type = 'fin' AND key IN ('f5', 'f6') ORDER BY key;

-- The remembered claim belongs to its transaction: a later transaction
-- completing the same key is refused (ID003).
SELECT claimed FROM idem_claim('f7', 'fin');
SELECT idem_complete('f7', 'fin');
