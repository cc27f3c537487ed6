-- Portable bodies of sql/batch.sql's C functions (scripts/portable.py).

-- @helpers
-- A lease document idem_claim answers from without the key lock: well
-- formed (idem.check_lease; a damaged one is left to idem_claim, which
-- raises it) and running at t_now.
CREATE FUNCTION idem.lease_running(doc jsonb, t_now timestamptz) RETURNS boolean
    IMMUTABLE LANGUAGE sql AS $fn$
    SELECT jsonb_typeof(doc -> 'attempt') = 'number' AND jsonb_typeof(doc -> 'lease_us') = 'number'
           AND jsonb_typeof(doc -> 'lease_until_us') = 'number' AND jsonb_typeof(doc -> 'owner_token_sha256') = 'string'
           AND idem.lease_until(doc) > t_now
$fn$;
COMMENT ON FUNCTION idem.lease_running(jsonb, timestamptz) IS 'Portable edition: whether a lease document is well formed and its lease runs at t_now.';

-- The first look at every key of a batch, in one statement (idem.probe's,
-- over the same TTL classes and partitions), and what each element of
-- keys is (kinds, by position in keys, 1-based):
--   n  new: no version of the key at all;
--   a  answered without the key lock, from its one live committed claim,
--      as idem_claim answers from its first look: a plain or completed
--      claim, a stored failure of a type that does not retry (retrying
--      false), a lease still running (states, results, claimed, expires,
--      fps: that claim's, for these elements only);
--   s  anything else, which idem_claim decides under the key lock: an
--      expired version only, a lease run out, a failure the type retries,
--      two live versions, a damaged lease document;
--   o  a key this transaction holds (its gate names this transaction), to
--      which idem.probe's own-row rule applies.
-- others: how many elements are s or o. ok is false when the type is in
-- more than three classes: then the batch goes through idem_claim key by
-- key.
CREATE FUNCTION idem.probe_batch(hs bigint[], biz_type text, keys text[], t_now timestamptz, retrying boolean,
                                 OUT ok boolean, OUT kinds "char"[], OUT states "char"[], OUT results jsonb[],
                                 OUT claimed timestamptz[], OUT expires timestamptz[], OUT fps text[], OUT others int)
    VOLATILE LANGUAGE plpgsql AS $fn$
DECLARE
    me xid8 := pg_current_xact_id_if_assigned();
    classes smallint[];
    untils timestamptz[];
    k1 smallint; k2 smallint; k3 smallint;
    u1 timestamptz; u2 timestamptz; u3 timestamptz;
    rows_seen bigint;
    ns bigint[];
BEGIN
    ok := false;
    -- The type's classes and their latest expiries as values, as in
    -- idem.probe (the planner prunes to the partitions that can hold a row
    -- of the type before anything is locked; no class: no partition, every
    -- key is new). Then each key looked up as idem.probe looks it up, by
    -- its digest in each partition's index: a join per key (LATERAL, kept
    -- a subquery by OFFSET 0, so that it stays a nested loop over the
    -- keys), not one scan for an array of digests or a join the planner
    -- may turn into a hash join: for 500 keys both were planned as a scan
    -- (a parallel one, too) of the partitions, computing the digest of
    -- every row in them.
    SELECT array_agg(x.k ORDER BY x.k), array_agg(x.u ORDER BY x.k) INTO classes, untils
      FROM (SELECT tc.ttl_class AS k, max(tc.until) AS u FROM idem.type_classes tc
             WHERE tc.biz_type = probe_batch.biz_type GROUP BY tc.ttl_class) x;
    IF cardinality(classes) > 3 THEN
        RETURN;
    END IF;
    IF classes IS NULL AND me IS NULL THEN
        kinds := array_fill('n'::"char", ARRAY[cardinality(keys)]);
        others := 0;
        ok := true;
        RETURN;
    END IF;
    k1 := classes[1]; u1 := untils[1];
    k2 := coalesce(classes[2], k1); u2 := coalesce(untils[2], u1);
    k3 := coalesce(classes[3], k1); u3 := coalesce(untils[3], u1);
    -- One row per version of each element's key (LEFT JOIN: one row of
    -- NULLs for a key without any), in the elements' order (a nested loop
    -- over them), aggregated without a sort, each row sorted as if its
    -- version were the key's only one. Most keys have at most one: then
    -- these rows are the elements. Where a key has more (an expired one
    -- beside a live one, say) or the rows came in another order, the rows
    -- are grouped by element: o or n as its row says, a if its one live
    -- version is, else s. (The rows are kept as arrays: an aggregate per
    -- key in the probe, with its arrays sorted back into the elements'
    -- order, cost a batch of committed keys a quarter more;
    -- docs/performance.md.)
    SELECT count(*), array_agg(u.n), array_agg(x.kind), array_agg(c.state), array_agg(c.result),
           array_agg(c.claimed_at), array_agg(c.expires_at), array_agg(c.fingerprint),
           count(*) FILTER (WHERE x.kind IN ('s', 'o'))
      INTO rows_seen, ns, kinds, states, results, claimed, expires, fps, others
      FROM unnest(hs, keys) WITH ORDINALITY AS u(h, k, n)
      LEFT JOIN LATERAL (
        SELECT c.state, c.result, c.claimed_at, c.expires_at, c.fingerprint
          FROM idem.claims c
         WHERE idem.key_hash(c.biz_type, c.key) = u.h
           AND c.biz_type = probe_batch.biz_type
           AND c.key = u.k
           AND (c.ttl_class = k1 AND c.expires_at <= u1
                OR c.ttl_class = k2 AND c.expires_at <= u2
                OR c.ttl_class = k3 AND c.expires_at <= u3)
        OFFSET 0) AS c ON true
     CROSS JOIN LATERAL (
        SELECT CASE WHEN me IS NOT NULL
                         AND EXISTS (SELECT 1 FROM idem.key_gates g WHERE g.h = u.h AND g.writer = me) THEN 'o'
                    WHEN c.state IS NULL THEN 'n'
                    WHEN c.expires_at > t_now
                         AND (c.state IN ('p', 'c') OR c.state IN ('f', 'r') AND NOT retrying
                              OR c.state = 'l' AND idem.lease_running(c.result, t_now)) THEN 'a'
                    ELSE 's' END::"char" AS kind) AS x;
    IF rows_seen = cardinality(keys) AND ns = ARRAY(SELECT generate_series(1, rows_seen)) THEN
        ok := true;
        RETURN;
    END IF;
    SELECT array_agg(x.kind ORDER BY x.n), array_agg(x.state ORDER BY x.n), array_agg(x.result ORDER BY x.n),
           array_agg(x.claimed_at ORDER BY x.n), array_agg(x.expires_at ORDER BY x.n),
           array_agg(x.fingerprint ORDER BY x.n), count(*) FILTER (WHERE x.kind IN ('s', 'o'))
      INTO kinds, states, results, claimed, expires, fps, others
      FROM (SELECT v.n,
                   CASE WHEN bool_or(v.kind = 'o') THEN 'o'
                        WHEN bool_or(v.kind = 'n') THEN 'n'
                        WHEN count(*) FILTER (WHERE v.expires_at > t_now) = 1
                             AND bool_or(v.kind = 'a') THEN 'a'
                        ELSE 's' END::"char" AS kind,
                   min(v.state) FILTER (WHERE v.kind = 'a') AS state,
                   (array_agg(v.result) FILTER (WHERE v.kind = 'a'))[1] AS result,
                   min(v.claimed_at) FILTER (WHERE v.kind = 'a') AS claimed_at,
                   min(v.expires_at) FILTER (WHERE v.kind = 'a') AS expires_at,
                   min(v.fingerprint) FILTER (WHERE v.kind = 'a') AS fingerprint
              FROM unnest(ns, kinds, states, results, claimed, expires, fps)
                   AS v(n, kind, state, result, claimed_at, expires_at, fingerprint)
             GROUP BY v.n) x;
    ok := true;
