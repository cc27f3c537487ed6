-- claim_many_mixed: idem_claim_many on batches that mix keys of every kind a
-- batch meets (new, completed, claimed and committed, a running lease, a
-- lease run out, a stored failure replayed or retried, an expired claim, a
-- key this transaction holds, a key given twice), with and without wait:
-- each element answered as idem_claim would answer it, one business row
-- per key won. Business types used here: mixed.orders, mixed.retry,
-- mixed.nowait.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idem;
RESET client_min_messages;
\set SHOW_CONTEXT never
\set VERBOSITY sqlstate

CREATE TABLE mixed_applied (msg text NOT NULL, biz_type text NOT NULL);
-- Earlier deliveries: c1 completed, p1 claimed and committed without an
-- outcome, f1 failed, l1 leased for an hour; r1 leased for a second and x1
-- claimed for a second (both run out below); f2 failed under a type that
-- retries.
SELECT idem_configure('mixed.retry', '1 day', 'retry');
BEGIN;
SELECT count(*) FROM idem_claim_many(ARRAY['c1', 'p1', 'f1'], 'mixed.orders');
SELECT idem_complete('c1', 'mixed.orders', '{"applied": "c1"}');
SELECT idem_fail('f1', 'mixed.orders', '{"error": "declined"}');
SELECT claimed FROM idem_claim('l1', 'mixed.orders', lease => '1 hour');
SELECT claimed FROM idem_claim('r1', 'mixed.orders', lease => '1 second');
SELECT claimed FROM idem_claim('x1', 'mixed.orders', ttl => '1 second');
SELECT claimed FROM idem_claim('f2', 'mixed.retry');
SELECT idem_fail('f2', 'mixed.retry', '{"error": "timeout"}');
COMMIT;
SELECT pg_sleep(1.2);

-- A redelivered poll with new keys among the old ones, n1 twice: the new
-- keys and the lapsed lease and claim are claimed, every other key is
-- answered with what it stored.
BEGIN;
CREATE TEMP TABLE poll AS
  SELECT * FROM idem_claim_many(ARRAY['n2', 'c1', 'l1', 'n1', 'f1', 'x1', 'r1', 'p1', 'n1'], 'mixed.orders')
         WITH ORDINALITY AS b(key, claimed, state, result, first_claimed_at, expires_at, pos);
SELECT pos, key, claimed, state, result, first_claimed_at IS NOT NULL AS has_first,
       expires_at > first_claimed_at AS expires_later
  FROM poll ORDER BY pos;
INSERT INTO mixed_applied SELECT key, 'mixed.orders' FROM poll WHERE claimed;
-- In the same transaction: the keys it holds are in progress (n1, x1, r1),
-- n3 is new, the others answer as before.
SELECT key, claimed, state FROM idem_claim_many(ARRAY['x1', 'n3', 'n1', 'c1', 'l1', 'r1'], 'mixed.orders');
INSERT INTO mixed_applied VALUES ('n3', 'mixed.orders');
DROP TABLE poll;
COMMIT;
-- Redelivered once more, committed: nothing is claimed again.
SELECT key, claimed, state FROM idem_claim_many(ARRAY['n1', 'n2', 'n3', 'x1', 'r1', 'c1', 'l1', 'f1', 'p1'], 'mixed.orders')
 WHERE claimed;
SELECT msg, count(*) AS rows FROM mixed_applied GROUP BY msg ORDER BY msg;
SELECT key, count(*) AS live_claims FROM idem.claims
 WHERE biz_type = 'mixed.orders' AND expires_at > now() GROUP BY key ORDER BY key;

-- Each new key's first_claimed_at is its own claim's (not one for the
-- batch), its expiry its TTL later.
SELECT count(DISTINCT first_claimed_at) > 1 AS own_times,
       bool_and(expires_at - first_claimed_at = interval '1 hour') AS ttl_each
  FROM idem_claim_many(ARRAY(SELECT 't' || g FROM generate_series(1, 200) g), 'mixed.orders', ttl => '1 hour');

-- A type that retries failures: f2 is claimed anew (attempt 2) beside new
-- keys.
SELECT key, claimed, state, result FROM idem_claim_many(ARRAY['n1', 'f2'], 'mixed.retry');

-- A fingerprint that differs from an answered key's stored one is ID001
-- for the whole statement: nothing is claimed.
SELECT key FROM idem_claim_many(ARRAY['v1'], 'mixed.orders', fingerprints => ARRAY['a']);
SELECT key FROM idem_claim_many(ARRAY['v2', 'v1'], 'mixed.orders', fingerprints => ARRAY[NULL, 'b']);
SELECT state FROM idem_lookup('v2', 'mixed.orders');

-- wait => false with the same mix, and under REPEATABLE READ.
BEGIN;
SELECT count(*) FROM idem_claim_many(ARRAY['c1'], 'mixed.nowait');
SELECT claimed FROM idem_claim('l1', 'mixed.nowait', lease => '1 hour');
SELECT idem_complete('c1', 'mixed.nowait', '{"applied": "c1"}');
COMMIT;
BEGIN;
SELECT key, claimed, state, result FROM idem_claim_many(ARRAY['n2', 'c1', 'n1', 'l1', 'n1'], 'mixed.nowait', wait => false);
COMMIT;
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT key, claimed, state FROM idem_claim_many(ARRAY['n4', 'c1', 'n1', 'n3'], 'mixed.nowait');
SELECT key, claimed, state FROM idem_claim_many(ARRAY['n5', 'n4', 'n1'], 'mixed.nowait', wait => false);
COMMIT;

DROP TABLE mixed_applied;
DELETE FROM idem.claims WHERE biz_type LIKE 'mixed.%';
DELETE FROM idem.biz_types WHERE biz_type LIKE 'mixed.%';
