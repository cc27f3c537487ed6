-- Partition lifecycle of idem.claims: make the partitions coming claims need,
-- drop those whose every row has expired, move claims out of the default
-- partition once a partition covers them. docs/design.md has the reasoning.

-- Recent maintenance runs, newest last; idem_maintain keeps the last 100.
CREATE TABLE idem.maintenance_runs (
    run_id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL,
    report      jsonb       NOT NULL
);
COMMENT ON TABLE idem.maintenance_runs IS 'Reports of the last 100 idem_maintain() runs.';

-- The reports are this server's own. A FOR ALL TABLES publication cannot
-- leave the table out, and a subscriber's own runs would collide with the
-- publisher's on run_id and stop its apply worker: this trigger, enabled for
-- replication only (session_replication_role = replica, as in logical
-- replication workers), discards every row change replicated into the table
-- (docs/design.md §12).
CREATE FUNCTION idem.discard_replicated() RETURNS trigger
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
    AS $$ BEGIN RETURN NULL; END $$;
COMMENT ON FUNCTION idem.discard_replicated() IS 'Trigger that discards a row change (enabled for replication only on idem.maintenance_runs: the reports stay local).';
CREATE TRIGGER local_only BEFORE INSERT OR UPDATE OR DELETE ON idem.maintenance_runs
    FOR EACH ROW EXECUTE FUNCTION idem.discard_replicated();
ALTER TABLE idem.maintenance_runs ENABLE REPLICA TRIGGER local_only;

-- What makes idem_maintain run once at a time: its EXCLUSIVE lock on this
-- empty table, which only roles that may change the table (its owner,
-- superusers, pg_maintain members from 17 on) can take or hold. (0.3.0 used
-- an advisory lock, which any role could take and keep to stop
-- maintenance.) Never written, so autovacuum has nothing to do here and
-- never holds it up.
CREATE TABLE idem.maintenance_lock () WITH (autovacuum_enabled = false);
ALTER TABLE idem.maintenance_lock REPLICA IDENTITY FULL;
COMMENT ON TABLE idem.maintenance_lock IS 'Empty; idem_maintain() holds an EXCLUSIVE lock on it while it runs, so that it runs once at a time.';

-- The settings maintenance reads, with their defaults when unset.
CREATE FUNCTION idem.setting_interval(name text, fallback interval) RETURNS interval
    STABLE LANGUAGE sql SET search_path = pg_catalog, pg_temp SET IntervalStyle = 'postgres'
    AS $$ SELECT coalesce(nullif(current_setting(name, true), '')::interval, fallback) $$;
COMMENT ON FUNCTION idem.setting_interval(text, interval) IS 'An interval-valued setting, or fallback when unset.';

-- Whether Citus distributes a table (false without Citus).
CREATE FUNCTION idem.is_distributed(rel regclass) RETURNS boolean
    STABLE SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    found boolean := false;
BEGIN
    IF to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = $1)' INTO found USING rel;
    END IF;
    RETURN found;
END
$fn$;
COMMENT ON FUNCTION idem.is_distributed(regclass) IS 'Whether Citus distributes the table (false without Citus).';

CREATE FUNCTION idem.partition_name(ttl_class smallint, lo timestamptz) RETURNS text
    IMMUTABLE LANGUAGE sql SET search_path = pg_catalog, pg_temp
    AS $$ SELECT 'claims_c' || ttl_class || '_' || to_char(lo AT TIME ZONE 'UTC', 'YYYYMMDD"_"HH24MISS"_"MS') $$;
COMMENT ON FUNCTION idem.partition_name(smallint, timestamptz) IS 'Name of the partition of a TTL class whose range starts at lo (UTC).';

-- Partitions with their bounds, read from the catalog in binary
-- (idem.partition_from/to): no session setting can change them.
CREATE VIEW idem.partition_bounds AS
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

-- The steps both kinds of idem.claims share (a single node's, and one that
-- Citus distributes): each rule in one place, called by idem_maintain and
-- idem.maintain_distributed under their pinned settings. Internal: not
-- granted to PUBLIC.

-- The tables of idem.claims (the parent and every partition) whose updates
-- and deletes do not carry whole old rows: what maintenance repairs and
-- what idem_publications reports (REPLICA IDENTITY FULL, sql/storage.sql).
CREATE VIEW idem.replica_identity_missing AS
SELECT c.oid::regclass AS rel
  FROM pg_class c
 WHERE c.relreplident <> 'f'
   AND c.oid IN (SELECT partition FROM idem.partition_bounds UNION ALL SELECT 'idem.claims'::regclass);