END
$fn$;
COMMENT ON FUNCTION idem.probe_batch(bigint[], text, text[], timestamptz, boolean) IS 'Portable edition: the first look at a batch''s keys in one statement: per element, whether its key is new (n), answered from its one live committed claim without the key lock (a, with that claim''s columns), left to idem_claim under the key lock (s), or held by this transaction (o).';
-- @end

-- @body idem_claim_many
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    -- 1-based copies, whatever the bounds the caller's arrays have.
    ks text[];
    fps text[];
    hs bigint[];
    -- Per element (the statements below subscript these arrays, which
    -- PL/pgSQL keeps expanded, rather than join arrays: a join of arrays is
    -- planned for 10 rows each, a nested loop, n^2 comparisons for n keys):
    -- the position of the first element of the same key; what
    -- idem.probe_batch found (kinds and, for an answered key, its claim);
    -- for a first element that takes the key lock, how this call goes on
    -- with it (via: NULL, in statements for the batch; c, through
    -- idem_claim; x, in progress in another transaction, with wait false);
    -- a new claim's time.
    firsts int[];
    kinds "char"[];
    f_state "char"[];
    f_result jsonb[];
    f_claimed timestamptz[];
    f_expires timestamptz[];
    f_fp text[];
    via "char"[];
    ts timestamptz[];
    others bigint[];
    done @extschema@.idem_claim_result[];
    i int;
    bad text;
    p record;
    fast boolean := false;
    to_lock int;
    inserted int;
    lock_wait text;
    ttl_us bigint;
    ttl_iv interval;
    type_ttl_us bigint;
    t_last timestamptz;
    cls smallint;
