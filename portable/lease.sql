-- Portable bodies of sql/lease.sql's C functions (scripts/portable.py).

-- @body idem_release
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    PERFORM idem.check_claim_key(key, biz_type);
    PERFORM idem.finish('idem_release', key, biz_type, 'l', NULL, NULL, NULL, lease_token);
END
$fn$;
-- @end
