-- What idem.key_hash, idem_claim_id, idem.ttl_class, idem.class_width and
-- idem.class_max_ttl return on a fixed set of inputs, one line each, for
-- tests/scenarios/editions.sh portable to compare between the editions (run as a
-- superuser: it sets idem.partition_width). The keys include multi-byte
-- UTF-8 (2, 3 and 4 bytes a character), the empty string, 1024-byte keys,
-- 64-character types, every length from 0 to 80 (SHA-256 pads a message
-- of 56 bytes or more into a second block) and backslashes (the portable
-- digest reads a key's bytes through bytea's escape format).
\pset footer off
SELECT 'key_hash|' || t || '|' || md5(k) || '|' || octet_length(k) || '|' || idem.key_hash(t, k)
  FROM (SELECT 'payment' AS t, 'req-42' AS k
        UNION ALL SELECT 'a', ''
        UNION ALL SELECT 'x', repeat('k', 1024)
        UNION ALL SELECT 'x', repeat('é', 512)
        UNION ALL SELECT 'x', repeat('€', 341) || 'a'
        UNION ALL SELECT 'x', repeat('😀', 256)
        UNION ALL SELECT repeat('t', 64), repeat('z', 1023)
        UNION ALL SELECT 'len', left(repeat('abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGH', 2), n) FROM generate_series(0, 80) n
        UNION ALL SELECT 'bs', chr(92) || 'x4142' UNION ALL SELECT 'bs', 'a' || chr(92) || chr(92) || 'b' || chr(92)
        UNION ALL SELECT 'bs', repeat(chr(92), 1024) UNION ALL SELECT 'bs', chr(92) || '000' || chr(92) || '377é'
        UNION ALL SELECT 'type.' || (g % 64), left(md5(g::text) || repeat('ü€😀', g % 9), g % 45) FROM generate_series(1, 2000) g
        UNION ALL SELECT repeat('T', 1 + g % 64), repeat(chr(160 + g), g) FROM generate_series(1, 300) g
        UNION ALL SELECT 'ab', 'c' UNION ALL SELECT 'a', 'bc') s
 ORDER BY 1;
-- idem_claim_id on the same keys, at times from 2000 (0 microseconds) on,
-- before it (negative), and to the microsecond.
SELECT 'claim_id|' || t || '|' || md5(k) || '|' || extract(epoch FROM at) || '|' || idem_claim_id(k, t, at)
  FROM (SELECT 'payment' AS t, 'req-42' AS k
        UNION ALL SELECT 'x', repeat('😀', 256)
        UNION ALL SELECT repeat('t', 64), repeat('z', 1023)
        UNION ALL SELECT 'type.' || (g % 64), left(md5(g::text) || repeat('ü€😀', g % 9), g % 45) FROM generate_series(1, 200) g) s,
       (VALUES (timestamptz '2000-01-01 00:00:00+00'), ('1999-12-31 23:59:59.999999+00'), ('2026-12-06 01:02:03.456789+00')) v(at)
 ORDER BY 1;
CREATE TEMP TABLE widths (w text);
INSERT INTO widths VALUES ('1 minute'), ('100 milliseconds'), ('7 seconds'), ('13 minutes'), ('1 day'), ('400 days');
CREATE FUNCTION pg_temp.classes(w text) RETURNS SETOF text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('idem.partition_width', w, true);
    RETURN QUERY SELECT 'ttl_class|' || w || '|' || i || '|' || idem.ttl_class(i)
      FROM (SELECT make_interval(secs => g * g * 0.731) AS i FROM generate_series(0, 3000) g
            UNION ALL SELECT x::interval FROM unnest(ARRAY['1 second', '239.999999 seconds', '4 minutes', '1 day',
                 '30 days', '1 mon', '1 year', '400 days', '-5 days', '1000 years', '1 mon 3 days 4 hours']) x) s;
    RETURN QUERY SELECT 'class|' || w || '|' || k || '|' || coalesce(idem.class_width(k)::text, 'NULL')
                        || '|' || coalesce(idem.class_max_ttl(k)::text, 'NULL')
      FROM generate_series(-2, 82) k;
END
$$;
BEGIN;
SELECT c FROM widths, pg_temp.classes(w) c ORDER BY 1;
COMMIT;
-- The counters, off in both (the native server compared with does not
-- preload idem, as the suite's cluster does not).
SELECT 'metrics|' || row_to_json(m)::text FROM idem_metrics m;
SELECT 'metrics_info|' || row_to_json(m)::text FROM idem.metrics_info() m;
SELECT 'metrics_database|' || row_to_json(m)::text FROM idem.metrics_database() m;
SELECT 'metrics_types|' || count(*) FROM idem.metrics_types();
SELECT 'metrics_release|' || idem.metrics_release('x') || '|' || idem.metrics_release_dropped();
