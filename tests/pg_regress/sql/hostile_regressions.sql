-- Inputs the hostile-input property tests (tests/fuzz/hostile.py) found
-- mishandled in 0.1.0, each pinned here with its documented outcome.
CREATE EXTENSION IF NOT EXISTS idem;
\set SHOW_CONTEXT never
\set VERBOSITY sqlstate
-- "SQLSTATE: message", or "ok".
CREATE FUNCTION pg_temp.try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- 1. Recovery data is kept exactly: any nesting depth, any numeric precision.
--    (0.1.0 went through serde_json: XX000 past 127 levels or beyond f64,
--    rounded digits otherwise, and a key stuck until it expired.)
SELECT result->>'lease_token' AS deep_tok FROM idem_claim('deep', 'hr.lease', lease => '1 second') \gset
SELECT idem_checkpoint('deep', 'hr.lease', 'p1', (repeat('[', 300) || repeat(']', 300))::jsonb, :'deep_tok');
SELECT idem_checkpoint('deep', 'hr.lease', 'p2',
       '{"amount": 123456789.123456789, "ref": 12345678901234567890123, "big": 1e400}', :'deep_tok');
SELECT pg_sleep(1.2);
-- The lease ran out: the next claim takes over and gets the data back unchanged.
SELECT claimed, result->'attempt' AS attempt, result->'recovery_point' AS point,
       result->'recovery_data' = '{"amount": 123456789.123456789, "ref": 12345678901234567890123, "big": 1e400}'::jsonb AS data_exact,
       result->'recovery_data'->>'amount' AS amount
  FROM idem_claim('deep', 'hr.lease', lease => '1 minute');
-- Deep data survives a takeover too.
SELECT result->>'lease_token' AS deep2_tok FROM idem_claim('deep2', 'hr.lease', lease => '1 second') \gset
SELECT idem_checkpoint('deep2', 'hr.lease', 'p', (repeat('[', 1000) || repeat(']', 1000))::jsonb, :'deep2_tok');
SELECT pg_sleep(1.2);
SELECT claimed, (result->'recovery_data')::text = repeat('[', 1000) || repeat(']', 1000) AS deep_exact
  FROM idem_claim('deep2', 'hr.lease');

-- 2. Token TTLs are counted like claim TTLs (a year is 365.25 days): at most 400 days.
SELECT pg_temp.try($$SELECT idem_issue_token('hr.tok', '1 year 35 days')$$);
SELECT length(idem_issue_token('hr.tok', '1 year 34 days')) AS token_length;
SELECT pg_temp.try($$SELECT idem_issue_token('hr.tok', '0.5 seconds')$$);

-- 3. Guards on columns whose trigger name would pass 63 bytes.
SELECT idem_define_machine('hr.m', '{"A": ["B"], "B": ["C"]}');
CREATE TABLE hr_long (id int PRIMARY KEY,
    "sssssssssssssssssssssssssssssssssssssssssssssssssssss1" text,
    "sssssssssssssssssssssssssssssssssssssssssssssssssssss2" text);
INSERT INTO hr_long VALUES (1, 'A', 'A');
SELECT idem_guard('hr_long', 'sssssssssssssssssssssssssssssssssssssssssssssssssssss1', 'hr.m');
SELECT idem_guard('hr_long', 'sssssssssssssssssssssssssssssssssssssssssssssssssssss1', 'hr.m');  -- again: replaces it
SELECT idem_guard('hr_long', 'sssssssssssssssssssssssssssssssssssssssssssssssssssss2', 'hr.m');  -- same 52-byte prefix
SELECT count(*) AS guard_triggers FROM pg_trigger WHERE tgrelid = 'hr_long'::regclass AND NOT tgisinternal;
SELECT pg_temp.try($$UPDATE hr_long SET "sssssssssssssssssssssssssssssssssssssssssssssssssssss1" = 'C'$$);  -- ID002
SELECT pg_temp.try($$UPDATE hr_long SET "sssssssssssssssssssssssssssssssssssssssssssssssssssss2" = 'C'$$);  -- ID002
SELECT idem_unguard('hr_long', 'sssssssssssssssssssssssssssssssssssssssssssssssssssss1');
SELECT pg_temp.try($$UPDATE hr_long SET "sssssssssssssssssssssssssssssssssssssssssssssssssssss1" = 'C'$$);  -- unguarded now
SELECT pg_temp.try($$UPDATE hr_long SET "sssssssssssssssssssssssssssssssssssssssssssssssssssss2" = 'C'$$);  -- still guarded: ID002
SELECT count(*) AS guard_triggers FROM pg_trigger WHERE tgrelid = 'hr_long'::regclass AND NOT tgisinternal;
SELECT pg_temp.try($$SELECT idem_unguard(NULL, NULL)$$);
CREATE VIEW hr_view AS SELECT * FROM hr_long;
SELECT pg_temp.try($$SELECT idem_guard('hr_view', 'sssssssssssssssssssssssssssssssssssssssssssssssssssss1', 'hr.m')$$);

-- 4. idem_transition: version_col must be an integer column, not the state column.
CREATE TABLE hr_orders (id int PRIMARY KEY, status text, note text, v int DEFAULT 0);
INSERT INTO hr_orders VALUES (1, 'A', 'x');
SELECT pg_temp.try($$SELECT idem_transition('hr_orders', 'id', '1', 'status', 'B', 'hr.m', 'note')$$);
SELECT pg_temp.try($$SELECT idem_transition('hr_orders', 'id', '1', 'status', 'B', 'hr.m', 'status')$$);
SELECT idem_transition('hr_orders', 'id', '1', 'status', 'B', 'hr.m', 'v', 0);
SELECT pg_temp.try($$SELECT idem_machine(NULL)$$);

DROP VIEW hr_view;
DROP TABLE hr_long, hr_orders;
