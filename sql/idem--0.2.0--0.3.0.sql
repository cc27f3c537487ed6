-- idem 0.2.0 → 0.3.0. Hand-written: every schema change between the two
-- versions, in the order a fresh 0.3.0 install makes it.
-- tests/scenarios/upgrade.sh installs 0.2.0 (tests/upgrade/idem--0.2.0.sql),
-- claims, runs this update, and checks that the claims survive and that the
-- schema equals a fresh 0.3.0 install's.
\echo Use "ALTER EXTENSION idem UPDATE TO '0.3.0'" to load this file. \quit

-- This update alters idem.claims and its partitions (replica identity) and
-- idem.biz_types. It runs with the library of the package that ships it,
-- whose claims read idem.biz_types before they lock idem.claims (as
-- sql/idem--0.3.0--0.4.0.sql says; the update to 0.4.0 runs this one
-- first): take the locks in that order too, so that the update waits for
-- claims in progress instead of deadlocking with one of them (with
-- idem.claims alone first, a claim holding biz_types and waiting for
-- idem.claims, and this update holding idem.claims and waiting to alter
-- biz_types, deadlocked).
LOCK TABLE idem.biz_types, idem.claims IN ACCESS EXCLUSIVE MODE;

-- storage.sql ---------------------------------------------------------------


-- Business types may be reserved for the members of a role (idem_set_owner).
ALTER TABLE idem.biz_types ADD COLUMN owner regrole;
COMMENT ON TABLE idem.biz_types IS 'Business type settings: the TTL of its claims (idem_configure) and the role whose members alone may use it (idem_set_owner).';

-- Logical replication: updates and deletes of claims carry the whole old
-- row (no column set identifies a claim), on every partition, including
-- those 0.2.0's maintenance made.
ALTER TABLE idem.claims REPLICA IDENTITY FULL;
DO $$
DECLARE
    p record;
BEGIN
    FOR p IN SELECT inhrelid::regclass AS rel FROM pg_inherits WHERE inhparent = 'idem.claims'::regclass LOOP
        EXECUTE format('ALTER TABLE %s REPLICA IDENTITY FULL', p.rel);
    END LOOP;
END
$$;

-- Partition bounds read in binary, for the views and maintenance.
CREATE FUNCTION idem.partition_from(partition regclass) RETURNS timestamptz
    STABLE STRICT PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_partition_from';
COMMENT ON FUNCTION idem.partition_from(regclass) IS 'Lower bound (inclusive) of a partition of idem.claims, read in binary; NULL for the default partition.';
CREATE FUNCTION idem.partition_to(partition regclass) RETURNS timestamptz
    STABLE STRICT PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_partition_to';
COMMENT ON FUNCTION idem.partition_to(regclass) IS 'Upper bound (exclusive) of a partition of idem.claims, read in binary; NULL for the default partition.';

-- claim.sql -----------------------------------------------------------------

COMMENT ON FUNCTION idem_claim(text, text, interval, text, boolean, interval) IS
'Claim (biz_type, key) in the current transaction. First arrival: claimed = true, state = new. Duplicate: claimed = false and the first outcome (completed/failed with its result). Concurrent uncommitted claim: waits for it (wait => true) or returns state = in_progress at once. ttl overrides the type''s TTL; a differing fingerprint raises ID001. With lease (at most the ttl), the claim is meant to be committed before work outside the database: others see in_progress until it is finished or the lease runs out, then the next claim takes it over; the lease holder gets {attempt, recovery_point, recovery_data, lease_until, lease_token} in result and proves ownership with lease_token. 25006 in a read-only transaction.';
COMMENT ON FUNCTION idem_complete(text, text, jsonb, text) IS
'Store the outcome of a claim this transaction made, or of a leased claim whose lease_token the caller passes; duplicates get result back. ID003 otherwise (also for a leased claim without its token: behind a connection pooler a session is not a client).';
COMMENT ON FUNCTION idem_fail(text, text, jsonb, text) IS
'Store a deterministic business failure (e.g. insufficient stock) for a claim the caller holds (made by this transaction, or leased with the lease_token passed); duplicates get state = failed and the error back. ID003 if the caller holds no claim on the key.';
COMMENT ON FUNCTION idem_checkpoint(text, text, text, jsonb, text) IS
'Record a recovery point (e.g. charge_created) and its data on a leased claim, in the caller''s transaction, and renew the lease (never beyond the claim''s expiry). Pass the lease_token idem_claim returned (or call it in the transaction that took the lease). A later takeover is told the last point. ID003 for anyone else.';
COMMENT ON FUNCTION idem_configure(text, interval) IS
'Set the TTL of a business type (1 second to 400 days); NULL returns it to idem.default_ttl. Applies to claims made afterwards. Keeps the type''s owner.';

