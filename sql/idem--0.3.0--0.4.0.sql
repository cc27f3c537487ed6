-- idem 0.3.0 → 0.4.0. Hand-written: every schema change between the two
-- versions, in the order a fresh 0.4.0 install makes it.
-- tests/scenarios/upgrade.sh installs 0.3.0 (tests/upgrade/idem--0.3.0.sql),
-- claims, runs this update, and checks that the claims survive and that the
-- schema equals a fresh 0.4.0 install's.
\echo Use "ALTER EXTENSION idem UPDATE TO '0.4.0'" to load this file. \quit

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
CREATE FUNCTION idem.drops_idem(statement text) RETURNS boolean
    IMMUTABLE SET search_path = pg_catalog, pg_temp
    LANGUAGE sql AS $$
    SELECT EXISTS (
        SELECT 1
          FROM regexp_matches(statement, '\mdrop\s+extension\s+(?:if\s+exists\s+)?([^;]*)', 'gi') m,
               unnest(string_to_array(regexp_replace(m[1], '\s+(cascade|restrict)\s*$', '', 'i'), ',')) n
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
BEGIN
    IF to_regclass('pg_catalog.pg_dist_placement') IS NULL OR NOT idem.drops_idem(current_query())
       OR NOT pg_catalog.citus_is_coordinator() THEN
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

CREATE OR REPLACE FUNCTION idem.maintain_distributed(width interval, max_ttl interval, limit_parts int, retries int)
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
    los         timestamptz[];
    his         timestamptz[];
    unindexed   text[];
    made        text[] := '{}';
    indexed     text[] := '{}';
    replica_fixed text[];
    shards_without_ri regclass[];
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
    SELECT coalesce(array_agg(c.name ORDER BY c.range_from), '{}'), coalesce(array_agg(c.range_from ORDER BY c.range_from), '{}'),
           coalesce(array_agg(c.range_to ORDER BY c.range_from), '{}')
      INTO names, los, his FROM idem.coming_partitions(width, t_now + max_ttl + width, limit_parts, t_now) c;
    SELECT array_agg(b.name ORDER BY b.range_from) INTO unindexed FROM idem.partition_bounds b
     WHERE NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = b.partition);
    shards_without_ri := idem.shard_replica_identity_missing();
    IF cardinality(names) = 0 AND unindexed IS NULL AND cardinality(shards_without_ri) = 0
       AND NOT idem.partition_set_needs_change(t_now) THEN
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
    FOR p IN SELECT b.partition, b.name FROM idem.partition_bounds b
              WHERE NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = b.partition) LOOP
        EXECUTE format('CREATE INDEX ON %s (idem.key_hash(biz_type, key))', p.partition);
        indexed := indexed || p.name;
    END LOOP;

    -- Which new ranges the default partition holds claims for: one
    -- distributed query for the span, then one per range inside it.
    IF cardinality(names) > 0 THEN
        EXECUTE 'SELECT min(expires_at), max(expires_at) FROM idem.claims_default WHERE expires_at >= $1 AND expires_at < $2'
           INTO lo_rows, hi_rows USING los[1], his[cardinality(his)];
    END IF;
    FOR i IN 1 .. cardinality(names) LOOP
        n := 0;
        IF lo_rows IS NOT NULL AND los[i] <= hi_rows AND his[i] > lo_rows THEN
            EXECUTE 'SELECT count(*) FROM idem.claims_default WHERE expires_at >= $1 AND expires_at < $2' INTO n USING los[i], his[i];
        END IF;
        IF n = 0 THEN
            EXECUTE format('CREATE TABLE idem.%I PARTITION OF idem.claims FOR VALUES FROM (%L) TO (%L)', names[i], los[i], his[i]);
            EXECUTE format('ALTER TABLE idem.%I REPLICA IDENTITY FULL', names[i]);
        ELSE
            EXECUTE format('CREATE TABLE idem.%I (LIKE idem.claims INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', names[i]);
            EXECUTE format('ALTER TABLE idem.%I REPLICA IDENTITY FULL', names[i]);
            PERFORM pg_catalog.create_distributed_table(format('idem.%I', names[i]), 'key', colocate_with => 'idem.claims');
            EXECUTE format('INSERT INTO idem.%I SELECT * FROM idem.claims_default WHERE expires_at >= $1 AND expires_at < $2', names[i])
              USING los[i], his[i];
            GET DIAGNOSTICS n = ROW_COUNT;
            moved := moved + n;
            EXECUTE 'DELETE FROM idem.claims_default WHERE expires_at >= $1 AND expires_at < $2' USING los[i], his[i];
            EXECUTE format('ALTER TABLE idem.claims ATTACH PARTITION idem.%I FOR VALUES FROM (%L) TO (%L)', names[i], los[i], his[i]);
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
        'lock_attempts', got_lock.attempts);
END
$fn$;
COMMENT ON FUNCTION idem.maintain_distributed(interval, interval, int, int) IS 'idem_maintain''s work on a Citus-distributed idem.claims (run on the coordinator).';
REVOKE EXECUTE ON FUNCTION idem.maintain_distributed(interval, interval, int, int) FROM PUBLIC;
