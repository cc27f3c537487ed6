-- A prototype of idem_maintain's Citus branch (issue 14, item 4), for
-- measurement only: not idem's code. Run on the coordinator of a database
-- where idem_distribute has run. maint_proto(width, ttl_horizon):
--  * LOCK TABLE idem.claims IN ACCESS EXCLUSIVE MODE NOWAIT first (Citus
--    propagates the LOCK to every node with metadata, so claims on the
--    workers, which open the shell idem.claims before any shard, wait
--    behind it instead of forming a distributed deadlock with the DDL),
--    retried with backoff, as the single-node branch does;
--  * partitions named to the millisecond (idem.partition_name), aligned to
--    the width, each with its key index (CREATE INDEX on the partition is
--    propagated to its shards);
--  * claims waiting in the default partition for a new range are moved
--    into a standalone distributed table co-located with idem.claims, which
--    is then attached (no 23514);
--  * sequential multi-shard mode, so that DDL after the moves in one
--    transaction is allowed.
CREATE OR REPLACE FUNCTION maint_proto(width interval, ttl_horizon interval,
                                       retries int DEFAULT 20) RETURNS jsonb
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET TimeZone = 'UTC'
    SET DateStyle = 'ISO, YMD' SET IntervalStyle = 'postgres' AS $fn$
DECLARE
    started timestamptz := clock_timestamp();
    t_now timestamptz;
    w_us numeric := extract(epoch FROM width) * 1000000;
    horizon timestamptz;
    cur timestamptz; nxt timestamptz;
    attempt int := 0; locked boolean := false;
    made text[] := '{}'; dropped text[] := '{}';
    moved bigint := 0; n bigint; p record; nm text;
BEGIN
    PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
    LOOP
        attempt := attempt + 1;
        BEGIN
            LOCK TABLE idem.claims IN ACCESS EXCLUSIVE MODE NOWAIT;
            locked := true;
        -- A NOWAIT refused on a worker (55P03 there) reaches the coordinator
        -- as XX000 "failure on connection marked as essential".
        EXCEPTION WHEN lock_not_available OR deadlock_detected OR internal_error THEN
            locked := false;
        END;
        EXIT WHEN locked OR attempt >= retries;
        PERFORM pg_sleep(least(0.01 * attempt * attempt, 1.0));
    END LOOP;
    IF NOT locked THEN
        RETURN jsonb_build_object('skipped', 'lock not available', 'lock_attempts', attempt);
    END IF;
    t_now := clock_timestamp();
    horizon := t_now + ttl_horizon + width;
    SELECT greatest(max(to_value::timestamptz),
                    to_timestamp(floor(extract(epoch FROM t_now) * 1000000 / w_us) * w_us / 1000000))
      INTO cur FROM pg_catalog.time_partitions
     WHERE parent_table = 'idem.claims'::regclass AND to_value IS NOT NULL;
    WHILE cur < horizon LOOP
        nxt := to_timestamp((floor(extract(epoch FROM cur) * 1000000 / w_us) + 1) * w_us / 1000000);
        nm := idem.partition_name(cur);
        IF EXISTS (SELECT 1 FROM idem.claims_default WHERE expires_at >= cur AND expires_at < nxt) THEN
            EXECUTE format('CREATE TABLE idem.%I (LIKE idem.claims INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', nm);
            PERFORM pg_catalog.create_distributed_table(format('idem.%I', nm), 'key', colocate_with => 'idem.claims');
            EXECUTE format('INSERT INTO idem.%I SELECT * FROM idem.claims_default WHERE expires_at >= $1 AND expires_at < $2', nm)
              USING cur, nxt;
            GET DIAGNOSTICS n = ROW_COUNT;
            moved := moved + n;
            DELETE FROM idem.claims_default WHERE expires_at >= cur AND expires_at < nxt;
            EXECUTE format('CREATE INDEX ON idem.%I (idem.key_hash(biz_type, key))', nm);
            EXECUTE format('ALTER TABLE idem.claims ATTACH PARTITION idem.%I FOR VALUES FROM (%L) TO (%L)', nm, cur, nxt);
        ELSE
            EXECUTE format('CREATE TABLE idem.%I PARTITION OF idem.claims FOR VALUES FROM (%L) TO (%L)', nm, cur, nxt);
            EXECUTE format('CREATE INDEX ON idem.%I (idem.key_hash(biz_type, key))', nm);
        END IF;
        made := made || nm;
        cur := nxt;
    END LOOP;
    FOR p IN SELECT partition::regclass AS rel, partition::text AS name FROM pg_catalog.time_partitions
              WHERE parent_table = 'idem.claims'::regclass AND to_value::timestamptz <= t_now LOOP
        EXECUTE format('DROP TABLE %s', p.rel);
        dropped := dropped || p.name;
    END LOOP;
    DELETE FROM idem.claims_default WHERE expires_at <= t_now;
    RETURN jsonb_build_object('partitions_created', to_jsonb(made), 'partitions_dropped', to_jsonb(dropped),
                              'rows_moved_from_default', moved, 'lock_attempts', attempt,
                              'duration_ms', round(extract(epoch FROM clock_timestamp() - started)::numeric * 1000, 3));
END
$fn$;
