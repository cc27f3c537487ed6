#!/usr/bin/env bash
# Privileges of the portable edition, as tests/scenarios/hardening.sh privileges
# checks the native one, with real login roles, for both ways of installing
# it: through pg_tle by a member of pgtle_admin (the extension's owner, not a
# superuser) and by the plain script as the database's owner.
#  A. every SECURITY DEFINER function of the edition pins search_path to
#     pg_catalog[, pg_temp] (a query over pg_proc; none may be missing);
#  B. a role without grants can do what it can on the native edition's
#     default install (claim, complete, fail, look up, lease, tokens,
#     transitions and guards on its own tables) and no more (the admin
#     functions, storage, the views: 42501);
#  C. per-type owners (idem_set_owner) and grants hold: members only, SET
#     ROLE for a NOINHERIT member, a grant of idem_configure does not reach
#     a reserved type, EXECUTE revoked from PUBLIC is revoked; and, as
#     docs/portable.md "Who a call acts for" says, a call from inside another
#     SECURITY DEFINER function is checked against the session's role;
#  D. a hostile search_path: a role's schema with functions, operators and
#     tables named like those the edition uses, placed before pg_catalog
#     (and temp tables), is never called or written, and the answers are
#     right;
#  E. a role that sets every idem.* setting the edition reads (when it
#     connects, by SET, by set_config) changes nothing for others: its
#     claims go into the classes of the database's idem.partition_width.
#
#   bash tests/portable/privileges.sh [SOCKET_DIR [PORT]]     (tests/portable/lib.sh)
#
# PORTABLE_BREAK=unpin runs the negative control: idem_claim's search_path
# setting is removed after installing; A and D must then fail.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
P=portable_priv
ADMIN=${P}_admin OWNER=${P}_owner OTHER=${P}_other TENANT=${P}_tenant MEMBER=${P}_member
NOINH=${P}_noinh OPS=${P}_ops EVIL=${P}_evil
ROLES="$OTHER $MEMBER $NOINH $OPS $EVIL $TENANT $ADMIN $OWNER"
DBS="${P}_tle ${P}_plain"
trap 'pp_drop "$DBS" "$ROLES"; pp_cleanup_dist' EXIT
pp_drop "$DBS" "$ROLES"
pp_roles $ROLES
pp_psql postgres postgres -c "GRANT $TENANT TO $MEMBER" -c "ALTER ROLE $NOINH NOINHERIT" -c "GRANT $TENANT TO $NOINH"

# want STATE ROLE DB SQL: STATE is ok or a SQLSTATE.
want() { expect "$5as $2: $4" "$(pp_sqlstate "$2" "$3" "$4")" "$1"; }
# answer ROLE DB SQL: the unaligned output of SQL (errors shown as such).
answer() { pp_psql "$1" "$2" -At -c "$3" 2>&1 | tr '\n' ' ' | sed 's/ $//'; }

