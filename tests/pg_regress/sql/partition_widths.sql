-- partition_widths: every documented idem.partition_width with claims of
-- every TTL class made at every other width. A claim's class is decided at
-- the width of its time, and its type stays registered in that class; at
-- another width that class can be far wider than any TTL (a 400-day claim
-- made at one minute is in class 34, 2^17 × 100 days wide at 100 days).
-- Claims, idem_maintain and idem_health must all keep working at every
-- width, and every claim must still be found. Business types used here:
-- grid.* (runs last: it leaves partitions of many classes behind).
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idem;
RESET client_min_messages;
\set SHOW_CONTEXT never
\set VERBOSITY sqlstate

-- (Widths and TTLs in microseconds: nothing printed or parsed here may
-- depend on the session's IntervalStyle.)
-- (Few partitions per maintenance run: what is tested is that runs work,
-- and every partition made costs the portable edition's claims a lock.)
SET idem.premake_limit = 16;
-- (idem_maintain runs in READ COMMITTED only, whatever the session's default:
-- the environment matrix runs this file under SERIALIZABLE too.)
SET default_transaction_isolation = 'read committed';
CREATE TEMPORARY TABLE widths (w bigint PRIMARY KEY);
INSERT INTO widths SELECT extract(epoch FROM x::interval) * 1000000
  FROM unnest(ARRAY['100 milliseconds', '1 second', '1 minute', '1 hour', '6 hours', '1 day', '100 days', '400 days']) x;
-- What failed: step, the width of the moment, SQLSTATE and message.
CREATE TEMPORARY TABLE failures (step text, width text, detail text);
-- The claims made, with their expiry.
CREATE TEMPORARY TABLE grid_keys (biz_type text, key text, ttl_us bigint, expires_us numeric);

CREATE FUNCTION pg_temp.try(step text, stmt text) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    ok boolean;
BEGIN
    EXECUTE stmt INTO ok;
    IF ok IS NOT TRUE THEN
        INSERT INTO failures VALUES (step, current_setting('idem.partition_width'), stmt || ': ' || coalesce(ok::text, 'NULL'));
    END IF;
    RETURN ok;
EXCEPTION WHEN OTHERS THEN
    INSERT INTO failures VALUES (step, current_setting('idem.partition_width'), stmt || ': ' || SQLSTATE || ' ' || SQLERRM);
    RETURN false;
END $$;
-- A claim of a key made in step 1 is answered from that claim (claimed is
-- false), unless the claim has expired by the time it answers (then it
-- claims anew). clock_timestamp() after the call is past any moment the
-- call can have judged the expiry at.
CREATE FUNCTION pg_temp.found_again(g grid_keys) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_temp.try('found again',
        format('SELECT NOT c.claimed OR %s <= extract(epoch FROM clock_timestamp()) * 1000000
                  FROM idem_claim(%L, %L, ttl => %s * interval ''1 microsecond'') c', g.expires_us, g.key, g.biz_type, g.ttl_us));
END $$;

-- One transaction per call (as an application makes them): a claim holds
-- the locks of its partitions to its end.
CREATE PROCEDURE pg_temp.grid() LANGUAGE plpgsql AS $$
DECLARE
    wc bigint;
    wm bigint;
    t bigint;
    g grid_keys;
BEGIN
    -- 1. At each width, claims whose TTLs fall into every class that width
    --    has (4 widths of each class, from 1 second to 400 days).
    FOR wc IN SELECT w FROM widths ORDER BY w LOOP
        PERFORM set_config('idem.partition_width', wc || ' microseconds', false);
        FOR t IN SELECT DISTINCT least(greatest(4 * extract(epoch FROM idem.class_width(k)) * 1000000, 1000000), 34560000000000)::bigint
                   FROM generate_series(0, 80) k ORDER BY 1 LOOP
            PERFORM pg_temp.try('claim', format(
                'WITH c AS (SELECT * FROM idem_claim(%L, %L, ttl => %s * interval ''1 microsecond''))
                 INSERT INTO grid_keys SELECT %L, %L, %s, extract(epoch FROM c.expires_at) * 1000000 FROM c WHERE c.claimed
                 RETURNING true', t, 'grid.' || wc, t, 'grid.' || wc, t, t));
            COMMIT;
        END LOOP;
    END LOOP;
    -- 2. At each width: maintenance (twice: the second run finds the
    --    partitions the first made), the health view, the partitions view,
    --    and the 400-day claims (the widest classes) found again.
    FOR wm IN SELECT w FROM widths ORDER BY w LOOP
        PERFORM set_config('idem.partition_width', wm || ' microseconds', false);
        PERFORM pg_temp.try('idem_maintain', $q$SELECT idem_maintain() IS NOT NULL$q$);
        COMMIT;
        PERFORM pg_temp.try('idem_maintain', $q$SELECT idem_maintain() IS NOT NULL$q$);
        COMMIT;
        PERFORM pg_temp.try('idem_health', $q$SELECT count(*) > 0 FROM idem_health$q$);
        PERFORM pg_temp.try('idem_partitions', $q$SELECT count(*) > 0 FROM idem_partitions$q$);
        FOR g IN SELECT * FROM grid_keys WHERE ttl_us = 34560000000000 LOOP
            PERFORM pg_temp.found_again(g);
            COMMIT;
        END LOOP;
    END LOOP;
    -- 3. Back at the default width, every claim of step 1 found again.
    PERFORM set_config('idem.partition_width', '1 minute', false);
    FOR g IN SELECT * FROM grid_keys LOOP
        PERFORM pg_temp.found_again(g);
        COMMIT;
    END LOOP;
END $$;
CALL pg_temp.grid();
RESET idem.partition_width;
RESET idem.premake_limit;
RESET default_transaction_isolation;

-- Every class of every width was claimed: TTLs of 4 widths of each class,
-- and 1 second and 400 days (52 TTLs at 100 ms, 36 at one minute; at 100
-- and 400 days every TTL is class 0).
SELECT w AS width_us, count(*) AS ttls
  FROM widths JOIN grid_keys ON biz_type = 'grid.' || w
 GROUP BY w ORDER BY w;
SELECT step, width, detail FROM failures ORDER BY step, width, detail LIMIT 20;
SELECT count(*) AS failures FROM failures;
-- One live row per key: none was claimed twice.
SELECT count(*) FILTER (WHERE n > 1) AS keys_claimed_twice
  FROM (SELECT count(*) AS n FROM idem.claims WHERE biz_type LIKE 'grid.%' AND expires_at > now() GROUP BY biz_type, key) x;
-- No class is wider than 400 days, nor has a longer TTL, at any width.
CREATE FUNCTION pg_temp.classes_at(w bigint) RETURNS TABLE (k int, width interval, max_ttl interval, next_width interval)
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('idem.partition_width', w || ' microseconds', true);
    RETURN QUERY SELECT g, idem.class_width(g), idem.class_max_ttl(g), idem.class_width(g + 1) FROM generate_series(0, 79) g;
END $$;
SELECT w AS width_us, max(c.width) <= interval '400 days' AS widths_capped,
       max(c.max_ttl) <= interval '400 days' AS ttls_capped,
       bool_and(c.next_width >= c.width) AS widths_grow
  FROM widths, pg_temp.classes_at(w) c
 GROUP BY w ORDER BY w;
-- The partitions: none wider than 400 days (and the millisecond a sliver
-- left by a change of width adds), none narrower than a millisecond (names
-- are to the millisecond: two such ranges of a class could share one).
SELECT count(*) FILTER (WHERE range_to - range_from < interval '1 millisecond') AS narrower_than_1_ms,
       count(*) FILTER (WHERE range_to - range_from >= interval '400 days 1 millisecond') AS wider_than_400_days
  FROM idem.partition_bounds WHERE NOT is_default;
