-- idem 0.3.0 → 0.4.0. Hand-written: every schema change between the two
-- versions, in the order a fresh 0.4.0 install makes it.
-- tests/scenarios/upgrade.sh installs 0.3.0 (tests/upgrade/idem--0.3.0.sql),
-- claims, runs this update, and checks that the claims survive and that the
-- schema equals a fresh 0.4.0 install's.
\echo Use "ALTER EXTENSION idem UPDATE TO '0.4.0'" to load this file. \quit

-- Business types' settings and idem.claims' partitions are read by claims
-- after they lock idem.claims: lock it first, as 0.3.0's update did.
LOCK TABLE idem.claims IN ACCESS EXCLUSIVE MODE;

-- Under Citus, once idem_distribute ran, Citus runs this update on the
-- coordinator, then on every worker (sql/scaling.sql's idem.citus_node says
-- which this is): a change the coordinator's update makes to a distributed
-- or reference table has reached the workers' copies before their update
-- runs, and is not made again there. Such a change is made in a DO block:
-- Citus sends it to the workers as the text of the statement it runs,
-- which for a statement of the script itself is the whole script (42601,
-- "cannot insert multiple commands into a prepared statement", on a
-- worker); in a DO block it is the one statement.
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

-- storage.sql ----------------------------------------------------------------

-- A type's owner is kept by name, so that restoring a dump onto a server
-- without the role keeps every other setting (0.3.0: regrole, whose COPY
-- fails there and loses every type's TTL). (A reference table under Citus:
-- changed by the coordinator's update on every node.)
DO $$
BEGIN
    IF idem.citus_node() IS DISTINCT FROM 'worker' THEN
        ALTER TABLE idem.biz_types ALTER COLUMN owner TYPE name USING pg_catalog.pg_get_userbyid(owner);
    END IF;
END
$$;

-- A type's policy for stored failures (idem_configure's on_failure).
DO $$
BEGIN
    IF idem.citus_node() IS DISTINCT FROM 'worker' THEN
        -- (column and constraint apart, the constraint named as CREATE TABLE
        -- names it: Citus refuses a column added with an unnamed constraint
        -- on its reference table)
        ALTER TABLE idem.biz_types ADD COLUMN on_failure text;
        ALTER TABLE idem.biz_types ADD CONSTRAINT biz_types_on_failure_check CHECK (on_failure IN ('replay', 'retry'));
    END IF;
END
$$;
COMMENT ON TABLE idem.biz_types IS 'Business type settings: the TTL of its claims and what a stored failure does to the next arrival (idem_configure), and the role whose members alone may use it (idem_set_owner).';

-- claim.sql: idem_configure with on_failure and idem_checkpoint with merge,
-- new functions with the privileges of the old forms (below).
COMMENT ON FUNCTION idem_configure(text, interval) IS
'Set the TTL of a business type (1 second to 400 days); NULL returns it to idem.default_ttl. Applies to claims made afterwards. Keeps the type''s owner and on_failure policy.';
CREATE FUNCTION idem_configure(biz_type text, ttl interval, on_failure text) RETURNS void
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_configure_policy';
COMMENT ON FUNCTION idem_configure(text, interval, text) IS
'Set the TTL of a business type (as idem_configure(biz_type, ttl)) and what a failure stored with idem_fail does to the next arrival: replay (NULL is the same; every later arrival is answered failed with the error until the claim expires) or retry (the next arrival claims the key anew, told {attempt, previous_error} in result; a completed key is still never claimed again before it expires). 22023 for another value. Keeps the type''s owner.';
REVOKE EXECUTE ON FUNCTION idem_configure(text, interval, text) FROM PUBLIC;
-- With merge => true, the recovery data is merged into, not replaced: a
-- separate function, as idem_configure's third argument is (sql/claim.sql
-- says why).
CREATE FUNCTION idem_checkpoint(key text, biz_type text, point text, data jsonb, lease_token text, merge boolean) RETURNS void
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_checkpoint_merge';
COMMENT ON FUNCTION idem_checkpoint(text, text, text, jsonb, text, boolean) IS
'idem_checkpoint(key, biz_type, point, data, lease_token) with merge: true adds data''s fields to the stored recovery data (an object; absent or JSON null counts as {}; a field of the same name is replaced; NULL data keeps it as it is), false replaces it. Pass lease_token => NULL in the transaction that took the lease. 22023 when data or the stored recovery data is not a JSON object.';

-- The new forms of idem_configure and idem_checkpoint get the privileges
-- their old forms have: PUBLIC's (revoked by a hardened installation:
-- docs/operations.md § Grants) and every role's an operator granted.
DO $$
DECLARE
    pair text[];
    g record;
    old_public boolean;
BEGIN
    FOREACH pair SLICE 1 IN ARRAY ARRAY[
        ['idem_configure(text, interval)', 'idem_configure(text, interval, text)'],
        ['idem_checkpoint(text, text, text, jsonb, text)', 'idem_checkpoint(text, text, text, jsonb, text, boolean)']] LOOP
        -- (Changed only where they differ: a fresh install's default ACL
        -- stays the default.)
        old_public := pg_catalog.has_function_privilege('public', ('@extschema@.' || pair[1])::regprocedure, 'EXECUTE');
        IF old_public AND NOT pg_catalog.has_function_privilege('public', ('@extschema@.' || pair[2])::regprocedure, 'EXECUTE') THEN
            EXECUTE 'GRANT EXECUTE ON FUNCTION @extschema@.' || pair[2] || ' TO PUBLIC';
        ELSIF NOT old_public AND pg_catalog.has_function_privilege('public', ('@extschema@.' || pair[2])::regprocedure, 'EXECUTE') THEN
            EXECUTE 'REVOKE EXECUTE ON FUNCTION @extschema@.' || pair[2] || ' FROM PUBLIC';
        END IF;
        FOR g IN SELECT a.grantee::regrole::text AS grantee, a.is_grantable
                   FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
                  WHERE p.oid = ('@extschema@.' || pair[1])::regprocedure
                    AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner LOOP
            EXECUTE 'GRANT EXECUTE ON FUNCTION @extschema@.' || pair[2] || ' TO ' || g.grantee
                    || CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END;
        END LOOP;
    END LOOP;
END
$$;

-- maintenance.sql ------------------------------------------------------------

-- What makes idem_maintain run once at a time: its EXCLUSIVE lock on this
-- empty table, which only roles that may change the table (its owner,
-- superusers, pg_maintain members from 17 on) can take or hold. (0.3.0 used
-- an advisory lock, which any role could take and keep to stop
-- maintenance.) Never written, so autovacuum has nothing to do here and
-- never holds it up.
CREATE TABLE idem.maintenance_lock () WITH (autovacuum_enabled = false);
ALTER TABLE idem.maintenance_lock REPLICA IDENTITY FULL;
COMMENT ON TABLE idem.maintenance_lock IS 'Empty; idem_maintain() holds an EXCLUSIVE lock on it while it runs, so that it runs once at a time.';

-- (idem_maintain(): restated below, with the TTL classes.)

-- metrics.sql ----------------------------------------------------------------

-- Counters (src/metrics.rs): a slot only for types that exist, a share of
-- the slots per database with its (other types) row, slots of gone types
-- and dropped databases given back (idem.metrics_reclaim, which
-- idem_maintain runs); idem_health's metrics check reads the database's
-- share.
-- This database's share of the slots (sql/metrics.sql's idem_health reads
-- it): slots it holds, its (other types) row included, of how many it may
-- hold, and how many times an existing type found them all taken.
CREATE FUNCTION idem.metrics_database(OUT slots_used int, OUT share int, OUT no_room bigint)
    RETURNS SETOF record
    VOLATILE ROWS 1
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_metrics_database';
COMMENT ON FUNCTION idem.metrics_database() IS 'This database''s share of the counters'' slots: how many it holds ((other types) included), how many it may hold, and how many times a type that exists found no room (NULLs when the counters are off).';

