-- The public signatures of the idem extension in this database, one line
-- each, for tests/scenarios/editions.sh portable to compare between the editions:
-- every function, view and type of the extension outside schema idem (its
-- API) with argument names, types, defaults and result; and the functions
-- in schema idem, which the portable edition must have too (it may have
-- more there: its helpers).
WITH ext AS (
  SELECT d.classid, d.objid FROM pg_depend d
   WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
     AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idem')
)
SELECT line FROM (
  SELECT CASE WHEN n.nspname = 'idem' THEN 'internal ' ELSE '' END
         || 'function ' || CASE WHEN n.nspname = 'idem' THEN 'idem.' ELSE '' END || p.proname
         || '(' || pg_get_function_arguments(p.oid) || ') returns ' || pg_get_function_result(p.oid)
         || ' ' || CASE p.provolatile WHEN 'i' THEN 'immutable' WHEN 's' THEN 'stable' ELSE 'volatile' END
         || CASE WHEN p.proisstrict THEN ' strict' ELSE '' END
         || CASE WHEN has_function_privilege('public', p.oid, 'EXECUTE') THEN '' ELSE ' (no PUBLIC execute)' END AS line
    FROM ext JOIN pg_proc p ON ext.classid = 'pg_proc'::regclass AND p.oid = ext.objid
    JOIN pg_namespace n ON n.oid = p.pronamespace
  UNION ALL
  SELECT 'view ' || c.relname || '(' || string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attnum) || ')'
    FROM ext JOIN pg_class c ON ext.classid = 'pg_class'::regclass AND c.oid = ext.objid AND c.relkind = 'v'
    JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname <> 'idem'
    JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
   GROUP BY c.relname
  UNION ALL
  SELECT 'type ' || t.typname || '(' || string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attnum) || ')'
    FROM ext JOIN pg_type t ON ext.classid = 'pg_type'::regclass AND t.oid = ext.objid
    JOIN pg_namespace n ON n.oid = t.typnamespace AND n.nspname <> 'idem'
    JOIN pg_attribute a ON a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped
   GROUP BY t.typname
) s ORDER BY line;
