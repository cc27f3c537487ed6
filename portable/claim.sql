-- The portable edition's claim protocol (the native edition's SQL path,
-- src/storage/sql.rs, with src/protocol.rs, src/lease.rs, src/biztype.rs),
-- in PL/pgSQL. What differs from the native edition is in docs/portable.md.
--
-- The API functions are SECURITY DEFINER (the native ones reach storage
-- from C; here the extension's owner does), so the caller's role cannot be
-- current_user inside them: idem.caller_role() says whose business types a
-- call may use.
--
-- The key lock is the key's gate row in idem.key_gates (below; docs/design.md
-- §14): taken before the key is probed again, held until the transaction
-- ends, and the record of which claim version this transaction wrote.

-- @helpers after: CREATE TYPE idem_claim_result
-- The helpers below run only inside the API functions of this file, which
-- are SECURITY DEFINER with search_path pinned to pg_catalog, pg_temp (no
-- role but the owner has USAGE on schema idem), so they run under that
-- search_path and do not set it again: a function with a SET clause saves
-- and restores the setting and recomputes the schema search path on every
-- call, about 10 % of a claim's instructions over a dozen calls
-- (docs/performance.md, "Portable edition").
--
-- The helpers a claim calls on every call are PL/pgSQL, not SQL: a SQL
-- function PostgreSQL cannot inline (one with SET search_path, a FROM clause
-- or a body more volatile than declared) is parsed and planned again in
-- every transaction that calls it, 20-80 µs each; a PL/pgSQL function keeps
-- its plans for the session (docs/performance.md, "Portable edition").
CREATE FUNCTION idem.caller_role() RETURNS name
    STABLE LANGUAGE plpgsql AS $fn$
BEGIN
    -- SET ROLE's role, else the session's: SECURITY DEFINER changes neither.
    RETURN CASE WHEN current_setting('role') = 'none' THEN session_user
                ELSE current_setting('role')::name END;
END
$fn$;
COMMENT ON FUNCTION idem.caller_role() IS 'The role a call of the portable edition acts for: the role of SET ROLE, else the session''s user.';

CREATE FUNCTION idem.fail_with(code text, message text, hint text DEFAULT NULL) RETURNS void
    IMMUTABLE LANGUAGE plpgsql AS $fn$
BEGIN
    IF hint IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = code, MESSAGE = message;
    END IF;
    RAISE EXCEPTION USING ERRCODE = code, MESSAGE = message, HINT = hint;
END
$fn$;
COMMENT ON FUNCTION idem.fail_with(text, text, text) IS 'Raise an error with this SQLSTATE, message and hint.';

-- The checks of a (key, biz_type) argument pair, in the native order.
CREATE FUNCTION idem.check_claim_key(key text, biz_type text) RETURNS void
    IMMUTABLE LANGUAGE plpgsql AS $fn$
DECLARE
    shown text;
BEGIN
    IF biz_type IS NULL THEN
        PERFORM idem.fail_with('22004', 'idem: biz_type must not be NULL');
    END IF;
    IF key IS NULL THEN
        PERFORM idem.fail_with('22004', 'idem: key must not be NULL');
    END IF;
    IF key = '' THEN
        PERFORM idem.fail_with('22023', 'idem: key must not be empty');
    END IF;
    IF octet_length(key) > 1024 THEN
        PERFORM idem.fail_with('22023', format('idem: key is %s bytes long; the limit is 1024', octet_length(key)));
    END IF;
    -- (The pattern tested here first: a valid type costs no second call.)
    IF biz_type !~ '^[A-Za-z0-9_.:-]{1,64}$' THEN
        PERFORM idem.check_biz_type(biz_type);
    END IF;
END
$fn$;
COMMENT ON FUNCTION idem.check_claim_key(text, text) IS 'Raise 22004 or 22023 for a key or biz_type idem_claim refuses.';

CREATE FUNCTION idem.check_biz_type(biz_type text) RETURNS void
    IMMUTABLE LANGUAGE plpgsql AS $fn$
DECLARE
    shown text := biz_type;
BEGIN
    IF biz_type IS NULL THEN
        PERFORM idem.fail_with('22004', 'idem: biz_type must not be NULL');
    END IF;
    IF biz_type !~ '^[A-Za-z0-9_.:-]{1,64}$' THEN
        -- At most 80 bytes of it, cut at a character boundary.
        WHILE octet_length(shown) > 80 LOOP
            shown := left(shown, -1);
        END LOOP;
        PERFORM idem.fail_with('22023', format('idem: biz_type "%s" is not valid: it must match ^[A-Za-z0-9_.:-]{1,64}$', shown));
    END IF;
END
$fn$;
COMMENT ON FUNCTION idem.check_biz_type(text) IS 'Raise 22023 unless biz_type is valid (22004 for NULL), showing at most 80 bytes of it.';

CREATE FUNCTION idem.checked_ttl_us(ttl interval, what text) RETURNS bigint
    IMMUTABLE STRICT LANGUAGE plpgsql AS $fn$
DECLARE
    us numeric := idem.interval_us(ttl);
BEGIN
    IF us < 1000000 OR us > 34560000000000 THEN
        PERFORM idem.fail_with('22023', format('idem: %s must be between 1 second and 400 days', what));
    END IF;
    RETURN us::bigint;
END
$fn$;
COMMENT ON FUNCTION idem.checked_ttl_us(interval, text) IS 'A TTL or lease in microseconds; 22023 unless it is 1 second to 400 days.';

CREATE FUNCTION idem.require_writable(what text) RETURNS void
    STABLE LANGUAGE plpgsql AS $fn$
BEGIN
    -- A parallel worker (a call from a function wrongly marked PARALLEL
    -- SAFE) can write nothing; the leader itself is refused by PostgreSQL
    -- when it writes (25000 too). A worker has no client connection, so a
    -- session connected over TCP (inet_client_port() is NULL only for a
    -- worker or a Unix-socket client) is not one, without the look at
    -- pg_stat_get_activity, which copies every backend's status (about
    -- 48 k instructions a call; docs/performance.md, "Fewer statements per
    -- claim").
    -- Nor does a session found to be none before: the first look notes
    -- the process id in idem_portable.checked_pid (not under idem.: the
    -- native library, preloaded on the same server, reserves that prefix
    -- and refuses a name it does not define, 42602), session-level (undone
    -- if the transaction rolls back), which a worker inherits from its
    -- leader with the leader's id, never its own, and which a role that
    -- sets it itself makes skip only its own session's look; so a
    -- Unix-socket session reads the backends' status once. (set_config
    -- refuses in a parallel operation, with 25000 too: a leader running
    -- a parallel plan is refused as in the native edition.) The status is
    -- read in a statement of its own, nested, so that a session that
    -- skips it does not start its executor either.
    IF inet_client_port() IS NULL
       AND current_setting('idem_portable.checked_pid', true) IS DISTINCT FROM pg_backend_pid()::text THEN
        IF (SELECT a.backend_type FROM pg_stat_get_activity(pg_backend_pid()) a) = 'parallel worker' THEN
            PERFORM idem.fail_with('25000', format('cannot execute %s during a parallel operation', what),
                'A function that calls it must be PARALLEL UNSAFE (the default for CREATE FUNCTION): a parallel worker cannot write.');
        END IF;
        PERFORM set_config('idem_portable.checked_pid', pg_backend_pid()::text, false);
    END IF;
    IF pg_is_in_recovery() THEN
        PERFORM idem.fail_with('25006', format('cannot execute %s in a read-only transaction', what),
                               'This server is a hot standby: claim on the primary. idem_lookup works here.');
    END IF;
    IF current_setting('transaction_read_only')::boolean THEN
        PERFORM idem.fail_with('25006', format('cannot execute %s in a read-only transaction', what));
    END IF;