-- Reclaiming slots (idem.metrics_reclaim, run by idem_maintain).
CREATE FUNCTION idem.metrics_types(OUT biz_type text, OUT stats_since timestamptz) RETURNS SETOF record
    VOLATILE ROWS 100
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_metrics_types';
COMMENT ON FUNCTION idem.metrics_types() IS 'The business types of this database that hold a slot of the counters, and since when their row counts.';
REVOKE EXECUTE ON FUNCTION idem.metrics_types() FROM PUBLIC;

CREATE FUNCTION idem.metrics_release(biz_type text) RETURNS boolean
    VOLATILE STRICT PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_metrics_release';
COMMENT ON FUNCTION idem.metrics_release(text) IS 'Free this database''s slot of biz_type; its counts are added to the (other types) row. Whether it had one.';
REVOKE EXECUTE ON FUNCTION idem.metrics_release(text) FROM PUBLIC;

CREATE FUNCTION idem.metrics_release_dropped() RETURNS int
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_metrics_release_dropped';
COMMENT ON FUNCTION idem.metrics_release_dropped() IS 'Free the slots of databases that were dropped; how many.';
REVOKE EXECUTE ON FUNCTION idem.metrics_release_dropped() FROM PUBLIC;

-- Give back the slots of types that are gone: those of dropped databases
-- (always: no scan), and this database's types that have no claim left and
-- no row in idem.biz_types. Finding the latter reads idem.claims once, so
-- it is done only when this database holds more than half its share (or
-- with every_type => true). Their counts move to the (other types) row.
-- A type that claims again gets a new row (a new stats_since).
CREATE FUNCTION idem.metrics_reclaim(every_type boolean DEFAULT false) RETURNS int
    VOLATILE PARALLEL UNSAFE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    freed int := idem.metrics_release_dropped();
    db    record;
    held  text[];
BEGIN
    SELECT * INTO db FROM idem.metrics_database();
    IF db.slots_used IS NULL OR NOT (every_type OR db.slots_used > db.share / 2) THEN
        RETURN freed;
    END IF;
    held := ARRAY(SELECT m.biz_type FROM idem.metrics_types() m);
    SELECT freed + count(*) FILTER (WHERE idem.metrics_release(t)) INTO freed
      FROM unnest(held) t
     WHERE t <> ALL (ARRAY(SELECT DISTINCT c.biz_type FROM idem.claims c WHERE c.biz_type = ANY (held)))
       AND t <> ALL (ARRAY(SELECT b.biz_type FROM idem.biz_types b WHERE b.biz_type = ANY (held)));
    RETURN freed;
END
$fn$;
COMMENT ON FUNCTION idem.metrics_reclaim(boolean) IS 'Free the counters'' slots of dropped databases, and (when this database holds more than half its share, or every_type) of its types with no claim and no settings left, their counts moved to (other types). idem_maintain runs it. How many slots were freed.';
REVOKE EXECUTE ON FUNCTION idem.metrics_reclaim(boolean) FROM PUBLIC;

COMMENT ON VIEW idem_metrics IS
'Counters per business type of this database since stats_since (server start, first use, or idem_metrics_reset()): claims (new), takeovers (of leases that ran out), duplicates answered completed / failed, in_progress answers, waits for another transaction and their total time, ID001 fingerprint mismatches, ID003 refusals (not_held), 40001 raised, and idem_complete / idem_fail / idem_checkpoint calls. Counted when decided, committed or not; in shared memory, reset on restart like pg_stat_*. A type gets its row when a transaction that wrote or found a claim of it commits; the row biz_type = ''(other types)'' counts the calls on types that do not exist here, the types that found this database''s share of slots full, and the counts of rows reclaimed. Needs shared_preload_libraries = ''idem''; without it, one row whose note says so. A row with biz_type NULL counts what found the whole table full, all databases together.';

-- (idem_health: restated below, with the TTL classes.)

-- ---------------------------------------------------------------------------
-- Citus: uninstall, replica identity of the shards after moves, and a
-- maintenance lock that gets through claims in multi-statement transactions
-- (sql/scaling.sql, sql/maintenance.sql's idem.maintain_distributed;
-- docs/scaling.md). The functions and the event trigger as a fresh install
-- makes them.
-- ---------------------------------------------------------------------------

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

-- (idem.maintain_distributed: restated below, with the TTL classes.)

-- ---------------------------------------------------------------------------
-- Retention: TTL classes (src/ttl_class.rs, docs/design.md §1, §2, §4). idem.claims
-- is partitioned by (ttl_class, expires_at) instead of expires_at alone, and
-- idem.type_classes says which classes hold which type's claims, so that a
-- claim looks into a few partitions of its own class whatever the TTLs in
-- use. A partition key cannot change in place: 0.3.0's idem.claims is
-- renamed, the new one made, every claim copied into it (into its default
-- partition: the next idem_maintain() makes the classes' partitions and
-- moves them there), every type registered in the classes of its claims,
-- the views that read the old table made anew, and the old table dropped
-- with its partitions. (The lock taken at the top keeps claims out.)
-- ---------------------------------------------------------------------------

CREATE FUNCTION idem.ttl_class(ttl interval) RETURNS smallint
    IMMUTABLE STRICT PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_ttl_class';
COMMENT ON FUNCTION idem.ttl_class(interval) IS 'The TTL class of a claim with this TTL (beyond 400 days: that of 400 days), at the session''s idem.partition_width: at the default, 0 (under 4 minutes) to 34 (364 days and more); its partitions are idem.class_width(class) wide.';
CREATE FUNCTION idem.class_width(ttl_class integer) RETURNS interval
    IMMUTABLE STRICT PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_class_width';
COMMENT ON FUNCTION idem.class_width(integer) IS 'The partition width of a TTL class: idem.partition_width times the square root of 2 to the power of the class, at most 400 days; NULL for a class that does not exist.';
CREATE FUNCTION idem.class_max_ttl(ttl_class integer) RETURNS interval
    IMMUTABLE STRICT PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_class_max_ttl';
COMMENT ON FUNCTION idem.class_max_ttl(integer) IS 'The longest TTL a claim of a TTL class can have; NULL for a class that does not exist.';
CREATE FUNCTION idem.partition_class(partition regclass) RETURNS smallint
    STABLE STRICT PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_partition_class';
COMMENT ON FUNCTION idem.partition_class(regclass) IS 'TTL class of a partition of idem.claims, read in binary; NULL for the default partition.';
-- Which TTL classes may hold claims of which business type: a claim looks
-- into the partitions of these classes only (and the default partition).
-- Written by the claim that first puts a type's claim into a class, in its
-- own transaction (so the row commits, or rolls back, with the claim), for
-- claims expiring up to `until`; deleted by idem_maintain once no partition
-- that could hold such a claim is left. No unique index: two first claims
-- at once each write a row rather than one waiting for the other's commit.
-- Under Citus it is distributed by `key` next to idem.claims (sql/scaling.sql):
-- a registration lives on the shard of the claim that wrote it. The
-- coordinator's update distributes it (below, as idem.claims: out of the
-- extension, so that Citus makes its shells on the workers); a worker's
-- update takes its shell into the extension instead of making the table.
DO $$
BEGIN
    IF idem.citus_node() = 'worker' THEN
        COMMENT ON TABLE idem.type_classes IS 'TTL classes that may hold claims of a business type expiring up to until; claims of the type look into those classes'' partitions only.';
        ALTER EXTENSION idem ADD TABLE idem.type_classes;
        PERFORM pg_catalog.citus_unmark_object_distributed('pg_class'::regclass, 'idem.type_classes'::regclass, 0, false);
        RETURN;
    END IF;
    CREATE TABLE idem.type_classes (
        biz_type  text     COLLATE "C" NOT NULL,
        ttl_class smallint NOT NULL,
        until     timestamptz NOT NULL,
        key       text                  -- Citus: the registering claim's key, which places the row (NULL otherwise)
    );
    CREATE INDEX type_classes_biz_type ON idem.type_classes (biz_type);
    ALTER TABLE idem.type_classes REPLICA IDENTITY FULL;
    COMMENT ON TABLE idem.type_classes IS 'TTL classes that may hold claims of a business type expiring up to until; claims of the type look into those classes'' partitions only.';
END
$$;

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

