-- A canonical description of everything the extension owns, one row per
-- object, so that two databases (a fresh install and an upgraded one) can be
-- compared with diff. OIDs and object order do not appear.
WITH members AS (
  SELECT classid, objid FROM pg_depend d
  JOIN pg_extension e ON e.oid = d.refobjid AND d.refclassid = 'pg_extension'::regclass
  WHERE e.extname = 'idem' AND d.deptype = 'e'
)
SELECT 'function ' || p.oid::regprocedure || E'\n' || pg_get_functiondef(p.oid)
       || E'\nacl ' || coalesce(p.proacl::text, '-')
       || E'\ncomment ' || coalesce(obj_description(p.oid, 'pg_proc'), '-')
FROM members m JOIN pg_proc p ON m.classid = 'pg_proc'::regclass AND p.oid = m.objid
UNION ALL
SELECT 'relation ' || c.oid::regclass || ' kind ' || c.relkind::text
       || ' persistence ' || c.relpersistence::text
       || ' replica identity ' || c.relreplident::text
       || coalesce(' partition of ' || (SELECT i.inhparent::regclass::text FROM pg_inherits i WHERE i.inhrelid = c.oid), '')
       || coalesce(' bound ' || pg_get_expr(c.relpartbound, c.oid), '')
       || coalesce(' partkey ' || pg_get_partkeydef(c.oid), '')
       || E'\ncolumns ' || coalesce((SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
                                     || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
                                     || coalesce(' default ' || pg_get_expr(ad.adbin, ad.adrelid), ''), ', ' ORDER BY a.attnum)
                               FROM pg_attribute a LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
                               WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '-')
       || E'\nconstraints ' || coalesce((SELECT string_agg(co.conname || ' ' || pg_get_constraintdef(co.oid), '; ' ORDER BY co.conname)
                                   FROM pg_constraint co WHERE co.conrelid = c.oid), '-')
       || E'\nindexes ' || coalesce((SELECT string_agg(pg_get_indexdef(ix.indexrelid), '; ' ORDER BY 1)
                               FROM pg_index ix WHERE ix.indrelid = c.oid), '-')
       || E'\ntriggers ' || coalesce((SELECT string_agg(pg_get_triggerdef(t.oid) || ' enabled ' || t.tgenabled::text, '; ' ORDER BY t.tgname)
                                FROM pg_trigger t WHERE t.tgrelid = c.oid AND NOT t.tgisinternal), '-')
       || E'\nview ' || CASE WHEN c.relkind = 'v' THEN pg_get_viewdef(c.oid) ELSE '-' END
       || E'\nacl ' || coalesce(c.relacl::text, '-')
       || E'\ncomment ' || coalesce(obj_description(c.oid, 'pg_class'), '-')
FROM members m JOIN pg_class c ON m.classid = 'pg_class'::regclass AND c.oid = m.objid
UNION ALL
SELECT 'type ' || t.oid::regtype || ' kind ' || t.typtype::text
       || E'\nattributes ' || coalesce((SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attnum)
                                  FROM pg_attribute a WHERE a.attrelid = t.typrelid AND a.attnum > 0), '-')
       || E'\ncomment ' || coalesce(obj_description(t.oid, 'pg_type'), '-')
FROM members m JOIN pg_type t ON m.classid = 'pg_type'::regclass AND t.oid = m.objid
UNION ALL
SELECT 'schema ' || n.nspname || ' acl ' || coalesce(n.nspacl::text, '-')
       || E'\ncomment ' || coalesce(obj_description(n.oid, 'pg_namespace'), '-')
FROM members m JOIN pg_namespace n ON m.classid = 'pg_namespace'::regclass AND n.oid = m.objid
UNION ALL
SELECT 'member ' || pg_describe_object(m.classid, m.objid, 0)
FROM members m WHERE m.classid NOT IN ('pg_proc'::regclass, 'pg_class'::regclass, 'pg_type'::regclass, 'pg_namespace'::regclass)
UNION ALL
SELECT 'config dump ' || string_agg(u.rel::regclass::text || ' where ' || coalesce(nullif(u.cond, ''), '-'), ', ' ORDER BY u.rel::regclass::text)
FROM pg_extension e, unnest(e.extconfig, e.extcondition) AS u(rel, cond) WHERE e.extname = 'idem'
ORDER BY 1;
