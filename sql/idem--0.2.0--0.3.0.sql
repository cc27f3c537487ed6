-- idem 0.2.0 → 0.3.0. Hand-written: every schema change between the two
-- versions, in the order a fresh 0.3.0 install makes it.
-- tests/scenarios/upgrade.sh installs 0.2.0 (tests/upgrade/idem--0.2.0.sql),
-- claims, runs this update, and checks that the claims survive and that the
-- schema equals a fresh 0.3.0 install's.
\echo Use "ALTER EXTENSION idem UPDATE TO '0.3.0'" to load this file. \quit

-- storage.sql ---------------------------------------------------------------


-- Business types may be reserved for the members of a role (idem_set_owner).
ALTER TABLE idem.biz_types ADD COLUMN owner regrole;
COMMENT ON TABLE idem.biz_types IS 'Business type settings: the TTL of its claims (idem_configure) and the role whose members alone may use it (idem_set_owner).';

-- Partition bounds read in binary, for the views and maintenance.
CREATE FUNCTION idem.partition_from(partition regclass) RETURNS timestamptz
    STABLE STRICT PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_partition_from';
COMMENT ON FUNCTION idem.partition_from(regclass) IS 'Lower bound (inclusive) of a partition of idem.claims, read in binary; NULL for the default partition.';
CREATE FUNCTION idem.partition_to(partition regclass) RETURNS timestamptz
    STABLE STRICT PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_partition_to';
COMMENT ON FUNCTION idem.partition_to(regclass) IS 'Upper bound (exclusive) of a partition of idem.claims, read in binary; NULL for the default partition.';

-- claim.sql -----------------------------------------------------------------

COMMENT ON FUNCTION idem_claim(text, text, interval, text, boolean, interval) IS
'Claim (biz_type, key) in the current transaction. First arrival: claimed = true, state = new. Duplicate: claimed = false and the first outcome (completed/failed with its result). Concurrent uncommitted claim: waits for it (wait => true) or returns state = in_progress at once. ttl overrides the type''s TTL; a differing fingerprint raises ID001. With lease (at most the ttl), the claim is meant to be committed before work outside the database: others see in_progress until it is finished or the lease runs out, then the next claim takes it over; the lease holder gets {attempt, recovery_point, recovery_data, lease_until, lease_token} in result and proves ownership with lease_token. 25006 in a read-only transaction.';
COMMENT ON FUNCTION idem_complete(text, text, jsonb, text) IS
'Store the outcome of a claim this transaction made, or of a leased claim whose lease_token the caller passes; duplicates get result back. ID003 otherwise (also for a leased claim without its token: behind a connection pooler a session is not a client).';
COMMENT ON FUNCTION idem_fail(text, text, jsonb, text) IS
'Store a deterministic business failure (e.g. insufficient stock) for a claim the caller holds (made by this transaction, or leased with the lease_token passed); duplicates get state = failed and the error back. ID003 if the caller holds no claim on the key.';
COMMENT ON FUNCTION idem_checkpoint(text, text, text, jsonb, text) IS
'Record a recovery point (e.g. charge_created) and its data on a leased claim, in the caller''s transaction, and renew the lease (never beyond the claim''s expiry). Pass the lease_token idem_claim returned (or call it in the transaction that took the lease). A later takeover is told the last point. ID003 for anyone else.';
COMMENT ON FUNCTION idem_configure(text, interval) IS
'Set the TTL of a business type (1 second to 400 days); NULL returns it to idem.default_ttl. Applies to claims made afterwards. Keeps the type''s owner.';

CREATE FUNCTION idem_set_owner(biz_type text, owner regrole) RETURNS void
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_set_owner';
COMMENT ON FUNCTION idem_set_owner(text, regrole) IS
'Reserve a business type for the members of a role: only they may claim, finish, look up or forget its keys (42501 for others). NULL opens it to every role again. Keeps the type''s TTL.';
REVOKE EXECUTE ON FUNCTION idem_set_owner(text, regrole) FROM PUBLIC;

-- maintenance.sql -----------------------------------------------------------

-- Settings are read under a pinned IntervalStyle.
ALTER FUNCTION idem.setting_interval(text, interval) SET IntervalStyle = 'postgres';

-- Bounds in binary rather than parsed back from pg_get_expr's text (which
-- follows the session's DateStyle and TimeZone).
CREATE OR REPLACE VIEW idem.partition_bounds AS
SELECT c.oid::regclass AS partition,
       c.relname::text AS name,
       idem.partition_from(c.oid) AS range_from,
       idem.partition_to(c.oid) AS range_to,
       idem.partition_to(c.oid) IS NULL AS is_default
  FROM pg_inherits h
  JOIN pg_class c ON c.oid = h.inhrelid
 WHERE h.inhparent = 'idem.claims'::regclass;

-- Maintenance writes bounds into DDL in one fixed style, whatever the
-- calling session's settings.
ALTER FUNCTION idem_maintain()
    SET DateStyle = 'ISO, YMD'
    SET TimeZone = 'UTC'
    SET IntervalStyle = 'postgres'
    SET timezone_abbreviations = 'Default';
