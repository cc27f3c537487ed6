-- Portable bodies of sql/batch.sql's C functions (scripts/portable.py).

-- @helpers
-- The batch's keys that a set of statements can claim or answer without
-- idem_claim's per-key statements (docs/performance.md, "Batch claims"):
-- the first look at every key of the batch in one statement (idem.probe,
-- over the same TTL classes and partitions), whose rows say, per key,
-- whether it is new (no version of it at all), answered without the key
-- lock (one live committed claim, plain or completed: what idem_claim
-- answers from its first look), or anything else (a lease, a stored
-- failure, an expired version, two live ones). ok is false when any key is
-- of the last kind, the type is in more than three classes, or this
-- transaction holds the gate of one of the keys (it wrote it): then the
-- batch goes through idem_claim key by key. Otherwise found_* describe the
-- answered elements (found_at: their positions in keys, 1-based), and every
-- other element's key is new.
CREATE FUNCTION idem.probe_batch(hs bigint[], biz_type text, keys text[], t_now timestamptz,
                                 OUT ok boolean, OUT found_at int[], OUT found_states "char"[],
                                 OUT found_results jsonb[], OUT found_claimed timestamptz[],
                                 OUT found_expires timestamptz[], OUT found_fps text[])
    VOLATILE LANGUAGE plpgsql AS $fn$
DECLARE
    me xid8 := pg_current_xact_id_if_assigned();
    classes smallint[];
    untils timestamptz[];
    k1 smallint; k2 smallint; k3 smallint;
    u1 timestamptz; u2 timestamptz; u3 timestamptz;
    rows_seen int;
    elements_seen int;
    odd boolean;
BEGIN
    ok := false;
    -- (any gate naming this transaction: idem.probe's own-row rule then
    -- applies, which idem_claim has)
    IF me IS NOT NULL AND EXISTS (SELECT 1 FROM idem.key_gates g WHERE g.h = ANY (hs) AND g.writer = me) THEN
        RETURN;
    END IF;
    -- The type's classes and their latest expiries as values, as in
    -- idem.probe (the planner prunes to the partitions that can hold a row
    -- of the type before anything is locked). Then each key looked up as
    -- idem.probe looks it up, by its digest in each partition's index: a
    -- join per key (LATERAL, kept a subquery by OFFSET 0, so that it stays
    -- a nested loop over the keys), not one scan for an array of digests
    -- or a join the planner may turn into a hash join: for 500 keys both
    -- were planned as a scan (a parallel one, too) of the partitions,
    -- computing the digest of every row in them.
    SELECT array_agg(x.k ORDER BY x.k), array_agg(x.u ORDER BY x.k) INTO classes, untils
      FROM (SELECT tc.ttl_class AS k, max(tc.until) AS u FROM idem.type_classes tc
             WHERE tc.biz_type = probe_batch.biz_type GROUP BY tc.ttl_class) x;
    IF classes IS NULL THEN
        ok := true;
        RETURN;
    END IF;
    IF cardinality(classes) > 3 THEN
        RETURN;
    END IF;
    k1 := classes[1]; u1 := untils[1];
    k2 := coalesce(classes[2], k1); u2 := coalesce(untils[2], u1);
    k3 := coalesce(classes[3], k1); u3 := coalesce(untils[3], u1);
    SELECT count(*), count(DISTINCT u.n),
           coalesce(bool_or(c.expires_at <= t_now OR c.state NOT IN ('p', 'c')), false),
           array_agg(u.n), array_agg(c.state), array_agg(c.result), array_agg(c.claimed_at),
           array_agg(c.expires_at), array_agg(c.fingerprint)
      INTO rows_seen, elements_seen, odd, found_at, found_states, found_results, found_claimed,
           found_expires, found_fps
      FROM unnest(hs, keys) WITH ORDINALITY AS u(h, k, n)
     CROSS JOIN LATERAL (
        SELECT c.state, c.result, c.claimed_at, c.expires_at, c.fingerprint
          FROM idem.claims c
         WHERE idem.key_hash(c.biz_type, c.key) = u.h
           AND c.biz_type = probe_batch.biz_type
           AND c.key = u.k
           AND (c.ttl_class = k1 AND c.expires_at <= u1
                OR c.ttl_class = k2 AND c.expires_at <= u2
                OR c.ttl_class = k3 AND c.expires_at <= u3)
        OFFSET 0) AS c;
    ok := rows_seen = elements_seen AND NOT odd;
