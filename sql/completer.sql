-- The completer (src/completer.rs): a C function as in claim.sql, kept apart
-- from the claim module it extends.

CREATE FUNCTION idem_take_expired_leases(biz_type text, max_leases integer DEFAULT 100, lease interval DEFAULT NULL)
RETURNS TABLE (key text, attempt bigint, recovery_point text, recovery_data jsonb, lease_token text,
               lease_until timestamptz, first_claimed_at timestamptz, expires_at timestamptz, claim_id uuid)
    VOLATILE PARALLEL UNSAFE ROWS 10
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_take_expired_leases';
COMMENT ON FUNCTION idem_take_expired_leases(text, integer, interval) IS
'The completer: take over, in the current transaction, up to max_leases (1 to 10000) leases of biz_type that ran out (or were released) with no claim taking them over since, as the next idem_claim would: attempt + 1, a new lease (lease long, 1 second to 400 days, or as long as the last one; a lease past the claim''s expiry ends at the expiry instead of being refused) and token; one row per lease taken, with what a re-drive needs (the recovery point and data, NULL when none; the lease_token for idem_checkpoint/idem_complete/idem_fail, the claim_id). A lease another transaction is taking over meanwhile is passed by, never waited for: of several completers, and of a completer and a duplicate''s idem_claim, exactly one takes each lease. Scans the type''s live claims (as idem_leases does). 42501 for a type reserved for another role, 22023 for a bad biz_type, max_leases or lease (under 1 second or over 400 days), 22004 for NULL, 25006 in a read-only transaction, 0A000 when Citus distributes idem.claims.';
