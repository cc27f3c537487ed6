-- claim_errors: bad input and misuse, each with its SQLSTATE, and proof that a
-- failed call writes nothing. Business types used here: err, err.*.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idem;
RESET client_min_messages;
\set SHOW_CONTEXT never
\set VERBOSITY sqlstate

-- Runs a statement and reports "SQLSTATE: message", or "ok" when it succeeds.
-- Each call runs in a subtransaction (the EXCEPTION block), so a call that
-- wrote anything before failing would leave a transaction id assigned.
CREATE FUNCTION pg_temp.try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- Existing state the misuse cases below refer to.
SELECT claimed, state FROM idem_claim('done', 'err');
SELECT claimed, state FROM idem_claim('with-fp', 'err', fingerprint => 'fp-1');
SELECT count(*) AS claims_before FROM idem.claims \gset
SELECT count(*) AS types_before FROM idem.biz_types \gset

-- Every bad call in one transaction. None of them may write: no transaction id
-- is assigned, and no claim or business type appears. The business types
-- err.new* are unknown until now, so registering one would be a write.
-- (Calls naming an unknown type that fail later, e.g. ID003 from idem_complete,
-- are in claim_nowrite.)
BEGIN;
SELECT pg_temp.try(stmt) AS outcome, stmt
  FROM unnest(ARRAY[
    -- NULL key or biz_type: 22004.
    $$SELECT idem_claim(NULL, 'err.new1')$$,
    $$SELECT idem_claim('k', NULL)$$,
    $$SELECT idem_complete(NULL, 'err')$$,
    $$SELECT idem_complete('k', NULL)$$,
    $$SELECT idem_fail(NULL, 'err', '{}')$$,
    $$SELECT idem_fail('k', NULL, '{}')$$,
    $$SELECT idem_lookup(NULL, 'err')$$,
    $$SELECT idem_lookup('k', NULL)$$,
    $$SELECT idem_forget(NULL, 'err')$$,
    $$SELECT idem_forget('k', NULL)$$,
    $$SELECT idem_configure(NULL, '1 hour')$$,
    -- idem_fail needs an error value: 22004.
    $$SELECT idem_fail('done', 'err', NULL)$$,
    -- Empty key and key over 1024 bytes (bytes, not characters): 22023.
    $$SELECT idem_claim('', 'err.new2')$$,
    $$SELECT idem_claim(repeat('k', 1025), 'err.new3')$$,
    $$SELECT idem_claim(repeat('é', 513), 'err.new4')$$,
    $$SELECT idem_lookup('', 'err')$$,
    $$SELECT idem_complete(repeat('k', 1025), 'err')$$,
    $$SELECT idem_forget('', 'err')$$,
    -- biz_type outside ^[A-Za-z0-9_.:-]{1,64}$: 22023.
    $$SELECT idem_claim('k', '')$$,
    $$SELECT idem_claim('k', 'has space')$$,
    $$SELECT idem_claim('k', 'semi;colon')$$,
    $$SELECT idem_claim('k', 'tëst')$$,
    $$SELECT idem_claim('k', repeat('t', 65))$$,
    $$SELECT idem_lookup('k', 'bad/type')$$,
    $$SELECT idem_configure('bad type', '1 hour')$$,
    -- ttl under 1 second or over 400 days: 22023.
    $$SELECT idem_claim('k', 'err.new5', ttl => '999 milliseconds')$$,
    $$SELECT idem_claim('k', 'err.new6', ttl => '0 seconds')$$,
    $$SELECT idem_claim('k', 'err.new7', ttl => '-1 hour')$$,
    $$SELECT idem_claim('k', 'err.new8', ttl => '400 days 1 second')$$,
    $$SELECT idem_claim('k', 'err.new9', ttl => '2 years')$$,
    $$SELECT idem_configure('err.new10', '0.5 seconds')$$,
    $$SELECT idem_configure('err.new11', '401 days')$$,
    -- Finishing a key this transaction does not hold: ID003.
    $$SELECT idem_complete('never-claimed', 'err')$$,
    $$SELECT idem_fail('never-claimed', 'err', '{}')$$,
    -- ... including a key claimed and committed by an earlier transaction.
    $$SELECT idem_complete('done', 'err', '{"late": true}')$$,
    $$SELECT idem_fail('done', 'err', '{"late": true}')$$,
    -- A duplicate with a different fingerprint: ID001.
    $$SELECT idem_claim('with-fp', 'err', fingerprint => 'fp-2')$$
  ]) WITH ORDINALITY AS s(stmt, n)
 ORDER BY n;
SELECT pg_current_xact_id_if_assigned() IS NULL AS no_xid;
COMMIT;
SELECT count(*) - :claims_before AS new_claims FROM idem.claims;
SELECT count(*) - :types_before AS new_types FROM idem.biz_types;
SELECT count(*) AS registered FROM idem.biz_types WHERE biz_type LIKE 'err.new%';
-- The misused claims are unchanged.
SELECT claimed, state, result FROM idem_claim('done', 'err');
SELECT claimed, state, result FROM idem_claim('with-fp', 'err', fingerprint => 'fp-1');

-- The limits themselves are accepted: a 1024-byte key, a 64-character biz_type,
-- every allowed character, ttl of exactly 1 second and 400 days.
SELECT claimed, state FROM idem_claim(repeat('k', 1024), 'err');
SELECT claimed, state FROM idem_claim(repeat('é', 512), 'err');
SELECT claimed, state FROM idem_claim('k', repeat('t', 64));
SELECT claimed, state FROM idem_claim('k', 'AZaz09_.:-');
SELECT claimed, state FROM idem_claim('ttl-min', 'err', ttl => '1 second');
SELECT claimed, state FROM idem_claim('ttl-max', 'err', ttl => '400 days');

-- Called directly (not through the helper), the errors abort the statement with their SQLSTATE.
SELECT idem_claim(NULL, 'err');
SELECT idem_claim('', 'err');
SELECT idem_claim('k', 'err', ttl => '0 seconds');
SELECT idem_fail('done', 'err', NULL);
SELECT idem_complete('done', 'err');
SELECT idem_claim('with-fp', 'err', fingerprint => 'fp-2');

-- A failed claim inside a transaction aborts it, and the transaction's earlier claim goes with it.
BEGIN;
SELECT claimed, state FROM idem_claim('in-failed-xact', 'err');
SELECT idem_claim('', 'err');
COMMIT;
SELECT claimed, state FROM idem_lookup('in-failed-xact', 'err');

-- ID003 for a claim whose savepoint was rolled back.
BEGIN;
SAVEPOINT s1;
SELECT claimed, state FROM idem_claim('rolled-back', 'err');
ROLLBACK TO SAVEPOINT s1;
SELECT idem_complete('rolled-back', 'err');
ROLLBACK;

-- The idem. GUC prefix is reserved: a misspelt setting is an error, not a
-- placeholder. (Once the library is loaded in the session, as it is here.)
SET idem.nonexistent = 1;
SET idem.default_tll = '1 hour';
SHOW idem.default_ttl;
