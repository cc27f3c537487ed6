-- checkpoint_merge: idem_checkpoint(..., merge => true) merges the
-- checkpoint's data into the lease's recovery data instead of replacing
-- it, so that each step of a job records only what it learned. Business
-- type used here: merge.job.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idem;
RESET client_min_messages;
\set SHOW_CONTEXT never
\set VERBOSITY sqlstate

CREATE TEMP TABLE tok (t text);
INSERT INTO tok SELECT result->>'lease_token' FROM idem_claim('J-1', 'merge.job', lease => '10 minutes');
-- Step 1 replaces (the default), steps 2 and 3 merge; step 3 also changes
-- a field step 1 set.
SELECT idem_checkpoint('J-1', 'merge.job', 'charged', '{"charge": "ch_1", "amount": 100}', t) FROM tok;
SELECT idem_checkpoint('J-1', 'merge.job', 'shipped', '{"shipment": "sh_9"}', t, merge => true) FROM tok;
SELECT idem_checkpoint('J-1', 'merge.job', 'adjusted', '{"amount": 90, "note": {"why": "coupon"}}', t, true) FROM tok;
SELECT result->'recovery_point' AS point, result->'recovery_data' AS data FROM idem.claims WHERE biz_type = 'merge.job' AND key = 'J-1';
-- merge with no data keeps the data (the point moves on); without merge,
-- no data clears it.
SELECT idem_checkpoint('J-1', 'merge.job', 'noted', NULL, t, true) FROM tok;
SELECT result->'recovery_point' AS point, result->'recovery_data' AS data FROM idem.claims WHERE biz_type = 'merge.job' AND key = 'J-1';

-- Errors, with nothing written: data that is not an object (22023); a
-- NULL merge (22004: this form has no default, and a NULL must not pass
-- for false, which replaces the data).
SELECT idem_checkpoint('J-1', 'merge.job', 'bad', '[1, 2]', t, true) FROM tok;
SELECT idem_checkpoint('J-1', 'merge.job', 'bad', '"text"', t, true) FROM tok;
SELECT result->'recovery_point' AS point, result->'recovery_data' AS data FROM idem.claims WHERE biz_type = 'merge.job' AND key = 'J-1';
-- Without the token: ID003, before the data is looked at.
SELECT idem_checkpoint('J-1', 'merge.job', 'stranger', '[1]', NULL, true);
SELECT idem_checkpoint('J-1', 'merge.job', 'stranger', '{"x": 1}', 'not-the-token', true);
-- Stored data that is not an object cannot be merged into: 22023.
SELECT idem_checkpoint('J-1', 'merge.job', 'listed', '["a"]', t) FROM tok;
SELECT idem_checkpoint('J-1', 'merge.job', 'more', '{"b": 1}', t, true) FROM tok;
SELECT idem_checkpoint('J-1', 'merge.job', 'reset', '{"charge": "ch_1"}', t, NULL) FROM tok;
SELECT idem_checkpoint('J-1', 'merge.job', 'reset', '{"charge": "ch_1"}', t, merge => NULL) FROM tok;
SELECT result->'recovery_point' AS point, result->'recovery_data' AS data FROM idem.claims WHERE biz_type = 'merge.job' AND key = 'J-1';
SELECT idem_checkpoint('J-1', 'merge.job', 'reset', '{"charge": "ch_1"}', t, false) FROM tok;
SELECT idem_checkpoint('J-1', 'merge.job', 'refund', '{"refund": "re_1"}', t, true) FROM tok;

-- Handed back and taken over: the next attempt is told the merged data.
SELECT idem_release('J-1', 'merge.job', t) FROM tok;
SELECT claimed, result->'attempt' AS attempt, result->'recovery_point' AS point, result->'recovery_data' AS data
  FROM idem_claim('J-1', 'merge.job', lease => '10 minutes');

-- In the transaction that took the lease, without a token.
BEGIN;
SELECT claimed FROM idem_claim('J-2', 'merge.job', lease => '10 minutes');
SELECT idem_checkpoint('J-2', 'merge.job', 'a', '{"a": 1}', NULL, true);
SELECT idem_checkpoint('J-2', 'merge.job', 'b', '{"b": 2}', lease_token => NULL, merge => true);
SELECT result->'recovery_data' AS data FROM idem.claims WHERE biz_type = 'merge.job' AND key = 'J-2';
COMMIT;

DELETE FROM idem.claims WHERE biz_type = 'merge.job';