COMMENT ON VIEW idem.replica_identity_missing IS 'Tables of idem.claims (the parent and its partitions) without REPLICA IDENTITY FULL.';

-- The TTL classes maintenance makes partitions for: those a business type
-- is registered in for claims still to expire (idem.type_classes), those
-- of the configured TTLs, that of idem.default_ttl, and those of claims
-- waiting in the default partition (the first claims of a class); under
-- Citus, which keeps no registrations, also every class with a partition
-- not yet over. Each with the expiry its partitions must reach: the
-- longest TTL of the class from now, plus the lookahead that lets claims
-- find their partition while maintenance is late: idem.premake_ahead (20
-- minutes), but at least one width and at most 16 (at most about 23
-- partitions of a class exist at a time). SECURITY DEFINER and granted to PUBLIC for the view
-- idem_health, whose readers (a monitoring role) need nothing in schema
-- idem; it says nothing but class numbers and widths.
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

-- The ranges maintenance adds next, class by class: from the end of the
-- class's last range (or the width-aligned slot holding t_now, when there is
-- none yet) up to its horizon, at most limit_parts of them in all, each
-- aligned to the class's width. Never a gap, never an overlap.
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

-- Whether the partition set needs a change besides new partitions: the
-- default partition is missing or holds expired claims, a range is over,
-- or a table lacks REPLICA IDENTITY FULL. Read without any lock, so that a
-- run with nothing to do locks nothing.
CREATE FUNCTION idem.partition_set_needs_change(t_now timestamptz) RETURNS boolean
    STABLE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    expired_in_default boolean;
BEGIN
    -- (The default partition is named in dynamic SQL only: it may be gone.)
    IF to_regclass('idem.claims_default') IS NULL THEN
        RETURN true;
    END IF;
    EXECUTE 'SELECT EXISTS (SELECT 1 FROM idem.claims_default WHERE expires_at <= $1)' INTO expired_in_default USING t_now;
    RETURN expired_in_default
        OR EXISTS (SELECT 1 FROM idem.partition_bounds WHERE NOT is_default AND range_to <= t_now)
        OR EXISTS (SELECT 1 FROM idem.replica_identity_missing);
END
$fn$;
COMMENT ON FUNCTION idem.partition_set_needs_change(timestamptz) IS 'Whether idem_maintain must lock idem.claims for more than new partitions: a missing default partition, expired claims in it, a range that is over, a table without REPLICA IDENTITY FULL.';
REVOKE EXECUTE ON FUNCTION idem.partition_set_needs_change(timestamptz) FROM PUBLIC;

-- ACCESS EXCLUSIVE on idem.claims for a change of the partition set (see
-- design.md), waited for only briefly so that claims queued behind the
-- request are not held up: lock_wait at a time (0: NOWAIT, never queue;
-- under constant load the lock may then never come free), up to retries
-- attempts with a growing pause between them. A refusal is lock_not_available,
-- or deadlock_detected, or on Citus internal_error: a worker's refusal
-- reaches the coordinator as "failure on connection marked as essential".
-- The lock, once taken, is held to the end of the transaction.
CREATE FUNCTION idem.lock_claims_for_maintenance(lock_wait interval, retries int,
                                                 OUT locked boolean, OUT attempts int, OUT refusal text)
    VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    old_lock_timeout text := current_setting('lock_timeout');
BEGIN
    locked := false;
    attempts := 0;
    LOOP
        attempts := attempts + 1;
        BEGIN
            IF lock_wait = interval '0' THEN
                LOCK TABLE idem.claims IN ACCESS EXCLUSIVE MODE NOWAIT;
            ELSE
                PERFORM set_config('lock_timeout', (extract(epoch FROM lock_wait) * 1000)::bigint || 'ms', true);
                LOCK TABLE idem.claims IN ACCESS EXCLUSIVE MODE;
            END IF;
            locked := true;
        EXCEPTION WHEN lock_not_available OR deadlock_detected OR internal_error THEN
            refusal := SQLSTATE || ' ' || SQLERRM;
        END;
        EXIT WHEN locked OR attempts >= retries;
        PERFORM pg_sleep(least(0.01 * attempts * attempts, 1.0));
    END LOOP;
    PERFORM set_config('lock_timeout', old_lock_timeout, true);
