-- Portable body of sql/completer.sql's C function (scripts/portable.py).

-- @body idem_take_expired_leases
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    lease_us bigint;
    c record;
    h bigint;
    p record;
    t_now timestamptz;
    taken int := 0;
BEGIN
    PERFORM idem.check_biz_type(biz_type);
    IF max_leases IS NULL THEN
        PERFORM idem.fail_with('22004', 'idem: max_leases must not be NULL');
    END IF;
    IF max_leases < 1 OR max_leases > 10000 THEN
        PERFORM idem.fail_with('22023', 'idem: max_leases must be between 1 and 10000');
    END IF;
    lease_us := idem.checked_ttl_us(lease, 'lease');
    PERFORM idem.require_writable('idem_take_expired_leases');
    PERFORM idem.admit(biz_type);
    -- (src/completer.rs: the scan, then each key as protocol::take_expired.)
    FOR c IN SELECT cl.key AS k FROM idem.claims cl
              WHERE cl.biz_type = idem_take_expired_leases.biz_type AND cl.state = 'l'
                AND cl.expires_at > clock_timestamp()
                AND (cl.result ->> 'lease_until_us')::bigint <= idem.us_since_2000(clock_timestamp())
              ORDER BY (cl.result ->> 'lease_until_us')::bigint LOOP
        EXIT WHEN taken >= max_leases;
        h := idem.key_hash(biz_type, c.k);
        -- Seen without the gate first, as idem_claim does; gated, seen again.
        p := idem.probe(h, biz_type, c.k, clock_timestamp(), NULL);
        CONTINUE WHEN NOT p.present OR p.state <> 'l' OR p.own;
        PERFORM idem.check_lease(p.result);
        CONTINUE WHEN idem.lease_until(p.result) > clock_timestamp();
        IF NOT p.gated THEN
            -- Another transaction is taking it over: passed by, not waited for.
            CONTINUE WHEN NOT idem.take_gate(h, false);
            p := idem.probe(h, biz_type, c.k, clock_timestamp(), p.versions);
            CONTINUE WHEN NOT p.present OR p.state <> 'l' OR p.own;
            PERFORM idem.check_lease(p.result);
        END IF;
        t_now := clock_timestamp();
        CONTINUE WHEN idem.lease_until(p.result) > t_now;
        key := c.k;
        attempt := (p.result ->> 'attempt')::bigint + 1;
        recovery_point := p.result ->> 'recovery_point';
        recovery_data := CASE WHEN jsonb_typeof(p.result -> 'recovery_data') = 'null' THEN NULL ELSE p.result -> 'recovery_data' END;
        lease_token := idem.random_hex(16);
        lease_until := least(t_now + idem.us_interval(coalesce(lease_us, (p.result ->> 'lease_us')::bigint)), p.expires_at);
        first_claimed_at := p.claimed_at;
        expires_at := p.expires_at;
        claim_id := @extschema@.idem_claim_id(c.k, biz_type, p.claimed_at);
        PERFORM idem.rewrite_claim(h, p.part, p.tid, 'l',
            idem.lease_doc(attempt, coalesce(lease_us, (p.result ->> 'lease_us')::bigint), lease_until,
                           idem.sha256_hex(lease_token), p.result -> 'recovery_point', p.result -> 'recovery_data',
                           p.result -> 'previous_error'));
        taken := taken + 1;
        RETURN NEXT;
    END LOOP;
END
$fn$;
-- @end
