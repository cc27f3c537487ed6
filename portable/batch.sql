-- Portable bodies of sql/batch.sql's C functions (scripts/portable.py).

-- @body idem_claim_many
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    -- 1-based copies, whatever the bounds the caller's arrays have.
    ks text[];
    fps text[];
    done @extschema@.idem_claim_result[];
    i int;
BEGIN
    IF keys IS NULL THEN
        PERFORM idem.fail_with('22004', 'idem: keys must not be NULL');
    END IF;
    PERFORM idem.check_biz_type(biz_type);
    IF array_ndims(keys) > 1 THEN
        PERFORM idem.fail_with('22023', 'idem: keys must be a one-dimensional array');
    END IF;
    IF array_ndims(fingerprints) > 1 THEN
        PERFORM idem.fail_with('22023', 'idem: fingerprints must be a one-dimensional array');
    END IF;
    IF fingerprints IS NOT NULL AND cardinality(fingerprints) <> cardinality(keys) THEN
        PERFORM idem.fail_with('22023', 'idem: fingerprints must have one element per key (NULL for a key without one)');
    END IF;
    PERFORM idem.checked_ttl_us(ttl, 'ttl');
    ks := ARRAY(SELECT u.k FROM unnest(keys) WITH ORDINALITY AS u(k, n) ORDER BY u.n);
    fps := ARRAY(SELECT u.f FROM unnest(fingerprints) WITH ORDINALITY AS u(f, n) ORDER BY u.n);
    FOR i IN 1 .. cardinality(ks) LOOP
        PERFORM idem.check_claim_key(ks[i], biz_type);
    END LOOP;
    -- (refused here, in its own name, before idem_claim would refuse the
    -- first key in its name)
    PERFORM idem.require_writable('idem_claim_many');
    -- In the order of the keys' bytes, the first of equal keys first (as
    -- the native edition: src/api.rs, claim_many).
    FOR i IN SELECT u.n FROM unnest(ks) WITH ORDINALITY AS u(k, n) ORDER BY u.k COLLATE "C", u.n LOOP
        done[i] := @extschema@.idem_claim(ks[i], biz_type, ttl, fps[i], wait);
    END LOOP;
    RETURN QUERY
        SELECT ks[u.n], (done[u.n]).claimed, (done[u.n]).state, (done[u.n]).result,
               (done[u.n]).first_claimed_at, (done[u.n]).expires_at
          FROM generate_series(1, cardinality(ks)) AS u(n) ORDER BY u.n;
END
$fn$;
-- @end
