-- idem 0.1.0 → 0.2.0. Hand-written: every schema change between the two
-- versions, in the order a fresh 0.2.0 install makes it.
-- tests/scenarios/upgrade.sh installs 0.1.0 (tests/upgrade/idem--0.1.0.sql,
-- the script 0.1.0 shipped with), claims, runs this update, and checks that
-- the claims survive and that the schema equals a fresh 0.2.0 install's.
\echo Use "ALTER EXTENSION idem UPDATE TO '0.2.0'" to load this file. \quit

-- Privileges: idem_define_machine changes machines database-wide and
-- idem_maintain takes ACCESS EXCLUSIVE on idem.claims; neither is for PUBLIC.
REVOKE EXECUTE ON FUNCTION idem_define_machine(text, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION idem_maintain() FROM PUBLIC;

-- idem_issue_token: a TTL is counted as idem_claim counts it (400 days max).
CREATE OR REPLACE FUNCTION idem_issue_token(biz_type text, ttl interval DEFAULT '10 minutes') RETURNS text
    VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    token text := idem.random_token();
BEGIN
    IF biz_type IS NULL OR ttl IS NULL THEN
        RAISE EXCEPTION 'idem: biz_type and ttl must not be NULL' USING ERRCODE = '22004';
    END IF;
    PERFORM idem.check_name('biz_type', biz_type);
    -- Counted as idem_claim counts a TTL (extract(epoch ...): a month is 30
    -- days, a year 365.25), not by interval comparison (a year is 360 days).
    IF extract(epoch FROM ttl) < 1 OR extract(epoch FROM ttl) > 400 * 86400 THEN
        RAISE EXCEPTION 'idem: ttl must be between 1 second and 400 days' USING ERRCODE = '22023';
    END IF;
    INSERT INTO idem.tokens (token_sha256, biz_type, issued_at, expires_at)
    VALUES (sha256(convert_to(token, 'UTF8')), biz_type, clock_timestamp(), clock_timestamp() + ttl);
    RETURN token;
END
$fn$;
COMMENT ON FUNCTION idem_issue_token(text, interval) IS
'Issue a one-time token for biz_type (256 bits from a CSPRNG; stored only as its SHA-256), valid for ttl (1 second to 400 days, default 10 minutes).';

-- idem_maintain: a Citus-distributed idem.claims is maintained through Citus.
CREATE OR REPLACE FUNCTION idem_maintain() RETURNS jsonb
    VOLATILE PARALLEL UNSAFE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    started     timestamptz := clock_timestamp();
    t_now       timestamptz;
    width       interval := idem.setting_interval('idem.partition_width', '1 day');
    lock_wait   interval := idem.setting_interval('idem.maintenance_lock_timeout', '50 milliseconds');
    retries     int := coalesce(nullif(current_setting('idem.maintenance_lock_retries', true), '')::int, 20);
    limit_parts int := coalesce(nullif(current_setting('idem.premake_limit', true), '')::int, 32);
    max_ttl     interval;
    horizon     timestamptz;
    cur         timestamptz;
    nxt         timestamptz;
    w_us        numeric;
    made        text[] := '{}';
    dropped     text[] := '{}';
    skipped     text[] := '{}';
    rows_dropped bigint := 0;
    moved       bigint := 0;
    expired_default bigint := 0;
    locked      boolean := false;
    expired_in_default boolean := false;
    los         timestamptz[] := '{}';
    his         timestamptz[] := '{}';
    old_lock_timeout text := current_setting('lock_timeout');
    attempt     int := 0;
    p           record;
    n           bigint;
    report      jsonb;
    distributed boolean := false;
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
    w_us := extract(epoch FROM width) * 1000000;

    -- The longest TTL a coming claim can get without a per-call override.
    SELECT greatest(idem.setting_interval('idem.default_ttl', '24 hours'), max(ttl))
      INTO max_ttl FROM idem.biz_types;

    -- A Citus-distributed idem.claims (idem_distribute, docs/scaling.md):
    -- its partitions are made and dropped through Citus, on every worker.
    IF to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = $1)'
           INTO distributed USING 'idem.claims'::regclass;
    END IF;
    IF distributed THEN
        t_now := clock_timestamp();
        EXECUTE 'SELECT pg_catalog.create_time_partitions($1, $2, $3)'
          USING 'idem.claims'::regclass, width, t_now + max_ttl + width;
        FOR p IN EXECUTE 'SELECT partition::regclass AS rel FROM pg_catalog.time_partitions
                           WHERE parent_table = $1 AND to_value::timestamptz <= $2'
                   USING 'idem.claims'::regclass, t_now LOOP
            EXECUTE format('DROP TABLE %s', p.rel);
            dropped := dropped || p.rel::text;
        END LOOP;
        DELETE FROM idem.tokens WHERE expires_at <= t_now;
        report := jsonb_build_object(
            'citus', true,
            'partitions_until', t_now + max_ttl + width,
            'partitions_dropped', to_jsonb(dropped),
            'duration_ms', round(extract(epoch FROM clock_timestamp() - started)::numeric * 1000, 3));
        INSERT INTO idem.maintenance_runs (started_at, finished_at, report) VALUES (started, clock_timestamp(), report);
        DELETE FROM idem.maintenance_runs WHERE run_id <= (SELECT max(run_id) - 100 FROM idem.maintenance_runs);
        RETURN report;
    END IF;

    -- Decide the work, and prepare the new partitions as standalone tables
    -- (index and range CHECK included, so that attaching them neither builds
    -- nor scans anything), all before taking the lock claims would queue on.
    t_now := clock_timestamp();
    horizon := t_now + max_ttl + width;
    SELECT greatest(max(range_to), to_timestamp(floor(extract(epoch FROM t_now) * 1000000 / w_us) * w_us / 1000000))
      INTO cur FROM idem.partition_bounds WHERE NOT is_default;
    WHILE cur < horizon AND coalesce(array_length(made, 1), 0) < limit_parts LOOP
        nxt := to_timestamp((floor(extract(epoch FROM cur) * 1000000 / w_us) + 1) * w_us / 1000000);
        EXECUTE format('CREATE TABLE idem.%I (LIKE idem.claims INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
                          CONSTRAINT range CHECK (expires_at >= %L AND expires_at < %L))',
                       idem.partition_name(cur), cur, nxt);
        EXECUTE format('CREATE INDEX ON idem.%I (idem.key_hash(biz_type, key))', idem.partition_name(cur));
        made := made || idem.partition_name(cur);
        los := los || cur;
        his := his || nxt;
        cur := nxt;
    END LOOP;

    -- (The default partition is named in dynamic SQL only: it may be gone.)
    IF to_regclass('idem.claims_default') IS NOT NULL THEN
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM idem.claims_default WHERE expires_at <= $1)' INTO expired_in_default USING t_now;
    END IF;
    IF cardinality(made) > 0
       OR to_regclass('idem.claims_default') IS NULL
       OR expired_in_default
       OR EXISTS (SELECT 1 FROM idem.partition_bounds WHERE NOT is_default AND range_to <= t_now)
    THEN
        -- Every change to the partition set locks idem.claims against claims
        -- (see design.md). Wait for the lock only briefly, so that claims
        -- queued behind the request are not held up, and try again a little
        -- later rather than queue behind a long transaction.
        LOOP
            attempt := attempt + 1;
            BEGIN
                IF lock_wait = interval '0' THEN
                    -- never queue: claims never wait behind us, but under
                    -- constant load the lock may never come free
                    LOCK TABLE idem.claims IN ACCESS EXCLUSIVE MODE NOWAIT;
                ELSE
                    PERFORM set_config('lock_timeout', (extract(epoch FROM lock_wait) * 1000)::bigint || 'ms', true);
                    LOCK TABLE idem.claims IN ACCESS EXCLUSIVE MODE;
                END IF;
                locked := true;
            EXCEPTION WHEN lock_not_available THEN
                locked := false;
            END;
            EXIT WHEN locked OR attempt >= retries;
            PERFORM pg_sleep(least(0.01 * attempt * attempt, 1.0));
        END LOOP;
        PERFORM set_config('lock_timeout', old_lock_timeout, true);
        IF NOT locked THEN
            RAISE NOTICE 'idem_maintain: idem.claims stayed locked by other transactions through % attempts; nothing changed, the next run catches up', attempt;
            skipped := skipped || 'lock on idem.claims not available'::text;
            -- The prepared tables go with this transaction's rollback of them.
            FOR i IN 1 .. coalesce(array_length(made, 1), 0) LOOP
                EXECUTE format('DROP TABLE idem.%I', made[i]);
            END LOOP;
            made := '{}';
        END IF;
    END IF;

    IF locked THEN
        t_now := clock_timestamp();
        -- Someone dropped the default partition: claims beyond the premade
        -- ranges need it back.
        IF to_regclass('idem.claims_default') IS NULL THEN
            CREATE TABLE idem.claims_default PARTITION OF idem.claims DEFAULT;
            CREATE INDEX claims_default_key_hash ON idem.claims_default (idem.key_hash(biz_type, key));
        END IF;
        -- Drop partitions whose range is over: every row in them has expired.
        FOR p IN SELECT b.partition, b.name FROM idem.partition_bounds b
                  WHERE NOT b.is_default AND b.range_to <= t_now ORDER BY b.range_to LOOP
            SELECT greatest(c.reltuples::bigint, 0) INTO n FROM pg_class c WHERE c.oid = p.partition;
            EXECUTE format('DROP TABLE %s', p.partition);
            dropped := dropped || p.name;
            rows_dropped := rows_dropped + n;
        END LOOP;

        -- Claims in the default partition that expired before any partition
        -- covered them (maintenance was late): the only rows deleted one by one.
        EXECUTE 'DELETE FROM idem.claims_default WHERE expires_at <= $1' USING t_now;
        GET DIAGNOSTICS expired_default = ROW_COUNT;

        -- Attach the prepared partitions, moving in the claims the default
        -- partition holds for their range.
        FOR i IN 1 .. coalesce(array_length(made, 1), 0) LOOP
            EXECUTE format($q$WITH m AS (DELETE FROM idem.claims_default
                                           WHERE expires_at >= %L AND expires_at < %L RETURNING *)
                              INSERT INTO idem.%I SELECT * FROM m$q$, los[i], his[i], made[i]);
            GET DIAGNOSTICS n = ROW_COUNT;
            moved := moved + n;
            EXECUTE format('ALTER TABLE idem.claims ATTACH PARTITION idem.%I FOR VALUES FROM (%L) TO (%L)',
                           made[i], los[i], his[i]);
        END LOOP;
    END IF;

    -- Spent and expired one-time tokens (a small table: row by row is fine).
    DELETE FROM idem.tokens WHERE expires_at <= t_now;

    report := jsonb_build_object(
        'partitions_created', to_jsonb(made),
        'partitions_dropped', to_jsonb(dropped),
        'rows_removed', rows_dropped + expired_default,
        'rows_in_dropped_partitions_estimate', rows_dropped,
        'expired_rows_deleted_from_default', expired_default,
        'rows_moved_from_default', moved,
        'lock_attempts', attempt,
        'skipped', CASE WHEN cardinality(skipped) > 0 THEN to_jsonb(skipped) END,
        'duration_ms', round(extract(epoch FROM clock_timestamp() - started)::numeric * 1000, 3));
    INSERT INTO idem.maintenance_runs (started_at, finished_at, report) VALUES (started, clock_timestamp(), report);
    DELETE FROM idem.maintenance_runs WHERE run_id <= (SELECT max(run_id) - 100 FROM idem.maintenance_runs);
    RETURN report;