-- Under Citus the coordinator's update makes the new idem.claims,
-- distributes it next to the old one (Citus makes a shell of a table on the
-- workers only when it belongs to no extension: it is taken out of idem's
-- for that, and back in after), and copies the claims into it through the
-- coordinator (from a local copy: the workers have no idem.ttl_class yet);
-- then every worker's update takes its shells of the new tables into its
-- extension. The old table's renames reach the workers' copies too.
DO $$
DECLARE
    node text := idem.citus_node();
    c record;
    claims_comment text := 'Dedup records. Uniqueness of (biz_type, key) among live rows is enforced by idem_claim, not by an index.';
BEGIN
    IF node = 'worker' THEN
        -- (Citus makes the shells without the table's comment.)
        EXECUTE format('COMMENT ON TABLE idem.claims IS %L', claims_comment);
        ALTER EXTENSION idem ADD TABLE idem.claims;
        ALTER EXTENSION idem ADD TABLE idem.claims_default;
        PERFORM pg_catalog.citus_unmark_object_distributed('pg_class'::regclass, r, 0, false)
           FROM unnest(ARRAY['idem.claims'::regclass, 'idem.claims_default'::regclass]) r;
        RETURN;
    END IF;
    ALTER TABLE idem.claims RENAME TO claims_0_3;
    ALTER TABLE idem.claims_default RENAME TO claims_0_3_default;
    ALTER INDEX idem.claims_default_key_hash RENAME TO claims_0_3_default_key_hash;
    -- (PostgreSQL 18 names NOT NULL constraints, and gives a new one a name no
    -- constraint of the schema has yet: the old table's are renamed first, so
    -- that the new table's get the names a fresh install gives them.)
    FOR c IN SELECT con.conname FROM pg_catalog.pg_constraint con
              WHERE con.contype = 'n' AND con.conrelid = 'idem.claims_0_3'::regclass LOOP
        EXECUTE format('ALTER TABLE idem.claims_0_3 RENAME CONSTRAINT %I TO %I', c.conname, c.conname || '_0_3');
    END LOOP;
    CREATE TABLE idem.claims (
        expires_at  timestamptz NOT NULL,
        claimed_at  timestamptz NOT NULL,
        ttl_class   smallint    NOT NULL,   -- idem.ttl_class(expires_at - claimed_at)
        state       "char"      NOT NULL,   -- p: claimed, not finished; c: completed; f: failed; l: leased
        biz_type    text        NOT NULL,
        key         text        NOT NULL,
        fingerprint text,
        result      jsonb
    ) PARTITION BY RANGE (ttl_class, expires_at);
    EXECUTE format('COMMENT ON TABLE idem.claims IS %L', claims_comment);
    ALTER TABLE idem.claims REPLICA IDENTITY FULL;
    CREATE TABLE idem.claims_default PARTITION OF idem.claims DEFAULT;
    ALTER TABLE idem.claims_default REPLICA IDENTITY FULL;
    CREATE INDEX claims_default_key_hash ON idem.claims_default (idem.key_hash(biz_type, key));
    IF node = 'coordinator' THEN
        CREATE TEMPORARY TABLE claims_0_3_rows AS SELECT * FROM idem.claims_0_3;
        ALTER EXTENSION idem DROP TABLE idem.claims_default;
        ALTER EXTENSION idem DROP TABLE idem.claims;
        PERFORM pg_catalog.create_distributed_table('idem.claims', 'key', colocate_with => 'idem.claims_0_3');
        ALTER EXTENSION idem ADD TABLE idem.claims;
        ALTER EXTENSION idem ADD TABLE idem.claims_default;
        PERFORM pg_catalog.citus_unmark_object_distributed('pg_class'::regclass, r, 0, false)
           FROM unnest(ARRAY['idem.claims'::regclass, 'idem.claims_default'::regclass]) r;
        -- (As idem_distribute: Citus makes the shards without it.)
        ALTER TABLE idem.claims REPLICA IDENTITY FULL;
        INSERT INTO idem.claims (expires_at, claimed_at, ttl_class, state, biz_type, key, fingerprint, result)
        SELECT expires_at, claimed_at, idem.ttl_class(expires_at - claimed_at), state, biz_type, key, fingerprint, result
          FROM pg_temp.claims_0_3_rows;
        DROP TABLE pg_temp.claims_0_3_rows;
    ELSE
        INSERT INTO idem.claims (expires_at, claimed_at, ttl_class, state, biz_type, key, fingerprint, result)
        SELECT expires_at, claimed_at, idem.ttl_class(expires_at - claimed_at), state, biz_type, key, fingerprint, result
          FROM idem.claims_0_3;
    END IF;
    IF node = 'coordinator' THEN
        ALTER EXTENSION idem DROP TABLE idem.type_classes;
        PERFORM pg_catalog.create_distributed_table('idem.type_classes', 'key', colocate_with => 'idem.claims');
        ALTER EXTENSION idem ADD TABLE idem.type_classes;
        PERFORM pg_catalog.citus_unmark_object_distributed('pg_class'::regclass, 'idem.type_classes'::regclass, 0, false);
        PERFORM idem.fill_registry();
    ELSE
        INSERT INTO idem.type_classes (biz_type, ttl_class, until)
        SELECT biz_type, ttl_class, max(expires_at) FROM idem.claims GROUP BY biz_type, ttl_class;
    END IF;
END
$$;

DROP FUNCTION idem.partition_name(timestamptz);
CREATE FUNCTION idem.partition_name(ttl_class smallint, lo timestamptz) RETURNS text
    IMMUTABLE LANGUAGE sql SET search_path = pg_catalog, pg_temp
    AS $$ SELECT 'claims_c' || ttl_class || '_' || to_char(lo AT TIME ZONE 'UTC', 'YYYYMMDD"_"HH24MISS"_"MS') $$;
COMMENT ON FUNCTION idem.partition_name(smallint, timestamptz) IS 'Name of the partition of a TTL class whose range starts at lo (UTC).';
CREATE OR REPLACE VIEW idem.partition_bounds AS
SELECT c.oid::regclass AS partition,
       c.relname::text AS name,
       idem.partition_from(c.oid) AS range_from,
       idem.partition_to(c.oid) AS range_to,
       idem.partition_to(c.oid) IS NULL AS is_default,
       idem.partition_class(c.oid) AS ttl_class
  FROM pg_inherits h
  JOIN pg_class c ON c.oid = h.inhrelid
 WHERE h.inhparent = 'idem.claims'::regclass;
COMMENT ON VIEW idem.partition_bounds IS 'Partitions of idem.claims with their TTL class and range of expires_at, read in binary (NULL bounds: the default partition).';
CREATE OR REPLACE VIEW idem.replica_identity_missing AS
SELECT c.oid::regclass AS rel
  FROM pg_class c
 WHERE c.relreplident <> 'f'
   AND c.oid IN (SELECT partition FROM idem.partition_bounds UNION ALL SELECT 'idem.claims'::regclass);
COMMENT ON VIEW idem.replica_identity_missing IS 'Tables of idem.claims (the parent and its partitions) without REPLICA IDENTITY FULL.';
DROP FUNCTION idem.coming_partitions(interval, timestamptz, int, timestamptz);
CREATE FUNCTION idem.classes_to_premake(t_now timestamptz)
    RETURNS TABLE (ttl_class smallint, width interval, horizon timestamptz)
    STABLE PARALLEL UNSAFE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    waiting smallint[] := '{}';
    ongoing smallint[] := '{}';
    ahead   interval := idem.setting_interval('idem.premake_ahead', '20 minutes');
BEGIN
    -- (The default partition is named in dynamic SQL only: it may be gone.)
    IF to_regclass('idem.claims_default') IS NOT NULL THEN
        EXECUTE 'SELECT coalesce(array_agg(DISTINCT ttl_class), ''{}'') FROM idem.claims_default' INTO waiting;
    END IF;
    IF idem.is_distributed('idem.claims') THEN
        SELECT coalesce(array_agg(DISTINCT b.ttl_class), '{}') INTO ongoing
          FROM idem.partition_bounds b WHERE NOT b.is_default AND b.range_to > t_now;
    END IF;
    RETURN QUERY
    SELECT c.k, idem.class_width(c.k),
           t_now + idem.class_max_ttl(c.k) + greatest(idem.class_width(c.k), least(ahead, 16 * idem.class_width(c.k)))
      FROM (SELECT t.ttl_class AS k FROM idem.type_classes t WHERE t.until > t_now
            UNION SELECT idem.ttl_class(b.ttl) FROM idem.biz_types b WHERE b.ttl IS NOT NULL
            UNION SELECT idem.ttl_class(idem.setting_interval('idem.default_ttl', '24 hours'))
            UNION SELECT unnest(waiting || ongoing)) c
     WHERE c.k >= 0
     ORDER BY 1;
END
$fn$;
COMMENT ON FUNCTION idem.classes_to_premake(timestamptz) IS 'The TTL classes idem_maintain makes partitions for, their width, and how far ahead their partitions must reach.';
CREATE FUNCTION idem.coming_partitions(limit_parts int, t_now timestamptz)
    RETURNS TABLE (name text, ttl_class smallint, range_from timestamptz, range_to timestamptz)
    STABLE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    c    record;
    w_us numeric;
    cur  timestamptz;
    made int := 0;
BEGIN
    FOR c IN SELECT * FROM idem.classes_to_premake(t_now) LOOP
        w_us := extract(epoch FROM c.width) * 1000000;
        -- (Whole microseconds since 1970 below 2^53: exact in float8.)
        SELECT greatest(max(b.range_to), timestamptz '1970-01-01 00:00:00+00'
                          + interval '1 microsecond' * (floor(extract(epoch FROM t_now) * 1000000 / w_us) * w_us)::float8)
          INTO cur FROM idem.partition_bounds b WHERE NOT b.is_default AND b.ttl_class = c.ttl_class;
        WHILE cur < c.horizon AND made < limit_parts LOOP
            name := idem.partition_name(c.ttl_class, cur);
            ttl_class := c.ttl_class;
            range_from := cur;
            range_to := timestamptz '1970-01-01 00:00:00+00'
                        + interval '1 microsecond' * ((floor(extract(epoch FROM cur) * 1000000 / w_us) + 1) * w_us)::float8;
            -- After a change of width the class's last range can end a few
            -- microseconds before a boundary of the new width: that sliver
            -- joins the next range, so that no range is narrower than a
            -- millisecond and no two share a name (which is to the
            -- millisecond).
            IF range_to - cur < interval '1 millisecond' THEN
                range_to := range_to + c.width;
            END IF;
            RETURN NEXT;
            made := made + 1;
            cur := range_to;
        END LOOP;
    END LOOP;
END
$fn$;
COMMENT ON FUNCTION idem.coming_partitions(int, timestamptz) IS 'The next partition ranges idem_maintain makes: per TTL class, after its last range, up to its horizon, at most limit_parts in all, aligned to the class''s width.';
REVOKE EXECUTE ON FUNCTION idem.coming_partitions(int, timestamptz) FROM PUBLIC;
CREATE OR REPLACE FUNCTION idem.remove_expired(t_now timestamptz, OUT dropped text[], OUT rows_in_dropped bigint, OUT deleted_from_default bigint)
    VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    p record;
    firsts timestamptz[];
BEGIN
    dropped := '{}';
    rows_in_dropped := 0;
    FOR p IN SELECT b.partition, b.name, greatest(c.reltuples::bigint, 0) AS estimate
               FROM idem.partition_bounds b JOIN pg_class c ON c.oid = b.partition
              WHERE NOT b.is_default AND b.range_to <= t_now ORDER BY b.range_to LOOP
        EXECUTE format('DROP TABLE %s', p.partition);
        dropped := dropped || p.name;
        rows_in_dropped := rows_in_dropped + p.estimate;
    END LOOP;
    EXECUTE 'DELETE FROM idem.claims_default WHERE expires_at <= $1' USING t_now;
    GET DIAGNOSTICS deleted_from_default = ROW_COUNT;
    -- (Each class's first partition given as a value, class k at k + 1:
    -- under Citus the registry is distributed, and neither a subquery on
    -- the local partition list nor a cast in a COALESCE goes to the
    -- workers with the DELETE. A class past the array is kept: it has no
    -- partition to look into.)
    firsts := ARRAY(SELECT coalesce(min(b.range_from), 'infinity')
                      FROM generate_series(0, 127) k
                      LEFT JOIN idem.partition_bounds b ON NOT b.is_default AND b.ttl_class = k
                     GROUP BY k ORDER BY k);
    DELETE FROM idem.type_classes t
     WHERE t.until <= t_now
       AND t.until <= firsts[t.ttl_class + 1];
END
$fn$;
COMMENT ON FUNCTION idem.remove_expired(timestamptz) IS 'Under the maintenance lock: drop the partitions whose range is over, delete the claims that expired in the default partition and the registrations of types in TTL classes that no partition left can hold a claim of; reports what it removed.';
REVOKE EXECUTE ON FUNCTION idem.remove_expired(timestamptz) FROM PUBLIC;
DROP FUNCTION idem.maintain_distributed(interval, interval, int, int);
CREATE FUNCTION idem.maintain_distributed(limit_parts int, retries int)
    RETURNS jsonb
    VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    SET DateStyle = 'ISO, YMD'
    SET TimeZone = 'UTC'
    SET IntervalStyle = 'postgres'
    SET timezone_abbreviations = 'Default'
    LANGUAGE plpgsql AS $fn$
DECLARE
    t_now       timestamptz := clock_timestamp();
    names       text[];
    classes     smallint[];
    los         timestamptz[];
    his         timestamptz[];
    unindexed   text[];
    made        text[] := '{}';
    indexed     text[] := '{}';
    replica_fixed text[];
    shards_without_ri regclass[];
    refill      boolean;
    registered  bigint;
    rel         regclass;
    lock_wait   interval := greatest(idem.setting_interval('idem.maintenance_lock_timeout', '50 milliseconds'), interval '1 millisecond');
    old_lock_timeout text;
    moved       bigint := 0;
    n           bigint;
    got_lock    record;
    removed     record;
    lo_rows     timestamptz;
    hi_rows     timestamptz;
    p           record;
BEGIN
    IF NOT pg_catalog.citus_is_coordinator() THEN
        RAISE EXCEPTION 'idem: idem_maintain changes the partitions of the distributed idem.claims: run it on the Citus coordinator'
            USING ERRCODE = '55000';
    END IF;

    -- DDL after a multi-shard statement in one transaction needs Citus's
    -- sequential mode, from the transaction's first multi-shard statement.
    PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);

    -- Decide the work, before any lock.
    SELECT coalesce(array_agg(c.name ORDER BY c.ttl_class, c.range_from), '{}'),
           coalesce(array_agg(c.ttl_class ORDER BY c.ttl_class, c.range_from), '{}'),
           coalesce(array_agg(c.range_from ORDER BY c.ttl_class, c.range_from), '{}'),
           coalesce(array_agg(c.range_to ORDER BY c.ttl_class, c.range_from), '{}')
      INTO names, classes, los, his FROM idem.coming_partitions(limit_parts, t_now) c;
    SELECT array_agg(b.name ORDER BY b.range_from) INTO unindexed FROM idem.partition_bounds b
     WHERE NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = b.partition);
    shards_without_ri := idem.shard_replica_identity_missing();
    refill := idem.registry_incomplete();
    IF cardinality(names) = 0 AND unindexed IS NULL AND cardinality(shards_without_ri) = 0
       AND NOT idem.partition_set_needs_change(t_now) AND NOT refill THEN
        RETURN jsonb_build_object('citus', true, 'partitions_created', '[]'::jsonb, 'partitions_dropped', '[]'::jsonb,
                                  'lock_attempts', 0);
    END IF;

    -- A lock that waits, idem.maintenance_lock_timeout at a time, on every
    -- node: NOWAIT never gets it while claims in multi-statement
    -- transactions keep idem.claims locked on some worker at every moment.
    -- lock_timeout reaches the workers only as a SET LOCAL statement that
    -- Citus propagates (idem.set_local_on_all_nodes); it is put back once
    -- the lock is held, so that the DDL after it is not cut short.
    old_lock_timeout := current_setting('lock_timeout');
    PERFORM idem.set_local_on_all_nodes('lock_timeout', (extract(epoch FROM lock_wait) * 1000)::bigint || 'ms');
    SELECT * INTO got_lock FROM idem.lock_claims_for_maintenance(lock_wait, retries);
    PERFORM idem.set_local_on_all_nodes('lock_timeout', old_lock_timeout);
    IF NOT got_lock.locked THEN
        RAISE NOTICE 'idem_maintain: idem.claims stayed locked by claims on some node through % attempts (last: %); nothing changed, the next run catches up', got_lock.attempts, got_lock.refusal;
        RETURN jsonb_build_object('citus', true, 'partitions_created', '[]'::jsonb, 'partitions_dropped', '[]'::jsonb,
                                  'lock_attempts', got_lock.attempts, 'skipped', jsonb_build_array('lock on idem.claims not available: ' || got_lock.refusal));
    END IF;

    t_now := clock_timestamp();
    replica_fixed := idem.repair_partition_set();
    -- On the coordinator the tables have FULL already; Citus runs the ALTER
    -- TABLE on every shard of the distributed table all the same.
    FOREACH rel IN ARRAY shards_without_ri LOOP
        IF to_regclass(rel::text) IS NOT NULL THEN
            EXECUTE format('ALTER TABLE %s REPLICA IDENTITY FULL', rel);
            replica_fixed := replica_fixed || (rel::text || ' (shards)');
        END IF;
    END LOOP;
    SELECT * INTO removed FROM idem.remove_expired(t_now);
    -- A shard split left shards whose registrations are not known
    -- complete (sql/scaling.sql, idem.fill_registry): filled anew.
    IF refill THEN
        registered := idem.fill_registry();
    END IF;
    FOR p IN SELECT b.partition, b.name FROM idem.partition_bounds b
              WHERE NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = b.partition) LOOP
        EXECUTE format('CREATE INDEX ON %s (idem.key_hash(biz_type, key))', p.partition);
        indexed := indexed || p.name;
    END LOOP;

    -- Which new ranges the default partition holds claims for: one
    -- distributed query for whether it holds any, then one per range.
    IF cardinality(names) > 0 THEN
        EXECUTE 'SELECT min(expires_at), max(expires_at) FROM idem.claims_default'
           INTO lo_rows, hi_rows;
    END IF;
    FOR i IN 1 .. cardinality(names) LOOP
        n := 0;
        IF lo_rows IS NOT NULL AND los[i] <= hi_rows AND his[i] > lo_rows THEN
            EXECUTE 'SELECT count(*) FROM idem.claims_default WHERE ttl_class = $1 AND expires_at >= $2 AND expires_at < $3'
               INTO n USING classes[i], los[i], his[i];
        END IF;
        IF n = 0 THEN
            EXECUTE format('CREATE TABLE idem.%I PARTITION OF idem.claims FOR VALUES FROM (%s, %L) TO (%s, %L)',
                           names[i], classes[i], los[i], classes[i], his[i]);
            EXECUTE format('ALTER TABLE idem.%I REPLICA IDENTITY FULL', names[i]);
        ELSE
            EXECUTE format('CREATE TABLE idem.%I (LIKE idem.claims INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', names[i]);
            EXECUTE format('ALTER TABLE idem.%I REPLICA IDENTITY FULL', names[i]);
            PERFORM pg_catalog.create_distributed_table(format('idem.%I', names[i]), 'key', colocate_with => 'idem.claims');
            EXECUTE format('INSERT INTO idem.%I SELECT * FROM idem.claims_default WHERE ttl_class = $1 AND expires_at >= $2 AND expires_at < $3', names[i])
              USING classes[i], los[i], his[i];
            GET DIAGNOSTICS n = ROW_COUNT;
            moved := moved + n;
            EXECUTE 'DELETE FROM idem.claims_default WHERE ttl_class = $1 AND expires_at >= $2 AND expires_at < $3' USING classes[i], los[i], his[i];
            EXECUTE format('ALTER TABLE idem.claims ATTACH PARTITION idem.%I FOR VALUES FROM (%s, %L) TO (%s, %L)',
                           names[i], classes[i], los[i], classes[i], his[i]);
        END IF;
        EXECUTE format('CREATE INDEX ON idem.%I (idem.key_hash(biz_type, key))', names[i]);
        made := made || names[i];
    END LOOP;

    RETURN jsonb_build_object(
        'citus', true,
        'partitions_created', to_jsonb(made),
        'partitions_dropped', to_jsonb(removed.dropped),
        'partitions_indexed', CASE WHEN cardinality(indexed) > 0 THEN to_jsonb(indexed) END,
        'replica_identity_set', CASE WHEN cardinality(replica_fixed) > 0 THEN to_jsonb(replica_fixed) END,
        'expired_rows_deleted_from_default', removed.deleted_from_default,
        'rows_moved_from_default', moved,
        'registry_filled', registered,
        'lock_attempts', got_lock.attempts);
