-- storage_drift: storage whose shape was changed by hand. The direct path
-- writes tuples of the shape it created, so it checks every partition's
-- columns and index once per partition list and refuses anything else with
-- 0A000 before writing (0.2.0 wrote past the added column's arrays). The
-- SQL path names its columns and needs no check. Runs last: it reinstalls
-- the extension. Business type: drift.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idem;
RESET client_min_messages;
\set SHOW_CONTEXT never
\set VERBOSITY sqlstate
CREATE FUNCTION pg_temp.try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- Range partitions first (their names hold the date: shown as claims_N).
SET idem.partition_width = '1 hour';
-- (idem_maintain runs in READ COMMITTED only, whatever the session's default.)
BEGIN ISOLATION LEVEL READ COMMITTED;
SELECT idem_maintain() ? 'partitions_created' AS maintained;
COMMIT;
RESET idem.partition_width;
CREATE FUNCTION pg_temp.try_n(stmt text) RETURNS text LANGUAGE sql
    AS $$ SELECT regexp_replace(pg_temp.try(stmt), 'claims_c?[0-9_]+', 'claims_N') $$;
ALTER TABLE idem.claims ADD COLUMN extra int;
SELECT pg_temp.try_n($$SELECT idem_claim('drift-1', 'drift')$$);
SELECT pg_temp.try_n($$SELECT idem_lookup('drift-1', 'drift')$$);
ALTER TABLE idem.claims DROP COLUMN extra;
SELECT pg_temp.try_n($$SELECT idem_claim('drift-1', 'drift')$$);
SELECT count(*) AS drift_claims FROM idem.claims WHERE biz_type = 'drift';
-- (The test's last step: reinstall. CASCADE takes the guards of earlier
-- tests along.)
SET client_min_messages = warning;
DROP EXTENSION idem CASCADE;
RESET client_min_messages;
CREATE EXTENSION idem;
SELECT claimed, state FROM idem_claim('drift-1', 'drift');

-- A second index on a partition, or an index on something else than the
-- digest: refused too.
CREATE INDEX extra_index ON idem.claims_default (key);
SELECT pg_temp.try_n($$SELECT idem_claim('drift-2', 'drift')$$);
DROP INDEX idem.extra_index;
SELECT claimed, state FROM idem_claim('drift-2', 'drift');
