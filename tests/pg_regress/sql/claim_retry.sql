-- claim_retry: a business type's policy for stored failures
-- (idem_configure(biz_type, ttl, on_failure)). replay: a failure is every
-- later arrival's answer; retry: the next arrival after a failure claims
-- the key anew, told its attempt and the previous error, while a completed
-- key is never claimed again. Business types used here: retry.pay,
-- retry.replay, retry.lease, retry.batch.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idem;
RESET client_min_messages;
\set SHOW_CONTEXT never
\set VERBOSITY sqlstate

-- A payment handler: claim, then either a decline (idem_fail) or a charge
-- (a business row, then idem_complete), in one transaction.
CREATE TABLE retry_charges (id serial PRIMARY KEY, order_no text NOT NULL);
CREATE TABLE retry_outcomes (pos serial, order_no text, claimed boolean, state text, result jsonb);
CREATE FUNCTION retry_pay(order_no text, biz_type text, decline boolean) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  c record;
BEGIN
  SELECT claimed, state, result INTO c FROM idem_claim(order_no, biz_type);
  INSERT INTO retry_outcomes (order_no, claimed, state, result) VALUES (order_no, c.claimed, c.state, c.result);
  IF NOT c.claimed THEN
    RETURN;
  END IF;
  IF decline THEN
    PERFORM idem_fail(order_no, biz_type, jsonb_build_object('declined', order_no));
  ELSE
    INSERT INTO retry_charges (order_no) VALUES (order_no);
    PERFORM idem_complete(order_no, biz_type, jsonb_build_object('charged', order_no));
  END IF;
END $$;

-- Errors and what is stored.
SELECT idem_configure('retry.pay', '1 hour', 'sometimes');     -- 22023
SELECT idem_configure('retry.pay', '1 hour', 'RETRY');         -- 22023: names are exact
SELECT idem_configure(NULL, '1 hour', 'retry');                -- 22004
SELECT idem_configure('bad type!', '1 hour', 'retry');         -- 22023
SELECT idem_configure('retry.pay', '1 millisecond', 'retry');  -- 22023
SELECT count(*) FROM idem.biz_types WHERE biz_type LIKE 'retry.%';
SELECT idem_configure('retry.pay', '1 hour', 'retry');
SELECT idem_configure('retry.replay', '1 hour', 'replay');
SELECT biz_type, extract(epoch FROM ttl) AS ttl_s, on_failure FROM idem.biz_types WHERE biz_type LIKE 'retry.%' ORDER BY 1;
-- The two-argument form keeps the policy; NULL is replay.
SELECT idem_configure('retry.pay', '2 hours');
SELECT biz_type, extract(epoch FROM ttl) AS ttl_s, on_failure FROM idem.biz_types WHERE biz_type = 'retry.pay';
SELECT idem_configure('retry.replay', '1 hour', NULL);
SELECT biz_type, extract(epoch FROM ttl) AS ttl_s, on_failure FROM idem.biz_types WHERE biz_type = 'retry.replay';
-- Revoked from PUBLIC, as the two-argument form.
SELECT p.oid::regprocedure, EXISTS (SELECT 1 FROM aclexplode(p.proacl) a WHERE a.grantee = 0) AS public_may
  FROM pg_proc p WHERE p.proname = 'idem_configure' ORDER BY 1::text;
-- Read-only: 25006.
BEGIN READ ONLY;
SELECT idem_configure('retry.pay', '1 hour', 'retry');
ROLLBACK;

-- replay: a declined payment stays declined; the retry does nothing.
SELECT retry_pay('R-1', 'retry.replay', true);
SELECT retry_pay('R-1', 'retry.replay', false);
SELECT order_no, claimed, state, result FROM retry_outcomes ORDER BY pos;
SELECT count(*) AS charges FROM retry_charges WHERE order_no = 'R-1';
TRUNCATE retry_outcomes;

-- retry: declined twice, then charged; then never again.
SELECT retry_pay('P-1', 'retry.pay', true);
SELECT state, result FROM idem_lookup('P-1', 'retry.pay');
SELECT retry_pay('P-1', 'retry.pay', true);
-- The failure is read as stored (the attempt is kept beside it).
SELECT state, result FROM idem_lookup('P-1', 'retry.pay');
SELECT retry_pay('P-1', 'retry.pay', false);
SELECT retry_pay('P-1', 'retry.pay', false);
SELECT retry_pay('P-1', 'retry.pay', true);
SELECT order_no, claimed, state, result FROM retry_outcomes ORDER BY pos;
SELECT count(*) AS charges FROM retry_charges WHERE order_no = 'P-1';
-- The retries kept the key's first claim time and expiry.
SELECT count(*) AS rows_of_key, bool_and(expires_at - claimed_at = interval '2 hours') AS first_ttl
  FROM idem.claims WHERE biz_type = 'retry.pay' AND key = 'P-1';
TRUNCATE retry_outcomes;