END
$fn$;
COMMENT ON FUNCTION idem.maintain_distributed(int, int) IS 'idem_maintain''s work on a Citus-distributed idem.claims (run on the coordinator).';
REVOKE EXECUTE ON FUNCTION idem.maintain_distributed(int, int) FROM PUBLIC;
CREATE OR REPLACE FUNCTION idem_maintain() RETURNS jsonb
    VOLATILE PARALLEL UNSAFE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    SET DateStyle = 'ISO, YMD'
    SET TimeZone = 'UTC'
    SET IntervalStyle = 'postgres'
    SET timezone_abbreviations = 'Default'
    LANGUAGE plpgsql AS $fn$
DECLARE
    started     timestamptz := clock_timestamp();
    t_now       timestamptz;
    lock_wait   interval := idem.setting_interval('idem.maintenance_lock_timeout', '50 milliseconds');
    retries     int := coalesce(nullif(current_setting('idem.maintenance_lock_retries', true), '')::int, 20);
    limit_parts int := coalesce(nullif(current_setting('idem.premake_limit', true), '')::int, 128);
    made        text[] := '{}';
    classes     smallint[] := '{}';
    skipped     text[] := '{}';
    removed     record;
    moved       bigint := 0;
    got_lock    record;
    los         timestamptz[] := '{}';
    his         timestamptz[] := '{}';
    part        record;
    report      jsonb;
    to_move     boolean := false;
    replica_fixed text[];
    pub_problems jsonb;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        -- Moving claims out of the default partition must see every
        -- committed claim, which an older snapshot would not.
        RAISE EXCEPTION 'idem: idem_maintain must run in a READ COMMITTED transaction'
            USING ERRCODE = '55000';
    END IF;
    BEGIN
        LOCK TABLE idem.maintenance_lock IN EXCLUSIVE MODE NOWAIT;
    EXCEPTION WHEN lock_not_available THEN
        -- Recorded, so that idem_health counts it among the skipped runs.
        RAISE NOTICE 'idem_maintain is already running in another session; this call did nothing';
        report := jsonb_build_object('skipped', jsonb_build_array('another idem_maintain() is running'));
        INSERT INTO idem.maintenance_runs (started_at, finished_at, report) VALUES (started, clock_timestamp(), report);
        RETURN report;
    END;
    PERFORM idem.metrics_reclaim();  -- counters' slots of gone types and databases (sql/metrics.sql)

    -- A Citus-distributed idem.claims (idem_distribute, docs/scaling.md):
    -- its partitions are made and dropped through Citus, on every node.
    IF idem.is_distributed('idem.claims') THEN
        report := idem.maintain_distributed(limit_parts, retries)
                  || jsonb_build_object('duration_ms', round(extract(epoch FROM clock_timestamp() - started)::numeric * 1000, 3));
        DELETE FROM idem.tokens WHERE expires_at <= clock_timestamp();
        INSERT INTO idem.maintenance_runs (started_at, finished_at, report) VALUES (started, clock_timestamp(), report);
        DELETE FROM idem.maintenance_runs WHERE run_id <= (SELECT max(run_id) - 100 FROM idem.maintenance_runs);
        RETURN report;
    END IF;

    -- Decide the work, and prepare the new partitions as standalone tables
    -- (index and range CHECK included, so that attaching them neither builds
    -- nor scans anything), all before taking the lock claims would queue on.
    t_now := clock_timestamp();
    FOR part IN SELECT * FROM idem.coming_partitions(limit_parts, t_now) LOOP
        EXECUTE format('CREATE TABLE idem.%I (LIKE idem.claims INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
                          CONSTRAINT range CHECK (ttl_class = %s AND expires_at >= %L AND expires_at < %L))',
                       part.name, part.ttl_class, part.range_from, part.range_to);
        EXECUTE format('CREATE INDEX ON idem.%I (idem.key_hash(biz_type, key))', part.name);
        EXECUTE format('ALTER TABLE idem.%I REPLICA IDENTITY FULL', part.name);
        made := made || part.name;
        classes := classes || part.ttl_class;
        los := los || part.range_from;
        his := his || part.range_to;
    END LOOP;

    SELECT false AS locked, 0 AS attempts INTO got_lock;
    IF cardinality(made) > 0 OR idem.partition_set_needs_change(t_now) THEN
        SELECT * INTO got_lock FROM idem.lock_claims_for_maintenance(lock_wait, retries);
        IF NOT got_lock.locked THEN
            RAISE NOTICE 'idem_maintain: idem.claims stayed locked by other transactions through % attempts; nothing changed, the next run catches up', got_lock.attempts;
            skipped := skipped || 'lock on idem.claims not available'::text;
            -- The prepared tables go with this transaction's rollback of them.
            FOR i IN 1 .. cardinality(made) LOOP
                EXECUTE format('DROP TABLE idem.%I', made[i]);
            END LOOP;
            made := '{}';
        END IF;
    END IF;

    IF got_lock.locked THEN
        t_now := clock_timestamp();
        replica_fixed := idem.repair_partition_set();
        SELECT * INTO removed FROM idem.remove_expired(t_now);

        -- Attach the prepared partitions, and move in the claims the default
        -- partition holds for their ranges. ATTACH refuses while the default
        -- partition holds rows of the new range, so they wait in a temporary
        -- table, and go in through idem.claims once the partitions are
        -- attached: a row written into a table that is not a partition yet
        -- would reach a logical subscriber under that table's own name (or
        -- not at all), not as a row of idem.claims.
        IF cardinality(made) > 0 THEN
            EXECUTE 'SELECT EXISTS (SELECT 1 FROM idem.claims_default)' INTO to_move;
        END IF;
        IF to_move THEN
            CREATE TEMPORARY TABLE idem_maintain_moving (LIKE idem.claims);
            FOR i IN 1 .. cardinality(made) LOOP
                EXECUTE 'WITH m AS (DELETE FROM idem.claims_default WHERE ttl_class = $1 AND expires_at >= $2 AND expires_at < $3 RETURNING *)
                         INSERT INTO pg_temp.idem_maintain_moving SELECT * FROM m' USING classes[i], los[i], his[i];
            END LOOP;
        END IF;
        FOR i IN 1 .. cardinality(made) LOOP
            EXECUTE format('ALTER TABLE idem.claims ATTACH PARTITION idem.%I FOR VALUES FROM (%s, %L) TO (%s, %L)',
                           made[i], classes[i], los[i], classes[i], his[i]);
        END LOOP;
        IF to_move THEN
            EXECUTE 'INSERT INTO idem.claims SELECT * FROM pg_temp.idem_maintain_moving';
            GET DIAGNOSTICS moved = ROW_COUNT;
            DROP TABLE pg_temp.idem_maintain_moving;
        END IF;
    ELSE
        SELECT '{}'::text[] AS dropped, 0::bigint AS rows_in_dropped, 0::bigint AS deleted_from_default INTO removed;
    END IF;

    -- Spent and expired one-time tokens (a small table: row by row is fine).
    DELETE FROM idem.tokens WHERE expires_at <= t_now;

    -- Publications that would stop a logical subscriber or lose updates of
    -- claims on it (docs/operations.md, Logical replication and CDC).
    IF EXISTS (SELECT 1 FROM pg_publication) THEN
        SELECT jsonb_agg(jsonb_build_object('publication', r.publication, 'problem', r.problem) ORDER BY r.publication, r.problem)
          INTO pub_problems FROM idem.publication_problems() r;
    END IF;
    IF pub_problems IS NOT NULL THEN
        RAISE WARNING 'idem_maintain: publications that include idem''s tables need a change: %', pub_problems
            USING HINT = 'See the view idem_publications, and docs/operations.md, "Logical replication and CDC".';
    END IF;

    report := jsonb_build_object(
        'partitions_created', to_jsonb(made),
        'partitions_dropped', to_jsonb(removed.dropped),
        'rows_removed', removed.rows_in_dropped + removed.deleted_from_default,
        'rows_in_dropped_partitions_estimate', removed.rows_in_dropped,
        'expired_rows_deleted_from_default', removed.deleted_from_default,
        'rows_moved_from_default', moved,
        'lock_attempts', got_lock.attempts,
        'skipped', CASE WHEN cardinality(skipped) > 0 THEN to_jsonb(skipped) END,
        'replica_identity_set', CASE WHEN cardinality(replica_fixed) > 0 THEN to_jsonb(replica_fixed) END,
        'publication_problems', pub_problems,
        'duration_ms', round(extract(epoch FROM clock_timestamp() - started)::numeric * 1000, 3));
    INSERT INTO idem.maintenance_runs (started_at, finished_at, report) VALUES (started, clock_timestamp(), report);
    DELETE FROM idem.maintenance_runs WHERE run_id <= (SELECT max(run_id) - 100 FROM idem.maintenance_runs);
    RETURN report;
