/* idem 0.2.0 as it shipped (commit 3783c4f): sql/storage.sql, claim.sql, maintenance.sql, guards.sql and scaling.sql in pgrx's order. Frozen for tests/scenarios/upgrade.sh. */

-- sql/storage.sql
-- Storage for idem. Lives in schema `idem`, which PUBLIC can neither read nor
-- write: every public function reaches it as SECURITY DEFINER.

CREATE SCHEMA idem;
REVOKE ALL ON SCHEMA idem FROM PUBLIC;
COMMENT ON SCHEMA idem IS 'idem storage: dedup records, business types, partitions. Not for direct use.';

-- Configured business types. A type needs no row to be used: claims carry
-- the type's name, so the first use of a type writes nothing here and waits
-- for nobody.
CREATE TABLE idem.biz_types (
    biz_type   text        PRIMARY KEY,
    ttl        interval,                 -- NULL: idem.default_ttl applies
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE idem.biz_types IS 'Business type settings (idem_configure): the TTL of its claims.';

-- The stable 64-bit digest a claim is indexed by (SipHash-1-3 of biz_type and
-- key). Written in Rust; the claim path computes the same value itself.
CREATE FUNCTION idem.key_hash(biz_type text, key text) RETURNS bigint
    IMMUTABLE STRICT PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_key_hash';
COMMENT ON FUNCTION idem.key_hash(text, text) IS 'Digest of (biz_type, key) that idem.claims is indexed by; stable across versions.';

-- The dedup records, range-partitioned by expiry: a partition whose upper
-- bound has passed holds only expired claims and is dropped whole.
-- Column order is chosen for a narrow tuple (no alignment padding).
CREATE TABLE idem.claims (
    expires_at  timestamptz NOT NULL,
    claimed_at  timestamptz NOT NULL,
    state       "char"      NOT NULL,   -- p: claimed, not finished; c: completed; f: failed; l: leased
    biz_type    text        NOT NULL,
    key         text        NOT NULL,
    fingerprint text,
    result      jsonb
) PARTITION BY RANGE (expires_at);
COMMENT ON TABLE idem.claims IS 'Dedup records. Uniqueness of (biz_type, key) among live rows is enforced by idem_claim, not by an index.';

-- Catches claims whose expiry no partition covers yet (maintenance late or
-- never run, or a TTL past the premade horizon); idem_maintain moves them out.
CREATE TABLE idem.claims_default PARTITION OF idem.claims DEFAULT;

-- Every partition has exactly one index, on the digest; idem_maintain creates
-- it with the partition. Not unique: an expired row of a key may share a
-- partition with its live successor, and uniqueness across partitions is the
-- claim protocol's job. Deliberately no index on the parent: ATTACH would
-- then create one on each partition by itself, and a pg_restore (which
-- attaches partitions before it creates their indexes) would fail.
CREATE INDEX claims_default_key_hash ON idem.claims_default (idem.key_hash(biz_type, key));

-- The rule for business type and machine names, for the PL/pgSQL functions
-- (the C functions apply the same rule in claim.rs, valid_biz_type).
CREATE FUNCTION idem.check_name(what text, value text) RETURNS void
    IMMUTABLE LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    IF value !~ '^[A-Za-z0-9_.:-]{1,64}$' THEN
        RAISE EXCEPTION 'idem: % "%" is not valid: it must match ^[A-Za-z0-9_.:-]{1,64}$', what, value
            USING ERRCODE = '22023';
    END IF;
END
$fn$;
COMMENT ON FUNCTION idem.check_name(text, text) IS 'Raise 22023 unless value is a valid biz_type / machine name.';

-- sql/claim.sql
-- The claim API: C functions in the extension's schema. SECURITY INVOKER:
-- they reach storage directly (heap and index access checks no rights), and
-- the SQL they run on cold paths (catalog reads, idem_forget,
-- idem_configure) runs as the extension's owner with a pg_catalog-only
-- search path (catalog::as_owner). So callers need no rights on schema idem,
-- and the hot path pays no SECURITY DEFINER trampoline.

CREATE TYPE idem_claim_result AS (
    claimed          boolean,
    state            text,
    result           jsonb,
    first_claimed_at timestamptz,
    expires_at       timestamptz
);
COMMENT ON TYPE idem_claim_result IS 'What idem_claim and idem_lookup return: claimed (true only for the first arrival), state (new, in_progress, completed, failed, absent), the stored result or error, when the key was first claimed and when the claim expires.';

CREATE FUNCTION idem_claim(
    key         text,
    biz_type    text,
    ttl         interval DEFAULT NULL,
    fingerprint text     DEFAULT NULL,
    wait        boolean  DEFAULT true,
    lease       interval DEFAULT NULL
) RETURNS idem_claim_result
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_claim';
COMMENT ON FUNCTION idem_claim(text, text, interval, text, boolean, interval) IS
'Claim (biz_type, key) in the current transaction. First arrival: claimed = true, state = new. Duplicate: claimed = false and the first outcome (completed/failed with its result). Concurrent uncommitted claim: waits for it (wait => true) or returns state = in_progress at once. ttl overrides the type''s TTL; a differing fingerprint raises ID001. With lease, the claim is meant to be committed before work outside the database: others see in_progress until it is finished or the lease runs out, then the next claim takes it over and gets {attempt, recovery_point, recovery_data, lease_until, lease_token} in result.';

CREATE FUNCTION idem_complete(key text, biz_type text, result jsonb DEFAULT NULL, lease_token text DEFAULT NULL) RETURNS void
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_complete';
COMMENT ON FUNCTION idem_complete(text, text, jsonb, text) IS
'Store the outcome of a claim this transaction made, or of a leased claim the caller owns (the session that took the lease, or whoever passes its lease_token); duplicates get result back. ID003 otherwise.';

CREATE FUNCTION idem_fail(key text, biz_type text, error jsonb, lease_token text DEFAULT NULL) RETURNS void
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_fail';
COMMENT ON FUNCTION idem_fail(text, text, jsonb, text) IS
'Store a deterministic business failure (e.g. insufficient stock) for a claim the caller holds (as for idem_complete); duplicates get state = failed and the error back. ID003 if the caller holds no claim on the key.';

CREATE FUNCTION idem_checkpoint(key text, biz_type text, point text, data jsonb DEFAULT NULL, lease_token text DEFAULT NULL) RETURNS void
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_checkpoint';
COMMENT ON FUNCTION idem_checkpoint(text, text, text, jsonb, text) IS
'Record a recovery point (e.g. charge_created) and its data on a leased claim the caller owns, in the caller''s transaction, and renew the lease. A later takeover is told the last point. ID003 for anyone but the owner.';

CREATE FUNCTION idem_lookup(key text, biz_type text) RETURNS idem_claim_result
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_lookup';
COMMENT ON FUNCTION idem_lookup(text, text) IS
'Read the live claim of (biz_type, key) without claiming or waiting: state absent, in_progress, completed or failed; claimed is always false.';

CREATE FUNCTION idem_forget(key text, biz_type text) RETURNS boolean
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_forget';
COMMENT ON FUNCTION idem_forget(text, text) IS
'Operator eviction: delete the committed claim of (biz_type, key) so that the next arrival claims again. Returns whether a claim was removed.';
REVOKE EXECUTE ON FUNCTION idem_forget(text, text) FROM PUBLIC;

CREATE FUNCTION idem_configure(biz_type text, ttl interval) RETURNS void
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_configure';
COMMENT ON FUNCTION idem_configure(text, interval) IS
'Set the TTL of a business type (1 second to 400 days); NULL returns it to idem.default_ttl. Applies to claims made afterwards.';
REVOKE EXECUTE ON FUNCTION idem_configure(text, interval) FROM PUBLIC;

-- One-time tokens: issued by the server, spent once (form resubmission).
CREATE FUNCTION idem.random_token() RETURNS text
    VOLATILE STRICT LANGUAGE c AS 'MODULE_PATHNAME', 'idem_random_token';
COMMENT ON FUNCTION idem.random_token() IS '256 bits from PostgreSQL''s CSPRNG (pg_strong_random), as 64 hex digits.';

CREATE TABLE idem.tokens (
    token_sha256 bytea       PRIMARY KEY,
    biz_type     text        NOT NULL,
    issued_at    timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    spent_at     timestamptz
);
COMMENT ON TABLE idem.tokens IS 'One-time tokens, by SHA-256 of the token: the token itself is never stored.';
SELECT pg_catalog.pg_extension_config_dump('idem.tokens', '');

CREATE FUNCTION idem_issue_token(biz_type text, ttl interval DEFAULT '10 minutes') RETURNS text
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

CREATE FUNCTION idem_consume_token(token text, biz_type text) RETURNS boolean
    VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    spent boolean;
BEGIN
    IF token IS NULL OR biz_type IS NULL THEN
        RAISE EXCEPTION 'idem: token and biz_type must not be NULL' USING ERRCODE = '22004';
    END IF;
    -- A concurrent consumer of the same token waits on the row and then
    -- finds it spent: true exactly once.
    UPDATE idem.tokens t SET spent_at = clock_timestamp()
     WHERE t.token_sha256 = sha256(convert_to(token, 'UTF8'))
       AND t.biz_type = idem_consume_token.biz_type
       AND t.spent_at IS NULL
       AND t.expires_at > clock_timestamp()
    RETURNING true INTO spent;
    RETURN coalesce(spent, false);
END
$fn$;
COMMENT ON FUNCTION idem_consume_token(text, text) IS
'Spend a one-time token: true exactly once, false for an unknown, expired or already spent token (or one of another biz_type). Part of the caller''s transaction: a rollback un-spends it.';

-- sql/maintenance.sql
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

-- The settings maintenance reads, with their defaults when unset.
CREATE FUNCTION idem.setting_interval(name text, fallback interval) RETURNS interval
    STABLE LANGUAGE sql SET search_path = pg_catalog, pg_temp
    AS $$ SELECT coalesce(nullif(current_setting(name, true), '')::interval, fallback) $$;
COMMENT ON FUNCTION idem.setting_interval(text, interval) IS 'An interval-valued setting, or fallback when unset.';

CREATE FUNCTION idem.partition_name(lo timestamptz) RETURNS text
    IMMUTABLE LANGUAGE sql SET search_path = pg_catalog, pg_temp
    AS $$ SELECT 'claims_' || to_char(lo AT TIME ZONE 'UTC', 'YYYYMMDD"_"HH24MISS"_"MS') $$;
COMMENT ON FUNCTION idem.partition_name(timestamptz) IS 'Name of the partition whose range starts at lo (UTC).';

-- Partitions with their bounds, read from the catalog.
CREATE VIEW idem.partition_bounds AS
SELECT c.oid::regclass AS partition,
       c.relname::text AS name,
       m[1]::timestamptz AS range_from,
       m[2]::timestamptz AS range_to,
       c.relpartbound IS NOT NULL AND pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT' AS is_default
  FROM pg_inherits h
  JOIN pg_class c ON c.oid = h.inhrelid
  LEFT JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid),
         $re$^FOR VALUES FROM \('([^']*)'\) TO \('([^']*)'\)$$re$) AS m ON true
 WHERE h.inhparent = 'idem.claims'::regclass;

