-- The portable edition's bodies for the C functions of sql/storage.sql
-- (scripts/portable.py puts each `-- @body NAME` block in place of
-- `LANGUAGE c AS 'MODULE_PATHNAME', 'NAME'`; `-- @helpers` blocks go at the
-- start of the module, after schema idem exists). Everything here must give
-- exactly what the native functions give: tests/scenarios/editions.sh portable
-- compares them on the same inputs.

-- @helpers after: COMMENT ON SCHEMA idem
-- An interval in microseconds, counted as the native edition counts it
-- (extract(epoch ...): a day is 24 hours, a month 30 days, a year 365.25
-- days), as numeric so that no interval overflows.
CREATE FUNCTION idem.interval_us(i interval) RETURNS numeric
    IMMUTABLE STRICT LANGUAGE sql AS $fn$
    SELECT extract(epoch FROM i) * 1000000
$fn$;
COMMENT ON FUNCTION idem.interval_us(interval) IS 'An interval in microseconds, a month counted as 30 days and a year as 365.25 (extract(epoch ...)).';

-- A setting of the native edition's as a number of microseconds. Without
-- the library PostgreSQL keeps idem.* settings as unchecked text, so the
-- value is checked here, where it is read (22023 for a bad one).
--
-- idem.partition_width decides which partitions every role's claims go
-- into and which classes maintenance keeps; the native edition lets only a
-- superuser set it. Without the library any role can SET a placeholder
-- (or pass it when it connects), so here it is read from the session only
-- when the caller is a superuser; for everyone else it is the database's
-- stored setting (ALTER DATABASE ... SET), or the default.
--
-- No SET search_path of its own: every caller (idem_claim, idem.ttl_class,
-- idem.class_width, idem.class_max_ttl) pins it, and the SET clause cost
-- each claim a save and restore of the setting (portable/claim.sql).
CREATE FUNCTION idem.setting_us(setting text, fallback interval, min_us numeric, max_us numeric) RETURNS bigint
    STABLE LANGUAGE plpgsql AS $fn$
DECLARE
    raw text;
    us numeric;
    caller name;
BEGIN
    IF setting = 'idem.partition_width' THEN
        -- (the caller once, not once per row of pg_roles)
        caller := idem.caller_role();
    END IF;
    IF setting = 'idem.partition_width'
       AND NOT coalesce((SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = caller), false) THEN
        SELECT substr(c, length(setting) + 2) INTO raw
          FROM pg_db_role_setting s, unnest(s.setconfig) c
         WHERE s.setdatabase = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
           AND s.setrole = 0 AND left(c, length(setting) + 1) = setting || '=';
    ELSE
        raw := current_setting(setting, true);
    END IF;
    IF raw IS NULL OR raw = '' THEN
        RETURN idem.interval_us(fallback)::bigint;
    END IF;
    BEGIN
        us := idem.interval_us(raw::interval);
    EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow THEN
        us := NULL;
    END;
    IF us IS NULL OR us < min_us OR us > max_us THEN
        RAISE EXCEPTION 'invalid value for parameter "%": "%"', setting, raw
            USING ERRCODE = '22023',
                  DETAIL = format('It must be an interval from %s to %s.',
                                  CASE min_us WHEN 100000 THEN '100 milliseconds' ELSE '1 second' END, '400 days');
    END IF;
    RETURN us::bigint;
END
$fn$;
COMMENT ON FUNCTION idem.setting_us(text, interval, numeric, numeric) IS 'An interval setting (idem.default_ttl, idem.partition_width) in microseconds, checked: 22023 for a value the native edition would refuse to SET.';

-- Microseconds as an interval of hours and microseconds only (no days), as
-- the native edition makes it; whole hours first, so that interval input
-- never reads a number too long for exact parsing.
CREATE FUNCTION idem.us_interval(us numeric) RETURNS interval
    IMMUTABLE STRICT LANGUAGE plpgsql AS $fn$
BEGIN
    RETURN (div(us, 3600000000)::text || ' hours ' || mod(us, 3600000000)::text || ' microseconds')::interval;
END
$fn$;
COMMENT ON FUNCTION idem.us_interval(numeric) IS 'A number of microseconds as an interval of hours and microseconds (no days or months).';

-- The width of TTL class k for a class-0 width of unit microseconds
-- (src/ttl_class.rs, width_at: round(unit * 2^(k/2)), at most 400 days).
CREATE FUNCTION idem.width_at(unit bigint, k int) RETURNS numeric
    IMMUTABLE STRICT LANGUAGE plpgsql AS $fn$
DECLARE
    w float8 := unit::float8 * power(2::float8, k::float8 / 2.0::float8);
BEGIN
    RETURN CASE WHEN w >= 34560000000000::float8 THEN 34560000000000::numeric
                -- half away from zero, as Rust's f64::round; float8 to
                -- bigint is exact, float8 to numeric is not
                WHEN w - trunc(w) = 0.5 THEN (trunc(w) + 1)::bigint::numeric
                ELSE round(w)::bigint::numeric END;
END
$fn$;
COMMENT ON FUNCTION idem.width_at(bigint, int) IS 'The width in microseconds of TTL class k when class 0 is unit microseconds wide.';

-- The TTL class of a TTL of us microseconds (at most 400 days) when class 0
-- is unit microseconds wide: the largest k <= 80 whose classes 1..k all
-- have 4 × width <= us (src/ttl_class.rs counts k up one by one). Widths
-- grow with k by about the square root of 2, so k is about 2 log2(us / (4
-- unit)), computed first, then moved while a rounded width says otherwise:
-- two widths computed for a claim instead of a search's seven
-- (docs/portable.md, "Speed"). idem.claim_class calls it with the width it
-- read once; idem.ttl_class for one TTL.
CREATE FUNCTION idem.class_of(unit bigint, us numeric) RETURNS smallint
    IMMUTABLE STRICT LANGUAGE plpgsql AS $fn$
