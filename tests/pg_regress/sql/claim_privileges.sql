-- claim_privileges: what the extension exposes and to whom. An ordinary role
-- can claim, finish and look up keys, but cannot touch storage, evict or
-- configure; and nothing it puts on its search_path runs with the rights of
-- the extension's owner (the SQL the C functions run as the owner). Business types used here: priv, priv.*.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idem;
DROP ROLE IF EXISTS regress_idem_app;
RESET client_min_messages;
\set SHOW_CONTEXT never
\set VERBOSITY sqlstate

-- Every function of the extension carries a COMMENT (no rows).
SELECT p.proname
  FROM pg_proc p
  JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
  JOIN pg_extension e ON e.oid = d.refobjid
 WHERE e.extname = 'idem' AND obj_description(p.oid, 'pg_proc') IS NULL;

-- The claim API lives in the extension, is SECURITY INVOKER (its C code
-- reaches storage directly and runs its SQL as the owner), and only
-- idem_forget and idem_configure are withheld from PUBLIC.
SELECT p.oid::regprocedure AS function, p.prosecdef AS security_definer,
       has_function_privilege('public', p.oid, 'EXECUTE') AS public_execute
  FROM pg_proc p
  JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
  JOIN pg_extension e ON e.oid = d.refobjid
 WHERE e.extname = 'idem'
   AND p.proname IN ('idem_claim', 'idem_complete', 'idem_fail', 'idem_lookup', 'idem_forget', 'idem_configure')
 ORDER BY p.proname, p.pronargs;

-- Storage: schema idem, no rights for PUBLIC.
SELECT has_schema_privilege('public', 'idem', 'USAGE') AS public_usage,
       has_schema_privilege('public', 'idem', 'CREATE') AS public_create;
-- The result type, the schema and the two storage tables are commented too.
SELECT obj_description('idem_claim_result'::regtype, 'pg_type') IS NOT NULL AS type_commented,
       obj_description('idem'::regnamespace, 'pg_namespace') IS NOT NULL AS schema_commented,
       obj_description('idem.claims'::regclass, 'pg_class') IS NOT NULL AS claims_commented,
       obj_description('idem.biz_types'::regclass, 'pg_class') IS NOT NULL AS biz_types_commented;

CREATE ROLE regress_idem_app;
SET ROLE regress_idem_app;

-- An ordinary role can claim, complete, fail and look up.
BEGIN;
SELECT claimed, state FROM idem_claim('p1', 'priv');
SELECT idem_complete('p1', 'priv', '{"by": "app"}');
COMMIT;
SELECT claimed, state, result FROM idem_claim('p1', 'priv');
SELECT claimed, state, result FROM idem_lookup('p1', 'priv');
BEGIN;
SELECT claimed, state FROM idem_claim('p2', 'priv', ttl => '1 hour', fingerprint => 'f', wait => false);
SELECT idem_fail('p2', 'priv', '{"error": "declined"}');
COMMIT;
SELECT claimed, state, result FROM idem_claim('p2', 'priv', fingerprint => 'f');
-- ... and the errors it gets are idem's own.
SELECT claimed FROM idem_claim('p2', 'priv', fingerprint => 'g');
SELECT idem_complete('p1', 'priv');

-- It cannot read or write idem's storage directly: 42501.
SELECT count(*) FROM idem.claims;
SELECT count(*) FROM idem.claims_default;
SELECT count(*) FROM idem.biz_types;
INSERT INTO idem.claims (expires_at, claimed_at, state, biz_type, key) VALUES (now() + interval '1 hour', now(), 'c', 'priv', 'forged');
DELETE FROM idem.claims;
UPDATE idem.biz_types SET ttl = '1 second';
SELECT idem.key_hash('priv', 'p1');
CREATE TABLE idem.claims_forged PARTITION OF idem.claims FOR VALUES FROM ('2000-01-01') TO ('2000-01-02');

-- It cannot evict or configure: 42501.
SELECT idem_forget('p1', 'priv');
SELECT idem_configure('priv', '1 hour');
RESET ROLE;

