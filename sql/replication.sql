-- Logical replication and CDC: which publications include idem's tables,
-- and what in them would stop a subscriber or lose claim updates there.
-- docs/design.md §12 has the reasoning, docs/operations.md ("Logical
-- replication and CDC") the set-ups.

-- The tables of schema idem each publication publishes, as
-- pg_publication_tables shows them, leaving out a publication dropped while
-- it is read. pg_publication_tables looks each publication of the
-- statement's snapshot up by name in the newest catalog, and raises 42704
-- for one dropped in between: read as one query, that would fail a
-- maintenance run or a monitoring scrape over a publication that no
-- longer exists. One publication at a time here, each in its own block.
CREATE FUNCTION idem.published_tables() RETURNS TABLE (pubname name, tablename name, attnames name[])
    STABLE LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    pub name;
BEGIN
    FOR pub IN SELECT p.pubname FROM pg_publication p ORDER BY p.pubname LOOP
        BEGIN
            RETURN QUERY SELECT t.pubname, t.tablename, t.attnames FROM pg_publication_tables t
                          WHERE t.pubname = pub AND t.schemaname = 'idem';
        EXCEPTION WHEN undefined_object THEN
            NULL; -- dropped meanwhile: it publishes nothing any more
        END;
    END LOOP;
END
$fn$;
COMMENT ON FUNCTION idem.published_tables() IS
'The tables of schema idem that each publication publishes (as pg_publication_tables shows them), without failing when a publication is dropped while they are read.';

-- One row per problem, none when every publication is fine. idem_maintain
-- raises a WARNING with these, the view idem_publications lists them.
-- SECURITY DEFINER: it reads idem.partition_bounds, and a monitoring role
-- granted SELECT on idem_publications needs nothing in schema idem. It
-- reads catalogs only, and shows what pg_publication_tables shows anyone.
CREATE FUNCTION idem.publication_problems() RETURNS TABLE (publication name, problem text)
    STABLE SECURITY DEFINER LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $fn$
WITH published AS (
    -- the tables of schema idem each publication publishes, as a subscriber
    -- sees them (with publish_via_partition_root, idem.claims itself;
    -- without, its partitions)
    SELECT p.pubname, p.pubupdate, p.pubdelete, c.oid AS relid, c.relname, t.attnames,
           c.oid IN (SELECT partition FROM idem.partition_bounds) AS is_partition
      FROM pg_publication p
      JOIN idem.published_tables() t ON t.pubname = p.pubname
      JOIN pg_class c ON c.relname = t.tablename AND c.relnamespace = 'idem'::regnamespace
), claims AS (
    SELECT DISTINCT pubname, pubupdate, pubdelete FROM published
     WHERE relid = 'idem.claims'::regclass OR is_partition
)
SELECT pubname, 'publishes the partitions of idem.claims under their own names (publish_via_partition_root = false): '
                || 'a subscriber lacks the partitions idem_maintain makes later, and its apply worker stops or skips their rows. '
                || format('Fix: ALTER PUBLICATION %I SET (publish_via_partition_root = true)', pubname)
                || ', then ALTER SUBSCRIPTION ... REFRESH PUBLICATION on each subscriber'
  FROM published WHERE is_partition GROUP BY pubname
UNION ALL
SELECT cl.pubname, format('%s has no REPLICA IDENTITY FULL: the SQL path cannot update or delete its claims, '
                          || 'and the direct path''s updates reach subscribers unmatched. Fix: SELECT idem_maintain()', r.rel)
  FROM claims cl
  CROSS JOIN idem.replica_identity_missing r
 WHERE cl.pubupdate OR cl.pubdelete
UNION ALL
SELECT cl.pubname, 'publishes idem.claims without '
                   || CASE WHEN NOT cl.pubupdate AND NOT cl.pubdelete THEN 'updates and deletes'
                           WHEN NOT cl.pubupdate THEN 'updates' ELSE 'deletes' END
                   || ': on a subscriber, finished claims stay unfinished, or forgotten and moved ones stay'
  FROM claims cl
 WHERE NOT (cl.pubupdate AND cl.pubdelete)
UNION ALL
SELECT cl.pubname, format('publishes idem.claims without idem.type_classes: a subscriber that takes over claims would not look for '
                          || 'the claims it received in their partitions. Fix: ALTER PUBLICATION %I ADD TABLE idem.type_classes', cl.pubname)
  FROM claims cl
 WHERE NOT EXISTS (SELECT 1 FROM published pb WHERE pb.pubname = cl.pubname AND pb.relname = 'type_classes')
UNION ALL
SELECT pb.pubname, format('publishes only some columns of idem.%I (a column list): subscribers get incomplete rows, '
                          || 'and updates and deletes of a table whose replica identity is not covered are refused', pb.relname)
  FROM published pb
 WHERE pb.attnames IS NOT NULL
   AND cardinality(pb.attnames) < (SELECT count(*) FROM pg_attribute a
                                    WHERE a.attrelid = pb.relid AND a.attnum > 0 AND NOT a.attisdropped)
$fn$;
COMMENT ON FUNCTION idem.publication_problems() IS
'Problems of the publications that include tables of schema idem: one row per problem, none when all is well.';

CREATE VIEW idem_publications AS
WITH published AS (SELECT * FROM idem.published_tables())
SELECT p.pubname AS publication,
       p.puballtables AS all_tables,
       p.pubviaroot AS via_root,
       array_to_string(ARRAY[CASE WHEN p.pubinsert THEN 'insert' END, CASE WHEN p.pubupdate THEN 'update' END,
                             CASE WHEN p.pubdelete THEN 'delete' END, CASE WHEN p.pubtruncate THEN 'truncate' END], ', ') AS publishes,
       (SELECT array_agg(format('idem.%I', t.tablename) ORDER BY t.tablename)
          FROM published t WHERE t.pubname = p.pubname) AS tables,
       coalesce((SELECT array_agg(r.problem ORDER BY r.problem) FROM idem.publication_problems() r
                  WHERE r.publication = p.pubname), '{}') AS problems
  FROM pg_publication p
 WHERE EXISTS (SELECT 1 FROM published t WHERE t.pubname = p.pubname)
 ORDER BY 1;
COMMENT ON VIEW idem_publications IS
'Publications that include tables of schema idem: what they publish, which idem tables, and what would stop a subscriber or lose claim updates there (problems; empty when fine).';

-- A publication FOR ALL TABLES publishes idem's tables from the moment they
-- exist, with no one having chosen to: say so when the extension is created
-- (as a WARNING: CREATE EXTENSION hides the script's NOTICEs), with what
-- the view idem_publications already finds wrong in it.
DO $do$
DECLARE
    pubs text;
    problems bigint;
BEGIN
    SELECT string_agg(quote_ident(p.pubname), ', ' ORDER BY p.pubname) INTO pubs
      FROM pg_catalog.pg_publication p WHERE p.puballtables;
    IF pubs IS NOT NULL THEN
        SELECT count(*) INTO problems FROM idem.publication_problems();
        RAISE WARNING 'idem: publication % publishes all tables, so idem''s tables too', pubs
            USING DETAIL = format('A subscriber receives every claim; what it needs to answer retries as this server does is in docs/design.md §12. Problems found now: %s.', problems),
                  HINT = 'SELECT * FROM idem_publications lists them and what to change.';
    END IF;
END
$do$;