run_checks() { # db installer
  local db=$1 inst=$2 tag="[$1] "
  # The edition's functions: the extension's members (pg_tle), or what the
  # plain script made (schema idem, and the API named idem_* in public).
  local members="SELECT p.oid FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = 'idem' OR (n.nspname = 'public' AND p.proname LIKE 'idem\\_%')"
  if [ "${PORTABLE_BREAK:-}" = unpin ]; then
    pp_psql "$inst" "$db" -c "ALTER FUNCTION idem_claim(text, text, interval, text, boolean, interval) RESET search_path"
    echo "  (broken on purpose: idem_claim's search_path setting removed)"
  fi

  echo "== $db: A. SECURITY DEFINER functions pin search_path"
  local n unpinned
  n=$(answer postgres "$db" "SELECT count(*) FROM pg_proc WHERE prosecdef AND oid IN ($members)")
  unpinned=$(answer postgres "$db" "
    SELECT coalesce(string_agg(p.oid::regprocedure::text, ', ' ORDER BY 1), '') FROM pg_proc p
     WHERE p.prosecdef AND p.oid IN ($members)
       AND NOT coalesce((SELECT bool_or(c ~ '^search_path=(\"?pg_catalog\"?)(, *\"?pg_temp\"?)?$') FROM unnest(p.proconfig) c), false)")
  expect "${tag}SECURITY DEFINER functions: $n, each with search_path = pg_catalog[, pg_temp]; without" "${unpinned:-none}" none
  expect "${tag}the API's SECURITY DEFINER functions found" "$([ "$n" -ge 15 ] && echo yes || echo "only $n")" yes

  echo "== $db: B. a role without grants: what the native default install allows, no more"
  pp_psql "$inst" "$db" -c "SELECT idem_define_machine('priv.order', '{\"CREATED\":[\"PAID\"],\"PAID\":[\"SHIPPED\"]}')" >/dev/null
  pp_psql "$inst" "$db" -c "GRANT CREATE ON SCHEMA public TO $OTHER, $EVIL"
  want ok $OTHER "$db" "BEGIN; SELECT idem_claim('b1', 'priv.pay'); SELECT idem_complete('b1', 'priv.pay', '{\"ok\":1}'); COMMIT" "$tag"
  expect "${tag}as $OTHER: a duplicate replays" "$(answer $OTHER "$db" "SELECT claimed, state, result FROM idem_claim('b1', 'priv.pay')")" 'f|completed|{"ok": 1}'
  want ok $OTHER "$db" "BEGIN; SELECT idem_claim('b2', 'priv.pay', fingerprint => 'f'); SELECT idem_fail('b2', 'priv.pay', '{\"e\":1}'); COMMIT" "$tag"
  want ID001 $OTHER "$db" "SELECT idem_claim('b2', 'priv.pay', fingerprint => 'g')" "$tag"
  want ok $OTHER "$db" "SELECT idem_claim('b3', 'priv.job', lease => '1 minute'); SELECT idem_checkpoint('b3', 'priv.job', 's', '{}');
                         SELECT idem_complete('b3', 'priv.job')" "$tag"
  expect "${tag}as $OTHER: lookup" "$(answer $OTHER "$db" "SELECT state FROM idem_lookup('b2', 'priv.pay')")" failed
  expect "${tag}as $OTHER: the claim id" "$(answer $OTHER "$db" "SELECT idem_claim_id('b2', 'priv.pay', first_claimed_at) = idem_claim_id('b2', 'priv.pay', first_claimed_at) FROM idem_lookup('b2', 'priv.pay')")" t
  expect "${tag}as $OTHER: a token spent once" \
    "$(answer $OTHER "$db" "SELECT idem_consume_token(t, 'priv.form'), idem_consume_token(t, 'priv.form') FROM idem_issue_token('priv.form') t")" "t|f"
  want ok $OTHER "$db" "CREATE TABLE priv_orders (id int PRIMARY KEY, status text); INSERT INTO priv_orders VALUES (1, 'CREATED'), (2, 'SHIPPED');
                         SELECT idem_transition('priv_orders', 'id', '1', 'status', 'PAID', 'priv.order'); SELECT idem_guard('priv_orders', 'status', 'priv.order')" "$tag"
  want ID002 $OTHER "$db" "UPDATE priv_orders SET status = 'CREATED' WHERE id = 2" "$tag"
  local f
  for f in "idem_forget('b1', 'priv.pay')" "idem_configure('priv.pay', '1 hour')" "idem_maintain()" \
           "idem_define_machine('priv.order', '{\"SHIPPED\":[\"CREATED\"]}')" "idem_set_owner('priv.pay', '$OTHER')" \
           "idem_metrics_reset()" "idem_distribute('priv_orders')" "idem.key_hash('priv.pay', 'b1')"; do
    want 42501 $OTHER "$db" "SELECT $f" "$tag"
  done
  for f in "SELECT count(*) FROM idem.claims" "DELETE FROM idem.biz_types" "UPDATE idem.machines SET transitions = '{}'" \
           "CREATE TABLE idem.forged (x int)" "SELECT count(*) FROM idem_stats" "SELECT count(*) FROM idem_partitions" \
           "SELECT count(*) FROM idem_leases"; do
    want 42501 $OTHER "$db" "$f" "$tag"
  done

  echo "== $db: C. per-type owners and grants"
  pp_psql "$inst" "$db" -c "SELECT idem_set_owner('priv.tenant', '$TENANT')" \
    -c "GRANT EXECUTE ON FUNCTION idem_configure(text, interval), idem_forget(text, text) TO $OPS" >/dev/null
  want ok $MEMBER "$db" "BEGIN; SELECT idem_claim('c1', 'priv.tenant'); SELECT idem_complete('c1', 'priv.tenant', '{}'); COMMIT" "$tag"
  want 42501 $OTHER "$db" "SELECT idem_claim('c2', 'priv.tenant')" "$tag"
  want 42501 $OTHER "$db" "SELECT idem_lookup('c1', 'priv.tenant')" "$tag"
  want 42501 $OTHER "$db" "SELECT idem_complete('c1', 'priv.tenant', '{}')" "$tag"
  want 42501 $NOINH "$db" "SELECT idem_claim('c3', 'priv.tenant')" "$tag"
  want ok $NOINH "$db" "SET ROLE $TENANT; SELECT idem_claim('c3', 'priv.tenant')" "$tag"
  want ok $OPS "$db" "SELECT idem_configure('priv.pay', '2 days'); SELECT idem_forget('b1', 'priv.pay')" "$tag"
  want 42501 $OPS "$db" "SELECT idem_configure('priv.tenant', '2 days')" "$tag"
  want 42501 $OPS "$db" "SELECT idem_forget('c1', 'priv.tenant')" "$tag"
  want 42501 $OPS "$db" "SELECT idem_set_owner('priv.tenant', NULL)" "$tag"
  # Who a call acts for (docs/portable.md): a SECURITY DEFINER function of
  # a member, called by a role that is not one, is checked against the
  # session's role (the native edition would check the function's owner).
  pp_psql "$inst" "$db" -c "GRANT CREATE ON SCHEMA public TO $MEMBER" >/dev/null
  pp_psql $MEMBER "$db" -c "CREATE FUNCTION member_claims(k text) RETURNS boolean LANGUAGE sql SECURITY DEFINER
      SET search_path = public, pg_catalog AS \$\$ SELECT claimed FROM idem_claim(k, 'priv.tenant') \$\$" >/dev/null
  want 42501 $OTHER "$db" "SELECT member_claims('c4')" "$tag"
  want ok $MEMBER "$db" "SELECT member_claims('c4')" "$tag"
  # Grants the installer changes hold for the API.
  pp_psql "$inst" "$db" -c "REVOKE EXECUTE ON FUNCTION idem_claim(text, text, interval, text, boolean, interval) FROM PUBLIC" >/dev/null
  want 42501 $OTHER "$db" "SELECT idem_claim('c5', 'priv.pay')" "$tag"
  pp_psql "$inst" "$db" -c "GRANT EXECUTE ON FUNCTION idem_claim(text, text, interval, text, boolean, interval) TO $OTHER" >/dev/null
  want ok $OTHER "$db" "SELECT idem_claim('c5', 'priv.pay')" "$tag"
  pp_psql "$inst" "$db" -c "GRANT EXECUTE ON FUNCTION idem_claim(text, text, interval, text, boolean, interval) TO PUBLIC" >/dev/null

  echo "== $db: D. a hostile search_path"
  pp_psql "$inst" "$db" -c "GRANT CREATE ON DATABASE $db TO $EVIL" >/dev/null
  pp_psql $EVIL "$db" >/dev/null <<'SQL'
CREATE SCHEMA evil;
CREATE TABLE evil.calls (what text, ran_as name);
GRANT USAGE ON SCHEMA evil TO PUBLIC;
GRANT INSERT, SELECT ON evil.calls TO PUBLIC;
CREATE TABLE evil.claims (key text, biz_type text);  CREATE TABLE evil.biz_types (biz_type text, ttl interval);
CREATE TABLE evil.type_classes (biz_type text);  CREATE TABLE evil.tokens (x int);  CREATE TABLE evil.machines (name text);
GRANT ALL ON ALL TABLES IN SCHEMA evil TO PUBLIC;
CREATE FUNCTION evil.log(w text) RETURNS void LANGUAGE sql AS $$ INSERT INTO evil.calls VALUES (w, current_user) $$;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA evil TO PUBLIC;
DO $do$
DECLARE
    f text[];
BEGIN
    -- name, arguments, result type, what it returns: each logs its call.
    FOREACH f SLICE 1 IN ARRAY ARRAY[
        ['pg_advisory_xact_lock', 'bigint', 'void', 'NULL'],
        ['pg_try_advisory_xact_lock', 'bigint', 'boolean', 'true'],
        ['pg_xact_status', 'xid8', 'text', '''committed'''],
        ['pg_current_snapshot', '', 'pg_snapshot', 'NULL'],
        ['pg_current_xact_id', '', 'xid8', '''1'''],
        ['pg_current_xact_id_if_assigned', '', 'xid8', '''1'''],
        ['set_config', 'text, text, boolean', 'text', '''evil'''],
        ['current_setting', 'text', 'text', '''evil'''],
        ['current_setting', 'text, boolean', 'text', '''evil'''],
        ['now', '', 'timestamptz', '''2000-01-01'''],
        ['clock_timestamp', '', 'timestamptz', '''2000-01-01'''],
        ['statement_timestamp', '', 'timestamptz', '''2000-01-01'''],
        ['sha256', 'bytea', 'bytea', '''\x00'''],
        ['convert_to', 'text, name', 'bytea', '''\x00'''],
        ['encode', 'bytea, text', 'text', '''00'''],
        ['gen_random_uuid', '', 'uuid', '''00000000-0000-0000-0000-000000000000'''],
        ['random', '', 'double precision', '0'],
        ['md5', 'text', 'text', '''0'''],
        ['length', 'text', 'integer', '0'],
        ['octet_length', 'text', 'integer', '0'],
        ['lower', 'text', 'text', '''evil'''],
        ['jsonb_typeof', 'jsonb', 'text', '''object'''],
        ['pg_has_role', 'name, oid, text', 'boolean', 'true'],
        ['pg_backend_pid', '', 'integer', '0'],
        ['idem_machine', 'text, text', 'jsonb', '''{"transitions":{"SHIPPED":["CREATED"]},"reachable":{"SHIPPED":["CREATED"],"CREATED":[]}}'''],
        ['idem_classify_transition', 'text, text, text', 'text', '''allowed''']]
    LOOP
        EXECUTE format('CREATE FUNCTION evil.%I(%s) RETURNS %s LANGUAGE plpgsql AS $f$ BEGIN PERFORM evil.log(%L); RETURN %s; END $f$',
                       f[1], (SELECT string_agg(format('a%s %s', i, t), ', ') FROM unnest(string_to_array(nullif(f[2], ''), ', ')) WITH ORDINALITY u(t, i)),
                       f[3], f[1] || '(' || f[2] || ')', CASE WHEN f[3] = 'void' THEN '' ELSE f[4] END);
    END LOOP;
    -- Operators: name, left, right, answer.
    FOREACH f SLICE 1 IN ARRAY ARRAY[
        ['=', 'text', 'text', 'true'], ['<>', 'text', 'text', 'false'], ['=', 'bigint', 'bigint', 'true'],
        ['=', 'bytea', 'bytea', 'true'], ['<', 'timestamptz', 'timestamptz', 'false'], ['>', 'timestamptz', 'timestamptz', 'true'],
        ['<=', 'timestamptz', 'timestamptz', 'false'], ['>=', 'timestamptz', 'timestamptz', 'true'],
        ['<', 'interval', 'interval', 'false'], ['=', '"char"', '"char"', 'true'], ['?', 'jsonb', 'text', 'true'],
        ['=', 'integer', 'integer', 'true'], ['<', 'bigint', 'bigint', 'false'], ['+', 'bigint', 'bigint', '0'],
        ['=', 'xid8', 'xid8', 'true'], ['=', 'oid', 'oid', 'true'], ['=', 'tid', 'tid', 'true']]
    LOOP
        EXECUTE format('CREATE FUNCTION evil.op_%s(a %s, b %s) RETURNS %s LANGUAGE plpgsql AS $f$ BEGIN PERFORM evil.log(%L); RETURN %s; END $f$',
                       md5(f[1] || f[2] || f[3]), f[2], f[3], CASE WHEN f[1] = '+' THEN 'bigint' ELSE 'boolean' END,
                       f[1] || ' (' || f[2] || ', ' || f[3] || ')', f[4]);
        EXECUTE format('CREATE OPERATOR evil.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = evil.op_%s)', f[1], f[2], f[3], md5(f[1] || f[2] || f[3]));
    END LOOP;
END
$do$;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA evil TO PUBLIC;
SQL
  local path="SET search_path = evil, pg_catalog, public;
    CREATE TEMP TABLE IF NOT EXISTS claims (x int); CREATE TEMP TABLE IF NOT EXISTS biz_types (x int);
    CREATE TEMP TABLE IF NOT EXISTS type_classes (x int); CREATE TEMP TABLE IF NOT EXISTS pg_locks (x int);"
  hostile() { answer "$1" "$db" "$path $2"; }
  expect "${tag}hostile path, as $OTHER: claim, complete, duplicate" \
    "$(hostile $OTHER "BEGIN; SELECT claimed, state FROM idem_claim('d1', 'priv.evil'); SELECT idem_complete('d1', 'priv.evil', '{\"v\":1}'); COMMIT;
                       SELECT claimed, state, result FROM idem_claim('d1', 'priv.evil')")" 't|new  f|completed|{"v": 1}'
  expect "${tag}hostile path, as $OTHER: lease, checkpoint, fail, lookup" \
    "$(hostile $OTHER "SELECT claimed FROM idem_claim('d2', 'priv.evil', lease => '1 minute'); SELECT idem_checkpoint('d2', 'priv.evil', 'p');
                       SELECT idem_fail('d2', 'priv.evil', '{}'); SELECT state FROM idem_lookup('d2', 'priv.evil')")" 't   failed'
  expect "${tag}hostile path, as $OTHER: tokens" \
    "$(hostile $OTHER "SELECT idem_consume_token(t, 'priv.evil'), idem_consume_token(t, 'priv.evil') FROM idem_issue_token('priv.evil') t")" 't|f'
  expect "${tag}hostile path, as $OTHER: a member-only type" \
    "$(pp_sqlstate $OTHER "$db" "$path SELECT idem_claim('d3', 'priv.tenant')")" 42501
  expect "${tag}hostile path, as $OTHER: transitions and the guard" \
    "$(hostile $OTHER "SELECT idem_transition('priv_orders', 'id', '1', 'status', 'SHIPPED', 'priv.order'),
                              public.idem_classify_transition('priv.order', 'SHIPPED', 'CREATED')") $(pp_sqlstate $OTHER "$db" "$path UPDATE priv_orders SET status = 'CREATED' WHERE id = 1")" \
    "applied|stale ID002"
  expect "${tag}hostile path, as $inst: idem_configure, idem_forget, idem_maintain, idem_define_machine, idem_set_owner" \
    "$(pp_sqlstate "$inst" "$db" "$path SELECT idem_configure('priv.evil', '1 hour'); SELECT idem_forget('d1', 'priv.evil');
       SELECT idem_maintain(); SELECT idem_define_machine('priv.evil', '{\"A\":[\"B\"]}'); SELECT idem_set_owner('priv.evil', NULL)")" ok
  expect "${tag}hostile path: forgotten" "$(hostile $OTHER "SELECT claimed FROM idem_claim('d1', 'priv.evil')")" t
  expect "${tag}shadowing functions and operators called (and by whom)" \
    "$(answer postgres "$db" "SELECT coalesce(string_agg(DISTINCT what || ' as ' || ran_as, '; '), 'none') FROM evil.calls")" none
  expect "${tag}rows written to the look-alike tables" "$(answer postgres "$db" "SELECT (SELECT count(*) FROM evil.claims)
    + (SELECT count(*) FROM evil.biz_types) + (SELECT count(*) FROM evil.type_classes) + (SELECT count(*) FROM evil.tokens)
    + (SELECT count(*) FROM evil.machines)")" 0

  echo "== $db: E. a role's own settings reach no one else"
  # Every idem.* setting the edition reads, set by $OTHER when it connects,
  # by SET and by set_config: idem.partition_width among them would put its
  # 400-day claims into class 52 (of 100 ms), 2^26 days wide at a
  # database's width of a day. Its claims must go where the database's
  # setting (here the default, one minute: class 34) puts them.
  local opts="-c idem.partition_width=100ms -c idem.premake_ahead=400d -c idem.premake_limit=1 -c idem.default_ttl=1s"
  local sets="SET idem.partition_width = '100 milliseconds'; DO \$d\$ BEGIN PERFORM set_config('idem.partition_width', '200 ms', false); END \$d\$;
    SET idem.premake_ahead = '400 days'; SET idem.maintenance_lock_timeout = '0'; SET idem.maintenance_lock_retries = '1';
    SET idem.premake_limit = '1'; SET idem.health_maintenance_after = '1 second'; SET idem.health_lease_after = '1 second';
    SET idem.storage_access = 'direct';"
  expect "${tag}as $OTHER, with every idem.* setting its own: a 400-day claim" \
    "$(PGOPTIONS="$opts" answer $OTHER "$db" "$sets SELECT claimed FROM idem_claim('e1', 'priv.width', ttl => '400 days')")" "t"
  expect "${tag}its class is that of the database's width (1 minute), its registrations too" \
    "$(answer postgres "$db" "SELECT string_agg(DISTINCT ttl_class::text, ',') FROM idem.claims WHERE biz_type = 'priv.width'")|$(answer postgres "$db" "SELECT string_agg(DISTINCT ttl_class::text, ',') FROM idem.type_classes WHERE biz_type = 'priv.width'")" "34|34"
  # The database's stored setting is what counts (a superuser stores it).
  pp_psql postgres postgres -c "ALTER DATABASE $db SET idem.partition_width = '1 day'"
  expect "${tag}as $OTHER, the database's width set to 1 day: a 400-day claim goes into its class" \
    "$(PGOPTIONS="$opts" answer $OTHER "$db" "$sets SELECT claimed FROM idem_claim('e2', 'priv.width', ttl => '400 days')")|$(answer postgres "$db" "SELECT ttl_class FROM idem.claims WHERE biz_type = 'priv.width' AND key = 'e2'")" \
    "t|$(answer postgres "$db" "SET idem.partition_width = '1 day'; SELECT idem.ttl_class('400 days')")"
  want ok "$inst" "$db" "SELECT idem_maintain(); SELECT count(*) FROM idem_health" "$tag"
  expect "${tag}both claims found again" "$(answer $OTHER "$db" "$sets SELECT count(*) FILTER (WHERE NOT claimed) FROM idem_claim('e1', 'priv.width') UNION ALL SELECT count(*) FILTER (WHERE NOT claimed) FROM idem_claim('e2', 'priv.width')")" "1 1"
  # A stored value is checked where it is read.
  pp_psql postgres postgres -c "ALTER DATABASE $db SET idem.partition_width = '10 milliseconds'"
  want 22023 $OTHER "$db" "SELECT idem_claim('e3', 'priv.width')" "$tag"
  pp_psql postgres postgres -c "ALTER DATABASE $db RESET idem.partition_width"
}

echo "== installed through pg_tle by $ADMIN (pgtle_admin, not a superuser)"
pp_tle_install ${P}_tle "$ADMIN"
run_checks ${P}_tle "$ADMIN"
echo "== installed by the plain script as the database's owner $OWNER"
pp_plain_install ${P}_plain "$OWNER"
run_checks ${P}_plain "$OWNER"
finish "portable privileges"
