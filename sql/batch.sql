-- Claiming a batch of keys in one call (a consumer's poll of 100 to 1,000
-- messages, committed in one transaction): a C function as in claim.sql.

CREATE FUNCTION idem_claim_many(
    keys         text[],
    biz_type     text,
    ttl          interval DEFAULT NULL,
    fingerprints text[]   DEFAULT NULL,
    wait         boolean  DEFAULT true
) RETURNS TABLE (key text, claimed boolean, state text, result jsonb, first_claimed_at timestamptz, expires_at timestamptz)
    VOLATILE PARALLEL UNSAFE ROWS 100
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_claim_many';
COMMENT ON FUNCTION idem_claim_many(text[], text, interval, text[], boolean) IS
'Claim every key of keys (one biz_type) in the current transaction, as idem_claim would one by one; one row per element of keys, in their order: the key, then idem_claim_result''s columns. Keys are claimed in the order of their bytes, so two batches with keys in common never deadlock; a key given twice is claimed by its first element and answered in_progress for the later one. fingerprints, when given, has one element (or NULL) per key. No leases (claim leased work with idem_claim); a lease that ran out is taken over as a plain claim, as by idem_claim without lease. 22004 for NULL keys or a NULL element, 22023 for a bad key or a fingerprints array of another length, ID001 for a fingerprint mismatch (the whole statement fails). 0A000 when Citus distributes idem.claims: claim each key with idem_claim.';