END
$fn$;
COMMENT ON FUNCTION idem_maintain() IS
'Partition maintenance: create the partitions coming claims need, drop whole partitions whose claims have all expired, move claims out of the default partition. Runs once at a time (a concurrent call returns at once with a NOTICE); waits for its lock only briefly and retries. Returns a jsonb report.';
CREATE OR REPLACE VIEW idem_partitions AS
SELECT b.name AS partition,
       b.range_from,
       b.range_to,
       b.is_default,
       coalesce(s.estimated_rows, 0) AS estimated_rows,
       coalesce(s.bytes, 0) AS bytes,
       coalesce(b.range_to <= now(), false) AS expired,
       b.ttl_class,
       idem.class_width(b.ttl_class) AS width
  FROM idem.partition_bounds b
  LEFT JOIN idem.partition_sizes() s ON s.partition = b.partition
 ORDER BY b.is_default, b.ttl_class, b.range_from;
COMMENT ON VIEW idem_partitions IS 'Partitions of idem.claims: range of expiry, estimated rows, bytes (under Citus: summed over the workers), whether every claim in it has expired, its TTL class and the class''s width.';
CREATE OR REPLACE VIEW idem_stats AS
SELECT coalesce(c.biz_type, t.biz_type) AS biz_type,
       coalesce(t.ttl, idem.setting_interval('idem.default_ttl', '24 hours')) AS ttl,
       count(c.*) AS live_keys,
       count(c.*) FILTER (WHERE c.state IN ('p', 'c')) AS completed,
       count(c.*) FILTER (WHERE c.state IN ('f', 'r')) AS failed,
       count(c.*) FILTER (WHERE c.state = 'l') AS in_progress,
       min(c.claimed_at) AS oldest_claim,
       max(c.claimed_at) AS newest_claim
  FROM (SELECT * FROM idem.claims WHERE expires_at > now()) c
  FULL JOIN idem.biz_types t ON t.biz_type = c.biz_type
 GROUP BY 1, t.ttl
 ORDER BY 1;
