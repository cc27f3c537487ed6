-- The claim API: C functions in the extension's schema (src/api.rs names
-- each argument's position). SECURITY INVOKER: they reach storage directly
-- (heap and index access checks no rights), and the SQL they run (business
-- type settings, the SQL storage path) runs as the extension's owner with a
-- pg_catalog-only search path (catalog::as_owner). So callers need no rights
-- on schema idem, and the hot path pays no SECURITY DEFINER trampoline.

CREATE TYPE idem_claim_result AS (
    claimed          boolean,
    state            text,
    result           jsonb,
    first_claimed_at timestamptz,
    expires_at       timestamptz
);
COMMENT ON TYPE idem_claim_result IS 'What idem_claim and idem_lookup return: claimed (true only for the first arrival), state (new, in_progress, completed, failed, absent), the stored result or error, when the key was first claimed and when the claim expires.';

CREATE FUNCTION idem_claim(
    key         text,
    biz_type    text,
    ttl         interval DEFAULT NULL,
    fingerprint text     DEFAULT NULL,
    wait        boolean  DEFAULT true,
    lease       interval DEFAULT NULL
) RETURNS idem_claim_result
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_claim';
COMMENT ON FUNCTION idem_claim(text, text, interval, text, boolean, interval) IS
'Claim (biz_type, key) in the current transaction. First arrival: claimed = true, state = new. Duplicate: claimed = false and the first outcome (completed/failed with its result). Concurrent uncommitted claim: waits for it (wait => true) or returns state = in_progress at once. ttl overrides the type''s TTL; a differing fingerprint raises ID001. With lease (at most the ttl), the claim is meant to be committed before work outside the database: others see in_progress until it is finished or the lease runs out, then the next claim takes it over; the lease holder gets {attempt, recovery_point, recovery_data, lease_until, lease_token} in result and proves ownership with lease_token. A claim without lease that takes a run-out lease over is a plain claim of its transaction (result {attempt, recovery_point, recovery_data}, no lease, no token). 25006 in a read-only transaction.';

CREATE FUNCTION idem_complete(key text, biz_type text, result jsonb DEFAULT NULL, lease_token text DEFAULT NULL) RETURNS void
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_complete';
COMMENT ON FUNCTION idem_complete(text, text, jsonb, text) IS
'Store the outcome of a claim this transaction made, or of a leased claim whose lease_token the caller passes; duplicates get result back. ID003 otherwise (also for a leased claim without its token: behind a connection pooler a session is not a client).';

CREATE FUNCTION idem_fail(key text, biz_type text, error jsonb, lease_token text DEFAULT NULL) RETURNS void
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_fail';
COMMENT ON FUNCTION idem_fail(text, text, jsonb, text) IS
'Store a deterministic business failure (e.g. insufficient stock) for a claim the caller holds (made by this transaction, or leased with the lease_token passed); duplicates get state = failed and the error back. ID003 if the caller holds no claim on the key.';

CREATE FUNCTION idem_checkpoint(key text, biz_type text, point text, data jsonb DEFAULT NULL, lease_token text DEFAULT NULL) RETURNS void
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_checkpoint';
COMMENT ON FUNCTION idem_checkpoint(text, text, text, jsonb, text) IS
'Record a recovery point (e.g. charge_created) and its data on a leased claim, in the caller''s transaction, and renew the lease (never beyond the claim''s expiry). Pass the lease_token idem_claim returned (or call it in the transaction that took the lease). A later takeover is told the last point. ID003 for anyone else.';

CREATE FUNCTION idem_claim_id(key text, biz_type text, first_claimed_at timestamptz) RETURNS uuid
    IMMUTABLE STRICT PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_claim_id';
COMMENT ON FUNCTION idem_claim_id(text, text, timestamptz) IS
'The id of the claim of (biz_type, key) first claimed at first_claimed_at (as idem_claim returns it): a UUID derived from the three, the same on every attempt, takeover and retry of that claim and different for a claim of the key after it expired. Pass it downstream as a provider''s idempotency key. Not a secret: anyone who knows the key and the time can compute it.';