BEGIN
    IF keys IS NULL THEN
        PERFORM idem.fail_with('22004', 'idem: keys must not be NULL');
    END IF;
    PERFORM idem.check_biz_type(biz_type);
    IF array_ndims(keys) > 1 THEN
        PERFORM idem.fail_with('22023', 'idem: keys must be a one-dimensional array');
    END IF;
    IF array_ndims(fingerprints) > 1 THEN
        PERFORM idem.fail_with('22023', 'idem: fingerprints must be a one-dimensional array');
    END IF;
    IF fingerprints IS NOT NULL AND cardinality(fingerprints) <> cardinality(keys) THEN
        PERFORM idem.fail_with('22023', 'idem: fingerprints must have one element per key (NULL for a key without one)');
    END IF;
    ttl_us := idem.checked_ttl_us(ttl, 'ttl');
    ks := ARRAY(SELECT u.k FROM unnest(keys) WITH ORDINALITY AS u(k, n) ORDER BY u.n);
    fps := ARRAY(SELECT u.f FROM unnest(fingerprints) WITH ORDINALITY AS u(f, n) ORDER BY u.n);
    -- The first key idem_claim would refuse, in input order (one statement,
    -- not a call per key; the type was checked above).
    SELECT u.k INTO bad FROM unnest(ks) WITH ORDINALITY AS u(k, n)
     WHERE u.k IS NULL OR u.k = '' OR octet_length(u.k) > 1024 ORDER BY u.n LIMIT 1;
    IF FOUND THEN
        PERFORM idem.check_claim_key(bad, biz_type);
    END IF;
    -- (refused here, in its own name, before idem_claim would refuse the
    -- first key in its name)
    PERFORM idem.require_writable('idem_claim_many');
    IF cardinality(ks) = 0 THEN
        RETURN;
    END IF;
    type_ttl_us := idem.admit(biz_type);
    -- The batch in statements for all its keys (idem.probe_batch), but for
    -- the keys idem_claim has to decide under their key locks; the whole
    -- batch key by key below when the type is in more than three classes,
    -- or two keys share a digest (and so a gate).
    hs := ARRAY(SELECT idem.key_hash(biz_type, u.k) FROM unnest(ks) WITH ORDINALITY AS u(k, n) ORDER BY u.n);
    IF (SELECT count(DISTINCT u.k) = count(DISTINCT u.h) FROM unnest(ks, hs) AS u(k, h)) THEN
        p := idem.probe_batch(hs, biz_type, ks, clock_timestamp(), idem.retries_failures(biz_type));
        fast := p.ok;
    END IF;
    IF NOT fast THEN
        -- In the order of the keys' bytes, the first of equal keys first (as
        -- the native edition: src/api.rs, claim_many).
        FOR i IN SELECT u.n FROM unnest(ks) WITH ORDINALITY AS u(k, n) ORDER BY u.k COLLATE "C", u.n LOOP
            done[i] := @extschema@.idem_claim(ks[i], biz_type, ttl, fps[i], wait);
        END LOOP;
        RETURN QUERY
            SELECT ks[u.n], (done[u.n]).claimed, (done[u.n]).state, (done[u.n]).result,
                   (done[u.n]).first_claimed_at, (done[u.n]).expires_at
              FROM generate_series(1, cardinality(ks)) AS u(n) ORDER BY u.n;
        RETURN;
    END IF;
    kinds := p.kinds;
    f_state := p.states;
    f_result := p.results;
    f_claimed := p.claimed;
    f_expires := p.expires;
    f_fp := p.fps;
    firsts := ARRAY(SELECT min(u.n) OVER (PARTITION BY u.k) FROM unnest(ks) WITH ORDINALITY AS u(k, n) ORDER BY u.n);
    -- Fingerprints, as idem_claim checks them key by key: against the
    -- committed claim an answered key has, and a later element of a new key
    -- against its first element's (which claims it); idem_claim checks
    -- the others' itself. The whole statement fails.
    SELECT u.k INTO bad FROM unnest(ks, fps) WITH ORDINALITY AS u(k, f, n)
     WHERE u.f IS NOT NULL
       AND CASE kinds[u.n] WHEN 'a' THEN u.f <> f_fp[u.n] WHEN 'n' THEN u.f <> fps[firsts[u.n]] ELSE false END
     ORDER BY u.k COLLATE "C", u.n LIMIT 1;
    IF FOUND THEN
        PERFORM idem.refuse_fingerprint(bad, biz_type);
    END IF;
    IF coalesce(wait, true) THEN
        -- The key locks of every key not answered (new or not), in one
        -- statement, in the order of the keys' bytes (the rows are inserted
        -- in the order the sort gives them, each waiting for its gate's
        -- holder as idem.lock_gate does), so that two batches with keys in
        -- common wait for each other in one direction only, and idem_claim
        -- below waits for no key. An answered key takes none, as in
        -- idem_claim. A new key's gate inserted ('i' of idem.lock_gate) is a
        -- key no one has written since the first look; where a gate was
        -- there ('l'), the key's idem_claim looks again, under the lock now
        -- held. (inserted: the new keys' gates inserted; the others' may be
        -- too, where idem_maintain removed them.)
        IF p.others > 0 THEN
            others := ARRAY(SELECT hs[u.n] FROM generate_series(1, cardinality(ks)) AS u(n)
                             WHERE kinds[u.n] IN ('s', 'o') AND firsts[u.n] = u.n);
        END IF;
        WITH lock_order AS (
            SELECT u.h, kinds[u.n] AS kind FROM unnest(ks, hs) WITH ORDINALITY AS u(k, h, n)
             WHERE kinds[u.n] <> 'a' AND firsts[u.n] = u.n
             ORDER BY u.k COLLATE "C"),
        ins AS (
            INSERT INTO idem.key_gates AS g (h, writer)
            SELECT l.h, pg_current_xact_id() FROM lock_order l
                ON CONFLICT ON CONSTRAINT key_gates_pkey DO UPDATE SET writer = g.writer WHERE false
            RETURNING g.h)
        SELECT (SELECT count(*) FROM lock_order l WHERE l.kind = 'n'),
               (SELECT count(*) FROM ins WHERE others IS NULL OR NOT ins.h = ANY (others))
          INTO to_lock, inserted;
        IF p.others > 0 OR inserted < to_lock THEN
            -- The new keys' gates the statement above inserted are the only
            -- ones of these keys that name this transaction as their writer
            -- (o: none did before).
            via := ARRAY(SELECT CASE WHEN firsts[u.n] <> u.n OR kinds[u.n] = 'a' THEN NULL
                                     WHEN kinds[u.n] <> 'n' THEN 'c'
                                     WHEN inserted < to_lock
                                          AND NOT EXISTS (SELECT 1 FROM idem.key_gates g
                                                           WHERE g.h = u.h AND g.writer = pg_current_xact_id()) THEN 'c'
                                END::"char"
                           FROM unnest(hs) WITH ORDINALITY AS u(h, n) ORDER BY u.n);
        END IF;
    ELSE
        -- Without waiting, as idem.lock_gate with wait false, for the whole
        -- batch: a key whose gate is there is locked at once unless another
        -- transaction holds it (x: in progress); the gates of the others are
        -- inserted in one statement, in a subtransaction that may wait a
        -- millisecond for a first insert in flight (docs/design.md §14); if
        -- one is, each of those keys is left to idem_claim, which tries it
        -- on its own.
        via := ARRAY(SELECT CASE WHEN firsts[u.n] <> u.n OR kinds[u.n] = 'a' THEN NULL
                                 WHEN EXISTS (SELECT 1 FROM idem.key_gates g WHERE g.h = u.h FOR UPDATE SKIP LOCKED) THEN 'c'
                                 WHEN EXISTS (SELECT 1 FROM idem.key_gates g WHERE g.h = u.h) THEN 'x'
                                 ELSE '-' END::"char"
                       FROM unnest(hs) WITH ORDINALITY AS u(h, n) ORDER BY u.n);
        -- (a new key whose gate was there goes through idem_claim, as above)
        IF '-' = ANY (via) THEN
            to_lock := (SELECT count(*) FROM unnest(via) v WHERE v = '-');
            lock_wait := current_setting('lock_timeout');
            BEGIN
                PERFORM set_config('lock_timeout', '1ms', true);
                WITH ins AS (
                    INSERT INTO idem.key_gates AS g (h, writer)
                    SELECT hs[u.n], pg_current_xact_id() FROM unnest(ks) WITH ORDINALITY AS u(k, n)
                     WHERE via[u.n] = '-' ORDER BY u.k COLLATE "C"
                        ON CONFLICT ON CONSTRAINT key_gates_pkey DO UPDATE SET writer = g.writer WHERE false
                    RETURNING g.h)
                SELECT count(*) INTO inserted FROM ins;
                PERFORM set_config('lock_timeout', lock_wait, true);
                via := ARRAY(SELECT CASE WHEN v.v IS DISTINCT FROM '-' THEN v.v
                                         WHEN kinds[v.n] <> 'n' THEN 'c'
                                         WHEN inserted < to_lock
                                              AND NOT EXISTS (SELECT 1 FROM idem.key_gates g
                                                               WHERE g.h = hs[v.n] AND g.writer = pg_current_xact_id()) THEN 'c'
                                    END::"char"
                               FROM unnest(via) WITH ORDINALITY AS v(v, n) ORDER BY v.n);
            EXCEPTION WHEN lock_not_available THEN
                via := ARRAY(SELECT CASE WHEN v.v = '-' THEN 'c' ELSE v.v END::"char"
                               FROM unnest(via) WITH ORDINALITY AS v(v, n) ORDER BY v.n);
            END;
        END IF;
    END IF;
    -- The new keys whose gates this call inserted: each claim's time its
    -- own, as each native claim reads the clock (read here in the
    -- elements' order: in the keys' order, a sort of the keys, cost 8 % of
    -- a batch of new keys), one class decision for the batch (the TTL is
    -- the batch's) and its registration made for the latest expiry, which
    -- covers every other.
    ts := ARRAY(SELECT CASE WHEN kinds[u.n] = 'n' AND firsts[u.n] = u.n AND via[u.n] IS NULL THEN clock_timestamp() END
                  FROM generate_series(1, cardinality(ks)) AS u(n));
    t_last := (SELECT max(t) FROM unnest(ts) t);
    IF t_last IS NOT NULL THEN
        ttl_us := coalesce(ttl_us, type_ttl_us,
                           idem.setting_us('idem.default_ttl', interval '24 hours', 1000000, 34560000000000));
        ttl_iv := idem.us_interval(ttl_us);
        cls := idem.claim_class(biz_type, t_last, t_last + ttl_iv);
        -- Each new claim row, and this transaction's gate for its key naming
        -- it (idem.insert_claim, for the whole batch; the digest again, by
        -- which the gate is found in its index).
        WITH c AS (
            INSERT INTO idem.claims AS ic (expires_at, claimed_at, ttl_class, state, biz_type, key, fingerprint, result)
            SELECT ts[u.n] + ttl_iv, ts[u.n], cls, 'p', biz_type, u.k, fps[u.n], NULL
              FROM unnest(ks) WITH ORDINALITY AS u(k, n)
             WHERE ts[u.n] IS NOT NULL
            RETURNING ic.key, ic.tableoid, ic.ctid)
        UPDATE idem.key_gates g SET writer = pg_current_xact_id(), part = c.tableoid, tid = c.ctid
          FROM c WHERE g.h = idem.key_hash(biz_type, c.key);
    END IF;
    -- The keys left to idem_claim, holding their locks (or, with wait
    -- false, trying them), in the order of the keys' bytes, each element (a
    -- later one of the same key after the first, as the loop above).
    IF 'c' = ANY (via) THEN
        FOR i IN SELECT u.n FROM unnest(ks) WITH ORDINALITY AS u(k, n) WHERE via[firsts[u.n]] = 'c'
                  ORDER BY u.k COLLATE "C", u.n LOOP
            done[i] := @extschema@.idem_claim(ks[i], biz_type, ttl, fps[i], wait);
        END LOOP;
    END IF;
    -- One row per element, in input order: idem_claim's answer where it
    -- made one; in progress where another transaction holds the key (wait
    -- false); a committed claim's outcome (idem.outcome_of_row); a new
    -- key's first element claimed it, and a later one finds it in progress.
    RETURN QUERY
        SELECT o.k, (o.r).claimed, (o.r).state, (o.r).result, (o.r).first_claimed_at, (o.r).expires_at
          FROM (SELECT u.n, u.k,
                       CASE WHEN (done[u.n]).claimed IS NOT NULL THEN done[u.n]
                            WHEN via[firsts[u.n]] = 'x' THEN ROW(false, 'in_progress', NULL, NULL, NULL)::@extschema@.idem_claim_result
                            WHEN kinds[u.n] = 'a'
                            THEN idem.outcome_of_row(f_state[u.n], false, f_result[u.n], f_claimed[u.n], f_expires[u.n])
                            WHEN firsts[u.n] = u.n
                            THEN ROW(true, 'new', NULL, ts[u.n], ts[u.n] + ttl_iv)::@extschema@.idem_claim_result
                            ELSE ROW(false, 'in_progress', NULL, ts[firsts[u.n]], ts[firsts[u.n]] + ttl_iv)::@extschema@.idem_claim_result
                       END AS r
                  FROM unnest(ks) WITH ORDINALITY AS u(k, n)
                OFFSET 0) AS o
         ORDER BY o.n;
END
$fn$;
-- @end