CREATE FUNCTION idem_set_owner(biz_type text, owner regrole) RETURNS void
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_set_owner';
COMMENT ON FUNCTION idem_set_owner(text, regrole) IS
'Reserve a business type for the members of a role: only they may claim, finish, look up or forget its keys (42501 for others). NULL opens it to every role again. Keeps the type''s TTL.';
REVOKE EXECUTE ON FUNCTION idem_set_owner(text, regrole) FROM PUBLIC;

-- How calls reach idem.claims on this node: direct, sql or citus.
CREATE FUNCTION idem_storage_path() RETURNS text
    VOLATILE PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_storage_path';
COMMENT ON FUNCTION idem_storage_path() IS
'How calls in this database on this node reach idem.claims: direct (heap and index access), sql (SQL on idem.claims, idem.storage_access = sql), or citus (idem.claims distributed by Citus: a call on a key runs only on the node holding its shard and reaches the shard directly there; elsewhere it is refused with 0A000).';

-- maintenance.sql -----------------------------------------------------------

-- Settings are read under a pinned IntervalStyle.
ALTER FUNCTION idem.setting_interval(text, interval) SET IntervalStyle = 'postgres';

-- Bounds in binary rather than parsed back from pg_get_expr's text (which
-- follows the session's DateStyle and TimeZone).
CREATE OR REPLACE VIEW idem.partition_bounds AS
SELECT c.oid::regclass AS partition,
       c.relname::text AS name,
       idem.partition_from(c.oid) AS range_from,
       idem.partition_to(c.oid) AS range_to,
       idem.partition_to(c.oid) IS NULL AS is_default
  FROM pg_inherits h
  JOIN pg_class c ON c.oid = h.inhrelid
 WHERE h.inhparent = 'idem.claims'::regclass;
COMMENT ON VIEW idem.partition_bounds IS 'Partitions of idem.claims with their range of expires_at, read in binary (NULL bounds: the default partition).';

-- The maintenance reports stay local: a logical subscriber discards the
-- publisher's (their run_ids would collide with its own).
CREATE FUNCTION idem.discard_replicated() RETURNS trigger
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
    AS $$ BEGIN RETURN NULL; END $$;
COMMENT ON FUNCTION idem.discard_replicated() IS 'Trigger that discards a row change (enabled for replication only on idem.maintenance_runs: the reports stay local).';
CREATE TRIGGER local_only BEFORE INSERT OR UPDATE OR DELETE ON idem.maintenance_runs
    FOR EACH ROW EXECUTE FUNCTION idem.discard_replicated();
ALTER TABLE idem.maintenance_runs ENABLE REPLICA TRIGGER local_only;

-- Citus (docs/scaling.md): whether Citus distributes a table, and
-- idem_maintain's own work on a distributed idem.claims (locks without
-- waiting and retries, partitions with their key index, named to the
-- millisecond, claims moved out of the default partition).
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

-- The ranges maintenance adds next: from the end of the last range (or the
-- width-aligned slot holding t_now, when there is none yet) up to horizon,
-- at most limit_parts of them, each aligned to width. A change of width
-- continues after the last range: never a gap, never an overlap.
CREATE FUNCTION idem.coming_partitions(width interval, horizon timestamptz, limit_parts int, t_now timestamptz)
    RETURNS TABLE (name text, range_from timestamptz, range_to timestamptz)
    STABLE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    w_us numeric := extract(epoch FROM width) * 1000000;
    cur  timestamptz;
    made int := 0;
BEGIN
    SELECT greatest(max(b.range_to), to_timestamp(floor(extract(epoch FROM t_now) * 1000000 / w_us) * w_us / 1000000))
      INTO cur FROM idem.partition_bounds b WHERE NOT b.is_default;
    WHILE cur < horizon AND made < limit_parts LOOP
        name := idem.partition_name(cur);
        range_from := cur;
        range_to := to_timestamp((floor(extract(epoch FROM cur) * 1000000 / w_us) + 1) * w_us / 1000000);
        RETURN NEXT;
        made := made + 1;
        cur := range_to;
    END LOOP;