-- A retry that rolls back leaves the failure (and its attempt) as it was.
SELECT retry_pay('P-2', 'retry.pay', true);
BEGIN;
SELECT claimed, state, result FROM idem_claim('P-2', 'retry.pay');
-- its own claim, asked again in the same transaction: in_progress
SELECT claimed, state, result FROM idem_claim('P-2', 'retry.pay');
ROLLBACK;
SELECT claimed, state, result FROM idem_claim('P-2', 'retry.pay', wait => false);
-- committed unfinished: completed, no result (the retry's document is its
-- claimer's only)
SELECT claimed, state, result FROM idem_claim('P-2', 'retry.pay');

-- A different request under the key is refused, failure or not: ID001.
BEGIN;
SELECT claimed FROM idem_claim('P-3', 'retry.pay', fingerprint => 'a');
SELECT idem_fail('P-3', 'retry.pay', '"declined"');
COMMIT;
SELECT claimed FROM idem_claim('P-3', 'retry.pay', fingerprint => 'b');
SELECT claimed, state, result FROM idem_claim('P-3', 'retry.pay', fingerprint => 'a');

-- Under the replay policy again, a stored failure is replayed, whichever
-- attempt stored it.
BEGIN;
SELECT claimed FROM idem_claim('P-4', 'retry.pay');
SELECT idem_fail('P-4', 'retry.pay', '"first"');
COMMIT;
BEGIN;
SELECT claimed, state, result FROM idem_claim('P-4', 'retry.pay');
SELECT idem_fail('P-4', 'retry.pay', '"second"');
COMMIT;
SELECT idem_configure('retry.pay', '2 hours', 'replay');
SELECT claimed, state, result FROM idem_claim('P-4', 'retry.pay');
SELECT idem_configure('retry.pay', '2 hours', 'retry');
SELECT claimed, state, result FROM idem_claim('P-4', 'retry.pay');

-- With a lease: the retry takes a lease (attempt, previous error, a new
-- token); its failure, with the token, keeps the attempt.
SELECT idem_configure('retry.lease', '1 hour', 'retry');
CREATE TEMP TABLE lease_tok (tok text);
INSERT INTO lease_tok SELECT result->>'lease_token' FROM idem_claim('L-1', 'retry.lease', lease => '5 minutes');
SELECT idem_fail('L-1', 'retry.lease', '{"provider": "down"}', tok) FROM lease_tok;
TRUNCATE lease_tok;
WITH c AS (SELECT * FROM idem_claim('L-1', 'retry.lease', lease => '5 minutes')),
     t AS (INSERT INTO lease_tok SELECT result->>'lease_token' FROM c)
SELECT claimed, state, result - 'lease_token' - 'lease_until' AS result,
       length(result->>'lease_token') AS token_length, (result->>'lease_until')::timestamptz > now() AS lease_runs
  FROM c;
SELECT idem_fail('L-1', 'retry.lease', '{"provider": "down again"}');        -- ID003: no token
SELECT idem_fail('L-1', 'retry.lease', '{"provider": "down again"}', tok) FROM lease_tok;
TRUNCATE lease_tok;
WITH c AS (SELECT * FROM idem_claim('L-1', 'retry.lease', lease => '5 minutes')),
     t AS (INSERT INTO lease_tok SELECT result->>'lease_token' FROM c)
SELECT claimed, state, result - 'lease_token' - 'lease_until' AS result FROM c;
SELECT idem_fail('L-1', 'retry.lease', '{"provider": "gone"}', tok) FROM lease_tok;
SELECT claimed, state, result FROM idem_lookup('L-1', 'retry.lease');

-- The error a retry's lease retries stays with the lease: a checkpoint and
-- a release keep it, and a takeover is told it, with a lease or without.
BEGIN;
SELECT claimed FROM idem_claim('L-2', 'retry.lease');
SELECT idem_fail('L-2', 'retry.lease', '{"e": "first"}');
COMMIT;
TRUNCATE lease_tok;
INSERT INTO lease_tok SELECT result->>'lease_token' FROM idem_claim('L-2', 'retry.lease', lease => '5 minutes');
SELECT idem_checkpoint('L-2', 'retry.lease', 'p1', '{"a": 1}', tok) FROM lease_tok;
SELECT idem_release('L-2', 'retry.lease', tok) FROM lease_tok;
TRUNCATE lease_tok;
WITH c AS (SELECT * FROM idem_claim('L-2', 'retry.lease', lease => '5 minutes')),
     t AS (INSERT INTO lease_tok SELECT result->>'lease_token' FROM c)
SELECT claimed, state, result - 'lease_token' - 'lease_until' AS result FROM c;
SELECT idem_release('L-2', 'retry.lease', tok) FROM lease_tok;
BEGIN;
SELECT claimed, state, result FROM idem_claim('L-2', 'retry.lease');
SELECT idem_fail('L-2', 'retry.lease', '{"e": "third"}');
COMMIT;
SELECT claimed, state, result FROM idem_lookup('L-2', 'retry.lease');

-- A batch retries as single claims do.
SELECT idem_configure('retry.batch', '1 hour', 'retry');
BEGIN;
SELECT key, claimed FROM idem_claim_many(ARRAY['b1', 'b2'], 'retry.batch');
SELECT idem_fail('b1', 'retry.batch', '"bad record"');
SELECT idem_complete('b2', 'retry.batch', '"applied"');
COMMIT;
SELECT key, claimed, state, result FROM idem_claim_many(ARRAY['b2', 'b1', 'b1'], 'retry.batch');

-- idem_stats counts retried failures as failed.
SELECT biz_type, completed, failed FROM idem_stats WHERE biz_type LIKE 'retry.%' ORDER BY 1;

DROP FUNCTION retry_pay(text, text, boolean);
DROP TABLE retry_charges, retry_outcomes;
DELETE FROM idem.claims WHERE biz_type LIKE 'retry.%';
DELETE FROM idem.biz_types WHERE biz_type LIKE 'retry.%';