END
$fn$;
COMMENT ON FUNCTION idem.lock_claims_for_maintenance(interval, int) IS 'Take ACCESS EXCLUSIVE on idem.claims for idem_maintain, waiting lock_wait at a time (0: NOWAIT) for up to retries attempts; reports whether it did, the attempts, and the last refusal.';
REVOKE EXECUTE ON FUNCTION idem.lock_claims_for_maintenance(interval, int) FROM PUBLIC;

-- Under the maintenance lock: the default partition back if someone dropped
-- it (claims beyond the premade ranges need it), then REPLICA IDENTITY FULL
-- on every table (sql/storage.sql: also on those made by hand, restored from
-- a dump of an older version, or altered since; Citus's logical shard moves
-- need a replica identity too). Returns the tables it changed.
CREATE FUNCTION idem.repair_partition_set() RETURNS text[]
    VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    fixed text[] := '{}';
    p     record;
BEGIN
    IF to_regclass('idem.claims_default') IS NULL THEN
        CREATE TABLE idem.claims_default PARTITION OF idem.claims DEFAULT;
        CREATE INDEX claims_default_key_hash ON idem.claims_default (idem.key_hash(biz_type, key));
        ALTER TABLE idem.claims_default REPLICA IDENTITY FULL;
    END IF;
    FOR p IN SELECT rel FROM idem.replica_identity_missing LOOP
        EXECUTE format('ALTER TABLE %s REPLICA IDENTITY FULL', p.rel);
        fixed := fixed || p.rel::text;
    END LOOP;
    RETURN fixed;
END
$fn$;
COMMENT ON FUNCTION idem.repair_partition_set() IS 'Under the maintenance lock: recreate a dropped default partition, and set REPLICA IDENTITY FULL where it is missing; returns the tables whose replica identity it set.';
REVOKE EXECUTE ON FUNCTION idem.repair_partition_set() FROM PUBLIC;

-- The exact number of rows in each partition whose range is over, counted
-- before maintenance takes its lock (a count is a scan, about a tenth of a
-- second per million rows, which claims would otherwise queue behind):
-- once a range is over, no claim can write into its partition (a new claim
-- expires after now; a claim in it has expired, so only the transaction
-- that wrote it can still change it, and that one holds a lock on the
-- partition until it ends). So a partition no other transaction holds a
-- lock on keeps the count taken after that check until it is dropped. A
-- partition someone holds a lock on (a transaction that claimed into it
-- and is still open, or a claim looking into it) is left out: counted
-- under the lock, by idem.remove_expired.
CREATE FUNCTION idem.count_ended_partitions(t_now timestamptz, OUT parts oid[], OUT counts bigint[])
    VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    p record;
    n bigint;
BEGIN
    parts := '{}';
    counts := '{}';
    FOR p IN SELECT b.partition FROM idem.partition_bounds b
              WHERE NOT b.is_default AND b.range_to <= t_now
                AND NOT EXISTS (SELECT 1 FROM pg_locks l
                                 WHERE l.locktype = 'relation' AND l.relation = b.partition
                                   AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
                                   AND l.pid IS DISTINCT FROM pg_backend_pid())
              ORDER BY b.range_to LOOP
        EXECUTE format('SELECT count(*) FROM %s', p.partition) INTO n;
        parts := parts || p.partition::oid;
        counts := counts || n;
    END LOOP;
END
$fn$;
COMMENT ON FUNCTION idem.count_ended_partitions(timestamptz) IS 'Before maintenance takes its lock: the exact row counts of the partitions whose range is over and that no other transaction holds a lock on (no claim can write into them any more).';
REVOKE EXECUTE ON FUNCTION idem.count_ended_partitions(timestamptz) FROM PUBLIC;

-- Under the maintenance lock: drop every partition whose range is over
-- (every row in it has expired), oldest first, counting its rows (counted
-- before the lock by idem.count_ended_partitions, else now), then delete
-- the claims that expired in the default partition before any partition
-- covered them (maintenance was late): the only rows deleted one by one.
-- Then the registrations of business types in TTL classes (idem.type_classes)
-- that no partition left can hold a claim of: their claims all expired, in
-- partitions dropped here or before, or in the default partition. (Under
-- the lock no claim reads them meanwhile.) Without counted_parts (under
-- Citus) nothing is counted and rows_in_dropped is NULL.
CREATE FUNCTION idem.remove_expired(t_now timestamptz, counted_parts oid[] DEFAULT NULL, counted bigint[] DEFAULT NULL,
                                    OUT dropped text[], OUT rows_in_dropped bigint, OUT deleted_from_default bigint)
    VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    p record;
    i int;
    n bigint;
    firsts timestamptz[];