END
$fn$;
COMMENT ON FUNCTION idem.coming_partitions(interval, timestamptz, int, timestamptz) IS 'The next partition ranges idem_maintain makes: after the last range, up to horizon, at most limit_parts, aligned to width.';
REVOKE EXECUTE ON FUNCTION idem.coming_partitions(interval, timestamptz, int, timestamptz) FROM PUBLIC;

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

-- Under the maintenance lock: drop every partition whose range is over
-- (every row in it has expired), oldest first, then delete the claims that
-- expired in the default partition before any partition covered them
-- (maintenance was late): the only rows deleted one by one.
CREATE FUNCTION idem.remove_expired(t_now timestamptz, OUT dropped text[], OUT rows_in_dropped bigint, OUT deleted_from_default bigint)
    VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    p record;
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
END
$fn$;
COMMENT ON FUNCTION idem.remove_expired(timestamptz) IS 'Under the maintenance lock: drop the partitions whose range is over, and delete the claims that expired in the default partition; reports what it removed.';
REVOKE EXECUTE ON FUNCTION idem.remove_expired(timestamptz) FROM PUBLIC;

CREATE FUNCTION idem.maintain_distributed(width interval, max_ttl interval, limit_parts int, retries int)
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
    IF cardinality(names) = 0 AND unindexed IS NULL AND NOT idem.partition_set_needs_change(t_now) THEN
        RETURN jsonb_build_object('citus', true, 'partitions_created', '[]'::jsonb, 'partitions_dropped', '[]'::jsonb,
                                  'lock_attempts', 0);
    END IF;

    -- NOWAIT: lock_timeout is not propagated to the workers.
    SELECT * INTO got_lock FROM idem.lock_claims_for_maintenance(interval '0', retries);
    IF NOT got_lock.locked THEN
        RAISE NOTICE 'idem_maintain: idem.claims stayed locked by claims on some node through % attempts (last: %); nothing changed, the next run catches up', got_lock.attempts, got_lock.refusal;
        RETURN jsonb_build_object('citus', true, 'partitions_created', '[]'::jsonb, 'partitions_dropped', '[]'::jsonb,
                                  'lock_attempts', got_lock.attempts, 'skipped', jsonb_build_array('lock on idem.claims not available: ' || got_lock.refusal));
    END IF;

    t_now := clock_timestamp();
    replica_fixed := idem.repair_partition_set();
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

-- Maintenance writes bounds into DDL in one fixed style, whatever the
-- calling session's settings; it gives every partition REPLICA IDENTITY
-- FULL, moves claims out of the default partition through idem.claims once
-- their partition is attached, and warns of publications that need a change.
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
    width       interval := idem.setting_interval('idem.partition_width', '1 day');
    lock_wait   interval := idem.setting_interval('idem.maintenance_lock_timeout', '50 milliseconds');
    retries     int := coalesce(nullif(current_setting('idem.maintenance_lock_retries', true), '')::int, 20);
    limit_parts int := coalesce(nullif(current_setting('idem.premake_limit', true), '')::int, 32);
    max_ttl     interval;
    made        text[] := '{}';
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
    IF NOT pg_try_advisory_xact_lock(18756, 1) THEN
        RAISE NOTICE 'idem_maintain is already running in another session; this call did nothing';
        RETURN jsonb_build_object('skipped', 'another idem_maintain() is running');
    END IF;
    IF width < interval '100 milliseconds' OR width > interval '400 days' THEN
        RAISE EXCEPTION 'idem: idem.partition_width must be between 100 milliseconds and 400 days, not %', width
            USING ERRCODE = '22023';
    END IF;

    -- The longest TTL a coming claim can get without a per-call override.
    SELECT greatest(idem.setting_interval('idem.default_ttl', '24 hours'), max(ttl))
      INTO max_ttl FROM idem.biz_types;

    -- A Citus-distributed idem.claims (idem_distribute, docs/scaling.md):
    -- its partitions are made and dropped through Citus, on every node.
    IF idem.is_distributed('idem.claims') THEN
        report := idem.maintain_distributed(width, max_ttl, limit_parts, retries)
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
    FOR part IN SELECT * FROM idem.coming_partitions(width, t_now + max_ttl + width, limit_parts, t_now) LOOP
        EXECUTE format('CREATE TABLE idem.%I (LIKE idem.claims INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
                          CONSTRAINT range CHECK (expires_at >= %L AND expires_at < %L))',
                       part.name, part.range_from, part.range_to);
        EXECUTE format('CREATE INDEX ON idem.%I (idem.key_hash(biz_type, key))', part.name);
        EXECUTE format('ALTER TABLE idem.%I REPLICA IDENTITY FULL', part.name);
        made := made || part.name;
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
            EXECUTE 'SELECT EXISTS (SELECT 1 FROM idem.claims_default WHERE expires_at >= $1 AND expires_at < $2)'
               INTO to_move USING los[1], his[cardinality(made)];
        END IF;
        IF to_move THEN
            CREATE TEMPORARY TABLE idem_maintain_moving (LIKE idem.claims);
            EXECUTE 'WITH m AS (DELETE FROM idem.claims_default WHERE expires_at >= $1 AND expires_at < $2 RETURNING *)
                     INSERT INTO pg_temp.idem_maintain_moving SELECT * FROM m' USING los[1], his[cardinality(made)];
        END IF;
        FOR i IN 1 .. cardinality(made) LOOP
            EXECUTE format('ALTER TABLE idem.claims ATTACH PARTITION idem.%I FOR VALUES FROM (%L) TO (%L)',
                           made[i], los[i], his[i]);
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

