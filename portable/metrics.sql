-- The portable edition's counters: none. They live in shared memory, which
-- only a preloaded library has, so these behave exactly as the native
-- edition's do without shared_preload_libraries = 'idem': idem_metrics
-- shows one row whose note says the counters are off, and the rest report
-- nothing (docs/portable.md).

-- @body idem_metrics
LANGUAGE sql AS $fn$
    SELECT NULL::text, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint,
           NULL::double precision, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint,
           NULL::bigint, NULL::timestamptz,
           'counters are off: idem is not in shared_preload_libraries. Add it (shared_preload_libraries = ''idem'', or append it to the list there) and restart the server to count claims, duplicates, waits and errors per business type'::text
$fn$;
-- @end

-- @body idem_metrics_info
LANGUAGE sql AS $fn$
    SELECT false, NULL::int, NULL::int, NULL::boolean
$fn$;
-- @end

-- @body idem_metrics_database
LANGUAGE sql AS $fn$
    SELECT NULL::int, NULL::int, NULL::bigint
$fn$;
-- @end

-- @body idem_metrics_types
LANGUAGE sql AS $fn$
    SELECT NULL::text, NULL::timestamptz WHERE false
$fn$;
-- @end

-- @body idem_metrics_release
LANGUAGE sql AS $fn$
    SELECT false
$fn$;
-- @end

-- @body idem_metrics_release_dropped
LANGUAGE sql AS $fn$
    SELECT 0
$fn$;
-- @end

-- @body idem_metrics_reset
LANGUAGE sql AS $fn$
    SELECT
$fn$;
-- @end