CREATE FUNCTION idem_maintain() RETURNS jsonb
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

CREATE VIEW idem_partitions AS
SELECT b.name AS partition,
       b.range_from,
       b.range_to,
       b.is_default,
       greatest(c.reltuples, 0)::bigint AS estimated_rows,
       pg_total_relation_size(b.partition) AS bytes,
       coalesce(b.range_to <= now(), false) AS expired
  FROM idem.partition_bounds b
  JOIN pg_class c ON c.oid = b.partition
 ORDER BY b.is_default, b.range_from;
COMMENT ON VIEW idem_partitions IS 'Partitions of idem.claims: range, estimated rows, bytes, and whether every claim in it has expired.';

CREATE VIEW idem_stats AS
SELECT coalesce(c.biz_type, t.biz_type) AS biz_type,
       coalesce(t.ttl, idem.setting_interval('idem.default_ttl', '24 hours')) AS ttl,
       count(c.*) AS live_keys,
       count(c.*) FILTER (WHERE c.state IN ('p', 'c')) AS completed,
       count(c.*) FILTER (WHERE c.state = 'f') AS failed,
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

-- sql/guards.sql
-- State machines and guarded transitions. PL/pgSQL: this is orchestration of
-- one conditional UPDATE per call, on the caller's own tables, with the
-- caller's privileges (SECURITY INVOKER); only the machine definitions live
-- in schema idem, read through the SECURITY DEFINER idem_machine().