-- idem_partitions: under Citus, rows and bytes summed over the shards on
-- the workers (the coordinator's partitions are empty shells).
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

CREATE OR REPLACE VIEW idem_partitions AS
SELECT b.name AS partition,
       b.range_from,
       b.range_to,
       b.is_default,
       coalesce(s.estimated_rows, 0) AS estimated_rows,
       coalesce(s.bytes, 0) AS bytes,
       coalesce(b.range_to <= now(), false) AS expired
  FROM idem.partition_bounds b
  LEFT JOIN idem.partition_sizes() s ON s.partition = b.partition
 ORDER BY b.is_default, b.range_from;
COMMENT ON VIEW idem_partitions IS 'Partitions of idem.claims: range, estimated rows, bytes (under Citus: summed over the workers), and whether every claim in it has expired.';

-- replication.sql -----------------------------------------------------------

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
      JOIN pg_publication_tables t ON t.pubname = p.pubname AND t.schemaname = 'idem'
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
SELECT p.pubname AS publication,
       p.puballtables AS all_tables,
       p.pubviaroot AS via_root,
       array_to_string(ARRAY[CASE WHEN p.pubinsert THEN 'insert' END, CASE WHEN p.pubupdate THEN 'update' END,
                             CASE WHEN p.pubdelete THEN 'delete' END, CASE WHEN p.pubtruncate THEN 'truncate' END], ', ') AS publishes,
       (SELECT array_agg(format('%I.%I', t.schemaname, t.tablename) ORDER BY t.tablename)
          FROM pg_publication_tables t WHERE t.pubname = p.pubname AND t.schemaname = 'idem') AS tables,
       coalesce((SELECT array_agg(r.problem ORDER BY r.problem) FROM idem.publication_problems() r
                  WHERE r.publication = p.pubname), '{}') AS problems
  FROM pg_publication p
 WHERE EXISTS (SELECT 1 FROM pg_publication_tables t WHERE t.pubname = p.pubname AND t.schemaname = 'idem')
 ORDER BY 1;
COMMENT ON VIEW idem_publications IS
'Publications that include tables of schema idem: what they publish, which idem tables, and what would stop a subscriber or lose claim updates there (problems; empty when fine).';

-- metrics.sql ---------------------------------------------------------------

-- What an operator watches: counters of the claim protocol's outcomes
-- (src/metrics.rs; they need shared_preload_libraries = 'idem'), the record
-- of maintenance runs, and the health checks to alert on. A dashboard and a
-- postgres_exporter queries file built on these are in monitoring/.

-- The counters of this database, one row per business type used since the
-- server started (or the counters were reset); without preloading, one row
-- that says so.
CREATE FUNCTION idem.metrics(
    OUT biz_type text,
    OUT claims bigint,
    OUT takeovers bigint,
    OUT duplicates_completed bigint,
    OUT duplicates_failed bigint,
    OUT in_progress bigint,
    OUT waits bigint,
    OUT wait_seconds double precision,
    OUT fingerprint_mismatches bigint,
    OUT not_held bigint,
    OUT serialization_failures bigint,
    OUT completes bigint,
    OUT fails bigint,
    OUT checkpoints bigint,
    OUT stats_since timestamptz,
    OUT note text)
    RETURNS SETOF record
    VOLATILE ROWS 10
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_metrics';
COMMENT ON FUNCTION idem.metrics() IS 'The counters in shared memory of this database (read by the view idem_metrics).';

CREATE FUNCTION idem.metrics_info(OUT counting boolean, OUT slots_used int, OUT slots int, OUT overflowed boolean)
    RETURNS SETOF record
    VOLATILE ROWS 1
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_metrics_info';
COMMENT ON FUNCTION idem.metrics_info() IS 'Whether the counters run (idem preloaded), how many of their (database, biz_type) slots are used, of how many, and whether some pair found no room.';

CREATE VIEW idem_metrics AS
SELECT m.biz_type,
       m.claims,
       m.takeovers,
       m.duplicates_completed,
       m.duplicates_failed,
       m.in_progress,
       m.waits,
       m.wait_seconds,
       m.fingerprint_mismatches,
       m.not_held,
       m.serialization_failures,
       m.completes,
       m.fails,
       m.checkpoints,
       m.stats_since,
       m.note
  FROM idem.metrics() m;
COMMENT ON VIEW idem_metrics IS
'Counters per business type of this database since stats_since (server start, first use, or idem_metrics_reset()): claims (new), takeovers (of leases that ran out), duplicates answered completed / failed, in_progress answers, waits for another transaction and their total time, ID001 fingerprint mismatches, ID003 refusals (not_held), 40001 raised, and idem_complete / idem_fail / idem_checkpoint calls. Counted when decided, committed or not; in shared memory, reset on restart like pg_stat_*. Needs shared_preload_libraries = ''idem''; without it, one row whose note says so. A row with biz_type NULL and a note counts the pairs that found the table full.';

CREATE FUNCTION idem_metrics_reset() RETURNS void
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_metrics_reset';
COMMENT ON FUNCTION idem_metrics_reset() IS
'Zero the idem_metrics counters of this database (and the overflow row); their stats_since becomes now. Does nothing when the counters are off.';
REVOKE EXECUTE ON FUNCTION idem_metrics_reset() FROM PUBLIC;

-- One row: what the reports in idem.maintenance_runs (the last 100 runs)
-- say about maintenance.
CREATE VIEW idem_maintenance AS
WITH runs AS (
    SELECT r.run_id,
           r.finished_at,
           r.report,
           coalesce(jsonb_typeof(r.report->'skipped') = 'array', false) AS skipped
      FROM idem.maintenance_runs r
), last AS (
    SELECT * FROM runs ORDER BY run_id DESC LIMIT 1
), success AS (
    SELECT max(run_id) AS run_id, max(finished_at) AS finished_at FROM runs WHERE NOT skipped
)
SELECT last.finished_at AS last_run_at,
       (last.report->>'duration_ms')::numeric AS last_duration_ms,
       jsonb_array_length(coalesce(last.report->'partitions_created', '[]')) AS last_partitions_created,
       jsonb_array_length(coalesce(last.report->'partitions_dropped', '[]')) AS last_partitions_dropped,
       coalesce((last.report->>'rows_moved_from_default')::bigint, 0) AS last_rows_moved_from_default,
       last.skipped AS last_skipped,
       success.finished_at AS last_success_at,
       now() - success.finished_at AS since_last_success,
       (SELECT count(*) FROM runs WHERE run_id > coalesce(success.run_id, 0)) AS skipped_in_a_row,
       (SELECT count(*) FROM runs) AS runs_recorded,
       (SELECT count(*) FROM runs WHERE skipped) AS runs_skipped
  FROM success LEFT JOIN last ON true;
COMMENT ON VIEW idem_maintenance IS
'Maintenance at a glance, from the reports of the last 100 idem_maintain() runs (idem.maintenance_runs): the last run (when, how long, partitions created and dropped, claims moved out of the default partition, whether it gave up on its lock), the last successful run and how long ago, runs in a row that gave up on the lock, runs recorded and how many of them gave up.';

-- Intervals and times in idem_health's texts, the same whatever the
-- reading session's IntervalStyle, DateStyle and TimeZone (a text that
-- changes with them cannot be alerted on or compared): intervals in the
-- 'postgres' style ("3 days 00:15:00"), times in ISO 8601 UTC.
CREATE FUNCTION idem.interval_text(i interval) RETURNS text
    STABLE PARALLEL SAFE
    SET IntervalStyle = 'postgres'
    LANGUAGE sql AS $fn$ SELECT i::text $fn$;