-- With merge => true, the recovery data is merged into, not replaced: a
-- separate function, as idem_configure's third argument is (sql/claim.sql
-- says why).
CREATE FUNCTION idem_checkpoint(key text, biz_type text, point text, data jsonb, lease_token text, merge boolean) RETURNS void
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_checkpoint_merge';
COMMENT ON FUNCTION idem_checkpoint(text, text, text, jsonb, text, boolean) IS
'idem_checkpoint(key, biz_type, point, data, lease_token) with merge: true adds data''s fields to the stored recovery data (an object; absent or JSON null counts as {}; a field of the same name is replaced; NULL data keeps it as it is), false replaces it (22004 for NULL). Pass lease_token => NULL in the transaction that took the lease. 22023 when data or the stored recovery data is not a JSON object.';

CREATE FUNCTION idem_lookup(key text, biz_type text) RETURNS idem_claim_result
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_lookup';
COMMENT ON FUNCTION idem_lookup(text, text) IS
'Read the live claim of (biz_type, key) without claiming or waiting: state absent, in_progress, completed or failed; claimed is always false.';

CREATE FUNCTION idem_forget(key text, biz_type text) RETURNS boolean
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_forget';
COMMENT ON FUNCTION idem_forget(text, text) IS
'Operator eviction: delete the committed claim of (biz_type, key) so that the next arrival claims again. Returns whether a claim was removed.';
REVOKE EXECUTE ON FUNCTION idem_forget(text, text) FROM PUBLIC;

CREATE FUNCTION idem_configure(biz_type text, ttl interval) RETURNS void
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_configure';
COMMENT ON FUNCTION idem_configure(text, interval) IS
'Set the TTL of a business type (1 second to 400 days); NULL returns it to idem.default_ttl. Applies to claims made afterwards. Keeps the type''s owner and on_failure policy.';
REVOKE EXECUTE ON FUNCTION idem_configure(text, interval) FROM PUBLIC;

-- The same with the type's policy for stored failures. A separate function
-- rather than a third argument with a default: the two-argument form, and
-- the grants operators gave on it by that signature, stay as they were.
CREATE FUNCTION idem_configure(biz_type text, ttl interval, on_failure text) RETURNS void
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_configure_policy';
COMMENT ON FUNCTION idem_configure(text, interval, text) IS
'Set the TTL of a business type (as idem_configure(biz_type, ttl)) and what a failure stored with idem_fail does to the next arrival: replay (NULL is the same; every later arrival is answered failed with the error until the claim expires) or retry (the next arrival claims the key anew, told {attempt, previous_error} in result; a completed key is still never claimed again before it expires). 22023 for another value. Keeps the type''s owner.';
REVOKE EXECUTE ON FUNCTION idem_configure(text, interval, text) FROM PUBLIC;

-- And with where a claim's TTL counts from (a fourth argument, apart for
-- the same reason).
CREATE FUNCTION idem_configure(biz_type text, ttl interval, on_failure text, retain_from text) RETURNS void
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_configure_retention';
COMMENT ON FUNCTION idem_configure(text, interval, text, text) IS
'Set the TTL and on_failure policy of a business type (as idem_configure(biz_type, ttl, on_failure)) and where its claims'' TTL counts from: claim (NULL is the same: a claim expires its TTL after it was first claimed) or completion (once idem_complete or idem_fail stores its outcome, a claim expires its TTL after that, so a result stored late is kept as long; a failure the type retries keeps its expiry). Applies to claims finished afterwards. 22023 for another value. Keeps the type''s owner.';
REVOKE EXECUTE ON FUNCTION idem_configure(text, interval, text, text) FROM PUBLIC;