END
$fn$;
COMMENT ON FUNCTION idem.require_writable(text) IS 'Raise 25006 in a read-only transaction or on a hot standby, 25000 in a parallel worker.';

-- The type's TTL (microseconds; NULL: none configured), after checking that
-- the caller may use the type (42501).
CREATE FUNCTION idem.admit(biz_type text) RETURNS bigint
    STABLE LANGUAGE plpgsql AS $fn$
DECLARE
    t interval;
    o name;
    role oid;
    caller name;
BEGIN
    SELECT b.ttl, b.owner INTO t, o FROM idem.biz_types b WHERE b.biz_type = admit.biz_type;
    IF o IS NOT NULL THEN
        caller := idem.caller_role();
        SELECT r.oid INTO role FROM pg_roles r WHERE r.rolname = o;
        IF role IS NULL THEN
            IF NOT coalesce((SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = caller), false) THEN
                PERFORM idem.fail_with('42501',
                    format('idem: permission denied for biz_type "%s": it is reserved for role "%s", which does not exist on this server', biz_type, o),
                    'The role was dropped or renamed, or a dump was restored onto a server without it: until then only superusers may use the type. A superuser names its owner again with SELECT idem_set_owner(biz_type, role), or opens it to every role with idem_set_owner(biz_type, NULL).');
            END IF;
        ELSIF NOT pg_has_role(caller, role, 'USAGE') THEN
            PERFORM idem.fail_with('42501',
                format('idem: permission denied for biz_type "%s": only members of role "%s" may use it', biz_type, o),
                format('The business type is reserved for role "%s" (idem_set_owner); GRANT that role, or use another biz_type.', o));
        END IF;
    END IF;
    RETURN idem.interval_us(t)::bigint;
END
$fn$;
COMMENT ON FUNCTION idem.admit(text) IS 'The TTL configured for biz_type in microseconds (NULL if none); 42501 if the type is reserved for a role the caller is not a member of.';

-- A type's policies (src/biztype.rs): on_failure = retry is read only where
-- a stored failure is found (retry_failed), retain_from by every
-- idem_complete and idem_fail. One PL/pgSQL function, whose statement's
-- plan the session keeps, behind two SQL functions PostgreSQL inlines:
-- as SQL functions with a subquery, which cannot be inlined, they were
-- parsed and planned again in every transaction that called them.
CREATE FUNCTION idem.type_policy(biz_type text, policy text) RETURNS boolean
    STABLE LANGUAGE plpgsql AS $fn$
DECLARE
    yes boolean;
BEGIN
    SELECT CASE policy WHEN 'on_failure' THEN b.on_failure = 'retry' ELSE b.retain_from = 'completion' END INTO yes
      FROM idem.biz_types b WHERE b.biz_type = type_policy.biz_type;
    RETURN coalesce(yes, false);
END
$fn$;
COMMENT ON FUNCTION idem.type_policy(text, text) IS 'Whether biz_type''s on_failure (policy on_failure) is retry, or its retain_from (policy retain_from) is completion; false for a type without a row.';
CREATE FUNCTION idem.retries_failures(biz_type text) RETURNS boolean
    STABLE LANGUAGE sql AS $fn$
    SELECT idem.type_policy(biz_type, 'on_failure')
$fn$;
COMMENT ON FUNCTION idem.retries_failures(text) IS 'Whether biz_type''s on_failure is retry: the next arrival after a stored failure claims the key anew.';
CREATE FUNCTION idem.retains_from_completion(biz_type text) RETURNS boolean
    STABLE LANGUAGE sql AS $fn$
    SELECT idem.type_policy(biz_type, 'retain_from')
$fn$;
COMMENT ON FUNCTION idem.retains_from_completion(text) IS 'Whether biz_type''s retain_from is completion: a finished claim expires its TTL after it was finished.';