END
$fn$;
COMMENT ON FUNCTION idem_maintain() IS
'Partition maintenance: create the partitions coming claims need, drop whole partitions whose claims have all expired, move claims out of the default partition. Runs once at a time (a concurrent call returns at once with a NOTICE); waits for its lock only briefly and retries. Returns a jsonb report.';

-- idem_machine: a NULL name is 22004.
CREATE OR REPLACE FUNCTION idem_machine(name text, state text DEFAULT NULL) RETURNS jsonb
    STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    m jsonb;
BEGIN
    IF name IS NULL THEN
        RAISE EXCEPTION 'idem: machine name must not be NULL' USING ERRCODE = '22004';
    END IF;
    SELECT jsonb_build_object('transitions', d.transitions, 'reachable', d.reachable) INTO m
      FROM idem.machines d WHERE d.name = idem_machine.name;
    IF m IS NULL THEN
        RAISE EXCEPTION 'idem: no state machine named "%"', name USING ERRCODE = '22023',
            HINT = 'Define it with idem_define_machine(name, transitions).';
    END IF;
    IF state IS NOT NULL AND NOT (m->'reachable' ? state) THEN
        RAISE EXCEPTION 'idem: "%" is not a state of machine "%"', state, name USING ERRCODE = '22023';
    END IF;
    RETURN m;