BEGIN
    dropped := '{}';
    rows_in_dropped := CASE WHEN counted_parts IS NOT NULL THEN 0 END;
    FOR p IN SELECT b.partition, b.name FROM idem.partition_bounds b
              WHERE NOT b.is_default AND b.range_to <= t_now ORDER BY b.range_to LOOP
        IF counted_parts IS NOT NULL THEN
            i := array_position(counted_parts, p.partition::oid);
            IF i IS NOT NULL THEN
                n := counted[i];
            ELSE
                EXECUTE format('SELECT count(*) FROM %s', p.partition) INTO n;
            END IF;
            rows_in_dropped := rows_in_dropped + n;
        END IF;
        EXECUTE format('DROP TABLE %s', p.partition);
        dropped := dropped || p.name;
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
COMMENT ON FUNCTION idem.remove_expired(timestamptz, oid[], bigint[]) IS 'Under the maintenance lock: drop the partitions whose range is over, counting their rows exactly (with the counts taken before the lock where given), delete the claims that expired in the default partition and the registrations of types in TTL classes that no partition left can hold a claim of; reports what it removed.';
REVOKE EXECUTE ON FUNCTION idem.remove_expired(timestamptz, oid[], bigint[]) FROM PUBLIC;

-- idem_maintain's work when Citus distributes idem.claims (docs/scaling.md,
-- "Maintenance"). Run on the coordinator; every statement on idem.claims
-- and its partitions is propagated by Citus to the shards on the workers.
-- The same rules as on a single node, with Citus's constraints:
--  * the work is decided first, and nothing is locked when there is none;
--  * LOCK TABLE idem.claims, waiting idem.maintenance_lock_timeout at a
--    time on every node (lock_timeout propagated to the workers as a SET
--    LOCAL), retried with a growing pause (idem.maintenance_lock_retries
--    times). Citus propagates the LOCK to idem.claims on every node, and
--    every claim locks idem.claims on its node before any shard
--    (storage/citus.rs), so once maintenance holds the lock no claim holds a
--    shard lock it needs, and claims queue behind it instead of forming a
--    distributed deadlock with its DDL. A refusal on a worker reaches the
--    coordinator as 55P03, or as XX000 "failure on connection marked as
--    essential", or 40P01: all mean "try again". (NOWAIT, as in 0.3.0,
--    starved under claims in multi-statement transactions: some worker
--    always had one open);
--  * partitions are made per TTL class (idem.coming_partitions), named to
--    the millisecond (idem.partition_name), aligned to the class's width,
--    created with their key index, at most idem.premake_limit per run, and
--    continue after the class's last existing range;
--  * claims waiting in the default partition for a range being created are
--    moved into the new partition before it is attached (a standalone
--    distributed table co-located with idem.claims, filled with INSERT ...
--    SELECT, then attached), so that the default partition never makes a
--    run fail;
--  * a partition made without its index (idem 0.2.0 used Citus's
--    create_time_partitions) gets it;
--  * a shard without REPLICA IDENTITY FULL on a worker (a shard move makes
--    the moved shard of idem.claims anew without it) gets it again, through
--    its distributed table (idem.shard_replica_identity_missing).
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

-- The settings pinned below make every timestamp this function writes into
-- DDL (partition bounds, CHECK constraints) print as ISO 8601 in UTC, which
-- reads back exactly; no session's DateStyle, TimeZone or abbreviation set
-- can move a bound.
CREATE FUNCTION idem_maintain() RETURNS jsonb
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
    counted     record;
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

    -- Exact counts of what will be dropped, taken before the lock.
    SELECT * INTO counted FROM idem.count_ended_partitions(t_now);

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
        SELECT * INTO removed FROM idem.remove_expired(t_now, counted.parts, counted.counts);

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
        'rows_in_dropped_partitions', removed.rows_in_dropped,
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
-- SECURITY DEFINER, takes ACCESS EXCLUSIVE on idem.claims and creates
-- partitions: for the operator (and pg_cron), not for every role.
REVOKE EXECUTE ON FUNCTION idem_maintain() FROM PUBLIC;