COMMENT ON VIEW idem_stats IS 'Per business type: TTL in force, live (unexpired, committed) keys by state, oldest and newest claim.';
CREATE OR REPLACE VIEW idem_leases AS
SELECT c.biz_type,
       c.key,
       c.claimed_at AS first_claimed_at,
       c.expires_at,
       (c.result->>'attempt')::int AS attempt,
       c.result->>'recovery_point' AS recovery_point,
       c.result->'recovery_data' AS recovery_data,
       timestamptz '2000-01-01 00:00:00+00'
         + (c.result->>'lease_until_us')::bigint * interval '1 microsecond' AS lease_until,
       timestamptz '2000-01-01 00:00:00+00'
         + (c.result->>'lease_until_us')::bigint * interval '1 microsecond' <= now() AS ran_out
  FROM idem.claims c
 WHERE c.state = 'l' AND c.expires_at > now();
COMMENT ON VIEW idem_leases IS 'Live leased claims: attempt, last recovery point and data, when the lease ends and whether it ran out (the next idem_claim of the key takes it over).';
CREATE OR REPLACE VIEW idem_health AS
WITH s AS (
    SELECT interval '1 day' AS critical_after,
           idem.setting_interval('idem.health_maintenance_after', '15 minutes') AS maintenance_after,
           idem.setting_interval('idem.health_lease_after', '15 minutes') AS lease_after
), m AS (
    SELECT * FROM idem_maintenance
), p AS (
    SELECT count(*) FILTER (WHERE NOT b.is_default AND b.range_to < now() - s.maintenance_after) AS expired_left
      FROM s LEFT JOIN idem.partition_bounds b ON true
     GROUP BY s.maintenance_after
), h AS (
    -- Per TTL class maintenance keeps partitions for: how far beyond the
    -- expiry of a claim made now with the class's longest TTL they reach.
    -- The shortest is reported.
    SELECT c.ttl_class, idem.class_max_ttl(c.ttl_class) AS longest_ttl,
           (SELECT max(b.range_to) FROM idem.partition_bounds b WHERE b.ttl_class = c.ttl_class)
             - (now() + idem.class_max_ttl(c.ttl_class)) AS margin
      FROM idem.classes_to_premake(now()) c
     ORDER BY 3 NULLS FIRST, 1
     LIMIT 1
), k AS (
    -- The relations one claim can lock, for the business type whose
    -- claims look into the most partitions: idem.claims, the default
    -- partition, idem.type_classes and idem.biz_types (with their indexes),
    -- and each partition of the type's classes that can hold a live claim,
    -- with its index (docs/design.md §1: at most 7 + 2 x 3 x 8 = 55 while
    -- maintenance keeps up).
    -- Under Citus a claim on a worker reads the registrations of its
    -- shard (docs/design.md §13) and locks one relation more (the logical
    -- idem.claims and the shard: 8 fixed); this takes the union of a
    -- type's classes over the shards, which is at least what one shard
    -- has. Without the distributed registry (not updated yet) a claim
    -- looks into every class's partitions that can hold a claim made
    -- until now (src/storage/direct.rs), counted in the coordinator's
    -- list, which every shard's partitions follow.
    -- The portable edition (its gate table, idem.key_gates, exists) locks
    -- 8 more: idem.key_gates and its key, and the catalogs its SQL reads
    -- (pg_roles, pg_authid with two indexes, pg_db_role_setting with one).
    SELECT CASE WHEN c.citus AND NOT c.registry THEN c.n ELSE coalesce(x.n, 0) END * 2
           + CASE WHEN e.portable THEN 15 WHEN c.citus THEN 8 ELSE 7 END AS locks,
           CASE WHEN c.citus AND NOT c.registry THEN 'any business type (under Citus every class is looked into)' ELSE x.biz_type END AS biz_type
      FROM (SELECT max(n) AS n, (array_agg(biz_type ORDER BY n DESC))[1] COLLATE "default" AS biz_type
              FROM (SELECT t.biz_type, count(DISTINCT b.partition) AS n
                      FROM (SELECT biz_type, ttl_class, max(until) AS until FROM idem.type_classes GROUP BY 1, 2) t
                      JOIN idem.partition_bounds b ON b.ttl_class = t.ttl_class AND b.range_from <= t.until
                     GROUP BY t.biz_type) y) x,
           (SELECT idem.is_distributed('idem.claims') AS citus, idem.is_distributed('idem.type_classes') AS registry,
                   count(*) FILTER (WHERE NOT b.is_default
                                      AND b.range_from <= now() + idem.class_max_ttl(b.ttl_class) + idem.class_width(b.ttl_class)) AS n
              FROM idem.partition_bounds b) c,
           -- (from the catalogs, which every role reads: to_regclass on
           -- schema idem needs USAGE; and in FROM, where Citus plans it)
           (SELECT count(*) > 0 AS portable
              FROM pg_class g JOIN pg_namespace n ON n.oid = g.relnamespace
             WHERE n.nspname = 'idem' AND g.relname = 'key_gates') e
), d AS (
    SELECT idem.default_partition_rows(10000) AS n
), l AS (
    SELECT count(*) AS n, min(x.lease_until) AS oldest
      FROM s JOIN idem_leases x ON x.lease_until < now() - s.lease_after
), mi AS (
    SELECT i.*, d.slots_used AS db_slots_used, d.share AS db_share, d.no_room AS db_no_room
      FROM idem.metrics_info() i LEFT JOIN idem.metrics_database() d ON true
)
SELECT 'maintenance_overdue'::text AS check_name,
       CASE WHEN m.last_success_at IS NULL OR m.last_success_at < now() - s.critical_after THEN 'critical'
            WHEN m.last_success_at < now() - s.maintenance_after THEN 'warning'
            ELSE 'ok' END AS severity,
       extract(epoch FROM now() - m.last_success_at)::double precision AS value,
       CASE WHEN m.last_success_at IS NULL THEN 'no successful idem_maintain() run is recorded'
            ELSE format('the last successful idem_maintain() run finished %s ago (warning after %s, critical after %s)',
                        idem.interval_text(date_trunc('second', now() - m.last_success_at)), idem.interval_text(s.maintenance_after), idem.interval_text(s.critical_after)) END AS detail,
       'Run SELECT idem_maintain(), and schedule it every few minutes: SELECT idem_schedule_maintenance() with pg_cron, or cron and psql.'::text AS action
  FROM s, m
