CREATE EXTENSION IF NOT EXISTS idem;
\set VERBOSITY sqlstate
\set SHOW_CONTEXT never

-- An external charge: claim with a lease, committed on its own.
SELECT claimed, state, result->'attempt' AS attempt, result ? 'lease_token' AS has_token
  FROM idem_claim('pay-1', 'charge', lease => '3 seconds');
-- Others see it in progress (no waiting: the claim is committed).
SELECT claimed, state, result FROM idem_claim('pay-1', 'charge');
SELECT state FROM idem_lookup('pay-1', 'charge');
-- The owner records a recovery point after the provider created the charge.
SELECT idem_checkpoint('pay-1', 'charge', 'charge_created', '{"charge_id":"ch_1"}');
-- ... and crashes. The lease runs out; the next claim takes over and learns where it got to.
SELECT pg_sleep(3.1);
SELECT claimed, state, result->'attempt' AS attempt, result->'recovery_point' AS point,
       result->'recovery_data' AS data
  FROM idem_claim('pay-1', 'charge', lease => '1 hour');
-- The new owner finishes from a later transaction.
SELECT idem_complete('pay-1', 'charge', '{"charged":true}');
SELECT claimed, state, result FROM idem_claim('pay-1', 'charge');

-- Ownership: by session, or by lease token from any session.
SELECT result->>'lease_token' AS tok FROM idem_claim('pay-2', 'charge', lease => '1 hour') \gset
-- A wrong token: ID003.
SELECT idem_checkpoint('pay-2', 'charge', 'x', NULL, 'wrong-token');
SELECT idem_complete('pay-2', 'charge', '{}', 'wrong-token');
-- From another session: without the token ID003, with it fine.
\c -
SELECT idem_checkpoint('pay-2', 'charge', 'step1');
SELECT idem_checkpoint('pay-2', 'charge', 'step1', '{"n":1}', :'tok');
SELECT idem_fail('pay-2', 'charge', '{"declined":true}', :'tok');
SELECT claimed, state, result FROM idem_claim('pay-2', 'charge');
-- Checkpoint on a claim that is not leased: ID003.
BEGIN;
SELECT claimed FROM idem_claim('plain-1', 'charge');
SELECT idem_checkpoint('plain-1', 'charge', 'x');
ROLLBACK;
-- Bad input.
SELECT idem_claim('pay-3', 'charge', lease => '0 seconds');
SELECT idem_checkpoint('pay-1', 'charge', NULL);
SELECT idem_checkpoint('pay-1', 'charge', '');

-- A batch job resumes from its checkpoint: per-item progress is committed
-- with the item's business write; a rerun after a crash starts after it.
CREATE TABLE settled (shard int, item int PRIMARY KEY);
SELECT claimed FROM idem_claim('daily_settle:2026-10-27:shard-3', 'batch', lease => '1 second');
BEGIN;
INSERT INTO settled VALUES (3, 1), (3, 2);
SELECT idem_checkpoint('daily_settle:2026-10-27:shard-3', 'batch', 'item', '{"last_item":2}');
COMMIT;
BEGIN;
INSERT INTO settled VALUES (3, 3);
SELECT idem_checkpoint('daily_settle:2026-10-27:shard-3', 'batch', 'item', '{"last_item":3}');
ROLLBACK; -- crash in the middle of item 3: neither its row nor its checkpoint stays
SELECT pg_sleep(1.1);
SELECT claimed, result->'attempt' AS attempt, result->'recovery_data'->'last_item' AS resume_after
  FROM idem_claim('daily_settle:2026-10-27:shard-3', 'batch', lease => '1 hour');
SELECT count(*) AS items_settled FROM settled;

-- Operators see leases through idem_leases (no token in it): the batch job's
-- lease was just taken over (attempt 2), the recovery point is kept.
SELECT biz_type, key, attempt, recovery_point, recovery_data, ran_out,
       lease_until > now() + interval '50 minutes' AS renewed
  FROM idem_leases WHERE biz_type = 'batch';
SELECT count(*) AS views_mention_token
  FROM information_schema.columns WHERE table_name = 'idem_leases' AND column_name LIKE '%token%';