CREATE FUNCTION idem_schedule_maintenance(schedule text DEFAULT '*/5 * * * *') RETURNS bigint
    VOLATILE SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    job bigint;
BEGIN
    IF to_regprocedure('cron.schedule(text,text,text)') IS NULL THEN
        RAISE EXCEPTION 'idem: pg_cron is not installed in this database'
            USING ERRCODE = '55000',
                  HINT = 'Install pg_cron (shared_preload_libraries = ''pg_cron'', then CREATE EXTENSION pg_cron in the database named by cron.database_name), or run "SELECT idem_maintain();" every few minutes from any scheduler: cron with psql, a systemd timer, a Kubernetes CronJob.';
    END IF;
    -- Scheduling again under the same name updates the job.
    EXECUTE 'SELECT cron.schedule($1, $2, $3)' INTO job
      USING 'idem_maintain', schedule, format('SELECT %I.idem_maintain()', '@extschema@');
    PERFORM @extschema@.idem_maintain();
    RETURN job;
END
$fn$;
COMMENT ON FUNCTION idem_schedule_maintenance(text) IS
'Register (or update) the pg_cron job "idem_maintain" that runs SELECT idem_maintain() on the given schedule, and run maintenance once now. Without pg_cron: SQLSTATE 55000 with a hint on scheduling it elsewhere.';

-- Rows and bytes of every partition of idem.claims: this node's statistics,
-- or, when Citus distributes idem.claims, the sums over the shards of each
-- partition on every worker (the coordinator holds only empty shells).
-- SECURITY DEFINER for the view: its readers need no rights on schema idem
-- (nor can they call it by name without them).
CREATE FUNCTION idem.partition_sizes() RETURNS TABLE (partition regclass, estimated_rows bigint, bytes bigint)
    STABLE PARALLEL UNSAFE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
BEGIN
    IF NOT idem.is_distributed('idem.claims') THEN
        RETURN QUERY SELECT b.partition, greatest(c.reltuples, 0)::bigint, pg_total_relation_size(b.partition)
                       FROM idem.partition_bounds b JOIN pg_class c ON c.oid = b.partition;
        RETURN;
    END IF;
    -- Each worker reports the shards it holds, by the partition they
    -- belong to (shards are named by shard_name; pg_class is not queried,
    -- as Citus may hide shards from it). Live tuples from the statistics
    -- stand for the estimate.
    RETURN QUERY EXECUTE $q$
        SELECT (r->>'p')::regclass, sum((r->>'rows')::bigint)::bigint, sum((r->>'bytes')::bigint)::bigint
          FROM pg_catalog.run_command_on_workers($c$
                 SELECT coalesce(json_agg(json_build_object(
                          'p', s.logicalrelid::regclass::text,
                          'rows', pg_catalog.pg_stat_get_live_tuples(to_regclass(pg_catalog.shard_name(s.logicalrelid, s.shardid))),
                          'bytes', pg_catalog.pg_total_relation_size(to_regclass(pg_catalog.shard_name(s.logicalrelid, s.shardid))))), '[]')
                   FROM pg_catalog.pg_dist_shard s JOIN pg_catalog.pg_dist_placement pl USING (shardid)
                  WHERE pl.groupid = (SELECT groupid FROM pg_catalog.pg_dist_local_group)
                    AND s.logicalrelid IN (SELECT inhrelid FROM pg_catalog.pg_inherits
                                            WHERE inhparent = 'idem.claims'::pg_catalog.regclass)$c$) w,
               json_array_elements(w.result::json) r
         WHERE w.success
         GROUP BY 1$q$;
END
$fn$;
COMMENT ON FUNCTION idem.partition_sizes() IS 'Estimated rows and bytes of each partition of idem.claims (under Citus: summed over the shards on every worker).';

CREATE VIEW idem_partitions AS
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

CREATE VIEW idem_stats AS
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

-- Leased claims (idem_claim(..., lease => ...)): work outside the database
-- that has not finished. The lease record's fields are internal; this view
-- is their stable face, for operators (no lease token, only its owner).
CREATE VIEW idem_leases AS
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

-- pg_dump keeps configuration and the claims that live in the default
-- partition; the other partitions are ordinary tables and are dumped anyway.
SELECT pg_catalog.pg_extension_config_dump('idem.biz_types', '');
SELECT pg_catalog.pg_extension_config_dump('idem.claims_default', '');
SELECT pg_catalog.pg_extension_config_dump('idem.type_classes', '');