END
$fn$;
COMMENT ON FUNCTION idem.probe_batch(bigint[], text, text[], timestamptz) IS 'Portable edition: the first look at a batch''s keys in one statement: ok when every key is new or has one live committed plain or completed claim (found_*, by position in keys), which idem_claim_many then claims or answers with statements for the whole batch.';
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
    -- the position of the first element of the same key; the committed
    -- claim found for it; whether its key's gate was there already.
    firsts int[];
    f_state "char"[];
    f_result jsonb[];
    f_claimed timestamptz[];
    f_expires timestamptz[];
    f_fp text[];
    held boolean[];
    done @extschema@.idem_claim_result[];
    i int;
    j int;
    bad text;
    p record;
    fast boolean := false;
    to_lock int;
    inserted int;
    ttl_us bigint;
    type_ttl_us bigint;
    t_now timestamptz;
    t_exp timestamptz;
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
    -- The batch in statements for all its keys where every key is new or
    -- answered from a committed claim without the key lock (idem.probe_batch)
    -- and the call may wait; otherwise (and when two keys share a digest,
    -- and so a gate) key by key below.
    IF coalesce(wait, true) THEN
        hs := ARRAY(SELECT idem.key_hash(biz_type, u.k) FROM unnest(ks) WITH ORDINALITY AS u(k, n) ORDER BY u.n);
        IF (SELECT count(DISTINCT u.k) = count(DISTINCT u.h) FROM unnest(ks, hs) AS u(k, h)) THEN
            p := idem.probe_batch(hs, biz_type, ks, clock_timestamp());
            fast := p.ok;
        END IF;
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
    firsts := ARRAY(SELECT min(u.n) OVER (PARTITION BY u.k) FROM unnest(ks) WITH ORDINALITY AS u(k, n) ORDER BY u.n);
    FOR j IN 1 .. coalesce(cardinality(p.found_at), 0) LOOP
        i := p.found_at[j];
        f_state[i] := p.found_states[j];
        f_result[i] := p.found_results[j];
        f_claimed[i] := p.found_claimed[j];
        f_expires[i] := p.found_expires[j];
        f_fp[i] := p.found_fps[j];
    END LOOP;
    -- Fingerprints, as idem_claim checks them key by key: against the
    -- committed claim found, and a later element of a new key against its
    -- first element's (which claims it). The whole statement fails.
    SELECT u.k INTO bad FROM unnest(ks, fps) WITH ORDINALITY AS u(k, f, n)
     WHERE u.f IS NOT NULL
       AND CASE WHEN f_state[u.n] IS NOT NULL THEN u.f <> f_fp[u.n] ELSE u.f <> fps[firsts[u.n]] END
     ORDER BY u.k COLLATE "C", u.n LIMIT 1;
    IF FOUND THEN
        PERFORM idem.refuse_fingerprint(bad, biz_type);
    END IF;
    -- The key locks of the new keys, in one statement, in the order of the
    -- keys' bytes (the rows are inserted in the order the sort gives them,
    -- each waiting for its gate's holder as idem.lock_gate does); a key
    -- answered from its committed claim takes none, as in idem_claim. A
    -- gate inserted ('i' of idem.lock_gate) is a key no one has written
    -- since the first look; where a gate was there ('l'), the key's
    -- idem_claim looks again, under the lock now held.
    WITH lock_order AS (
        SELECT u.h FROM unnest(ks, hs) WITH ORDINALITY AS u(k, h, n)
         WHERE f_state[u.n] IS NULL AND firsts[u.n] = u.n
         ORDER BY u.k COLLATE "C"),
    ins AS (
        INSERT INTO idem.key_gates AS g (h, writer)
        SELECT l.h, pg_current_xact_id() FROM lock_order l
            ON CONFLICT ON CONSTRAINT key_gates_pkey DO UPDATE SET writer = g.writer WHERE false
        RETURNING g.h)
    SELECT (SELECT count(*) FROM lock_order), (SELECT count(*) FROM ins) INTO to_lock, inserted;
    IF inserted < to_lock THEN
        -- (rare: a gate left by an earlier claim of the key, or by one
        -- committed since the first look). The gates the statement above
        -- inserted are the only ones of these keys that name this
        -- transaction as their writer (idem.probe_batch: none did before).
        held := ARRAY(SELECT f_state[u.n] IS NULL AND firsts[u.n] = u.n
                             AND NOT EXISTS (SELECT 1 FROM idem.key_gates g WHERE g.h = u.h AND g.writer = pg_current_xact_id())
                        FROM unnest(ks, hs) WITH ORDINALITY AS u(k, h, n) ORDER BY u.n);
    END IF;
    IF inserted > 0 THEN
        ttl_us := coalesce(ttl_us, type_ttl_us,
                           idem.setting_us('idem.default_ttl', interval '24 hours', 1000000, 34560000000000));
        t_now := clock_timestamp();
        t_exp := t_now + idem.us_interval(ttl_us);
        cls := idem.claim_class(biz_type, t_now, t_exp);
        -- Each new claim row, and this transaction's gate for its key naming
        -- it (idem.insert_claim, for the whole batch; the digest again, by
        -- which the gate is found in its index).
        WITH c AS (
            INSERT INTO idem.claims AS ic (expires_at, claimed_at, ttl_class, state, biz_type, key, fingerprint, result)
            SELECT t_exp, t_now, cls, 'p', biz_type, u.k, fps[u.n], NULL
              FROM unnest(ks) WITH ORDINALITY AS u(k, n)
             WHERE f_state[u.n] IS NULL AND firsts[u.n] = u.n AND held[u.n] IS NOT TRUE
            RETURNING ic.key, ic.tableoid, ic.ctid)
        UPDATE idem.key_gates g SET writer = pg_current_xact_id(), part = c.tableoid, tid = c.ctid
          FROM c WHERE g.h = idem.key_hash(biz_type, c.key);
    END IF;
    -- Keys whose gate was there: idem_claim, holding the lock, in the order
    -- of the keys' bytes, each element (a later one of the same key after
    -- the first, as the loop above).
    IF inserted < to_lock THEN
        FOR i IN SELECT u.n FROM unnest(ks) WITH ORDINALITY AS u(k, n) WHERE held[firsts[u.n]]
                  ORDER BY u.k COLLATE "C", u.n LOOP
            done[i] := @extschema@.idem_claim(ks[i], biz_type, ttl, fps[i], wait);
        END LOOP;
    END IF;
    -- One row per element, in input order: idem_claim's answer where it
    -- made one; a committed claim's outcome (idem.outcome_of_row); a new
    -- key's first element claimed it, and a later one finds it in progress.
    RETURN QUERY
        SELECT o.k, (o.r).claimed, (o.r).state, (o.r).result, (o.r).first_claimed_at, (o.r).expires_at
          FROM (SELECT u.n, u.k,
                       CASE WHEN (done[u.n]).claimed IS NOT NULL THEN done[u.n]
                            WHEN f_state[u.n] IS NOT NULL
                            THEN idem.outcome_of_row(f_state[u.n], false, f_result[u.n], f_claimed[u.n], f_expires[u.n])
                            WHEN firsts[u.n] = u.n THEN ROW(true, 'new', NULL, t_now, t_exp)::@extschema@.idem_claim_result
                            ELSE ROW(false, 'in_progress', NULL, t_now, t_exp)::@extschema@.idem_claim_result
                       END AS r
                  FROM unnest(ks) WITH ORDINALITY AS u(k, n)
                OFFSET 0) AS o
         ORDER BY o.n;
END
$fn$;
-- @end
