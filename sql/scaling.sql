-- Citus: idem's storage distributed next to the business tables
-- (docs/scaling.md; tested by tests/scenarios/scaling.sh citus on a real Citus 13
-- cluster). Once idem.claims is distributed, every idem call on a key runs
-- only on the node that holds the key's shard (src/storage/citus.rs).

-- Under Citus, once idem_distribute ran, Citus runs ALTER EXTENSION idem
-- UPDATE on the coordinator, then on every worker: a change the
-- coordinator's update makes to a distributed or reference table has
-- reached the workers' copies before their update runs, and is not made
-- again there. Update scripts branch on this, in DO blocks (docs/scaling.md,
-- "Upgrading a Citus cluster"; sql/idem--0.3.0--0.4.0.sql says why).
CREATE FUNCTION idem.citus_node() RETURNS text
    STABLE SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    coordinator boolean;
BEGIN
    IF NOT idem.is_distributed('idem.claims') THEN
        RETURN NULL;
    END IF;
    -- (Named only where Citus is installed: a static call would not parse
    -- without it.)
    EXECUTE 'SELECT pg_catalog.citus_is_coordinator()' INTO coordinator;
    RETURN CASE WHEN coordinator THEN 'coordinator' ELSE 'worker' END;
END
$fn$;
COMMENT ON FUNCTION idem.citus_node() IS 'Once Citus distributes idem.claims: coordinator or worker, as this node is; NULL otherwise. Update scripts branch on it (Citus runs ALTER EXTENSION idem UPDATE on the coordinator, then on each worker).';

-- The registry of TTL classes under Citus (docs/design.md §13): idem.type_classes
-- distributed by `key` next to idem.claims, so that a claim reads and
-- writes its type's registrations on the node and beside the shard where it
-- runs, and a shard move carries them with the claims. Filled anew from the
-- claims themselves, per shard (the rows of a group all hash into one
-- shard's range, and the group's smallest key places the registration
-- there), with one anchor row per shard, ('#<shard id>', -1, infinity), by
-- which a claim knows the registrations of its shard complete: a shard
-- split makes shards with new ids, whose registrations were divided by the
-- registering claims' keys rather than by the claims they cover; claims on
-- a shard without its anchor look into every class until the next
-- idem_maintain fills the registry again. Run on the coordinator with
-- idem.claims locked against claims on every node.
CREATE FUNCTION idem.fill_registry() RETURNS bigint
    VOLATILE SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    bounds int[];
    s record;
    anchor text;
    n bigint;
    chunk int;
BEGIN
    -- (Citus's functions named in dynamic SQL only: without Citus these
    -- statements would not parse.)
    EXECUTE $q$SELECT array_agg(shardminvalue::int ORDER BY shardminvalue::int) FROM pg_catalog.pg_dist_shard
                WHERE logicalrelid = 'idem.type_classes'::regclass$q$ INTO bounds;
    DELETE FROM idem.type_classes;
    EXECUTE $q$INSERT INTO idem.type_classes (biz_type, ttl_class, until, key)
               SELECT biz_type, ttl_class, max(expires_at), min(key) FROM idem.claims
                GROUP BY width_bucket(pg_catalog.worker_hash(key), $1), biz_type, ttl_class$q$ USING bounds;
    GET DIAGNOSTICS n = ROW_COUNT;
    FOR s IN EXECUTE $q$SELECT shardid, shardminvalue::int AS lo, shardmaxvalue::int AS hi FROM pg_catalog.pg_dist_shard
                        WHERE logicalrelid = 'idem.type_classes'::regclass$q$ LOOP
        -- A key that hashes into the shard (a few tries per shard; a
        -- hundred thousand at a time, as a set-returning function in FROM
        -- makes all its rows before the first one is read).
        anchor := NULL;
        FOR chunk IN 0 .. 999 LOOP
            EXECUTE $q$SELECT 'idem-anchor-' || i FROM generate_series($3 * 100000 + 1, $3 * 100000 + 100000) i
                        WHERE pg_catalog.worker_hash('idem-anchor-' || i) BETWEEN $1 AND $2 LIMIT 1$q$
               INTO anchor USING s.lo, s.hi, chunk;
            EXIT WHEN anchor IS NOT NULL;
        END LOOP;
        INSERT INTO idem.type_classes (biz_type, ttl_class, until, key) VALUES ('#' || s.shardid, -1, 'infinity', anchor);
    END LOOP;
    RETURN n;
