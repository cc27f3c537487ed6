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
COMMENT ON FUNCTION idem_unguard(regclass, name) IS 'Remove the guard idem_guard installed on tbl.state_col.';