END
$fn$;
COMMENT ON FUNCTION idem_machine(text, text) IS
'A machine''s definition and the states reachable from each state. Raises 22023 if there is no such machine, or if state is given and is not one of its states.';

-- idem_transition: version_col must be an integer column other than the state column (22023).
CREATE OR REPLACE FUNCTION idem_transition(
    tbl         regclass,
    id_col      name,
    id          text,
    state_col   name,
    to_state    text,
    machine     text,
    version_col name   DEFAULT NULL,
    version     bigint DEFAULT NULL
) RETURNS text
    VOLATILE SECURITY INVOKER SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    m jsonb;
    id_type text;
    state_type text;
    sources text[];
    moved boolean;
    current_state text;
    current_version bigint;
    verdict text;
    bump text := '';
    guard text := '';
    n bigint;
BEGIN
    IF tbl IS NULL OR id_col IS NULL OR id IS NULL OR state_col IS NULL OR to_state IS NULL OR machine IS NULL THEN
        RAISE EXCEPTION 'idem: only version_col and version may be NULL' USING ERRCODE = '22004';
    END IF;
    m := @extschema@.idem_machine(machine, to_state);
    SELECT format_type(a.atttypid, a.atttypmod) INTO id_type
      FROM pg_attribute a WHERE a.attrelid = tbl AND a.attname = id_col AND a.attnum > 0 AND NOT a.attisdropped;
    SELECT format_type(a.atttypid, a.atttypmod) INTO state_type
      FROM pg_attribute a WHERE a.attrelid = tbl AND a.attname = state_col AND a.attnum > 0 AND NOT a.attisdropped;
    IF id_type IS NULL OR state_type IS NULL THEN
        RAISE EXCEPTION 'idem: table % has no column %', tbl, CASE WHEN id_type IS NULL THEN id_col ELSE state_col END
            USING ERRCODE = '42703';
    END IF;
    IF version_col IS NOT NULL THEN
        IF NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = tbl AND a.attname = version_col
                         AND a.attnum > 0 AND NOT a.attisdropped) THEN
            RAISE EXCEPTION 'idem: table % has no column %', tbl, version_col USING ERRCODE = '42703';
        END IF;
        IF version_col = state_col OR NOT EXISTS (
             SELECT 1 FROM pg_attribute a WHERE a.attrelid = tbl AND a.attname = version_col
                AND a.atttypid IN ('int2'::regtype, 'int4'::regtype, 'int8'::regtype)) THEN
            RAISE EXCEPTION 'idem: version_col % must be an integer column other than the state column', version_col
                USING ERRCODE = '22023';
        END IF;
        bump := format(', %I = %I + 1', version_col, version_col);
        IF version IS NOT NULL THEN
            guard := format(' AND %I = $4', version_col);
        END IF;
    ELSIF version IS NOT NULL THEN
        RAISE EXCEPTION 'idem: version needs version_col' USING ERRCODE = '22023';
    END IF;
    sources := ARRAY(SELECT f FROM jsonb_each(m->'transitions') e(f, t) WHERE t ? to_state);

    -- The one conditional UPDATE: it moves the row only from a state the
    -- machine allows, so a duplicate or an out-of-order event changes nothing.
    EXECUTE format('UPDATE %s SET %I = $1::%s%s WHERE %I = $2::%s AND %I::text = ANY ($3)%s RETURNING true',
                   tbl, state_col, state_type, bump, id_col, id_type, state_col, guard)
       INTO moved USING to_state, id, sources, version;
    IF moved THEN
        RETURN 'applied';
    END IF;

    -- Nothing moved: say why, from the row as it is now (locked, so that it
    -- cannot move under the verdict).
    EXECUTE format('SELECT %I::text%s FROM %s WHERE %I = $1::%s FOR SHARE',
                   state_col, CASE WHEN version_col IS NULL THEN ', NULL::bigint' ELSE format(', %I::bigint', version_col) END,
                   tbl, id_col, id_type)
       INTO current_state, current_version USING id;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n = 0 THEN
        RAISE EXCEPTION 'idem: % has no row with % = %', tbl, id_col, id USING ERRCODE = 'P0002';
    END IF;
    verdict := @extschema@.idem_classify_transition(machine, current_state, to_state);
    IF verdict = 'allowed' THEN
        -- only the version guard can have stopped an allowed transition
        RAISE EXCEPTION 'idem: % row % = % is at version %, not %', tbl, id_col, id, current_version, version
            USING ERRCODE = '40001', HINT = 'Read the row again and retry.';
    ELSIF verdict = 'illegal' THEN
        RAISE EXCEPTION 'idem: illegal transition from % to % (table %, % = %, machine %)',
            coalesce(current_state, 'NULL'), to_state, tbl, id_col, id, machine USING ERRCODE = 'ID002';
    END IF;
    RETURN verdict;