END
$fn$;
COMMENT ON FUNCTION idem.fill_registry() IS 'Citus, on the coordinator with idem.claims locked: register every claim''s type in its class on the claim''s shard of idem.type_classes, and mark each shard''s registrations complete (an anchor row); returns the registrations written.';
REVOKE EXECUTE ON FUNCTION idem.fill_registry() FROM PUBLIC;

-- Whether some shard of the distributed registry lacks its anchor (a shard
-- split made it): idem.maintain_distributed then fills the registry again.
CREATE FUNCTION idem.registry_incomplete() RETURNS boolean
    VOLATILE SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    missing boolean;
BEGIN
    IF NOT idem.is_distributed('idem.type_classes') THEN
        RETURN false;
    END IF;
    EXECUTE $q$SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_shard s
                               WHERE s.logicalrelid = 'idem.type_classes'::regclass
                                 AND '#' || s.shardid <> ALL ($1))$q$
       INTO missing
      USING ARRAY(SELECT t.biz_type::text FROM idem.type_classes t WHERE t.ttl_class = -1);
    RETURN missing;
END
$fn$;
COMMENT ON FUNCTION idem.registry_incomplete() IS 'Citus: whether a shard of idem.type_classes lacks the anchor row that marks its registrations complete (after a shard split).';
REVOKE EXECUTE ON FUNCTION idem.registry_incomplete() FROM PUBLIC;

CREATE FUNCTION idem_distribute(colocate_with regclass) RETURNS void
    VOLATILE SECURITY INVOKER SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    dist_type regtype;
