CREATE EXTENSION IF NOT EXISTS idem;
\set VERBOSITY sqlstate
\set SHOW_CONTEXT never

-- An external charge: claim with a lease, committed on its own.
CREATE TEMP TABLE lease1 AS SELECT * FROM idem_claim('pay-1', 'charge', lease => '3 seconds');
SELECT claimed, state, result->'attempt' AS attempt, result ? 'lease_token' AS has_token,
       length(result->>'lease_token') AS token_length, result->'recovery_point' AS point
  FROM lease1;
SELECT result->>'lease_token' AS tok1 FROM lease1 \gset
-- Others see it in progress (no waiting: the claim is committed).
SELECT claimed, state, result FROM idem_claim('pay-1', 'charge');
SELECT state FROM idem_lookup('pay-1', 'charge');
-- The owner records a recovery point after the provider created the charge,
-- proving ownership with the lease token.
SELECT idem_checkpoint('pay-1', 'charge', 'charge_created', '{"charge_id":"ch_1"}', :'tok1');
-- ... and crashes. The lease runs out; the next claim takes over and learns where it got to.
SELECT pg_sleep(3.1);
CREATE TEMP TABLE lease1b AS SELECT * FROM idem_claim('pay-1', 'charge', lease => '1 hour');
SELECT claimed, state, result->'attempt' AS attempt, result->'recovery_point' AS point,
       result->'recovery_data' AS data
  FROM lease1b;
SELECT result->>'lease_token' AS tok1b FROM lease1b \gset
-- The old owner's token no longer works: the lease was taken over.
SELECT idem_checkpoint('pay-1', 'charge', 'late', NULL, :'tok1');
-- The new owner finishes from a later transaction.
SELECT idem_complete('pay-1', 'charge', '{"charged":true}', :'tok1b');
SELECT claimed, state, result FROM idem_claim('pay-1', 'charge');

-- Ownership is the lease token, from any session; the session that took
-- the lease has no say without it (behind a pooler, the next client on the
-- same server session is a stranger).
SELECT result->>'lease_token' AS tok FROM idem_claim('pay-2', 'charge', lease => '1 hour') \gset
SELECT idem_checkpoint('pay-2', 'charge', 'step0');
SELECT idem_complete('pay-2', 'charge', '{"forged":true}');
-- A wrong token: ID003.
SELECT idem_checkpoint('pay-2', 'charge', 'x', NULL, 'wrong-token');
SELECT idem_complete('pay-2', 'charge', '{}', 'wrong-token');
-- From another session: without the token ID003, with it fine.
\c -
SELECT idem_checkpoint('pay-2', 'charge', 'step1');
SELECT idem_checkpoint('pay-2', 'charge', 'step1', '{"n":1}', :'tok');
SELECT idem_fail('pay-2', 'charge', '{"declined":true}', :'tok');
SELECT claimed, state, result FROM idem_claim('pay-2', 'charge');
-- The transaction that takes a lease holds it without the token until it ends.
BEGIN;
SELECT claimed FROM idem_claim('pay-4', 'charge', lease => '1 hour');
SELECT idem_checkpoint('pay-4', 'charge', 'same-transaction');
SELECT recovery_point FROM idem_leases WHERE key = 'pay-4';
COMMIT;
SELECT idem_checkpoint('pay-4', 'charge', 'after-commit');
-- A lease longer than the claim's TTL would outlive the claim: refused.
SELECT idem_claim('pay-5', 'charge', ttl => '1 minute', lease => '2 minutes');
SELECT claimed, state FROM idem_claim('pay-5', 'charge', ttl => '2 minutes', lease => '2 minutes');
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
SELECT claimed, result->>'lease_token' AS batch_tok
  FROM idem_claim('daily_settle:2026-10-27:shard-3', 'batch', lease => '1 second') \gset
BEGIN;
INSERT INTO settled VALUES (3, 1), (3, 2);
SELECT idem_checkpoint('daily_settle:2026-10-27:shard-3', 'batch', 'item', '{"last_item":2}', :'batch_tok');
COMMIT;
BEGIN;
INSERT INTO settled VALUES (3, 3);
SELECT idem_checkpoint('daily_settle:2026-10-27:shard-3', 'batch', 'item', '{"last_item":3}', :'batch_tok');
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

-- A transient failure: the holder hands the lease back with its token, and
-- the next arrival takes over at once (no waiting for the lease to run
-- out), counted as attempt 2, with the recovery point and data kept.
SELECT result->>'lease_token' AS rtok FROM idem_claim('rel-1', 'charge', lease => '1 hour') \gset
SELECT idem_checkpoint('rel-1', 'charge', 'charge_created', '{"charge_id":"ch_9"}', :'rtok');
SELECT state FROM idem_lookup('rel-1', 'charge');
SELECT idem_release('rel-1', 'charge', :'rtok');
SELECT ran_out, attempt, recovery_point, recovery_data FROM idem_leases WHERE key = 'rel-1';
-- Its token is spent: a second release, a checkpoint or a completion with it is ID003.
\set VERBOSITY default
SELECT idem_release('rel-1', 'charge', :'rtok');
\set VERBOSITY sqlstate
SELECT idem_complete('rel-1', 'charge', '{"late":true}', :'rtok');
CREATE TEMP TABLE rel1b AS SELECT * FROM idem_claim('rel-1', 'charge', lease => '1 hour');
SELECT claimed, state, result->'attempt' AS attempt, result->'recovery_point' AS point,
       result->'recovery_data' AS data
  FROM rel1b;
