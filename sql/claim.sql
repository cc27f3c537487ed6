-- The claim API. C functions in the extension's schema, SECURITY DEFINER so
-- that callers need no rights on schema idem. They run no SQL that resolves
-- names through the caller's search_path.

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
    wait        boolean  DEFAULT true
) RETURNS idem_claim_result
    VOLATILE PARALLEL UNSAFE SECURITY DEFINER
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_claim';
COMMENT ON FUNCTION idem_claim(text, text, interval, text, boolean) IS
'Claim (biz_type, key) in the current transaction. First arrival: claimed = true, state = new. Duplicate: claimed = false and the first outcome (completed/failed with its result). Concurrent uncommitted claim: waits for it (wait => true) or returns state = in_progress at once. ttl overrides the type''s TTL; a differing fingerprint raises ID001.';

CREATE FUNCTION idem_complete(key text, biz_type text, result jsonb DEFAULT NULL) RETURNS void
    VOLATILE PARALLEL UNSAFE SECURITY DEFINER
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_complete';
COMMENT ON FUNCTION idem_complete(text, text, jsonb) IS
'Store the outcome of a claim this transaction made; duplicates get result back. ID003 if this transaction holds no claim on the key.';

CREATE FUNCTION idem_fail(key text, biz_type text, error jsonb) RETURNS void
    VOLATILE PARALLEL UNSAFE SECURITY DEFINER
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_fail';
COMMENT ON FUNCTION idem_fail(text, text, jsonb) IS
'Store a deterministic business failure (e.g. insufficient stock) for a claim this transaction made; duplicates get state = failed and the error back. ID003 if this transaction holds no claim on the key.';

CREATE FUNCTION idem_lookup(key text, biz_type text) RETURNS idem_claim_result
    VOLATILE PARALLEL UNSAFE SECURITY DEFINER
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_lookup';
COMMENT ON FUNCTION idem_lookup(text, text) IS
'Read the live claim of (biz_type, key) without claiming or waiting: state absent, in_progress, completed or failed; claimed is always false.';

CREATE FUNCTION idem_forget(key text, biz_type text) RETURNS boolean
    VOLATILE PARALLEL UNSAFE SECURITY DEFINER
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_forget';
COMMENT ON FUNCTION idem_forget(text, text) IS
'Operator eviction: delete the committed claim of (biz_type, key) so that the next arrival claims again. Returns whether a claim was removed.';
REVOKE EXECUTE ON FUNCTION idem_forget(text, text) FROM PUBLIC;

CREATE FUNCTION idem_configure(biz_type text, ttl interval) RETURNS void
    VOLATILE PARALLEL UNSAFE SECURITY DEFINER
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_configure';
COMMENT ON FUNCTION idem_configure(text, interval) IS
'Set the TTL of a business type (1 second to 400 days); NULL returns it to idem.default_ttl. Applies to claims made afterwards.';
REVOKE EXECUTE ON FUNCTION idem_configure(text, interval) FROM PUBLIC;