UNION ALL
SELECT 'maintenance_lock',
       CASE WHEN m.skipped_in_a_row >= 3 THEN 'warning' ELSE 'ok' END,
       m.skipped_in_a_row,
       format('%s run(s) in a row did nothing (gave up on the lock on idem.claims, or found another idem_maintain() running)', m.skipped_in_a_row),
       'A long transaction keeps idem.claims locked, or one idem_maintain() runs for very long: find it in pg_stat_activity (oldest xact_start) and end it, or raise idem.maintenance_lock_retries.'
  FROM m
UNION ALL
SELECT 'default_partition',
       CASE WHEN d.n IS NULL THEN 'critical' WHEN d.n > 0 THEN 'warning' ELSE 'ok' END,
       d.n,
       CASE WHEN d.n IS NULL THEN 'idem.claims_default is missing: claims beyond the premade partitions fail'
            WHEN d.n >= 10000 THEN 'at least 10000 claims in the default partition'
            ELSE format('%s claims in the default partition', d.n) END,
       'Run SELECT idem_maintain() (it makes the partitions of their TTL classes and moves them there).'
  FROM d
UNION ALL
SELECT 'partition_horizon',
       CASE WHEN h.ttl_class IS NOT NULL AND (h.margin IS NULL OR h.margin < interval '0') THEN 'warning' ELSE 'ok' END,
       extract(epoch FROM h.margin)::double precision,
       CASE WHEN h.ttl_class IS NULL THEN 'no TTL class needs partitions'
            WHEN h.margin IS NULL THEN format('TTL class %s (TTLs up to %s) has no partition: its claims go to the default partition', h.ttl_class, idem.interval_text(h.longest_ttl))
            ELSE format('the partitions of TTL class %s end %s after the expiry of a claim made now with its longest TTL (%s); the other classes'' reach further',
                        h.ttl_class, idem.interval_text(date_trunc('second', h.margin)), idem.interval_text(h.longest_ttl)) END,
       'Run SELECT idem_maintain(); if the horizon stays short, raise idem.premake_limit (a run makes each class''s partitions up to now + the class''s longest TTL + idem.premake_ahead, at least one width and at most 16).'
  FROM (SELECT 1) one LEFT JOIN h ON true