SELECT result->>'lease_token' AS rtok2 FROM rel1b \gset
-- After the takeover the old token stays refused; the new holder finishes.
SELECT idem_release('rel-1', 'charge', :'rtok');
SELECT idem_complete('rel-1', 'charge', '{"charged":true}', :'rtok2');
SELECT claimed, state, result FROM idem_claim('rel-1', 'charge');
-- A finished claim is not released: ID003, and it stays completed.
SELECT idem_release('rel-1', 'charge', :'rtok2');
SELECT state FROM idem_lookup('rel-1', 'charge');
-- Without the token, with a wrong one, or on a key nobody claimed: ID003.
SELECT result->>'lease_token' AS rtok3 FROM idem_claim('rel-2', 'charge', lease => '1 hour') \gset
SELECT idem_release('rel-2', 'charge');
SELECT idem_release('rel-2', 'charge', 'wrong-token');
SELECT idem_release('rel-none', 'charge', :'rtok3');
SELECT claimed, state FROM idem_claim('rel-2', 'charge');
-- The transaction that took the lease may release it without the token; a
-- claim that is not leased is not released (ID003: roll back instead).
BEGIN;
SELECT claimed FROM idem_claim('rel-3', 'charge', lease => '1 hour');
SELECT idem_release('rel-3', 'charge');
COMMIT;
SELECT claimed, result->'attempt' AS attempt FROM idem_claim('rel-3', 'charge', lease => '1 hour');
BEGIN;
SELECT claimed FROM idem_claim('plain-2', 'charge');
SELECT idem_release('plain-2', 'charge');
ROLLBACK;
-- A release rolled back never happened: the token still works.
BEGIN;
SELECT idem_release('rel-2', 'charge', :'rtok3');
ROLLBACK;
SELECT idem_complete('rel-2', 'charge', '{"ok":true}', :'rtok3');
-- Bad input.
SELECT idem_release(NULL, 'charge', 'x');
SELECT idem_release('rel-2', NULL, 'x');

-- A claim made without a lease (idem_claim without lease =>, idem_claim_many)
-- that meets a lease that ran out takes the work over as a plain claim of
-- its transaction: told the attempt and where the last one got to, given
-- no lease and no token, finished in its transaction or read completed once
-- committed. So a consumer that commits its business write without a
-- finish applies the event once, however often it is delivered again
-- after the (1-second) lease it took over would have run out. Counted by
-- business rows.
CREATE TEMP TABLE applied (evt text, by text);
SELECT result->>'lease_token' AS ptok FROM idem_claim('evt-1', 'consumer', lease => '1 second') \gset
SELECT idem_checkpoint('evt-1', 'consumer', 'half', '{"n": 1}', :'ptok');
SELECT idem_release('evt-1', 'consumer', :'ptok');
SELECT result->>'lease_token' AS ptok FROM idem_claim('evt-2', 'consumer', lease => '1 second') \gset
SELECT idem_release('evt-2', 'consumer', :'ptok');
BEGIN;
CREATE TEMP TABLE took AS SELECT * FROM idem_claim('evt-1', 'consumer');
SELECT claimed, state, result FROM took;
INSERT INTO applied SELECT 'evt-1', 'handler 1' FROM took WHERE claimed;
INSERT INTO applied SELECT key, 'batch 1' FROM idem_claim_many(ARRAY['evt-2'], 'consumer') WHERE claimed;
-- Not leased: no checkpoint (ID003), and idem_leases lists neither.
SAVEPOINT s;
SELECT idem_checkpoint('evt-1', 'consumer', 'more', NULL);
ROLLBACK TO s;
SELECT count(*) AS leases FROM idem_leases WHERE biz_type = 'consumer' AND key IN ('evt-1', 'evt-2');
COMMIT;
DROP TABLE took;
SELECT key, l.state, l.result FROM unnest(ARRAY['evt-1', 'evt-2']) key, LATERAL idem_lookup(key, 'consumer') l;
SELECT pg_sleep(1.1);
-- Delivered again after the old lease's length: duplicates.
BEGIN;
INSERT INTO applied SELECT 'evt-1', 'handler 2' FROM idem_claim('evt-1', 'consumer') WHERE claimed;
INSERT INTO applied SELECT key, 'batch 2' FROM idem_claim_many(ARRAY['evt-2'], 'consumer') WHERE claimed;
COMMIT;
SELECT evt, count(*) AS times_applied, string_agg(by, ', ') AS by FROM applied GROUP BY evt ORDER BY evt;
-- Finished in its transaction, without a token; a takeover that asks for a
-- lease gets one, with a token.
SELECT result->>'lease_token' AS ptok FROM idem_claim('evt-3', 'consumer', lease => '1 hour') \gset
SELECT idem_release('evt-3', 'consumer', :'ptok');
BEGIN;
SELECT claimed, result FROM idem_claim('evt-3', 'consumer');
SELECT idem_complete('evt-3', 'consumer', '{"done": 3}');
COMMIT;
SELECT state, result FROM idem_lookup('evt-3', 'consumer');
SELECT result->>'lease_token' AS ptok FROM idem_claim('evt-4', 'consumer', lease => '1 hour') \gset
SELECT idem_release('evt-4', 'consumer', :'ptok');
SELECT claimed, result - 'lease_token' - 'lease_until' AS result, length(result->>'lease_token') AS token_length
  FROM idem_claim('evt-4', 'consumer', lease => '1 hour');
SELECT attempt, ran_out FROM idem_leases WHERE biz_type = 'consumer' AND key = 'evt-4';