CREATE FUNCTION idem_set_owner(biz_type text, owner regrole) RETURNS void
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_set_owner';
COMMENT ON FUNCTION idem_set_owner(text, regrole) IS
'Reserve a business type for the members of a role: only they may claim, finish, look up or forget its keys (42501 for others). NULL opens it to every role again. Keeps the type''s TTL.';
REVOKE EXECUTE ON FUNCTION idem_set_owner(text, regrole) FROM PUBLIC;

CREATE FUNCTION idem_storage_path() RETURNS text
    VOLATILE PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_storage_path';
COMMENT ON FUNCTION idem_storage_path() IS
'How calls in this database on this node reach idem.claims: direct (heap and index access), sql (SQL on idem.claims, idem.storage_access = sql), or citus (idem.claims distributed by Citus: a call on a key runs only on the node holding its shard and reaches the shard directly there; elsewhere it is refused with 0A000).';

-- One-time tokens: issued by the server, spent once (form resubmission).
CREATE FUNCTION idem.random_token() RETURNS text
    VOLATILE STRICT LANGUAGE c AS 'MODULE_PATHNAME', 'idem_random_token';
COMMENT ON FUNCTION idem.random_token() IS '256 bits from PostgreSQL''s CSPRNG (pg_strong_random), as 64 hex digits.';

CREATE TABLE idem.tokens (
    token_sha256 bytea       PRIMARY KEY,
    biz_type     text        NOT NULL,
    issued_at    timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    spent_at     timestamptz
);
COMMENT ON TABLE idem.tokens IS 'One-time tokens, by SHA-256 of the token: the token itself is never stored.';
SELECT pg_catalog.pg_extension_config_dump('idem.tokens', '');

CREATE FUNCTION idem_issue_token(biz_type text, ttl interval DEFAULT '10 minutes') RETURNS text
    VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    token text := idem.random_token();
BEGIN
    IF biz_type IS NULL OR ttl IS NULL THEN
        RAISE EXCEPTION 'idem: biz_type and ttl must not be NULL' USING ERRCODE = '22004';
    END IF;
    PERFORM idem.check_name('biz_type', biz_type);
    -- Counted as idem_claim counts a TTL (extract(epoch ...): a month is 30
    -- days, a year 365.25), not by interval comparison (a year is 360 days).
    IF extract(epoch FROM ttl) < 1 OR extract(epoch FROM ttl) > 400 * 86400 THEN
        RAISE EXCEPTION 'idem: ttl must be between 1 second and 400 days' USING ERRCODE = '22023';
    END IF;
    INSERT INTO idem.tokens (token_sha256, biz_type, issued_at, expires_at)
    VALUES (sha256(convert_to(token, 'UTF8')), biz_type, clock_timestamp(), clock_timestamp() + ttl);
    RETURN token;
END
$fn$;
COMMENT ON FUNCTION idem_issue_token(text, interval) IS
'Issue a one-time token for biz_type (256 bits from a CSPRNG; stored only as its SHA-256), valid for ttl (1 second to 400 days, default 10 minutes).';

CREATE FUNCTION idem_consume_token(token text, biz_type text) RETURNS boolean
    VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    spent boolean;
BEGIN
    IF token IS NULL OR biz_type IS NULL THEN
        RAISE EXCEPTION 'idem: token and biz_type must not be NULL' USING ERRCODE = '22004';
    END IF;
    -- A concurrent consumer of the same token waits on the row and then
    -- finds it spent: true exactly once.
    UPDATE idem.tokens t SET spent_at = clock_timestamp()
     WHERE t.token_sha256 = sha256(convert_to(token, 'UTF8'))
       AND t.biz_type = idem_consume_token.biz_type
       AND t.spent_at IS NULL
       AND t.expires_at > clock_timestamp()
    RETURNING true INTO spent;
    RETURN coalesce(spent, false);
END
$fn$;
COMMENT ON FUNCTION idem_consume_token(text, text) IS
'Spend a one-time token: true exactly once, false for an unknown, expired or already spent token (or one of another biz_type). Part of the caller''s transaction: a rollback un-spends it.';