BEGIN
    IF colocate_with IS NULL THEN
        RAISE EXCEPTION 'idem: colocate_with must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        RAISE EXCEPTION 'idem: idem_distribute needs the Citus extension in this database'
            USING ERRCODE = '55000',
                  HINT = 'Install Citus on every node, put citus first in shared_preload_libraries, CREATE EXTENSION citus, distribute the business table, then call idem_distribute again (docs/scaling.md).';
    END IF;
    IF coalesce(current_setting('idem.storage_access', true), 'auto') = 'direct' THEN
        -- The direct path reaches partitions by OID: on a worker it would
        -- miss the shard tables and let duplicates through.
        RAISE EXCEPTION 'idem: idem.storage_access is direct; distributed storage needs sql (or auto)'
            USING ERRCODE = '55000',
                  HINT = 'Set idem.storage_access = auto (or sql) on every node and reload.';
    END IF;
    -- Citus co-locates tables whose distribution columns have the same type;
    -- idem's key is text.
    EXECUTE 'SELECT a.atttypid::regtype FROM pg_catalog.pg_dist_partition p
               JOIN pg_catalog.pg_attribute a ON a.attrelid = p.logicalrelid
                AND a.attname = pg_catalog.column_to_column_name(p.logicalrelid, p.partkey)
              WHERE p.logicalrelid = $1'
       INTO dist_type USING colocate_with;
    IF dist_type IS NULL THEN
        RAISE EXCEPTION 'idem: % is not a hash-distributed table', colocate_with
            USING ERRCODE = '22023', HINT = 'Distribute it first: SELECT create_distributed_table(''table'', ''column'').';
    END IF;
    IF dist_type <> 'text'::regtype THEN
        RAISE EXCEPTION 'idem: % is distributed by a % column; idem''s key is text', colocate_with, dist_type
            USING ERRCODE = '22023', HINT = 'Co-location needs the same type: distribute the business table by a text column (the key).';
    END IF;
    -- Run again (after an upgrade), what is distributed stays as it is and
    -- the functions are registered again, new ones included.
    IF NOT idem.is_distributed('idem.type_classes') THEN
        -- No claim writes a registration until the registry is filled
        -- from the claims (this node's keep no key to place them by).
        -- Multi-shard writes after the distribution in one transaction
        -- need Citus's sequential mode from the start.
        PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
        LOCK TABLE idem.claims, idem.type_classes IN ACCESS EXCLUSIVE MODE;
    END IF;
    IF NOT idem.is_distributed('idem.biz_types') THEN
        PERFORM pg_catalog.create_reference_table('idem.biz_types');
    END IF;
    IF NOT idem.is_distributed('idem.machines') THEN
        PERFORM pg_catalog.create_reference_table('idem.machines');
    END IF;
    IF NOT idem.is_distributed('idem.claims') THEN
        PERFORM pg_catalog.create_distributed_table('idem.claims', 'key', colocate_with => colocate_with::text);
    END IF;
    -- Citus makes the shards of a partitioned table without its replica
    -- identity; set on the distributed table, it reaches every shard.
    ALTER TABLE idem.claims REPLICA IDENTITY FULL;
    IF NOT idem.is_distributed('idem.type_classes') THEN
        DELETE FROM idem.type_classes;
        PERFORM pg_catalog.create_distributed_table('idem.type_classes', 'key', colocate_with => 'idem.claims');
        PERFORM idem.fill_registry();
    END IF;
    -- Delegated to the worker that owns the key, inside the caller's
    -- transaction, next to the business rows of the same value.
    PERFORM pg_catalog.create_distributed_function(f, 'key', colocate_with => 'idem.claims', force_delegation => true)
       FROM unnest(ARRAY[
           '@extschema@.idem_claim(text, text, interval, text, boolean, interval)',
           '@extschema@.idem_complete(text, text, jsonb, text)',
           '@extschema@.idem_fail(text, text, jsonb, text)',
           '@extschema@.idem_checkpoint(text, text, text, jsonb, text)',
           '@extschema@.idem_release(text, text, text)',
           '@extschema@.idem_lookup(text, text)',
           '@extschema@.idem_forget(text, text)']::regprocedure[]) AS f;
END
$fn$;
COMMENT ON FUNCTION idem_distribute(regclass) IS
'Citus only: distribute idem.claims by key co-located with colocate_with (a table distributed by a text column) and idem.type_classes next to it (filled from the claims), make idem.biz_types and idem.machines reference tables, and register the claim functions (claim, complete, fail, checkpoint, release, lookup, forget) for delegation to the worker owning the key. Run it again after an upgrade: what is distributed stays, the functions are registered again. 55000 without Citus or with idem.storage_access = direct. See docs/scaling.md.';
REVOKE EXECUTE ON FUNCTION idem_distribute(regclass) FROM PUBLIC;

-- Uninstall under Citus (docs/scaling.md, "Uninstalling under Citus").
-- DROP EXTENSION idem on the coordinator drops idem's tables; Citus's drop
-- trigger then drops their shards and shells on every node, and Citus
-- sends the DROP EXTENSION to the workers. Two things stand in its way,
-- which an event trigger at the start of DROP EXTENSION idem removes, on
-- the coordinator:
--  * idem.claims_default, an extension member on the workers: Citus drops
--    a worker's shells of idem.claims' partitions with their parent, except
--    those that belong to an extension, whose metadata it removes all the
--    same; its drop of the default partition then fails there ("relation
--    claims_default is not distributed"). Taken out of the extension on
--    every worker first (as maintenance's partitions are not in it), it
--    goes with idem.claims. (Not at idem_distribute: Citus would then make
--    a shell of it on the workers, where it already exists.)
--  * the shards of idem's tables on the coordinator (the reference tables'
--    copies there): they depend on the schema idem and are no members of
--    the extension, so a DROP EXTENSION without CASCADE refuses (2BP01)
--    before Citus's drop trigger could remove them. Dropped first (Citus
--    drops the workers' shards itself).

CREATE FUNCTION idem.release_default_partition() RETURNS boolean
    VOLATILE SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
BEGIN
    IF to_regclass('idem.claims_default') IS NOT NULL
       AND EXISTS (SELECT 1 FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
                    WHERE d.classid = 'pg_class'::regclass AND d.objid = 'idem.claims_default'::regclass
                      AND d.deptype = 'e' AND e.extname = 'idem') THEN
        ALTER EXTENSION idem DROP TABLE idem.claims_default;
        RETURN true;
    END IF;
    RETURN false;
END
$fn$;
COMMENT ON FUNCTION idem.release_default_partition() IS 'Citus: take idem.claims_default out of the extension on this node (run on every worker when DROP EXTENSION idem starts on the coordinator), so that the drop removes it with idem.claims; true if it did.';
REVOKE EXECUTE ON FUNCTION idem.release_default_partition() FROM PUBLIC;

-- Whether the statement being run drops the extension idem: read from its
-- text (an event trigger at ddl_command_start gets no parse tree). A
-- statement it does not recognize is left to PostgreSQL and Citus, which
-- then refuse as without the trigger.
-- (The patterns are E'' strings: the body is parsed under the session's
-- standard_conforming_strings, and a plain literal's backslashes would be
-- escapes with it off.)
CREATE FUNCTION idem.drops_idem(statement text) RETURNS boolean
    IMMUTABLE SET search_path = pg_catalog, pg_temp
    LANGUAGE sql AS $$
    SELECT EXISTS (
        SELECT 1
          FROM regexp_matches(statement, E'\\mdrop\\s+extension\\s+(?:if\\s+exists\\s+)?([^;]*)', 'gi') m,
               unnest(string_to_array(regexp_replace(m[1], E'\\s+(cascade|restrict)\\s*$', '', 'i'), ',')) n
         WHERE lower(btrim(btrim(n, E' \t\r\n'), '"')) = 'idem')
$$;
COMMENT ON FUNCTION idem.drops_idem(text) IS 'Whether a statement''s text drops the extension idem (DROP EXTENSION [IF EXISTS] ..., idem, ... [CASCADE | RESTRICT]).';
REVOKE EXECUTE ON FUNCTION idem.drops_idem(text) FROM PUBLIC;

CREATE FUNCTION idem.uninstall_citus() RETURNS event_trigger
    VOLATILE SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    shard text;
    failed text;
    coordinator boolean;
BEGIN
    IF to_regclass('pg_catalog.pg_dist_placement') IS NULL OR NOT idem.drops_idem(current_query()) THEN
        RETURN;
    END IF;
    -- Named only where Citus is installed (a static call would not parse
    -- without it).
    EXECUTE 'SELECT pg_catalog.citus_is_coordinator()' INTO coordinator;
    IF NOT coordinator THEN
        RETURN;
    END IF;
    -- Connections of their own, before this transaction locks anything on
    -- the workers; a worker that does not answer would refuse the drop too.
    EXECUTE $q$SELECT string_agg(format('%s:%s: %s', nodename, nodeport, result), '; ')
                 FROM pg_catalog.run_command_on_workers('SELECT idem.release_default_partition()') WHERE NOT success$q$
       INTO failed;
    IF failed IS NOT NULL THEN
        RAISE EXCEPTION 'idem: DROP EXTENSION idem needs every worker: %', failed
            USING ERRCODE = '55000', HINT = 'Bring the workers up, then drop the extension again.';
    END IF;
    -- Citus refuses changes to a shard unless asked for them.
    PERFORM set_config('citus.enable_manual_changes_to_shards', 'on', true);
    FOR shard IN EXECUTE $q$
        SELECT pg_catalog.shard_name(s.logicalrelid, s.shardid)
          FROM pg_catalog.pg_dist_shard s
          JOIN pg_catalog.pg_dist_placement p USING (shardid)
          JOIN pg_catalog.pg_class c ON c.oid = s.logicalrelid
         WHERE c.relnamespace = 'idem'::regnamespace
           AND p.groupid = (SELECT groupid FROM pg_catalog.pg_dist_local_group)$q$ LOOP
        EXECUTE format('DROP TABLE IF EXISTS %s', shard);
    END LOOP;
END
$fn$;
COMMENT ON FUNCTION idem.uninstall_citus() IS 'Event trigger at the start of DROP EXTENSION: when it drops idem on a Citus coordinator, take idem.claims_default out of the extension on every worker and drop the coordinator''s shards of idem''s tables, so that DROP EXTENSION idem works without CASCADE. 55000 when a worker does not answer.';
REVOKE EXECUTE ON FUNCTION idem.uninstall_citus() FROM PUBLIC;

CREATE EVENT TRIGGER idem_uninstall_citus ON ddl_command_start
    WHEN TAG IN ('DROP EXTENSION')
    EXECUTE FUNCTION idem.uninstall_citus();

-- Replica identity of the shards (maintenance under Citus). A shard move
-- makes the moved shard of the partitioned idem.claims anew on its target
-- node with REPLICA IDENTITY DEFAULT (the partitions' shards keep FULL),
-- which the coordinator's own tables do not show: this asks every worker
-- for the tables of idem.claims' family (shards and shells: the partitioned
-- tables and partitions in schema idem) without FULL, and returns the
-- distributed tables they belong to. idem.maintain_distributed sets FULL on
-- those again (Citus runs the ALTER TABLE on each of their shards). A worker
-- that does not answer is left for a later run.
CREATE FUNCTION idem.shard_replica_identity_missing() RETURNS regclass[]
    VOLATILE SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    rels regclass[];
BEGIN
    EXECUTE $q$
        WITH missing AS (
            SELECT DISTINCT n AS relname
              FROM pg_catalog.run_command_on_workers($w$
                     SELECT coalesce(string_agg(c.relname, ' '), '') FROM pg_catalog.pg_class c
                      WHERE c.relnamespace = 'idem'::regnamespace AND c.relreplident <> 'f'
                        AND c.oid IN (SELECT inhrelid FROM pg_catalog.pg_inherits UNION SELECT inhparent FROM pg_catalog.pg_inherits)$w$) r,
                   unnest(string_to_array(nullif(r.result, ''), ' ')) n
             WHERE r.success),
        family AS (
            SELECT 'idem.claims'::regclass AS rel UNION SELECT b.partition FROM idem.partition_bounds b)
        SELECT array_agg(DISTINCT f.rel ORDER BY f.rel)
          FROM family f JOIN pg_catalog.pg_class c ON c.oid = f.rel
         WHERE c.relname IN (SELECT relname FROM missing)
            OR EXISTS (SELECT 1 FROM pg_catalog.pg_dist_shard s
                        WHERE s.logicalrelid = f.rel AND c.relname || '_' || s.shardid IN (SELECT relname FROM missing))$q$
       INTO rels;
    RETURN coalesce(rels, '{}');
END
$fn$;
COMMENT ON FUNCTION idem.shard_replica_identity_missing() IS 'Citus: the tables of idem.claims (the parent and its partitions) with a shard or shell on some worker without REPLICA IDENTITY FULL (a shard move leaves the moved parent shard without it).';
REVOKE EXECUTE ON FUNCTION idem.shard_replica_identity_missing() FROM PUBLIC;

-- SET LOCAL on this node and, through Citus, on every worker the
-- transaction uses (citus.propagate_set_commands = local). Citus propagates
-- a SET LOCAL run by a function only when the function runs inside a
-- statement of another one (its "executing a UDF" test), or in a
-- transaction block: called with PERFORM from idem.maintain_distributed,
-- this one is.
CREATE FUNCTION idem.set_local_on_all_nodes(setting text, value text) RETURNS void
    VOLATILE SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM set_config('citus.propagate_set_commands', 'local', true);
    EXECUTE format('SET LOCAL %I = %L', setting, value);
END
$fn$;
COMMENT ON FUNCTION idem.set_local_on_all_nodes(text, text) IS 'Citus: SET LOCAL setting = value here and on the workers of the transaction (citus.propagate_set_commands = local); call it with PERFORM from another function.';
REVOKE EXECUTE ON FUNCTION idem.set_local_on_all_nodes(text, text) FROM PUBLIC;
