-- scaling: the Citus entry point without Citus, and the storage-access
-- setting (docs/scaling.md). The SQL path itself is tested by
-- tests/scenarios/hardening.sh storage_sql on a cluster configured with it.
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

CREATE TABLE sc_orders (order_no text PRIMARY KEY);
SELECT pg_temp.try($$SELECT idem_distribute('sc_orders')$$);
SELECT pg_temp.try($$SELECT idem_distribute(NULL)$$);
-- Only its owner (or a role granted EXECUTE) may distribute idem's storage.
CREATE ROLE sc_app;
SET ROLE sc_app;
SELECT pg_temp.try($$SELECT idem_distribute('sc_orders')$$);
RESET ROLE;
DROP ROLE sc_app;

-- The setting: a SIGHUP enum, auto by default; a session cannot change it.
-- (Defined when the library loads: before that a SET makes a placeholder,
-- which the library then refuses to apply to a SIGHUP setting.)
LOAD 'idem';
SELECT name, setting, context, enumvals FROM pg_settings WHERE name = 'idem.storage_access';
SELECT pg_temp.try($$SET idem.storage_access = 'sql'$$);
SELECT pg_temp.try($$SET idem.storage_acess = 'sql'$$);
DROP TABLE sc_orders;
