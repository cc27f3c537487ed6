-- claim_many: idem_claim_many claims a batch of keys in one call, inside the
-- caller's transaction, one row per key in input order. Business types
-- used here: batch.orders, batch.fp, batch.big.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idem;
RESET client_min_messages;
\set SHOW_CONTEXT never
\set VERBOSITY sqlstate

-- A consumer's poll: apply each message once, with the offset commit.
CREATE TABLE applied (msg text PRIMARY KEY, n int NOT NULL DEFAULT 1);
BEGIN;
SELECT claimed, state FROM idem_claim('m2', 'batch.orders');
SELECT idem_complete('m2', 'batch.orders', '{"applied": "earlier"}');
COMMIT;
BEGIN;
-- Input order, not key order; m1 given twice; m2 done before.
CREATE TEMP TABLE poll AS
  SELECT * FROM idem_claim_many(ARRAY['m3', 'm1', 'm2', 'm1', 'm0'], 'batch.orders') WITH ORDINALITY AS b(key, claimed, state, result, first_claimed_at, expires_at, pos);
SELECT pos, key, claimed, state, result, first_claimed_at IS NOT NULL AS has_first,
       expires_at > first_claimed_at AS expires_later
  FROM poll ORDER BY pos;
INSERT INTO applied (msg) SELECT key FROM poll WHERE claimed;
SELECT idem_complete(key, 'batch.orders', jsonb_build_object('applied', key)) FROM poll WHERE claimed;
COMMIT;
-- The poll redelivered (the consumer crashed before committing its offset):
-- nothing is claimed again, each message answers its stored result.
SELECT key, claimed, state, result FROM idem_claim_many(ARRAY['m0', 'm1', 'm2', 'm3'], 'batch.orders');
SELECT msg, n FROM applied ORDER BY msg;
-- Rolled back, a batch claimed nothing.
BEGIN;
SELECT count(*) FILTER (WHERE claimed) AS claimed FROM idem_claim_many(ARRAY['r1', 'r2'], 'batch.orders');
ROLLBACK;
SELECT state FROM idem_lookup('r1', 'batch.orders');
-- An array whose bounds are not 1-based is read in its order; an empty one
-- answers no rows.
SELECT key, claimed FROM idem_claim_many('[0:2]={b2,b0,b1}'::text[], 'batch.orders');
SELECT count(*) AS rows FROM idem_claim_many('{}'::text[], 'batch.orders');
-- ttl as idem_claim's.
SELECT expires_at - first_claimed_at AS ttl FROM idem_claim_many(ARRAY['t1'], 'batch.orders', ttl => '5 minutes');

-- Fingerprints, one per key (NULL: none): a differing one is ID001 for the
-- whole statement, as a single claim's.
SELECT key, claimed FROM idem_claim_many(ARRAY['f1', 'f2'], 'batch.fp', fingerprints => ARRAY['a', NULL]);
SELECT key, claimed, state FROM idem_claim_many(ARRAY['f1', 'f2'], 'batch.fp', fingerprints => ARRAY['a', 'b']);
SELECT key FROM idem_claim_many(ARRAY['f3', 'f1'], 'batch.fp', fingerprints => ARRAY['c', 'x']);
SELECT state FROM idem_lookup('f3', 'batch.fp');
SELECT idem_claim_many(ARRAY['f1', 'f2'], 'batch.fp', fingerprints => ARRAY['a']);

-- Bad input: nothing is claimed.
SELECT idem_claim_many(NULL, 'batch.orders');
SELECT idem_claim_many(ARRAY['x1'], NULL);
SELECT idem_claim_many(ARRAY['x1'], 'bad type');
SELECT idem_claim_many(ARRAY['x1', NULL], 'batch.orders');
SELECT idem_claim_many(ARRAY['x1', ''], 'batch.orders');
SELECT idem_claim_many(ARRAY[repeat('k', 1025)], 'batch.orders');
SELECT idem_claim_many(ARRAY[['x1', 'x2'], ['x3', 'x4']], 'batch.orders');
SELECT idem_claim_many(ARRAY['x1'], 'batch.orders', ttl => '0 seconds');
SELECT state FROM idem_lookup('x1', 'batch.orders');
BEGIN READ ONLY;
SELECT idem_claim_many(ARRAY['x1'], 'batch.orders');
ROLLBACK;

-- A big batch: 10,000 keys in one call, then the same keys again in the
-- same transaction (all in progress), and once committed (all completed).
BEGIN;
SELECT count(*) FILTER (WHERE claimed) AS claimed, count(*) AS answered
  FROM idem_claim_many(ARRAY(SELECT 'k' || g FROM generate_series(1, 10000) g), 'batch.big');
SELECT count(*) FILTER (WHERE state = 'in_progress') AS in_progress
  FROM idem_claim_many(ARRAY(SELECT 'k' || g FROM generate_series(1, 10000) g), 'batch.big');
COMMIT;
SELECT state, count(*) FROM idem_claim_many(ARRAY(SELECT 'k' || g FROM generate_series(1, 10000) g), 'batch.big')
 GROUP BY state;
DROP TABLE applied;