DECLARE
    k int := least(80, greatest(0, floor(2 * ln(greatest(us, 1)::float8 / (4 * unit)::float8) / ln(2::float8))));
BEGIN
    WHILE k < 80 AND idem.width_at(unit, k + 1) * 4 <= us LOOP
        k := k + 1;
    END LOOP;
    WHILE k > 0 AND idem.width_at(unit, k) * 4 > us LOOP
        k := k - 1;
    END LOOP;
    RETURN k;
END
$fn$;
COMMENT ON FUNCTION idem.class_of(bigint, numeric) IS 'The TTL class of a TTL of us microseconds when class 0 is unit microseconds wide (idem.ttl_class at a given idem.partition_width).';
-- @end

-- @body idem_key_digest
-- The first 8 bytes of PostgreSQL's own sha256() (C) of what the native
-- function hashes (src/key.rs): the type's length (one byte), the type and
-- the key, as the bytes the database stores (the text to bytea cast with
-- every backslash doubled reads them back byte for byte, in any server
-- encoding). One PL/pgSQL expression, whose plan the session keeps: as a
-- SQL function PostgreSQL would inline it, and then compile the whole
-- expression again in every statement that uses it (the probe's filter on
-- each partition, the index expression of each insert), 0.1 M
-- instructions more per new key (docs/performance.md, "Portable
-- edition"). Every name is qualified, so the caller's search_path cannot
-- change it, without the cost of a SET clause on every call.
LANGUAGE plpgsql AS $fn$
BEGIN
    RETURN CAST(CAST(pg_catalog.textcat('x', pg_catalog.encode(pg_catalog.substr(pg_catalog.sha256(pg_catalog.byteacat(
               pg_catalog.substr(pg_catalog.int4send(pg_catalog.octet_length(biz_type)), 4),
               CAST(pg_catalog.replace(pg_catalog.textcat(biz_type, key), pg_catalog.chr(92), pg_catalog.repeat(pg_catalog.chr(92), 2))
                    AS pg_catalog.bytea))), 1, 8), 'hex')) AS pg_catalog.bit(64)) AS pg_catalog.int8);
END
$fn$;
-- @end

-- @body idem_ttl_class
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    -- (A TTL beyond 400 days, which no claim has, counts as 400 days.)
    RETURN idem.class_of(idem.setting_us('idem.partition_width', interval '1 minute', 100000, 34560000000000),
                         least(idem.interval_us(ttl), 34560000000000));
END
$fn$;
-- @end

-- @body idem_class_width
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    unit bigint := idem.setting_us('idem.partition_width', interval '1 minute', 100000, 34560000000000);
BEGIN
    IF ttl_class < 0 OR ttl_class > 80 THEN
        RETURN NULL;
    END IF;
    RETURN idem.us_interval(idem.width_at(unit, ttl_class));
END
$fn$;
-- @end

-- @body idem_class_max_ttl
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    unit bigint := idem.setting_us('idem.partition_width', interval '1 minute', 100000, 34560000000000);
BEGIN
    IF ttl_class < 0 OR ttl_class > 80 THEN
        RETURN NULL;
    END IF;
    RETURN idem.us_interval(least(idem.width_at(unit, ttl_class + 1) * 4 - 1, 34560000000000));
END
$fn$;
-- @end

-- Partition bounds: the native functions read the bound in binary; here it
-- is read from pg_get_expr's text under pinned DateStyle and TimeZone, so no
-- session setting changes what is parsed.
-- @helpers
CREATE FUNCTION idem.partition_bound(partition regclass, OUT ttl_class smallint, OUT lo timestamptz, OUT hi timestamptz)
    STABLE STRICT LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp SET DateStyle = 'ISO, YMD' SET TimeZone = 'UTC' AS $fn$
DECLARE
    bound text;
    parts text[];
BEGIN
    SELECT pg_get_expr(c.relpartbound, c.oid) INTO bound FROM pg_class c WHERE c.oid = partition;
    IF bound IS NULL OR bound = 'DEFAULT' THEN
        RETURN;
    END IF;
    -- An escape string: its backslashes mean the same whatever the
    -- caller's standard_conforming_strings (the body is parsed under it).
    parts := regexp_match(bound, E'^FOR VALUES FROM \\(''(-?[0-9]+)'', ''([^'']+)''\\) TO \\(''(-?[0-9]+)'', ''([^'']+)''\\)$');
    IF parts IS NULL THEN
        RAISE EXCEPTION 'idem: internal error: % is not a partition of idem.claims by (ttl_class, expires_at): %', partition, bound
            USING ERRCODE = 'XX000';
    END IF;
    IF parts[1] <> parts[3] THEN
        RAISE EXCEPTION 'idem: internal error: a partition of idem.claims spans more than one TTL class'
            USING ERRCODE = 'XX000';
    END IF;
    ttl_class := parts[1]::smallint;
    lo := parts[2]::timestamptz;
    hi := parts[4]::timestamptz;
END
$fn$;
COMMENT ON FUNCTION idem.partition_bound(regclass) IS 'TTL class and expiry range of a partition of idem.claims, parsed from its bound under pinned settings (NULLs for the default partition).';
-- @end

-- @body idem_partition_from
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT (idem.partition_bound(partition)).lo
$fn$;
-- @end

-- @body idem_partition_to
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT (idem.partition_bound(partition)).hi
$fn$;
-- @end

-- @body idem_partition_class
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT (idem.partition_bound(partition)).ttl_class
$fn$;
-- @end