END
$fn$;
COMMENT ON FUNCTION idem_transition(regclass, name, text, name, text, text, name, bigint) IS
'Move one row of tbl to to_state if the machine allows it from its current state, in one conditional UPDATE. Returns applied, already (a duplicate), stale (an old event: drop it) or premature (an early event: retry later); illegal transitions raise ID002, a missing row P0002, a version mismatch (with version_col and version) 40001.';

-- idem_guard / idem_unguard: the trigger is found by what it runs, not by its
-- (possibly truncated) name; long column names get an md5-based name.
CREATE OR REPLACE FUNCTION idem_guard(tbl regclass, state_col name, machine text) RETURNS void
    VOLATILE SECURITY INVOKER SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    trigger_name text;
BEGIN
    IF tbl IS NULL OR state_col IS NULL OR machine IS NULL THEN
        RAISE EXCEPTION 'idem: arguments must not be NULL' USING ERRCODE = '22004';
    END IF;
    PERFORM @extschema@.idem_machine(machine);
    IF NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = tbl AND a.attname = state_col
                     AND a.attnum > 0 AND NOT a.attisdropped) THEN
        RAISE EXCEPTION 'idem: table % has no column %', tbl, state_col USING ERRCODE = '42703';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = tbl AND c.relkind IN ('r', 'p')) THEN
        RAISE EXCEPTION 'idem: % is not a table', tbl USING ERRCODE = '22023';
    END IF;
    -- Creating a trigger needs the TRIGGER privilege on tbl: the caller's.
    -- A guard already on the column is replaced.
    PERFORM @extschema@.idem_unguard(tbl, state_col);
    trigger_name := 'idem_guard_' || state_col;
    IF octet_length(trigger_name) > 63 THEN
        trigger_name := 'idem_guard_' || md5(state_col);
    END IF;
    EXECUTE format('CREATE TRIGGER %I BEFORE UPDATE OF %I ON %s FOR EACH ROW EXECUTE FUNCTION @extschema@.idem_guard_trigger(%L, %L)',
                   trigger_name, state_col, tbl, state_col, machine);