-- The role's claims are stored like anyone's.
SELECT c.key, c.state, c.result
  FROM idem.claims c
 WHERE c.biz_type = 'priv' ORDER BY c.key;

-- EXECUTE on idem_forget can be granted.
GRANT EXECUTE ON FUNCTION idem_forget(text, text) TO regress_idem_app;
SET ROLE regress_idem_app;
SELECT idem_forget('p1', 'priv');
SELECT claimed, state FROM idem_lookup('p1', 'priv');
RESET ROLE;
REVOKE EXECUTE ON FUNCTION idem_forget(text, text) FROM regress_idem_app;

-- search_path: idem's functions run as the extension owner (a superuser), so
-- no operator or function the caller puts on its search_path may run inside
-- them. The role owns a schema with "=" for oid and text and "*" for
-- (float8, int4); each records a call. No call may be recorded, whether the
-- schema comes before pg_catalog or after it (an exact-type-match operator
-- wins over pg_catalog's even then), with cold caches (new session), for a
-- new business type and for an existing one.
CREATE SCHEMA regress_idem_shadow AUTHORIZATION regress_idem_app;
SET ROLE regress_idem_app;
CREATE TABLE regress_idem_shadow.calls (op text, ran_as name);
CREATE FUNCTION regress_idem_shadow.oideq(oid, oid) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO regress_idem_shadow.calls VALUES ('= (oid, oid)', current_user);
    RETURN $1 OPERATOR(pg_catalog.=) $2;
END $$;
CREATE FUNCTION regress_idem_shadow.texteq(text, text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO regress_idem_shadow.calls VALUES ('= (text, text)', current_user);
    RETURN $1 OPERATOR(pg_catalog.=) $2;
END $$;
CREATE FUNCTION regress_idem_shadow.mul(float8, int4) RETURNS float8 LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO regress_idem_shadow.calls VALUES ('* (float8, int4)', current_user);
    RETURN $1 OPERATOR(pg_catalog.*) $2;
END $$;
CREATE OPERATOR regress_idem_shadow.= (LEFTARG = oid, RIGHTARG = oid, FUNCTION = regress_idem_shadow.oideq);
CREATE OPERATOR regress_idem_shadow.= (LEFTARG = text, RIGHTARG = text, FUNCTION = regress_idem_shadow.texteq);
CREATE OPERATOR regress_idem_shadow.* (LEFTARG = float8, RIGHTARG = int4, FUNCTION = regress_idem_shadow.mul);
RESET ROLE;
-- Schema after pg_catalog (pg_catalog is implicitly first).
\c -
SET ROLE regress_idem_app;
SET search_path = public, regress_idem_shadow;
SELECT claimed, state, result FROM idem_lookup('p2', 'priv');
SELECT claimed, state, result FROM idem_claim('p2', 'priv');
BEGIN;
SELECT claimed, state FROM idem_claim('s1', 'priv.shadow1');
SELECT idem_complete('s1', 'priv.shadow1', '{"ok": true}');
COMMIT;
SELECT claimed, state, result FROM idem_claim('s1', 'priv.shadow1');
RESET search_path;
SELECT DISTINCT op, ran_as FROM regress_idem_shadow.calls ORDER BY op;
RESET ROLE;
-- Schema before pg_catalog.
\c -
SET ROLE regress_idem_app;
SET search_path = regress_idem_shadow, pg_catalog, public;
SELECT claimed, state, result FROM idem_lookup('p2', 'priv');
SELECT claimed, state, result FROM idem_claim('p2', 'priv');
BEGIN;
SELECT claimed, state FROM idem_claim('s2', 'priv.shadow2');
SELECT idem_fail('s2', 'priv.shadow2', '{"ok": false}');
COMMIT;
SELECT claimed, state, result FROM idem_lookup('s2', 'priv.shadow2');
RESET search_path;
SELECT DISTINCT op, ran_as FROM regress_idem_shadow.calls ORDER BY op;
RESET ROLE;

-- Cleanup.
SET client_min_messages = warning;
DROP SCHEMA regress_idem_shadow CASCADE;
RESET client_min_messages;
DROP OWNED BY regress_idem_app;
DROP ROLE regress_idem_app;
