-- claim_basic: the claim protocol as one session sees it.
-- Business types used here: basic, basic.other, basic.unknown (never claimed), basic.fp.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idem;
RESET client_min_messages;
\set SHOW_CONTEXT never
\set VERBOSITY sqlstate

-- The first claim of a key wins: claimed = true, state = new, nothing stored yet.
BEGIN;
SELECT claimed, state, result, first_claimed_at IS NOT NULL AS has_first, expires_at > first_claimed_at AS expires_later
  FROM idem_claim('order-1', 'basic');
-- The same key again in the same transaction: not claimed, still in progress.
SELECT claimed, state, result FROM idem_claim('order-1', 'basic');
-- lookup sees this transaction's own unfinished claim as in_progress.
SELECT claimed, state, result FROM idem_lookup('order-1', 'basic');
-- After idem_complete in the same transaction, a duplicate reads completed with the result.
SELECT idem_complete('order-1', 'basic', '{"order_id": 17}');
SELECT claimed, state, result FROM idem_claim('order-1', 'basic');
SELECT claimed, state, result FROM idem_lookup('order-1', 'basic');
COMMIT;

-- A duplicate in a later transaction gets the stored result and the original first_claimed_at.
-- (Kept as epoch numbers: a timestamp's text form depends on the session's
-- DateStyle and TimeZone, and would not read back exactly in every one.)
SELECT extract(epoch FROM first_claimed_at) AS first_at, extract(epoch FROM expires_at) AS first_expires
  FROM idem_lookup('order-1', 'basic') \gset
SELECT claimed, state, result,
       extract(epoch FROM first_claimed_at) = :first_at AS same_first_claimed_at,
       extract(epoch FROM expires_at) = :first_expires AS same_expires_at
  FROM idem_claim('order-1', 'basic');
-- The composite form works too.
SELECT (idem_claim('order-1', 'basic')).claimed, (idem_claim('order-1', 'basic')).result;

-- The same key in another business type is independent.
SELECT claimed, state FROM idem_claim('order-1', 'basic.other');
SELECT claimed, state, result FROM idem_claim('order-1', 'basic');

-- Claimed and committed without idem_complete/idem_fail: duplicates see completed, result NULL.
SELECT claimed, state FROM idem_claim('order-2', 'basic');
SELECT claimed, state, result FROM idem_claim('order-2', 'basic');
SELECT claimed, state, result FROM idem_lookup('order-2', 'basic');

-- idem_complete without a result stores completed with result NULL.
BEGIN;
SELECT claimed, state FROM idem_claim('order-3', 'basic');
SELECT idem_complete('order-3', 'basic');
COMMIT;
SELECT claimed, state, result FROM idem_claim('order-3', 'basic');

-- idem_fail stores a business failure; duplicates replay state failed with the error.
BEGIN;
SELECT claimed, state FROM idem_claim('order-4', 'basic');
SELECT idem_fail('order-4', 'basic', '{"code": "out_of_stock"}');
SELECT claimed, state, result FROM idem_claim('order-4', 'basic');
COMMIT;
SELECT claimed, state, result FROM idem_claim('order-4', 'basic');
SELECT claimed, state, result FROM idem_lookup('order-4', 'basic');

-- ROLLBACK leaves nothing: lookup says absent and a retry claims again.
BEGIN;
SELECT claimed, state FROM idem_claim('order-5', 'basic');
SELECT idem_complete('order-5', 'basic', '"lost"');
ROLLBACK;
SELECT claimed, state, result, first_claimed_at, expires_at FROM idem_lookup('order-5', 'basic');
SELECT claimed, state FROM idem_claim('order-5', 'basic');

-- An error in the claiming transaction rolls the claim back too.
BEGIN;
SELECT claimed, state FROM idem_claim('order-6', 'basic');
SELECT 1 / 0;
COMMIT;
SELECT claimed, state FROM idem_claim('order-6', 'basic');

-- A claim made in a savepoint that is rolled back leaves nothing; the transaction can claim again.
BEGIN;
SAVEPOINT s1;
SELECT claimed, state FROM idem_claim('order-7', 'basic');
ROLLBACK TO SAVEPOINT s1;
SELECT claimed, state FROM idem_lookup('order-7', 'basic');
SELECT claimed, state FROM idem_claim('order-7', 'basic');
SELECT idem_complete('order-7', 'basic', '{"try": 2}');
COMMIT;
SELECT claimed, state, result FROM idem_claim('order-7', 'basic');

-- A claim made in a released savepoint belongs to the transaction: idem_complete works on it.
BEGIN;
SAVEPOINT s1;
SELECT claimed, state FROM idem_claim('order-8', 'basic');
RELEASE SAVEPOINT s1;
SELECT idem_complete('order-8', 'basic', '{"released": true}');
COMMIT;
SELECT claimed, state, result FROM idem_claim('order-8', 'basic');