END
$fn$;
COMMENT ON FUNCTION idem_guard(regclass, name, text) IS
'Install a trigger on tbl so that no UPDATE, from any code path, moves state_col along a transition the machine does not allow (same-state updates pass); violations raise ID002 naming the table, the row key and both states.';

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
    -- bytes, so two long column names could share one.
    SELECT t.tgname INTO existing FROM pg_trigger t
     WHERE t.tgrelid = tbl AND NOT t.tgisinternal
       AND t.tgfoid = '@extschema@.idem_guard_trigger()'::regprocedure
       AND position(convert_to(state_col, pg_catalog.getdatabaseencoding()) || '\x00'::bytea IN t.tgargs) = 1;
    IF existing IS NOT NULL THEN
        EXECUTE format('DROP TRIGGER %I ON %s', existing, tbl);
    END IF;
END
$fn$;
COMMENT ON FUNCTION idem_unguard(regclass, name) IS 'Remove the guard idem_guard installed on tbl.state_col.';

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

-- Citus: idem_distribute (sql/scaling.sql).
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
    PERFORM pg_catalog.create_reference_table('idem.biz_types');
    PERFORM pg_catalog.create_reference_table('idem.machines');
    PERFORM pg_catalog.create_distributed_table('idem.claims', 'key', colocate_with => colocate_with::text);
    -- Delegated to the worker that owns the key, inside the caller's
    -- transaction, next to the business rows of the same value.
    PERFORM pg_catalog.create_distributed_function(f, 'key', colocate_with => 'idem.claims', force_delegation => true)
       FROM unnest(ARRAY[
           '@extschema@.idem_claim(text, text, interval, text, boolean, interval)',
           '@extschema@.idem_complete(text, text, jsonb, text)',
           '@extschema@.idem_fail(text, text, jsonb, text)',
           '@extschema@.idem_checkpoint(text, text, text, jsonb, text)',
           '@extschema@.idem_lookup(text, text)']::regprocedure[]) AS f;
END
$fn$;
COMMENT ON FUNCTION idem_distribute(regclass) IS
'Citus only: distribute idem.claims by key co-located with colocate_with (a table distributed by a text column), make idem.biz_types and idem.machines reference tables, and register the claim functions for delegation to the worker owning the key. 55000 without Citus or with idem.storage_access = direct. See docs/scaling.md.';
REVOKE EXECUTE ON FUNCTION idem_distribute(regclass) FROM PUBLIC;