UNION ALL
SELECT 'claim_locks',
       CASE WHEN k.locks > current_setting('max_locks_per_transaction')::int THEN 'critical'
            WHEN k.locks > 7 + 2 * 8 THEN 'warning' ELSE 'ok' END,
       k.locks,
       CASE WHEN k.biz_type IS NULL THEN 'no business type has claims in a TTL class yet'
            ELSE format('a claim of %s locks up to %s relations (max_locks_per_transaction = %s)', k.biz_type, k.locks, current_setting('max_locks_per_transaction')) END,
       'A type whose claims were made with TTLs of several classes (per-call ttl) looks into each, at most three: give the type one TTL with idem_configure; if expired partitions pile up, run SELECT idem_maintain().'
  FROM k
UNION ALL
SELECT 'stuck_leases',
       CASE WHEN l.n > 0 THEN 'warning' ELSE 'ok' END,
       l.n,
       CASE WHEN l.n = 0 THEN format('no lease ran out more than %s ago without a takeover', idem.interval_text(s.lease_after))
            ELSE format('%s lease(s) ran out more than %s ago and nobody took them over; the oldest ran out at %s',
                        l.n, idem.interval_text(s.lease_after), idem.time_text(l.oldest)) END,
       'The work they stand for stopped: rerun it (the next idem_claim of the key takes the lease over and is told the recovery point); idem_leases lists them.'
  FROM s, l
UNION ALL
SELECT 'expired_partitions',
       CASE WHEN p.expired_left > 0 THEN 'warning' ELSE 'ok' END,
       p.expired_left,
       format('%s partition(s) whose range ended more than %s ago are still there', p.expired_left, idem.interval_text(s.maintenance_after)),
       'Run SELECT idem_maintain() (it drops them); if they stay, a long transaction keeps idem.claims locked (see maintenance_lock).'
  FROM s, p
UNION ALL
SELECT 'metrics',
       CASE WHEN NOT mi.counting THEN 'info' WHEN mi.overflowed OR mi.db_no_room > 0 THEN 'warning' ELSE 'ok' END,
       mi.slots_used,
       CASE WHEN NOT mi.counting THEN 'counters are off (idem is not in shared_preload_libraries): idem_metrics has no counts'
            WHEN mi.overflowed THEN format('all %s (database, biz_type) slots of the counters are in use: idem_metrics counts what found no room in its overflow row (biz_type NULL), all databases together', mi.slots)
            WHEN mi.db_no_room > 0 THEN format('this database''s share of %s slots of the counters is full: idem_metrics counts the types that found no room in its (other types) row', mi.db_share)
            ELSE format('%s of %s (database, biz_type) slots of the counters in use, %s of this database''s share of %s', mi.slots_used, mi.slots, mi.db_slots_used, mi.db_share) END,
       CASE WHEN NOT mi.counting THEN 'To count claims, duplicates, waits and errors: add idem to shared_preload_libraries and restart the server.'
            WHEN mi.overflowed OR mi.db_no_room > 0 THEN 'Use fewer business types per database, or run SELECT idem_maintain() (it frees the slots of types with no claims left and of dropped databases); idem_metrics_reset() clears the warning.'
            ELSE 'None.' END
  FROM mi;
COMMENT ON VIEW idem_health IS
'Health checks, one row each, always in the same order: maintenance_overdue, maintenance_lock, default_partition, partition_horizon, claim_locks, stuck_leases, expired_partitions, metrics; each with severity (ok, info, warning, critical), a measured value, what was found (detail) and a one-line action. Alert on severity <> ''ok''. Thresholds: idem.health_maintenance_after and idem.health_lease_after. Scans the live claims for leases (as idem_leases does).';
CREATE OR REPLACE FUNCTION idem_distribute(colocate_with regclass) RETURNS void
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
CREATE OR REPLACE FUNCTION idem.publication_problems() RETURNS TABLE (publication name, problem text)
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
CREATE OR REPLACE VIEW idem_publications AS
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

-- The old table goes with its partitions; the new default partition and
-- the registry are kept by pg_dump as the old default partition was.
-- (Under Citus: the coordinator's drop removes the old table's shards and
-- metadata; a worker's update drops its copies, members of its extension,
-- which Citus leaves.)
DO $$
BEGIN
    IF to_regclass('idem.claims_0_3') IS NOT NULL THEN
        ALTER EXTENSION idem DROP TABLE idem.claims_0_3_default;
        DROP TABLE idem.claims_0_3;
    END IF;
END
$$;
SELECT pg_catalog.pg_extension_config_dump('idem.claims_default', '');
SELECT pg_catalog.pg_extension_config_dump('idem.type_classes', '');

-- guards.sql: idem_unguard (and idem_guard, which calls it) under a
-- session's standard_conforming_strings = off: the zero byte that ends a
-- guarded column's name in the trigger's arguments is no longer a literal
-- with a backslash (0.3.0: 22021, "invalid byte sequence", there).
CREATE OR REPLACE FUNCTION idem_unguard(tbl regclass, state_col name) RETURNS void
    VOLATILE SECURITY INVOKER SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    existing name;
BEGIN
    IF tbl IS NULL OR state_col IS NULL THEN
        RAISE EXCEPTION 'idem: arguments must not be NULL' USING ERRCODE = '22004';
    END IF;
    -- Found by what it runs rather than by its name: a name is cut to 63
    -- bytes, so two long column names could share one. (The zero byte is
    -- no literal with a backslash: the body is parsed under the caller's
    -- standard_conforming_strings.)
    SELECT t.tgname INTO existing FROM pg_trigger t
     WHERE t.tgrelid = tbl AND NOT t.tgisinternal
       AND t.tgfoid = '@extschema@.idem_guard_trigger()'::regprocedure
       AND position(convert_to(state_col, pg_catalog.getdatabaseencoding()) || pg_catalog.decode('00', 'hex') IN t.tgargs) = 1;
    IF existing IS NOT NULL THEN
        EXECUTE format('DROP TRIGGER %I ON %s', existing, tbl);
    END IF;
END
$fn$;

-- lease.sql ------------------------------------------------------------------
CREATE FUNCTION idem_release(key text, biz_type text, lease_token text DEFAULT NULL) RETURNS void
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_release';
COMMENT ON FUNCTION idem_release(text, text, text) IS
'End a lease early, after a transient failure: pass the lease_token idem_claim returned (or call it in the transaction that took the lease). The claim stays leased but has run out, so the next idem_claim takes it over at once (attempt + 1, recovery point and data kept); the token is spent, and its later use raises ID003. ID003 also for a claim that is not leased, or leased to another owner.';

-- claim.sql: the claim id -----------------------------------------------------
CREATE FUNCTION idem_claim_id(key text, biz_type text, first_claimed_at timestamptz) RETURNS uuid
    IMMUTABLE STRICT PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_claim_id';
COMMENT ON FUNCTION idem_claim_id(text, text, timestamptz) IS
'The id of the claim of (biz_type, key) first claimed at first_claimed_at (as idem_claim returns it): a UUID derived from the three, the same on every attempt, takeover and retry of that claim and different for a claim of the key after it expired. Pass it downstream as a provider''s idempotency key. Not a secret: anyone who knows the key and the time can compute it.';

-- batch.sql ------------------------------------------------------------------
CREATE FUNCTION idem_claim_many(
    keys         text[],
    biz_type     text,
    ttl          interval DEFAULT NULL,
    fingerprints text[]   DEFAULT NULL,
    wait         boolean  DEFAULT true
) RETURNS TABLE (key text, claimed boolean, state text, result jsonb, first_claimed_at timestamptz, expires_at timestamptz)
    VOLATILE PARALLEL UNSAFE ROWS 100
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_claim_many';
COMMENT ON FUNCTION idem_claim_many(text[], text, interval, text[], boolean) IS
'Claim every key of keys (one biz_type) in the current transaction, as idem_claim would one by one; one row per element of keys, in their order: the key, then idem_claim_result''s columns. Keys are claimed in the order of their bytes, so two batches with keys in common never deadlock; a key given twice is claimed by its first element and answered in_progress for the later one. fingerprints, when given, has one element (or NULL) per key. No leases (claim leased work with idem_claim). 22004 for NULL keys or a NULL element, 22023 for a bad key or a fingerprints array of another length, ID001 for a fingerprint mismatch (the whole statement fails). 0A000 when Citus distributes idem.claims: claim each key with idem_claim.';