CREATE TABLE idem.machines (
    name        text PRIMARY KEY,
    transitions jsonb NOT NULL,   -- {"FROM": ["TO", ...], ...}
    reachable   jsonb NOT NULL,   -- {"STATE": ["reachable in one or more steps", ...], ...}
    updated_at  timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE idem.machines IS 'State machines defined with idem_define_machine.';
SELECT pg_catalog.pg_extension_config_dump('idem.machines', '');

CREATE FUNCTION idem_define_machine(name text, transitions jsonb) RETURNS void
    VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    f text;
    targets jsonb;
    t jsonb;
    states text[] := '{}';
    reach jsonb := '{}';
    s text;
    frontier text[];
    seen text[];
BEGIN
    IF name IS NULL OR transitions IS NULL THEN
        RAISE EXCEPTION 'idem: name and transitions must not be NULL' USING ERRCODE = '22004';
    END IF;
    PERFORM idem.check_name('machine name', name);
    IF jsonb_typeof(transitions) <> 'object' OR transitions = '{}' THEN
        RAISE EXCEPTION 'idem: transitions must be a non-empty object {"FROM": ["TO", ...]}' USING ERRCODE = '22023';
    END IF;
    FOR f, targets IN SELECT * FROM jsonb_each(transitions) LOOP
        IF f = '' THEN
            RAISE EXCEPTION 'idem: machine "%": a state name is empty', name USING ERRCODE = '22023';
        END IF;
        IF jsonb_typeof(targets) <> 'array' THEN
            RAISE EXCEPTION 'idem: machine "%": the transitions of "%" must be an array of state names', name, f
                USING ERRCODE = '22023';
        END IF;
        states := states || f;
        FOR t IN SELECT * FROM jsonb_array_elements(targets) LOOP
            IF jsonb_typeof(t) <> 'string' OR t #>> '{}' = '' THEN
                RAISE EXCEPTION 'idem: machine "%": "%" lists % , which is not a state name', name, f, t
                    USING ERRCODE = '22023';
            END IF;
            IF t #>> '{}' = f THEN
                RAISE EXCEPTION 'idem: machine "%": "%" may not transition to itself', name, f USING ERRCODE = '22023';
            END IF;
            states := states || (t #>> '{}');
        END LOOP;
    END LOOP;
    -- Every state's reachable set (one or more steps), for telling stale
    -- events from premature ones without walking the graph per call.
    FOREACH s IN ARRAY (SELECT array_agg(DISTINCT x) FROM unnest(states) x) LOOP
        seen := '{}';
        frontier := ARRAY(SELECT jsonb_array_elements_text(coalesce(transitions -> s, '[]')));
        WHILE cardinality(frontier) > 0 LOOP
            seen := seen || frontier;
            frontier := ARRAY(SELECT DISTINCT n FROM unnest(frontier) x,
                                   jsonb_array_elements_text(coalesce(transitions -> x, '[]')) n
                               WHERE n <> ALL (seen));
        END LOOP;
        reach := reach || jsonb_build_object(s, to_jsonb(ARRAY(SELECT DISTINCT x FROM unnest(seen) x ORDER BY 1)));
    END LOOP;
    INSERT INTO idem.machines AS m (name, transitions, reachable) VALUES (name, transitions, reach)
    ON CONFLICT ON CONSTRAINT machines_pkey
    DO UPDATE SET transitions = EXCLUDED.transitions, reachable = EXCLUDED.reachable, updated_at = now();
END
$fn$;
COMMENT ON FUNCTION idem_define_machine(text, jsonb) IS
'Define (or replace) a state machine: {"CREATED":["PAID","CANCELLED"],"PAID":["SHIPPED"],...}. States are the keys and every listed target. Bad definitions raise 22023.';
-- Machines apply database-wide and have no owner: redefining one loosens every
-- guard that uses it, so only roles granted EXECUTE may.
REVOKE EXECUTE ON FUNCTION idem_define_machine(text, jsonb) FROM PUBLIC;

CREATE FUNCTION idem_machine(name text, state text DEFAULT NULL) RETURNS jsonb
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

-- The classification shared by idem_transition and the guard trigger.
CREATE FUNCTION idem_classify_transition(machine text, from_state text, to_state text) RETURNS text
    STABLE SECURITY INVOKER SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    m jsonb := @extschema@.idem_machine(machine, to_state);
BEGIN
    IF from_state IS NOT DISTINCT FROM to_state THEN RETURN 'already'; END IF;
    IF from_state IS NULL OR NOT (m->'reachable' ? from_state) THEN RETURN 'illegal'; END IF;
    IF coalesce(m->'transitions'->from_state, '[]') ? to_state THEN RETURN 'allowed'; END IF;
    -- With cycles both can hold; the event is then taken as stale.
    IF m->'reachable'->to_state ? from_state THEN RETURN 'stale'; END IF;
    IF m->'reachable'->from_state ? to_state THEN RETURN 'premature'; END IF;
    RETURN 'illegal';
END
$fn$;
COMMENT ON FUNCTION idem_classify_transition(text, text, text) IS
'How a transition from from_state to to_state reads in a machine: allowed (one step), already (same state), stale (to_state lies behind), premature (ahead, more than one step) or illegal.';

CREATE FUNCTION idem_transition(
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

CREATE FUNCTION idem_guard_trigger() RETURNS trigger
    SECURITY INVOKER SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    old_state text := to_jsonb(OLD) ->> TG_ARGV[0];
    new_state text := to_jsonb(NEW) ->> TG_ARGV[0];
    machine text := TG_ARGV[1];
    verdict text;
    key text;
BEGIN
    IF old_state IS NOT DISTINCT FROM new_state THEN
        RETURN NEW;
    END IF;
    IF new_state IS NOT NULL THEN
        verdict := @extschema@.idem_classify_transition(machine, old_state, new_state);
        IF verdict = 'allowed' OR (old_state IS NULL) THEN
            RETURN NEW;
        END IF;
    END IF;
    -- Name the row by its primary key (or its ctid when it has none).
    SELECT coalesce(string_agg(format('%s = %s', a.attname, to_jsonb(OLD) ->> a.attname::text), ', '),
                    'ctid = ' || OLD.ctid::text)
      INTO key
      FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
     WHERE i.indrelid = TG_RELID AND i.indisprimary;
    RAISE EXCEPTION 'idem: illegal transition from % to % (table %.%, %, machine %)',
        coalesce(old_state, 'NULL'), coalesce(new_state, 'NULL'), TG_TABLE_SCHEMA, TG_TABLE_NAME, key, machine
        USING ERRCODE = 'ID002';
END
$fn$;
COMMENT ON FUNCTION idem_guard_trigger() IS 'The trigger idem_guard installs; not for direct use.';

CREATE FUNCTION idem_guard(tbl regclass, state_col name, machine text) RETURNS void
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

CREATE FUNCTION idem_unguard(tbl regclass, state_col name) RETURNS void
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

-- sql/scaling.sql
-- Citus: idem's storage distributed next to the business tables
-- (docs/scaling.md). Citus is not in Debian's archive, so only the refusal
-- without Citus is tested here; the rest is written to Citus 13's documented
-- API and must be tried on a Citus cluster first (docs/scaling.md lists the
-- checks).

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