COMMENT ON FUNCTION idem.interval_text(interval) IS 'An interval as text in the postgres IntervalStyle, whatever the session''s (idem_health''s texts).';

CREATE FUNCTION idem.time_text(t timestamptz) RETURNS text
    STABLE PARALLEL SAFE
    LANGUAGE sql AS $fn$ SELECT to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') $fn$;
COMMENT ON FUNCTION idem.time_text(timestamptz) IS 'A time as ISO 8601 text in UTC, whatever the session''s DateStyle and TimeZone (idem_health''s texts).';

-- Claims in the default partition, counted up to cap (NULL if the default
-- partition is missing). Named in dynamic SQL so that nothing depends on
-- the partition (maintenance recreates it if it is dropped), and SECURITY
-- DEFINER so that the view works for roles that may not read idem.claims.
CREATE FUNCTION idem.default_partition_rows(cap bigint) RETURNS bigint
    STABLE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    n bigint;
BEGIN
    IF to_regclass('idem.claims_default') IS NULL THEN
        RETURN NULL;
    END IF;
    EXECUTE 'SELECT count(*) FROM (SELECT 1 FROM idem.claims_default LIMIT $1) d' INTO n USING cap;
    RETURN n;
END
$fn$;
COMMENT ON FUNCTION idem.default_partition_rows(bigint) IS 'Rows in idem.claims_default, counted up to cap; NULL when it is missing.';

