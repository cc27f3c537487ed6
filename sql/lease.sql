-- Handing a lease back: C functions as in claim.sql (src/api.rs names each
-- argument's position), kept apart from the claim module they extend.

CREATE FUNCTION idem_release(key text, biz_type text, lease_token text DEFAULT NULL) RETURNS void
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_release';
COMMENT ON FUNCTION idem_release(text, text, text) IS
'End a lease early, after a transient failure: pass the lease_token idem_claim returned (or call it in the transaction that took the lease). The claim stays leased but has run out, so the next idem_claim takes it over at once (attempt + 1, recovery point and data kept); the token is spent, and its later use raises ID003. ID003 also for a claim that is not leased, or leased to another owner.';