-- idem_complete inside a savepoint that is rolled back is undone; the claim itself stays.
BEGIN;
SELECT claimed, state FROM idem_claim('order-9', 'basic');
SAVEPOINT s1;
SELECT idem_complete('order-9', 'basic', '{"undone": true}');
SELECT claimed, state, result FROM idem_lookup('order-9', 'basic');
ROLLBACK TO SAVEPOINT s1;
SELECT claimed, state, result FROM idem_lookup('order-9', 'basic');
SELECT idem_fail('order-9', 'basic', '{"kept": true}');
COMMIT;
SELECT claimed, state, result FROM idem_claim('order-9', 'basic');

-- lookup never claims: absent stays absent, with every other column NULL.
SELECT claimed, state, result, first_claimed_at, expires_at FROM idem_lookup('never-claimed', 'basic');
SELECT claimed, state, result, first_claimed_at, expires_at FROM idem_lookup('never-claimed', 'basic');
-- lookup of a business type never used: absent, and the type is not registered.
SELECT claimed, state, result FROM idem_lookup('x', 'basic.unknown');
SELECT count(*) AS registered FROM idem.biz_types WHERE biz_type = 'basic.unknown';

-- idem_forget removes the committed claim: true once, then false; the key can be claimed again.
SELECT idem_forget('order-4', 'basic');
SELECT idem_forget('order-4', 'basic');
SELECT claimed, state FROM idem_lookup('order-4', 'basic');
SELECT claimed, state FROM idem_claim('order-4', 'basic');
SELECT claimed, state, result FROM idem_claim('order-4', 'basic');
-- idem_forget of a key never claimed, or of an unknown business type: false.
SELECT idem_forget('never-claimed', 'basic');
SELECT idem_forget('x', 'basic.unknown');
-- idem_forget rolled back: the claim is still there.
BEGIN;
SELECT idem_forget('order-1', 'basic');
SELECT claimed, state FROM idem_lookup('order-1', 'basic');
ROLLBACK;
SELECT claimed, state, result FROM idem_lookup('order-1', 'basic');

-- Fingerprints: a duplicate with the same fingerprint, or without one, gets the outcome.
BEGIN;
SELECT claimed, state FROM idem_claim('pay-1', 'basic.fp', fingerprint => 'sha:aaa');
SELECT idem_complete('pay-1', 'basic.fp', '{"paid": 10}');
COMMIT;
SELECT claimed, state, result FROM idem_claim('pay-1', 'basic.fp', fingerprint => 'sha:aaa');
SELECT claimed, state, result FROM idem_claim('pay-1', 'basic.fp');
-- A different fingerprint on a duplicate: ID001.
SELECT claimed, state, result FROM idem_claim('pay-1', 'basic.fp', fingerprint => 'sha:bbb');
-- The mismatch wrote nothing: the stored outcome is unchanged.
SELECT claimed, state, result FROM idem_claim('pay-1', 'basic.fp', fingerprint => 'sha:aaa');
-- A claim stored without a fingerprint is never checked.
SELECT claimed, state FROM idem_claim('pay-2', 'basic.fp');
SELECT claimed, state FROM idem_claim('pay-2', 'basic.fp', fingerprint => 'sha:anything');
-- A failed claim is checked too.
BEGIN;
SELECT claimed, state FROM idem_claim('pay-3', 'basic.fp', fingerprint => 'sha:ccc');
SELECT idem_fail('pay-3', 'basic.fp', '{"declined": true}');
COMMIT;
SELECT claimed, state, result FROM idem_claim('pay-3', 'basic.fp', fingerprint => 'sha:ccc');
SELECT claimed, state, result FROM idem_claim('pay-3', 'basic.fp', fingerprint => 'sha:ddd');
-- Within the claiming transaction a different fingerprint is refused as well.
BEGIN;
SELECT claimed, state FROM idem_claim('pay-4', 'basic.fp', fingerprint => 'sha:eee');
SAVEPOINT s1;
SELECT claimed, state FROM idem_claim('pay-4', 'basic.fp', fingerprint => 'sha:fff');
ROLLBACK TO SAVEPOINT s1;
SELECT claimed, state FROM idem_claim('pay-4', 'basic.fp', fingerprint => 'sha:eee');
COMMIT;

-- Several keys in one statement: each distinct key claims once, repeats in the statement do not.
SELECT k, (idem_claim(k, 'basic')).claimed
  FROM unnest(ARRAY['multi-a', 'multi-b', 'multi-a', 'multi-c', 'multi-b']) WITH ORDINALITY AS u(k, n)
 ORDER BY n;

-- An optional argument passed as NULL takes its default: wait => NULL
-- waits (true), as ttl, fingerprint and lease NULL mean none given.
SELECT claimed, state FROM idem_claim('wait-null', 'basic', ttl => NULL, fingerprint => NULL, wait => NULL, lease => NULL);
SELECT key, claimed, state FROM idem_claim_many(ARRAY['wait-null', 'wait-null-2'], 'basic', ttl => NULL, fingerprints => NULL, wait => NULL);