-- One row per check, always in this order, with its severity (ok, info,
-- warning, critical), a measured value, what was found, and what to do.
-- Alert on severity <> 'ok'. Reads idem.claims once for leased claims (a
-- scan, like idem_leases); everything else is small.
CREATE VIEW idem_health AS
WITH s AS (
    SELECT idem.setting_interval('idem.partition_width', '1 day') AS width,
           greatest(idem.setting_interval('idem.default_ttl', '24 hours'),
                    (SELECT max(t.ttl) FROM idem.biz_types t)) AS longest_ttl,
           idem.setting_interval('idem.health_maintenance_after', '15 minutes') AS maintenance_after,
           idem.setting_interval('idem.health_lease_after', '15 minutes') AS lease_after
), m AS (
    SELECT * FROM idem_maintenance
), p AS (
    SELECT max(b.range_to) FILTER (WHERE NOT b.is_default) AS horizon,
           count(*) FILTER (WHERE NOT b.is_default AND b.range_to < now() - s.maintenance_after) AS expired_left
      FROM s LEFT JOIN idem.partition_bounds b ON true
     GROUP BY s.maintenance_after
), d AS (
    SELECT idem.default_partition_rows(10000) AS n
), l AS (
    SELECT count(*) AS n, min(x.lease_until) AS oldest
      FROM s JOIN idem_leases x ON x.lease_until < now() - s.lease_after
), mi AS (
    SELECT * FROM idem.metrics_info()
)
SELECT 'maintenance_overdue'::text AS check_name,
       CASE WHEN m.last_success_at IS NULL OR m.last_success_at < now() - s.width THEN 'critical'
            WHEN m.last_success_at < now() - s.maintenance_after THEN 'warning'
            ELSE 'ok' END AS severity,
       extract(epoch FROM now() - m.last_success_at)::double precision AS value,
       CASE WHEN m.last_success_at IS NULL THEN 'no successful idem_maintain() run is recorded'
            ELSE format('the last successful idem_maintain() run finished %s ago (warning after %s, critical after %s)',
                        idem.interval_text(date_trunc('second', now() - m.last_success_at)), idem.interval_text(s.maintenance_after), idem.interval_text(s.width)) END AS detail,
       'Run SELECT idem_maintain(), and schedule it every few minutes: SELECT idem_schedule_maintenance() with pg_cron, or cron and psql.'::text AS action
  FROM s, m
UNION ALL
SELECT 'maintenance_lock',
       CASE WHEN m.skipped_in_a_row >= 3 THEN 'warning' ELSE 'ok' END,
       m.skipped_in_a_row,
       format('%s run(s) in a row gave up on the lock on idem.claims', m.skipped_in_a_row),
       'A long transaction keeps idem.claims locked: find it in pg_stat_activity (oldest xact_start) and end it, or raise idem.maintenance_lock_retries.'
  FROM m