-- The key lock: the key's gate row, one per digest, in a table only the
-- extension's owner reaches (docs/design.md §14). Taking it is an INSERT ...
-- ON CONFLICT that inserts the gate or locks the one there: a concurrent
-- first insert of the key is waited for by the speculative insertion, a
-- concurrent holder by the row lock, and both locks live in the tuple's
-- header (a waiter holds one lock-table entry while it waits), so a
-- transaction may hold any number of keys. Every transaction that writes a
-- claim version of the key makes itself the gate's writer with that write
-- (the same statement, or the next one of the same function), so under REPEATABLE READ and SERIALIZABLE PostgreSQL raises
-- 40001 when the gate version it meets was committed after the snapshot:
-- the key was claimed, finished or forgotten by a transaction the snapshot
-- cannot see. part and tid name the claim version the writer last wrote for
-- the key (NULL: none): the only record of whose row is whose (idem.probe),
-- in rows no other role can write, undone with the claim by a ROLLBACK TO
-- SAVEPOINT. writer is the top-level transaction's full id, which a
-- wrapped xid counter never repeats. Unlogged: a gate matters only to
-- transactions running with it, and none outlives a crash; on a hot standby
-- nothing reads it (idem.probe reads it only in a transaction with an xid).
-- The rows left behind go with idem_maintain (idem.sweep_key_gates).
CREATE UNLOGGED TABLE idem.key_gates (
    h      bigint PRIMARY KEY,
    writer xid8 NOT NULL,
    part   oid,
    tid    tid
) WITH (fillfactor = 50);
-- The type gates: which TTL classes a business type goes into next is
-- decided by the holder of its type gate (idem.insert_claim; the rule of
-- docs/design.md §1, "At most three classes per type"), a row lock on one
-- of these rows, in a table only the extension's owner reaches (an
-- advisory lock is a number any role can take: a LOGIN role holding it
-- made every new class of the type fold into the widest). The rows are
-- made here, committed, so a gate is tried with SKIP LOCKED and never
-- waited for (claims of a new type stay independent); a type's gate is
-- the slot of its digest (two types that share one only fold each
-- other's new classes while both add some). The holder that adds a class
-- writes its slot (writer), so that under REPEATABLE READ a later holder
-- whose snapshot cannot see that class gets 40001 from its lock. Logged:
-- the rows must survive a crash.
CREATE TABLE idem.type_gates (
    slot   int PRIMARY KEY,
    writer xid8
);
INSERT INTO idem.type_gates (slot) SELECT s FROM generate_series(0, 1023) s;
COMMENT ON TABLE idem.type_gates IS 'Portable edition: the type gates (1024 slots, a type''s digest picks one): the holder of its slot''s row lock decides which TTL class a business type goes into next.';

COMMENT ON TABLE idem.key_gates IS 'Portable edition: the key locks. One row per recently claimed digest (idem.key_hash): the transaction that last took it and the claim version it wrote.';

-- Take the key's gate for this transaction, waiting for its holder; with
-- wait false, 'n' (and nothing taken) while another transaction holds it.
-- A new gate is inserted with this transaction as its writer ('i'); an
-- existing one is only locked ('l': ON CONFLICT ... DO UPDATE ... WHERE
-- false locks the row it does not update, and returns no row): its writer
-- changes when this transaction writes a claim version of the key
-- (idem.insert_claim, idem.rewrite_claim, idem_forget), so that a call
-- that writes nothing leaves no gate version a REPEATABLE READ snapshot
-- could trip over. 'i' also tells that no write of the key committed since
-- the calling statement's snapshot: its writer's gate would still be there,
-- since a sweep keeps the gate of every writer this session's snapshot does
-- not see (docs/design.md §14), so a probe made since that snapshot need
-- not be made again.
CREATE FUNCTION idem.lock_gate(h bigint, wait boolean) RETURNS "char"
    VOLATILE LANGUAGE plpgsql AS $fn$
DECLARE
    lock_wait text;
    inserted boolean;
BEGIN
    IF NOT wait THEN
        -- A committed gate: locked at once, or held by another.
        PERFORM 1 FROM idem.key_gates g WHERE g.h = lock_gate.h FOR UPDATE SKIP LOCKED;
        IF FOUND THEN
            RETURN 'l';
        END IF;
        IF EXISTS (SELECT 1 FROM idem.key_gates g WHERE g.h = lock_gate.h) THEN
            RETURN 'n';
        END IF;
        -- None this snapshot sees, but another transaction's first insert
        -- may be in flight, which only an insert meets, and only by waiting
        -- for that transaction (docs/design.md §14): it may wait a
        -- millisecond for it (a subtransaction, on this path only).
        lock_wait := current_setting('lock_timeout');
        BEGIN
            PERFORM set_config('lock_timeout', '1ms', true);
            INSERT INTO idem.key_gates AS g (h, writer) VALUES (lock_gate.h, pg_current_xact_id())
                ON CONFLICT ON CONSTRAINT key_gates_pkey DO UPDATE SET writer = g.writer WHERE false;
            inserted := FOUND;
            PERFORM set_config('lock_timeout', lock_wait, true);
            RETURN CASE WHEN inserted THEN 'i' ELSE 'l' END;
        EXCEPTION WHEN lock_not_available THEN
            RETURN 'n';
        END;
    END IF;
    INSERT INTO idem.key_gates AS g (h, writer) VALUES (lock_gate.h, pg_current_xact_id())
        ON CONFLICT ON CONSTRAINT key_gates_pkey DO UPDATE SET writer = g.writer WHERE false;
    RETURN CASE WHEN FOUND THEN 'i' ELSE 'l' END;
END
$fn$;
COMMENT ON FUNCTION idem.lock_gate(bigint, boolean) IS 'Portable edition: take the key lock (the gate row of digest h) until the transaction ends: i when the gate was inserted, l when an existing one was locked; with wait false, n instead of waiting for another holder.';

CREATE FUNCTION idem.take_gate(h bigint, wait boolean) RETURNS boolean
    VOLATILE LANGUAGE plpgsql AS $fn$
BEGIN
    RETURN idem.lock_gate(h, wait) <> 'n';
END
$fn$;
COMMENT ON FUNCTION idem.take_gate(bigint, boolean) IS 'Portable edition: take the key lock (the gate row of digest h) until the transaction ends; with wait false, return false instead of waiting for another holder.';

-- The key's row as the protocol sees it (src/storage/sql.rs, probe): live
-- (this transaction's, or committed and unexpired), else a committed row
-- committed after the call arrived, expired or not. Only in the TTL
-- classes registered for the type. own: this transaction (or one of its
-- subtransactions) wrote it: the key's gate names this transaction and this
-- version (gated: the gate names this transaction, which has written the
-- key and holds it).
-- "Committed after the call arrived" (a duplicate that arrived while a
-- claim was in progress gets that claim's outcome, even past its expiry:
-- design.md §2) is not read from the raw xmin, which a frozen row keeps
-- and which may then map to a transaction that looks running at arrival
-- (design.md §2, "Who wrote a row"): idem_claim's first
-- probe, before the key lock, is its arrival; it returns in versions every
-- version of the key it saw ("oid:ctid"), and the probe after the lock
-- passes them as arrived: a version not among them was committed since.
-- arrived NULL: this probe is the call's first look, nothing is late.
CREATE FUNCTION idem.probe(h bigint, biz_type text, key text, t_now timestamptz, arrived text[],
                           OUT present boolean, OUT state "char", OUT claimed_at timestamptz, OUT expires_at timestamptz,
                           OUT fingerprint text, OUT result jsonb, OUT own boolean, OUT ttl_class smallint,
                           OUT part regclass, OUT tid tid, OUT versions text[], OUT gated boolean)
    VOLATILE LANGUAGE plpgsql AS $fn$
DECLARE
    me xid8 := pg_current_xact_id_if_assigned();
    gate_part oid;
    gate_tid tid;
    r record;
    classes smallint[];
    untils timestamptz[];
    k1 smallint; k2 smallint; k3 smallint;
    u1 timestamptz; u2 timestamptz; u3 timestamptz;
    live int := 0;
    late record;
    have_late boolean := false;
    version text;
    mine boolean;
    found_rows refcursor;
BEGIN
    present := false;
    versions := '{}';
    gated := false;
    -- Without an xid this transaction has written nothing. A gate naming
    -- this transaction is its own only if this transaction (or one of its
    -- subtransactions, whose xids come after its own) wrote that version:
    -- rows restored from a plain-script pg_dump of another cluster carry
    -- writers this cluster's counter may not have reached yet.
    -- (xmin is 32 bits: it is at or after me's low 32 bits, within 2^31.
    -- The arithmetic is written out: idem.full_xid, a SQL function with a
    -- FROM clause, is planned again in every transaction, about a sixth of
    -- a new key's claim; docs/performance.md, "Portable edition".)
    IF me IS NOT NULL THEN
        SELECT g.part, g.tid INTO gate_part, gate_tid FROM idem.key_gates g
         WHERE g.h = probe.h AND g.writer = me
           AND ((g.xmin::text::bigint - (me::text::bigint & 4294967295)) & 4294967295) < 2147483648;
        gated := FOUND;
    END IF;
    -- The type's classes, each with the latest expiry registered in it,
    -- first, in a statement of their own: given to the probe as values,
    -- they let the planner prune, before anything is locked, to the
    -- partitions that can hold a row of the type -- those of its classes
    -- that start before that expiry, as on the native paths
    -- (src/storage/sql.rs, PROBE): the relation bound of docs/design.md §1.
    -- (Read in the probe's own statement, as a subquery, they would be
    -- known only at run time, after every partition was locked; without
    -- the expiry, a narrow class's premade partitions would be locked too.)
    -- Three classes per statement (a type is in at most three, more only in
    -- the rare cases docs/design.md §1 names: then more statements).
    SELECT array_agg(x.k ORDER BY x.k), array_agg(x.u ORDER BY x.k) INTO classes, untils
      FROM (SELECT tc.ttl_class AS k, max(tc.until) AS u FROM idem.type_classes tc
             WHERE tc.biz_type = probe.biz_type GROUP BY tc.ttl_class) x;
    IF classes IS NULL THEN
        RETURN;
    END IF;
    FOR i IN 1 .. cardinality(classes) BY 3 LOOP
    k1 := classes[i]; u1 := untils[i];
    k2 := coalesce(classes[i + 1], k1); u2 := coalesce(untils[i + 1], u1);
    k3 := coalesce(classes[i + 2], k1); u3 := coalesce(untils[i + 2], u1);
    -- A type in one class (the usual case) is probed with that class's
    -- condition alone: every partition the probe starts compiles its
    -- filter, and the three-class form's is three times as long
    -- (docs/portable.md, "Speed").
    IF cardinality(classes) = 1 THEN
        OPEN found_rows FOR
            SELECT c.state, c.claimed_at, c.expires_at, c.fingerprint, c.result, c.ttl_class,
                   c.tableoid::regclass AS part, c.ctid AS tid
              FROM idem.claims c
             WHERE idem.key_hash(c.biz_type, c.key) = h
               AND c.biz_type = probe.biz_type
               AND c.key = probe.key
               AND c.ttl_class = k1 AND c.expires_at <= u1;
    ELSE
        OPEN found_rows FOR
            SELECT c.state, c.claimed_at, c.expires_at, c.fingerprint, c.result, c.ttl_class,
                   c.tableoid::regclass AS part, c.ctid AS tid
              FROM idem.claims c
             WHERE idem.key_hash(c.biz_type, c.key) = h
               AND c.biz_type = probe.biz_type
               AND c.key = probe.key
               AND (c.ttl_class = k1 AND c.expires_at <= u1
                    OR c.ttl_class = k2 AND c.expires_at <= u2
                    OR c.ttl_class = k3 AND c.expires_at <= u3);
    END IF;
    LOOP
        FETCH found_rows INTO r;
        EXIT WHEN NOT FOUND;
        version := r.part::oid || ':' || r.tid;
        versions := versions || version;
        mine := gated AND r.part::oid = gate_part AND r.tid = gate_tid;
        mine := coalesce(mine, false);
        IF mine OR r.expires_at > t_now THEN
            live := live + 1;
            IF live > 1 THEN
                CONTINUE;
            END IF;
            present := true;
            state := r.state; claimed_at := r.claimed_at; expires_at := r.expires_at;
            fingerprint := r.fingerprint; result := r.result; own := mine; ttl_class := r.ttl_class;
            part := r.part; tid := r.tid;
        ELSIF arrived IS NOT NULL AND NOT version = ANY (arrived) THEN
            late := r;
            have_late := true;
        END IF;
    END LOOP;
    CLOSE found_rows;
    END LOOP;
    IF live > 1 THEN
        PERFORM idem.fail_with('55000', format('idem: %s live claims of one key in idem.claims', live),
            'Were claims of this key made with different idem.storage_access settings? Every session must use one path. (Or, if idem.claims was distributed by Citus under idem 0.2.0: calls Citus did not delegate, such as SELECT (idem_claim(...)).claimed, ran on another node; since 0.3.0 they are refused.)');
    END IF;
    IF NOT present AND have_late THEN
        present := true;
        state := late.state; claimed_at := late.claimed_at; expires_at := late.expires_at;
        fingerprint := late.fingerprint; result := late.result; own := false; ttl_class := late.ttl_class;
        part := late.part; tid := late.tid;
    END IF;
END
$fn$;
COMMENT ON FUNCTION idem.probe(bigint, text, text, timestamptz, text[]) IS 'The live row of (biz_type, key) among its type''s TTL classes (or one committed since the versions arrived were seen), with whether this transaction wrote it (its gate names it), every version seen, and whether this transaction holds the key''s gate.';

-- What a call that found a row answers (src/protocol.rs, Outcome::of_row).
CREATE FUNCTION idem.outcome_of_row(state "char", own boolean, result jsonb, claimed_at timestamptz, expires_at timestamptz)
    RETURNS @extschema@.idem_claim_result
    IMMUTABLE LANGUAGE plpgsql AS $fn$
BEGIN
    RETURN ROW(false,
               CASE WHEN state = 'l' THEN 'in_progress'
                    WHEN state IN ('f', 'r') THEN 'failed'
                    WHEN state = 'c' THEN 'completed'
                    WHEN own THEN 'in_progress'
                    ELSE 'completed' END,
               -- (r: the error without its attempt; p: a retry's
               -- {attempt, previous_error} is for its claimer only)
               CASE WHEN state IN ('l', 'p') THEN NULL WHEN state = 'r' THEN result -> 'error' ELSE result END,
               claimed_at, expires_at)::@extschema@.idem_claim_result;
END
$fn$;
COMMENT ON FUNCTION idem.outcome_of_row("char", boolean, jsonb, timestamptz, timestamptz) IS 'The idem_claim_result of a call that found a claim row.';

CREATE FUNCTION idem.us_since_2000(t timestamptz) RETURNS bigint
    IMMUTABLE STRICT LANGUAGE sql AS $fn$
    SELECT (extract(epoch FROM t - timestamptz '2000-01-01 00:00:00+00') * 1000000)::bigint
$fn$;
COMMENT ON FUNCTION idem.us_since_2000(timestamptz) IS 'A timestamp as microseconds since 2000-01-01 UTC (how the native edition stores lease times).';

CREATE FUNCTION idem.iso_utc(t timestamptz) RETURNS text
    IMMUTABLE STRICT LANGUAGE sql AS $fn$
    SELECT to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
$fn$;
COMMENT ON FUNCTION idem.iso_utc(timestamptz) IS 'A timestamp as ISO 8601 in UTC with microseconds (lease_until).';

CREATE FUNCTION idem.random_hex(n_bytes int) RETURNS text
    VOLATILE STRICT LANGUAGE sql AS $fn$
    -- gen_random_uuid() draws from pg_strong_random, as the native edition;
    -- of a version 4 UUID's 32 hex digits, 30 are wholly random (the 13th
    -- is the version, the 17th carries the variant).
    SELECT left(string_agg(substr(u, 1, 12) || substr(u, 14, 3) || substr(u, 18), ''), 2 * n_bytes)
      FROM (SELECT replace(gen_random_uuid()::text, '-', '') AS u
              FROM generate_series(1, (2 * n_bytes + 29) / 30)) s
$fn$;
COMMENT ON FUNCTION idem.random_hex(int) IS 'n_bytes random bytes from PostgreSQL''s CSPRNG as hex digits.';

CREATE FUNCTION idem.sha256_hex(t text) RETURNS text
    IMMUTABLE STRICT LANGUAGE sql AS $fn$
    SELECT encode(sha256(convert_to(t, getdatabaseencoding())), 'hex')
$fn$;
COMMENT ON FUNCTION idem.sha256_hex(text) IS 'SHA-256 of a text''s bytes, as hex (lease tokens are stored only so).';

-- The lease document stored in result (src/lease.rs, Stored plus the
-- recovery point and data, and the error a retry's lease retries) and the
-- view of it its owner is given.
CREATE FUNCTION idem.with_previous_error(doc jsonb, previous jsonb) RETURNS jsonb
    IMMUTABLE LANGUAGE sql AS $fn$
    SELECT CASE WHEN previous IS NULL THEN doc ELSE doc || jsonb_build_object('previous_error', previous) END
$fn$;
COMMENT ON FUNCTION idem.with_previous_error(jsonb, jsonb) IS 'doc with the field previous_error when previous is not SQL NULL (a claim that retries a stored failure).';
CREATE FUNCTION idem.lease_doc(attempt bigint, lease_us bigint, until timestamptz, token_sha256 text, point jsonb, data jsonb,
                               previous jsonb)
    RETURNS jsonb IMMUTABLE LANGUAGE sql AS $fn$
    SELECT idem.with_previous_error(
               jsonb_build_object('attempt', attempt, 'lease_us', lease_us, 'lease_until_us', idem.us_since_2000(until),
                                  'owner_token_sha256', token_sha256, 'recovery_point', point, 'recovery_data', data),
               previous)
$fn$;
COMMENT ON FUNCTION idem.lease_doc(bigint, bigint, timestamptz, text, jsonb, jsonb, jsonb) IS 'The lease document a leased claim stores in result.';
CREATE FUNCTION idem.lease_view(attempt bigint, until timestamptz, token text, point jsonb, data jsonb, previous jsonb)
    RETURNS jsonb IMMUTABLE LANGUAGE sql AS $fn$
    SELECT idem.with_previous_error(
               jsonb_strip_nulls(jsonb_build_object('attempt', attempt, 'lease_until', idem.iso_utc(until), 'lease_token', token))
               || jsonb_build_object('recovery_point', point, 'recovery_data', data),
               previous)
$fn$;
COMMENT ON FUNCTION idem.lease_view(bigint, timestamptz, text, jsonb, jsonb, jsonb) IS 'What the holder of a lease is told: attempt, lease_until, lease_token (when issued), recovery_point and recovery_data; previous_error on a retry''s lease.';
CREATE FUNCTION idem.check_lease(doc jsonb) RETURNS void
    IMMUTABLE LANGUAGE plpgsql AS $fn$
DECLARE
    field text;
BEGIN
    IF doc IS NULL THEN
        PERFORM idem.fail_with('XX000', 'idem: internal error: a leased claim has no lease document',
            'This is a bug or a damaged installation; please report it with the server log.');
    END IF;
    FOREACH field IN ARRAY ARRAY['attempt', 'lease_us', 'lease_until_us'] LOOP
        IF jsonb_typeof(doc -> field) IS DISTINCT FROM 'number' THEN
            PERFORM idem.fail_with('XX000', format('idem: internal error: the lease document is damaged: %s is not a number', field),
                'This is a bug or a damaged installation; please report it with the server log.');
        END IF;
    END LOOP;
    IF jsonb_typeof(doc -> 'owner_token_sha256') IS DISTINCT FROM 'string' THEN
        PERFORM idem.fail_with('XX000', 'idem: internal error: the lease document is damaged: owner_token_sha256 is not a string',
            'This is a bug or a damaged installation; please report it with the server log.');
    END IF;
END
$fn$;
COMMENT ON FUNCTION idem.check_lease(jsonb) IS 'Raise XX000 unless doc is a lease document (attempt, lease_us, lease_until_us, owner_token_sha256).';
CREATE FUNCTION idem.lease_until(doc jsonb) RETURNS timestamptz
    IMMUTABLE STRICT LANGUAGE sql AS $fn$
    SELECT timestamptz '2000-01-01 00:00:00+00' + idem.us_interval((doc ->> 'lease_until_us')::numeric)
$fn$;
COMMENT ON FUNCTION idem.lease_until(jsonb) IS 'When the lease of a lease document runs out.';

CREATE FUNCTION idem.refuse_fingerprint(key text, biz_type text) RETURNS void
    IMMUTABLE LANGUAGE sql AS $fn$
    SELECT idem.fail_with('ID001', format('idem: key "%s" of biz_type "%s" was first claimed with a different fingerprint', key, biz_type),
        'The same idempotency key was reused for a different request; use a new key for a new intent.')
$fn$;
COMMENT ON FUNCTION idem.refuse_fingerprint(text, text) IS 'Raise ID001 for a claim whose fingerprint differs from the one the key was first claimed with.';

CREATE FUNCTION idem.not_claimed(key text, biz_type text, why text) RETURNS void
    IMMUTABLE LANGUAGE sql AS $fn$
    SELECT idem.fail_with('ID003', format('idem: key "%s" of biz_type "%s" %s', key, biz_type, why),
        'Finish a claim in the transaction that made it, or pass the lease_token that idem_claim returned with the lease.')
$fn$;
COMMENT ON FUNCTION idem.not_claimed(text, text, text) IS 'Raise ID003 for a call on a claim the caller does not hold.';

-- The new claim row (src/storage/sql.rs, insert): in its TTL's class, or
-- in a wider one (the rule of src/storage/type_classes.rs, choose: at most
-- three classes per type), after registering the type in that class when
-- no committed or own registration covers the row's expiry (a registration
-- spans up to the end of the class width the expiry falls in); this
-- transaction's gate for the key (digest h) then names it. False, with
-- nothing written, when wait is false and the claim would have had to wait.
-- A class the type is not in is decided by the holder of the type's gate
-- (idem.type_gates), on the registrations read again after taking it (in
-- READ COMMITTED a statement of its own sees what earlier holders
-- committed), so holders add classes one after the other, and leave room
-- for the widest class, as the native rule does. Registrations of other
-- transactions still running are not seen here, so a claim that finds the
-- gate held goes into the nearest wider class it sees, else the widest
-- (400 days) one, without the gate: only holders add other classes, so a
-- type's classes are at most the two a holder may add plus the widest.
-- (idem.claim_class decides the class and registers it; idem_claim_many
-- calls it once for a batch's new claims, which share one expiry.)
CREATE FUNCTION idem.claim_class(biz_type text, claimed_at timestamptz, expires_at timestamptz) RETURNS smallint
    VOLATILE LANGUAGE plpgsql AS $fn$
DECLARE
    -- (idem.ttl_class without its SET clause, the width read once for the
    -- claim's class and the widest)
    unit bigint := idem.setting_us('idem.partition_width', interval '1 minute', 100000, 34560000000000);
    k smallint := idem.class_of(unit, least(idem.interval_us(expires_at - claimed_at), 34560000000000));
    top smallint;
    reg_until timestamptz;
    gate int;
    held boolean := false;
    classes smallint[];
    span numeric;
    e numeric;
BEGIN
    -- The usual case, in one statement: the type is in its TTL's class up
    -- to this expiry already.
    SELECT max(tc.until) INTO reg_until FROM idem.type_classes tc
     WHERE tc.biz_type = claim_class.biz_type AND tc.ttl_class = k;
    IF reg_until >= expires_at THEN
        RETURN k;
    END IF;
    -- (The widest class is the one a claim may add without the gate.)
    top := greatest(idem.class_of(unit, 34560000000000), k);
    IF k <> top AND reg_until IS NULL THEN
        SELECT coalesce(array_agg(DISTINCT tc.ttl_class), '{}') INTO classes
          FROM idem.type_classes tc WHERE tc.biz_type = claim_class.biz_type;
        -- The gate only for a class that could be added (a type with room
        -- for it): a claim that folds anyway holds no gate, so a long
        -- transaction does not keep other types' new classes out.
        IF NOT k = ANY (classes) AND cardinality(classes) + 1 < 3 THEN
            gate := idem.key_hash(biz_type, '') & 1023;
            PERFORM 1 FROM idem.type_gates g WHERE g.slot = gate FOR UPDATE SKIP LOCKED;
            held := FOUND;
            IF held THEN
                SELECT coalesce(array_agg(DISTINCT tc.ttl_class), '{}') INTO classes
                  FROM idem.type_classes tc WHERE tc.biz_type = claim_class.biz_type;
            END IF;
        END IF;
        IF NOT k = ANY (classes) THEN
            IF NOT held OR cardinality(classes) + 1 >= 3 THEN
                k := coalesce((SELECT min(c) FROM unnest(classes) c WHERE c >= k), top);
            END IF;
            IF NOT k = ANY (classes) AND k <> top THEN
                UPDATE idem.type_gates g SET writer = pg_current_xact_id() WHERE g.slot = gate;
            END IF;
        END IF;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM idem.type_classes tc
                    WHERE tc.biz_type = claim_class.biz_type AND tc.ttl_class = k AND tc.until >= claim_class.expires_at) THEN
        span := greatest(idem.interval_us(idem.class_width(k)), 1);
        e := idem.us_since_2000(expires_at);
        INSERT INTO idem.type_classes (biz_type, ttl_class, until)
        VALUES (biz_type, k, timestamptz '2000-01-01 00:00:00+00' + idem.us_interval((floor(e / span) + 1) * span));
    END IF;
    RETURN k;
END
$fn$;
COMMENT ON FUNCTION idem.claim_class(text, timestamptz, timestamptz) IS 'The TTL class a new claim of biz_type from claimed_at to expires_at goes into (its own, or a wider one: at most three classes per type), registered for the type up to that expiry first when needed.';

CREATE FUNCTION idem.insert_claim(h bigint, biz_type text, key text, claimed_at timestamptz, expires_at timestamptz,
                                  state "char", fingerprint text, result jsonb) RETURNS void
    VOLATILE LANGUAGE plpgsql AS $fn$
DECLARE
    k smallint := idem.claim_class(biz_type, claimed_at, expires_at);
BEGIN
    WITH c AS (
        INSERT INTO idem.claims (expires_at, claimed_at, ttl_class, state, biz_type, key, fingerprint, result)
        VALUES (expires_at, claimed_at, k, state, biz_type, key, fingerprint, result)
        RETURNING tableoid, ctid)
    UPDATE idem.key_gates g SET writer = pg_current_xact_id(), part = c.tableoid, tid = c.ctid FROM c WHERE g.h = insert_claim.h;
END
$fn$;
COMMENT ON FUNCTION idem.insert_claim(bigint, text, text, timestamptz, timestamptz, "char", text, jsonb) IS 'Insert a claim row into its TTL class (or a wider one: at most three classes per type), registering the type there first when needed, and name it in this transaction''s gate for the key.';

CREATE FUNCTION idem.rewrite_claim(h bigint, part regclass, tid tid, state "char", result jsonb) RETURNS void
    VOLATILE LANGUAGE plpgsql AS $fn$
DECLARE
    n bigint;
    new_tid tid;
BEGIN
    -- The row the probe found, in its partition: the key lock keeps
    -- everyone else from changing it since. (An UPDATE of idem.claims by
    -- key would plan for every partition.)
    EXECUTE format('UPDATE %s SET state = $1, result = $2 WHERE ctid = $3 RETURNING ctid', part)
        INTO new_tid USING state, result, tid;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n <> 1 THEN
        PERFORM idem.fail_with('55000', format('idem: the claim row to update was found %s times, not once', n),
            'Were claims of this key made with different idem.storage_access settings? Every session must use one path.');
    END IF;
    -- The new version is this transaction's: its gate for the key names it
    -- (a statement of its own, whose plan the session keeps; the dynamic
    -- one above is planned on every call).
    UPDATE idem.key_gates g SET writer = pg_current_xact_id(), part = rewrite_claim.part, tid = new_tid
     WHERE g.h = rewrite_claim.h;
END
$fn$;
COMMENT ON FUNCTION idem.rewrite_claim(bigint, regclass, tid, "char", jsonb) IS 'Set the state and result of the claim row at tid in partition part, and name the new version in this transaction''s gate for the key (digest h).';
-- @end

-- @body idem_claim
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    -- (a void helper's result: an assignment is a simple expression, where
    -- PERFORM would start an executor for a SELECT)
    done text;
    ttl_us bigint;
    lease_us bigint;
    type_ttl_us bigint;
    h bigint;
    p record;
    t_now timestamptz;
    t_exp timestamptz;
    token text;
    until timestamptz;
    attempt bigint;
    running boolean;
    gate "char";
    retrying boolean := false;
    previous jsonb;
BEGIN
    done := idem.check_claim_key(key, biz_type);
    ttl_us := idem.checked_ttl_us(ttl, 'ttl');
    lease_us := idem.checked_ttl_us(lease, 'lease');
    done := idem.require_writable('idem_claim');
    type_ttl_us := idem.admit(biz_type);
    -- The claim's TTL is needed to check a lease against it, else only for
    -- a new claim (idem.default_ttl is read then: a duplicate reads no
    -- setting).
    IF lease_us IS NOT NULL THEN
        ttl_us := coalesce(ttl_us, type_ttl_us,
                           idem.setting_us('idem.default_ttl', interval '24 hours', 1000000, 34560000000000));
        IF lease_us > ttl_us THEN
            PERFORM idem.fail_with('22023', 'idem: lease must not be longer than the claim''s ttl');
        END IF;
    END IF;
    h := idem.key_hash(biz_type, key);
    -- A committed outcome other than a lease is final until it expires,
    -- and a committed lease runs until its time is up: both are answered
    -- without the lock (a call that writes nothing takes no key). This
    -- first look is the call's arrival (idem.probe). A key this transaction
    -- has written needs no second look: it holds the key, and no one else
    -- has changed it since.
    p := idem.probe(h, biz_type, key, clock_timestamp(), NULL);
    IF NOT p.gated THEN
        IF p.present AND p.state = 'l' AND NOT p.own THEN
            done := idem.check_lease(p.result);
            running := idem.lease_until(p.result) > clock_timestamp();
        END IF;
        -- A stored failure of a type that retries is claimed anew: under
        -- the key's gate, as a new claim.
        IF p.present AND p.state IN ('f', 'r') AND NOT p.own THEN
            retrying := idem.retries_failures(biz_type);
        END IF;
        IF NOT (p.present AND NOT p.own AND (p.state <> 'l' OR running) AND NOT retrying) THEN
            gate := idem.lock_gate(h, coalesce(wait, true));
            IF gate = 'n' THEN
                RETURN ROW(false, 'in_progress', NULL, NULL, NULL)::@extschema@.idem_claim_result;
            END IF;
            -- A gate inserted anew after a first look that saw no version
            -- of the key: nothing has been written since (idem.lock_gate),
            -- so a second look would see nothing too.
            IF gate = 'l' OR cardinality(p.versions) > 0 THEN
                p := idem.probe(h, biz_type, key, clock_timestamp(), p.versions);
            END IF;
            running := NULL;
        END IF;
    END IF;
    IF NOT p.present THEN
        ttl_us := coalesce(ttl_us, type_ttl_us,
                           idem.setting_us('idem.default_ttl', interval '24 hours', 1000000, 34560000000000));
        t_now := clock_timestamp();
        t_exp := t_now + idem.us_interval(ttl_us);
        IF lease_us IS NULL THEN
            done := idem.insert_claim(h, biz_type, key, t_now, t_exp, 'p', fingerprint, NULL);
            RETURN ROW(true, 'new', NULL, t_now, t_exp)::@extschema@.idem_claim_result;
        END IF;
        token := idem.random_hex(16);
        until := t_now + idem.us_interval(lease_us);
        done := idem.insert_claim(h, biz_type, key, t_now, t_exp, 'l', fingerprint,
                                  idem.lease_doc(1, lease_us, until, idem.sha256_hex(token), NULL, NULL, NULL));
        RETURN ROW(true, 'new', idem.lease_view(1, until, token, NULL, NULL, NULL), t_now, t_exp)::@extschema@.idem_claim_result;
    END IF;
    IF fingerprint IS NOT NULL AND p.fingerprint IS NOT NULL AND fingerprint <> p.fingerprint THEN
        PERFORM idem.refuse_fingerprint(key, biz_type);
    END IF;
    t_now := clock_timestamp();
    -- (src/protocol.rs, retry: the key is gated here, either way.)
    IF p.state IN ('f', 'r') AND NOT p.own AND (retrying OR p.gated AND idem.retries_failures(biz_type)) THEN
        attempt := CASE WHEN p.state = 'r' THEN (p.result ->> 'attempt')::bigint ELSE 1 END + 1;
        previous := CASE WHEN p.state = 'r' THEN p.result -> 'error' ELSE p.result END;
        IF lease_us IS NULL THEN
            done := idem.rewrite_claim(h, p.part, p.tid, 'p', jsonb_build_object('attempt', attempt, 'previous_error', previous));
            RETURN ROW(true, 'new', jsonb_build_object('attempt', attempt, 'previous_error', previous),
                       p.claimed_at, p.expires_at)::@extschema@.idem_claim_result;
        END IF;
        token := idem.random_hex(16);
        until := least(t_now + idem.us_interval(lease_us), p.expires_at);
        -- (the error goes into the lease document too: a takeover of this
        -- lease is told it as well)
        previous := coalesce(previous, 'null');
        done := idem.rewrite_claim(h, p.part, p.tid, 'l', idem.lease_doc(attempt, lease_us, until, idem.sha256_hex(token), NULL, NULL, previous));
        RETURN ROW(true, 'new', idem.lease_view(attempt, until, token, NULL, NULL, previous),
                   p.claimed_at, p.expires_at)::@extschema@.idem_claim_result;
    END IF;
    -- (running: a lease seen running without the lock, never taken over.)
    IF p.state <> 'l' OR p.own OR running THEN
        RETURN idem.outcome_of_row(p.state, p.own, p.result, p.claimed_at, p.expires_at);
    END IF;
    done := idem.check_lease(p.result);
    IF idem.lease_until(p.result) > t_now THEN
        RETURN idem.outcome_of_row(p.state, p.own, p.result, p.claimed_at, p.expires_at);
    END IF;
    -- The lease ran out: this call takes the claim over (src/protocol.rs,
    -- claim): with a lease of its own, as a new lease; without one, as a
    -- plain claim of this transaction.
    attempt := (p.result ->> 'attempt')::bigint + 1;
    previous := p.result -> 'previous_error';
    IF lease_us IS NULL THEN
        done := idem.rewrite_claim(h, p.part, p.tid, 'p', idem.with_previous_error(jsonb_build_object('attempt', attempt), previous));
        RETURN ROW(true, 'new',
                   idem.with_previous_error(jsonb_build_object('attempt', attempt, 'recovery_point', p.result -> 'recovery_point',
                                                               'recovery_data', p.result -> 'recovery_data'), previous),
                   p.claimed_at, p.expires_at)::@extschema@.idem_claim_result;
    END IF;
    until := least(t_now + idem.us_interval(lease_us), p.expires_at);
    token := idem.random_hex(16);
    done := idem.rewrite_claim(h, p.part, p.tid, 'l',
        idem.lease_doc(attempt, lease_us, until, idem.sha256_hex(token), p.result -> 'recovery_point', p.result -> 'recovery_data', previous));
    RETURN ROW(true, 'new',
               idem.lease_view(attempt, until, token, p.result -> 'recovery_point', p.result -> 'recovery_data', previous),
               p.claimed_at, p.expires_at)::@extschema@.idem_claim_result;
END
$fn$;
-- @end

-- @helpers
-- complete, fail and checkpoint (src/protocol.rs, finish): the key is
-- locked and probed; the caller must hold the claim (made by this
-- transaction, or leased with the token passed).
CREATE FUNCTION idem.finish(what text, key text, biz_type text, new_state "char", new_result jsonb,
                            point text, data jsonb, lease_token text, merge boolean DEFAULT false) RETURNS void
    VOLATILE LANGUAGE plpgsql AS $fn$
DECLARE
    -- (a void helper's result: an assignment is a simple expression, where
    -- PERFORM would start an executor for a SELECT)
    done text;
    h bigint;
    p record;
    leased boolean;
    holds boolean;
    locked boolean := false;
    until timestamptz;
BEGIN
    done := idem.require_writable(what);
    done := idem.admit(biz_type);
    h := idem.key_hash(biz_type, key);
    -- Whether the caller holds the claim is decided on a probe without the
    -- key lock first: a refusal (ID003) writes nothing and takes no xid.
    -- What it would allow is decided again under the lock, unless this
    -- transaction holds the key already.
    LOOP
        p := idem.probe(h, biz_type, key, clock_timestamp(), NULL);
        IF NOT p.present THEN
            PERFORM idem.not_claimed(key, biz_type, 'is not claimed by this transaction, nor leased to the caller');
        END IF;
        leased := p.state = 'l';
        IF leased THEN
            done := idem.check_lease(p.result);
            holds := p.own OR (lease_token IS NOT NULL AND idem.sha256_hex(lease_token) = p.result ->> 'owner_token_sha256');
        ELSE
            holds := p.own AND what NOT IN ('idem_checkpoint', 'idem_release');
        END IF;
        IF NOT holds THEN
            IF leased AND lease_token IS NULL THEN
                PERFORM idem.not_claimed(key, biz_type, 'is leased: pass the lease_token that idem_claim returned');
            ELSIF leased AND p.result ->> 'owner_token_sha256' = '' THEN
                PERFORM idem.not_claimed(key, biz_type, 'was released by its lease holder: claim it again (its token is spent)');
            ELSIF leased THEN
                PERFORM idem.not_claimed(key, biz_type, 'is leased to another owner (or the lease was taken over)');
            ELSIF p.own THEN
                PERFORM idem.not_claimed(key, biz_type, format('is not leased: %s needs idem_claim(..., lease => ...)', what));
            ELSE
                PERFORM idem.not_claimed(key, biz_type, 'is claimed by another transaction, not this one');
            END IF;
        END IF;
        EXIT WHEN p.gated OR locked;
        locked := idem.take_gate(h, true);
    END LOOP;
    IF what = 'idem_checkpoint' THEN
        -- (src/protocol.rs, merged: checked before anything is written)
        IF merge AND data IS NOT NULL THEN
            IF jsonb_typeof(data) <> 'object' THEN
                PERFORM idem.fail_with('22023', 'idem: merge => true needs data that is a JSON object');
            ELSIF jsonb_typeof(p.result -> 'recovery_data') = 'object' THEN
                data := (p.result -> 'recovery_data') || data;
            ELSIF coalesce(jsonb_typeof(p.result -> 'recovery_data'), 'null') <> 'null' THEN
                PERFORM idem.fail_with('22023', 'idem: merge => true needs the stored recovery data to be a JSON object (checkpoint it without merge first)');
            END IF;
        ELSIF merge THEN
            data := p.result -> 'recovery_data';
        END IF;
        until := least(clock_timestamp() + idem.us_interval((p.result ->> 'lease_us')::numeric), p.expires_at);
        new_result := idem.lease_doc((p.result ->> 'attempt')::bigint, (p.result ->> 'lease_us')::bigint, until,
                                     p.result ->> 'owner_token_sha256', to_jsonb(point), data, p.result -> 'previous_error');
    ELSIF what = 'idem_fail' THEN
        -- A retried claim's failure keeps its attempt while the type
        -- retries (src/protocol.rs, finish).
        IF (leased OR p.state = 'p' AND p.result IS NOT NULL) AND (p.result ->> 'attempt')::bigint > 1
           AND idem.retries_failures(biz_type) THEN
            new_state := 'r';
            new_result := jsonb_build_object('attempt', (p.result ->> 'attempt')::bigint, 'error', new_result);
        END IF;
    ELSIF what = 'idem_release' THEN
        -- Run out now, its token spent (src/lease.rs, release).
        new_result := idem.lease_doc((p.result ->> 'attempt')::bigint, (p.result ->> 'lease_us')::bigint,
                                     least(idem.lease_until(p.result), clock_timestamp()), '',
                                     p.result -> 'recovery_point', p.result -> 'recovery_data', p.result -> 'previous_error');
    END IF;
    -- (src/protocol.rs, write_outcome: under retain_from = completion the
    -- row is written anew with its expiry its TTL from now, and the old
    -- version deleted; a failure the type retries keeps its expiry. The
    -- TTL in microseconds, as the native edition counts it: an interval of
    -- days would follow the session's TimeZone across a DST change.)
    IF what IN ('idem_complete', 'idem_fail') AND idem.retains_from_completion(biz_type)
       AND NOT (new_state IN ('f', 'r') AND idem.retries_failures(biz_type))
       AND clock_timestamp() + idem.us_interval(idem.interval_us(p.expires_at - p.claimed_at)) > p.expires_at THEN
        EXECUTE format('DELETE FROM %s WHERE ctid = $1', p.part) USING p.tid;
        done := idem.insert_claim(h, biz_type, key, p.claimed_at, clock_timestamp() + idem.us_interval(idem.interval_us(p.expires_at - p.claimed_at)),
                                  new_state, p.fingerprint, new_result);
        RETURN;
    END IF;
    done := idem.rewrite_claim(h, p.part, p.tid, new_state, new_result);
END
$fn$;
COMMENT ON FUNCTION idem.finish(text, text, text, "char", jsonb, text, jsonb, text, boolean) IS 'idem_complete, idem_fail, idem_checkpoint and idem_release: rewrite the claim the caller holds (ID003 otherwise).';
-- @end

-- @body idem_complete
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    done text;  -- (idem_claim: an assignment, not PERFORM)
BEGIN
    done := idem.check_claim_key(key, biz_type);
    done := idem.finish('idem_complete', key, biz_type, 'c', result, NULL, NULL, lease_token);
END
$fn$;
-- @end

-- @body idem_fail
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    PERFORM idem.check_claim_key(key, biz_type);
    IF error IS NULL THEN
        PERFORM idem.fail_with('22004', 'idem: error must not be NULL');
    END IF;
    PERFORM idem.finish('idem_fail', key, biz_type, 'f', error, NULL, NULL, lease_token);
END
$fn$;
-- @end

-- @body idem_checkpoint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    PERFORM @extschema@.idem_checkpoint(key, biz_type, point, data, lease_token, false);
END
$fn$;
-- @end

-- @body idem_checkpoint_merge
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    PERFORM idem.check_claim_key(key, biz_type);
    IF point IS NULL THEN
        PERFORM idem.fail_with('22004', 'idem: point must not be NULL');
    END IF;
    IF octet_length(point) < 1 OR octet_length(point) > 256 THEN
        PERFORM idem.fail_with('22023', 'idem: point must be 1 to 256 bytes long');
    END IF;
    -- (no default in this form: NULL is refused, as in the native edition)
    IF merge IS NULL THEN
        PERFORM idem.fail_with('22004', 'idem: merge must not be NULL');
    END IF;
    PERFORM idem.finish('idem_checkpoint', key, biz_type, 'l', NULL, point, data, lease_token, merge);
END
$fn$;
-- @end

-- @body idem_claim_id
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $fn$
    -- src/key.rs, claim_id: the same bytes (convert_to to the database's
    -- own encoding: the text's bytes as stored). Nothing of schema idem:
    -- callers have no USAGE on it (idem.us_since_2000 written out).
    SELECT encode(set_byte(set_byte(d, 6, (get_byte(d, 6) & 15) | 128), 8, (get_byte(d, 8) & 63) | 128), 'hex')::uuid
      FROM (SELECT substring(sha256(convert_to(biz_type, getdatabaseencoding()) || decode('00', 'hex')
                                    || convert_to(key, getdatabaseencoding()) || decode('00', 'hex')
                                    || int8send((extract(epoch FROM first_claimed_at - timestamptz '2000-01-01 00:00:00+00') * 1000000)::bigint)) FROM 1 FOR 16) AS d) s
$fn$;
-- @end

-- @body idem_lookup
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    h bigint;
    p record;
BEGIN
    PERFORM idem.check_claim_key(key, biz_type);
    PERFORM idem.admit(biz_type);
    h := idem.key_hash(biz_type, key);
    p := idem.probe(h, biz_type, key, clock_timestamp(), NULL);
    IF p.present THEN
        RETURN idem.outcome_of_row(p.state, p.own, p.result, p.claimed_at, p.expires_at);
    END IF;
    -- (A first claim of the key in flight in another transaction is not
    -- seen: absent until it commits. docs/portable.md)
    RETURN ROW(false, 'absent', NULL, NULL, NULL)::@extschema@.idem_claim_result;
END
$fn$;
-- @end

-- @body idem_forget
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
<<forget>>
DECLARE
    h bigint;
    p record;
    n bigint;
BEGIN
    PERFORM idem.check_claim_key(key, biz_type);
    PERFORM idem.require_writable('idem_forget');
    PERFORM idem.admit(biz_type);
    h := idem.key_hash(biz_type, key);
    -- Nothing to forget (a first claim in flight is not seen): false,
    -- without taking the key. Else the key is locked and probed again.
    p := idem.probe(h, biz_type, key, clock_timestamp(), NULL);
    IF NOT p.present THEN
        -- Under REPEATABLE READ and SERIALIZABLE the snapshot may miss a
        -- claim committed after it, which the native edition refuses with
        -- 40001. Its gate tells: locking a gate version committed after
        -- the snapshot raises 40001, as for a claim (idem.lock_gate). The
        -- lock is taken in a subtransaction and undone, so a forget that
        -- finds nothing holds no key (it waits for a claim in flight).
        IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
            BEGIN
                PERFORM idem.take_gate(h, true);
                RAISE EXCEPTION USING ERRCODE = 'IDZ01', MESSAGE = 'idem: undo the gate';
            EXCEPTION WHEN SQLSTATE 'IDZ01' THEN
                NULL;
            END;
        END IF;
        RETURN false;
    END IF;
    IF NOT p.gated THEN
        PERFORM idem.take_gate(h, true);
        p := idem.probe(h, biz_type, key, clock_timestamp(), NULL);
        IF NOT p.present THEN
            RETURN false;
        END IF;
    END IF;
    EXECUTE format('DELETE FROM %s WHERE ctid = $1', p.part) USING p.tid;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n <> 1 THEN
        PERFORM idem.fail_with('55000', format('idem: the claim row to delete was found %s times, not once', n),
            'Were claims of this key made with different idem.storage_access settings? Every session must use one path.');
    END IF;
    UPDATE idem.key_gates g SET writer = pg_current_xact_id(), part = NULL, tid = NULL WHERE g.h = forget.h;
    RETURN true;
END
$fn$;
-- @end

-- @body idem_configure
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    PERFORM idem.check_biz_type(biz_type);
    PERFORM idem.checked_ttl_us(ttl, 'ttl');
    PERFORM idem.require_writable('idem_configure');
    PERFORM idem.admit(biz_type);
    INSERT INTO idem.biz_types AS b (biz_type, ttl, updated_at) VALUES (biz_type, ttl, now())
        ON CONFLICT ON CONSTRAINT biz_types_pkey DO UPDATE SET ttl = EXCLUDED.ttl, updated_at = EXCLUDED.updated_at;
END
$fn$;
-- @end

-- @body idem_configure_policy
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    PERFORM idem.check_biz_type(biz_type);
    PERFORM idem.checked_ttl_us(ttl, 'ttl');
    IF on_failure NOT IN ('replay', 'retry') THEN
        PERFORM idem.fail_with('22023', 'idem: on_failure must be replay or retry (or NULL: replay)');
    END IF;
    PERFORM idem.require_writable('idem_configure');
    PERFORM idem.admit(biz_type);
    INSERT INTO idem.biz_types AS b (biz_type, ttl, updated_at, on_failure) VALUES (biz_type, ttl, now(), on_failure)
        ON CONFLICT ON CONSTRAINT biz_types_pkey DO UPDATE SET ttl = EXCLUDED.ttl, updated_at = EXCLUDED.updated_at,
                                                            on_failure = EXCLUDED.on_failure;
END
$fn$;
-- @end

-- @body idem_configure_retention
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    IF retain_from NOT IN ('claim', 'completion') THEN
        PERFORM idem.fail_with('22023', 'idem: retain_from must be claim or completion (or NULL: claim)');
    END IF;
    -- The TTL and policy as the three-argument form sets them (its checks
    -- and the caller's admission included), then where the TTL counts from.
    PERFORM @extschema@.idem_configure(biz_type, ttl, on_failure);
    UPDATE idem.biz_types b SET retain_from = idem_configure.retain_from WHERE b.biz_type = idem_configure.biz_type;
END
$fn$;
-- @end

-- @body idem_set_owner
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    PERFORM idem.check_biz_type(biz_type);
    PERFORM idem.require_writable('idem_set_owner');
    PERFORM idem.admit(biz_type);
    INSERT INTO idem.biz_types AS b (biz_type, owner, updated_at)
    VALUES (biz_type, (SELECT r.rolname FROM pg_roles r WHERE r.oid = owner), now())
        ON CONFLICT ON CONSTRAINT biz_types_pkey DO UPDATE SET owner = EXCLUDED.owner, updated_at = EXCLUDED.updated_at;
END
$fn$;
-- @end

-- @body idem_storage_path
LANGUAGE sql AS $fn$
    SELECT 'sql'::text
$fn$;
-- @end

-- @body idem_random_token
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT idem.random_hex(32)
$fn$;
-- @end