UNION ALL
SELECT 'default_partition',
       CASE WHEN d.n IS NULL THEN 'critical' WHEN d.n > 0 THEN 'warning' ELSE 'ok' END,
       d.n,
       CASE WHEN d.n IS NULL THEN 'idem.claims_default is missing: claims beyond the premade partitions fail'
            WHEN d.n >= 10000 THEN 'at least 10000 claims in the default partition'
            ELSE format('%s claims in the default partition', d.n) END,
       'Run SELECT idem_maintain() (it moves them into range partitions); claims that stay there have a per-call ttl beyond the premade partitions: give their type that TTL with idem_configure instead.'
  FROM d
UNION ALL
SELECT 'partition_horizon',
       CASE WHEN p.horizon IS NULL OR p.horizon < now() + s.longest_ttl THEN 'warning' ELSE 'ok' END,
       extract(epoch FROM p.horizon - (now() + s.longest_ttl))::double precision,
       CASE WHEN p.horizon IS NULL THEN 'no range partition exists: every claim goes to the default partition'
            ELSE format('the partitions end %s after the expiry of a claim made now with the longest TTL (%s)',
                        idem.interval_text(date_trunc('second', p.horizon - (now() + s.longest_ttl))), idem.interval_text(s.longest_ttl)) END,
       'Run SELECT idem_maintain(); if the horizon stays short, raise idem.premake_limit or idem.partition_width (a run makes partitions up to now + the longest TTL + one width).'
  FROM s, p
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
       CASE WHEN NOT mi.counting THEN 'info' WHEN mi.overflowed THEN 'warning' ELSE 'ok' END,
       mi.slots_used,
       CASE WHEN NOT mi.counting THEN 'counters are off (idem is not in shared_preload_libraries): idem_metrics has no counts'
            WHEN mi.overflowed THEN format('all %s (database, biz_type) slots of the counters are in use: idem_metrics counts the other types together in its overflow row', mi.slots)
            ELSE format('%s of %s (database, biz_type) slots of the counters in use', mi.slots_used, mi.slots) END,
       CASE WHEN NOT mi.counting THEN 'To count claims, duplicates, waits and errors: add idem to shared_preload_libraries and restart the server.'
            WHEN mi.overflowed THEN 'Use fewer business types; a restart empties the table (and loses the counts).'
            ELSE 'None.' END
  FROM mi;
COMMENT ON VIEW idem_health IS
'Health checks, one row each, always in the same order: maintenance_overdue, maintenance_lock, default_partition, partition_horizon, stuck_leases, expired_partitions, metrics; each with severity (ok, info, warning, critical), a measured value, what was found (detail) and a one-line action. Alert on severity <> ''ok''. Thresholds: idem.health_maintenance_after and idem.health_lease_after. Scans the live claims for leases (as idem_leases does).';

-- scaling.sql ---------------------------------------------------------------

-- idem_distribute can be run again (after this update: it registers
-- idem_forget for delegation too, and leaves distributed tables as they are).
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
    -- Delegated to the worker that owns the key, inside the caller's
    -- transaction, next to the business rows of the same value.
    PERFORM pg_catalog.create_distributed_function(f, 'key', colocate_with => 'idem.claims', force_delegation => true)
       FROM unnest(ARRAY[
           '@extschema@.idem_claim(text, text, interval, text, boolean, interval)',
           '@extschema@.idem_complete(text, text, jsonb, text)',
           '@extschema@.idem_fail(text, text, jsonb, text)',
           '@extschema@.idem_checkpoint(text, text, text, jsonb, text)',
           '@extschema@.idem_lookup(text, text)',
           '@extschema@.idem_forget(text, text)']::regprocedure[]) AS f;
END
$fn$;
COMMENT ON FUNCTION idem_distribute(regclass) IS
'Citus only: distribute idem.claims by key co-located with colocate_with (a table distributed by a text column), make idem.biz_types and idem.machines reference tables, and register the claim functions (claim, complete, fail, checkpoint, lookup, forget) for delegation to the worker owning the key. Run it again after an upgrade: what is distributed stays, the functions are registered again. 55000 without Citus or with idem.storage_access = direct. See docs/scaling.md.';
