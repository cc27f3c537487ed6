#!/usr/bin/env bash
# Privileges, as an operator would set them up, with real login roles:
#  A. the default install (CREATE EXTENSION idem in public): every SECURITY
#     DEFINER function pins search_path; the admin functions (idem_forget,
#     idem_configure, idem_maintain, idem_define_machine) are not executable
#     by PUBLIC, and a role without grants cannot use them to block claims or
#     loosen another role's guard;
#  B. the hardened install (extension in its own schema, EXECUTE revoked
#     from PUBLIC, an idem_user role granted what applications need, an
#     idem_admin role for operators): a member of idem_user can claim,
#     complete, fail, look up, lease and checkpoint, spend tokens, transition
#     and guard its own tables, and cannot touch storage or call the admin
#     functions; a member of idem_admin can;
#  C. malicious objects on the caller's search_path (tables named like
#     idem's, temp tables shadowing catalogs, functions and operators named
#     like those idem uses, placed before pg_catalog) are never used by idem.
# Roles are cluster-wide, so they carry this test's prefix.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
dba=hostile_priv_default; dbb=hostile_priv_hard
R_USER=hostile_idem_user; R_ADMIN=hostile_idem_admin
APP=hostile_app; OTHER=hostile_other; OPS=hostile_ops; CLERK=hostile_clerk

cleanup() {
  for db in $dba $dbb; do psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true; done
  for r in $APP $OTHER $OPS $CLERK $R_USER $R_ADMIN; do psql_idem -q -d postgres -c "DROP ROLE IF EXISTS $r" >/dev/null 2>&1 || true; done
}
trap cleanup EXIT
cleanup

pass=0; fail=0; failures=()
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); failures+=("$1"); echo "  FAIL: $1"; }

# as ROLE DB SQL -> prints "ok" or the SQLSTATE of the first error
as() {
  local role=$1 db=$2 sql=$3 out
  out=$("$PG_BIN/psql" -X -At -h "$(cluster_dir)" -p "$IDEM_PORT" -U "$role" -d "$db" \
          -v ON_ERROR_STOP=1 -v VERBOSITY=sqlstate -c "\\set VERBOSITY sqlstate" -c "$sql" 2>&1) && { echo ok; return; }
  sed -n 's/^ERROR:  \([0-9A-Z]\{5\}\).*/\1/p' <<<"$out" | head -1 | grep . || echo "??? $out"
}
# expect WHAT ROLE DB SQL: WHAT is ok or a SQLSTATE
expect() {
  local want=$1 role=$2 db=$3 sql=$4 got
  got=$(as "$role" "$db" "$sql")
  if [ "$got" = "$want" ]; then ok; else bad "as $role: $sql -> $got (expected $want)"; fi
}

for r in $R_USER $R_ADMIN; do psql_idem -q -d postgres -c "CREATE ROLE $r NOLOGIN"; done
for r in $APP $OTHER $OPS $CLERK; do psql_idem -q -d postgres -c "CREATE ROLE $r LOGIN"; done
for db in $dba $dbb; do psql_idem -q -d postgres -c "CREATE DATABASE $db"; done

# ------------------------------------------------------------------ A
say "A. default install"
psql_idem -q -d $dba -c "CREATE EXTENSION idem" -c "SELECT idem_maintain()" >/dev/null
psql_idem -q -d $dba -c "GRANT CREATE ON SCHEMA public TO $APP"

echo "  functions of the extension (pg_depend): security definer, proconfig, PUBLIC execute"
psql_idem -d $dba -c "
  SELECT p.oid::regprocedure AS function, p.prosecdef AS definer, p.proconfig,
         has_function_privilege('public', p.oid, 'EXECUTE') AS public_exec
    FROM pg_proc p JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
    JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idem' ORDER BY p.prosecdef DESC, 1::text" | sed 's/^/    /'
# Every SECURITY DEFINER function sets search_path to pg_catalog (and
# pg_temp, last) and nothing else.
unpinned=$(psql_idem -d $dba -At -c "
  SELECT string_agg(p.oid::regprocedure::text, ', ')
    FROM pg_proc p JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
    JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idem'
   WHERE p.prosecdef
     AND NOT coalesce((SELECT bool_or(c ~ '^search_path=(\"?pg_catalog\"?)(, *\"?pg_temp\"?)?$') FROM unnest(p.proconfig) c), false)")
ndef=$(psql_idem -d $dba -At -c "
  SELECT count(*) FROM pg_proc p JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
    JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idem' WHERE p.prosecdef")
[ -z "$unpinned" ] && ok || bad "SECURITY DEFINER functions without a pinned search_path: $unpinned"
echo "  $ndef SECURITY DEFINER functions; without search_path = pg_catalog[, pg_temp]: ${unpinned:-none}"

for f in "idem_forget(text,text)" "idem_configure(text,interval)" "idem_maintain()" "idem_define_machine(text,jsonb)"; do
  v=$(psql_idem -d $dba -At -c "SELECT has_function_privilege('public', '$f', 'EXECUTE')")
  [ "$v" = f ] && ok || bad "admin function $f is executable by PUBLIC"
done
expect 42501 $OTHER $dba "SELECT idem_forget('k', 'pay')"
expect 42501 $OTHER $dba "SELECT idem_configure('pay', '1 hour')"
expect 42501 $OTHER $dba "SELECT idem_maintain()"
expect 42501 $OTHER $dba "SELECT idem_define_machine('hostile.any', '{\"A\":[\"B\"]}')"

# What PUBLIC's EXECUTE on idem_maintain allows: a role with no grant at all
# takes idem.claims' ACCESS EXCLUSIVE lock (it needs only some work to do,
# which raising its own idem.default_ttl provides) and holds it as long as
# its transaction stays open; every claim in the database waits meanwhile.
(PGAPPNAME=idem_priv_holder as $OTHER $dba "BEGIN; SET LOCAL idem.default_ttl = '400 days'; SELECT idem_maintain(); SELECT pg_sleep(3); COMMIT" >/tmp/hostile_priv_hold.$$ 2>&1) &
holder=$!
# The claim below runs once the holder is either gone (refused) or sleeping
# inside its transaction (holding whatever idem_maintain took).
for _ in $(seq 1 1200); do
  kill -0 $holder 2>/dev/null || break
  [ "$(psql_idem -d $dba -Atc "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'idem_priv_holder' AND query LIKE '%pg_sleep%'")" = 1 ] && break
  sleep 0.1
done
got=$(as $APP $dba "SET lock_timeout = '500ms'; SELECT idem_claim('blocked?', 'hostile.pay')")
wait $holder || true
held=$(cat /tmp/hostile_priv_hold.$$); rm -f /tmp/hostile_priv_hold.$$
echo "  a role without grants ran idem_maintain in an open transaction: '$held'; a claim meanwhile: $got"
[ "$got" = ok ] && ok || bad "a role without grants blocked claims through idem_maintain (claim got $got while it held its transaction open)"
parts=$(psql_idem -d $dba -At -c "SELECT count(*) FROM idem_partitions")
echo "  partitions of idem.claims now: $parts"

# What PUBLIC's EXECUTE on idem_define_machine allows: APP guards its table
# with machine hostile.order; OTHER, which has no right on APP's table,
# redefines the machine, and the guard lets an illegal update through.
expect ok postgres $dba "SELECT idem_define_machine('hostile.order', '{\"CREATED\":[\"PAID\"],\"PAID\":[\"SHIPPED\"]}')"
expect ok $APP $dba "CREATE TABLE app_orders (id int PRIMARY KEY, status text); INSERT INTO app_orders VALUES (1, 'SHIPPED');
                     SELECT idem_guard('app_orders', 'status', 'hostile.order')"
expect ID002 $APP $dba "UPDATE app_orders SET status = 'CREATED' WHERE id = 1"
as $OTHER $dba "SELECT idem_define_machine('hostile.order', '{\"SHIPPED\":[\"CREATED\"]}')" >/dev/null
expect ID002 $APP $dba "UPDATE app_orders SET status = 'CREATED' WHERE id = 1"

# ------------------------------------------------------------------ B
say "B. hardened install: schema idemapi, EXECUTE revoked from PUBLIC, roles $R_USER and $R_ADMIN"
# The grant SQL the README should show (role names prefixed here).
psql_idem -q -d $dbb >/dev/null <<SQL
CREATE SCHEMA idemapi;
CREATE EXTENSION idem SCHEMA idemapi;
SELECT idemapi.idem_maintain();
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA idemapi FROM PUBLIC;

GRANT USAGE ON SCHEMA idemapi TO $R_USER;
GRANT EXECUTE ON FUNCTION
    idemapi.idem_claim(text, text, interval, text, boolean, interval),
    idemapi.idem_complete(text, text, jsonb, text),
    idemapi.idem_fail(text, text, jsonb, text),
    idemapi.idem_checkpoint(text, text, text, jsonb, text),
    idemapi.idem_checkpoint(text, text, text, jsonb, text, boolean),
    idemapi.idem_lookup(text, text),
    idemapi.idem_issue_token(text, interval),
    idemapi.idem_consume_token(text, text),
    idemapi.idem_machine(text, text),
    idemapi.idem_classify_transition(text, text, text),
    idemapi.idem_transition(regclass, name, text, name, text, text, name, bigint),
    idemapi.idem_guard(regclass, name, text),
    idemapi.idem_unguard(regclass, name),
    idemapi.idem_guard_trigger()
  TO $R_USER;

GRANT $R_USER TO $R_ADMIN;
GRANT EXECUTE ON FUNCTION
    idemapi.idem_forget(text, text),
    idemapi.idem_configure(text, interval),
    idemapi.idem_configure(text, interval, text),
    idemapi.idem_configure(text, interval, text, text),
    idemapi.idem_define_machine(text, jsonb),
    idemapi.idem_maintain(),
    idemapi.idem_schedule_maintenance(text)
  TO $R_ADMIN;
GRANT SELECT ON idemapi.idem_stats, idemapi.idem_partitions TO $R_ADMIN;

GRANT $R_USER TO $APP;
GRANT $R_ADMIN TO $OPS;
ALTER DATABASE $dbb SET search_path = "\$user", public, idemapi;
GRANT CREATE ON SCHEMA public TO $APP;
SQL
expect ok $OPS $dbb "SELECT idem_define_machine('hostile.order', '{\"CREATED\":[\"PAID\",\"CANCELLED\"],\"PAID\":[\"SHIPPED\"]}')"

echo "  $APP (member of $R_USER): the application's calls"
expect ok $APP $dbb "BEGIN; SELECT idem_claim('p1', 'hostile.pay'); SELECT idem_complete('p1', 'hostile.pay', '{\"ok\":1}'); COMMIT"
expect ok $APP $dbb "SELECT 1/count(*) FROM idem_claim('p1', 'hostile.pay') WHERE NOT claimed AND state = 'completed' AND result = '{\"ok\":1}'"
expect ok $APP $dbb "BEGIN; SELECT idem_claim('p2', 'hostile.pay', ttl => '1 hour', fingerprint => 'f'); SELECT idem_fail('p2', 'hostile.pay', '{\"e\":1}'); COMMIT"
expect ok $APP $dbb "SELECT 1/count(*) FROM idem_lookup('p2', 'hostile.pay') WHERE state = 'failed'"
expect ID001 $APP $dbb "SELECT idem_claim('p2', 'hostile.pay', fingerprint => 'g')"
expect ok $APP $dbb "SELECT idem_claim('l1', 'hostile.job', lease => '1 minute');
                     SELECT idem_checkpoint('l1', 'hostile.job', 'step1', '{\"n\":1}');
                     SELECT idem_complete('l1', 'hostile.job')"
expect ok $APP $dbb "SELECT 1/count(*) FROM idem_consume_token(idem_issue_token('hostile.form'), 'hostile.form') t WHERE t"
expect ok $APP $dbb "CREATE TABLE orders (id int PRIMARY KEY, status text); INSERT INTO orders VALUES (1, 'CREATED'), (2, 'CREATED');
                     SELECT 1/count(*) FROM idem_transition('orders', 'id', '1', 'status', 'PAID', 'hostile.order') r WHERE r = 'applied'"
expect ok $APP $dbb "SELECT 1/count(*) FROM idem_transition('orders', 'id', '1', 'status', 'PAID', 'hostile.order') r WHERE r = 'already'"
expect ok $APP $dbb "SELECT 1/count(*) FROM idem_classify_transition('hostile.order', 'PAID', 'CREATED') r WHERE r = 'stale'"
expect ok $APP $dbb "SELECT idem_guard('orders', 'status', 'hostile.order')"
expect ID002 $APP $dbb "UPDATE orders SET status = 'CREATED' WHERE id = 1"
expect ok $APP $dbb "UPDATE orders SET status = 'SHIPPED' WHERE id = 1"
expect ID002 $APP $dbb "UPDATE orders SET status = 'SHIPPED' WHERE id = 2"

echo "  $APP: storage and admin functions refused"
for t in idem.claims idem.claims_default idem.biz_types idem.tokens idem.machines idem.maintenance_runs; do
  expect 42501 $APP $dbb "SELECT count(*) FROM $t"
  expect 42501 $APP $dbb "DELETE FROM $t"
done
expect 42501 $APP $dbb "INSERT INTO idem.claims (expires_at, claimed_at, state, biz_type, key) VALUES (now() + interval '1 hour', now(), 'c', 'hostile.pay', 'forged')"
expect 42501 $APP $dbb "UPDATE idem.machines SET transitions = '{\"SHIPPED\":[\"CREATED\"]}'"
expect 42501 $APP $dbb "SELECT idem.key_hash('hostile.pay', 'p1')"
expect 42501 $APP $dbb "SELECT idem.random_token()"
expect 42501 $APP $dbb "CREATE TABLE idem.forged (x int)"
expect 42501 $APP $dbb "SELECT idem_forget('p1', 'hostile.pay')"
expect 42501 $APP $dbb "SELECT idem_configure('hostile.pay', '1 hour')"
expect 42501 $APP $dbb "SELECT idem_maintain()"
expect 42501 $APP $dbb "SELECT idem_define_machine('hostile.order', '{\"SHIPPED\":[\"CREATED\"]}')"
expect 42501 $APP $dbb "SELECT idem_schedule_maintenance()"
expect 42501 $APP $dbb "SELECT * FROM idem_stats"
expect 42501 $APP $dbb "SELECT * FROM idem_partitions"
echo "  $OTHER (no grants): nothing"
expect 42883 $OTHER $dbb "SELECT idem_claim('o1', 'hostile.pay')"   # no USAGE on idemapi: not even found
expect 42501 $OTHER $dbb "SELECT idemapi.idem_lookup('p1', 'hostile.pay')"
echo "  $OPS (member of $R_ADMIN): the operator's calls"
expect ok $OPS $dbb "SELECT idem_configure('hostile.pay', '2 days')"
expect ok $OPS $dbb "SELECT 1/count(*) FROM idem_forget('p1', 'hostile.pay') f WHERE f"
expect ok $OPS $dbb "SELECT idem_maintain()"
expect ok $OPS $dbb "SELECT count(*) FROM idem_stats; SELECT count(*) FROM idem_partitions"
expect ok $OPS $dbb "BEGIN; SELECT 1/count(*) FROM idem_claim('p1', 'hostile.pay') WHERE claimed; ROLLBACK"
expect 55000 $OPS $dbb "SELECT idem_schedule_maintenance()"   # pg_cron is not in this database
expect 42501 $OPS $dbb "SELECT count(*) FROM idem.claims"     # even operators go through the API

# A role that may update a guarded table but holds no idem grant: the guard
# fails closed (the trigger's check needs EXECUTE and schema USAGE).
expect ok $APP $dbb "GRANT SELECT, UPDATE ON orders TO $CLERK"
got=$(as $CLERK $dbb "UPDATE orders SET status = 'PAID' WHERE id = 2")
echo "  $CLERK (UPDATE on a guarded table, no idem grant): a legal UPDATE gets $got"
[ "$got" = 42501 ] && ok || bad "clerk's update through the guard: $got (expected 42501: the guard fails closed)"
psql_idem -q -d $dbb -c "GRANT $R_USER TO $CLERK"
expect ok $CLERK $dbb "UPDATE orders SET status = 'PAID' WHERE id = 2"
expect ID002 $CLERK $dbb "UPDATE orders SET status = 'CREATED' WHERE id = 2"

# ------------------------------------------------------------------ C
say "C. malicious objects on the caller's search_path"
# APP owns schema evil: tables named like idem's storage, functions and
# operators named like those idem's code uses, each recording its call. It
# puts evil (and its temp schema, for relations) before pg_catalog.
psql_idem -q -d $dbb -c "CREATE SCHEMA evil AUTHORIZATION $APP"
"$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$(cluster_dir)" -p "$IDEM_PORT" -U $APP -d $dbb <<'SQL'
CREATE TABLE evil.calls (what text, ran_as name, at timestamptz DEFAULT clock_timestamp());
GRANT ALL ON SCHEMA evil TO PUBLIC;
GRANT INSERT, SELECT ON evil.calls TO PUBLIC;
CREATE TABLE evil.claims (LIKE orders);  CREATE TABLE evil.machines (name text, transitions jsonb, reachable jsonb);
CREATE TABLE evil.tokens (x int);  CREATE TABLE evil.biz_types (biz_type text, ttl interval);
CREATE TABLE evil.pg_attribute (x int); CREATE TABLE evil.pg_trigger (x int); CREATE TABLE evil.pg_index (x int);
INSERT INTO evil.machines VALUES ('hostile.order', '{"SHIPPED":["CREATED"]}', '{"SHIPPED":["CREATED"],"CREATED":[]}');
CREATE FUNCTION evil.log(w text) RETURNS void LANGUAGE sql AS $$ INSERT INTO evil.calls (what, ran_as) VALUES (w, current_user) $$;
CREATE FUNCTION evil.idem_machine(name text, state text DEFAULT NULL) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN PERFORM evil.log('idem_machine'); RETURN '{"transitions":{"SHIPPED":["CREATED"]},"reachable":{"SHIPPED":["CREATED"],"CREATED":[]}}'; END $$;
CREATE FUNCTION evil.idem_classify_transition(m text, f text, t text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM evil.log('idem_classify_transition'); RETURN 'allowed'; END $$;
CREATE FUNCTION evil.check_name(w text, v text) RETURNS void LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.log('check_name'); END $$;
CREATE FUNCTION evil.random_token() RETURNS text LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.log('random_token'); RETURN 'predictable'; END $$;
CREATE FUNCTION evil.sha256(bytea) RETURNS bytea LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.log('sha256'); RETURN '\x00'; END $$;
CREATE FUNCTION evil.convert_to(text, name) RETURNS bytea LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.log('convert_to'); RETURN '\x00'; END $$;
CREATE FUNCTION evil.clock_timestamp() RETURNS timestamptz LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.log('clock_timestamp'); RETURN '2000-01-01'; END $$;
CREATE FUNCTION evil.format_type(oid, integer) RETURNS text LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.log('format_type'); RETURN 'text'; END $$;
CREATE FUNCTION evil.jsonb_typeof(jsonb) RETURNS text LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.log('jsonb_typeof'); RETURN 'object'; END $$;
CREATE FUNCTION evil.texteq(a text, b text) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.log('= (text,text)'); RETURN a OPERATOR(pg_catalog.=) b; END $$;
CREATE FUNCTION evil.textne(a text, b text) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.log('<> (text,text)'); RETURN a OPERATOR(pg_catalog.<>) b; END $$;
CREATE FUNCTION evil.byteaeq(a bytea, b bytea) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.log('= (bytea,bytea)'); RETURN true; END $$;
CREATE FUNCTION evil.jsonb_exists(a jsonb, b text) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.log('? (jsonb,text)'); RETURN true; END $$;
CREATE FUNCTION evil.tsgt(a timestamptz, b timestamptz) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.log('> (timestamptz)'); RETURN true; END $$;
CREATE FUNCTION evil.ivlt(a interval, b interval) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.log('< (interval)'); RETURN false; END $$;
CREATE OPERATOR evil.=  (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.texteq);
CREATE OPERATOR evil.<> (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.textne);
CREATE OPERATOR evil.=  (LEFTARG = bytea, RIGHTARG = bytea, FUNCTION = evil.byteaeq);
CREATE OPERATOR evil.?  (LEFTARG = jsonb, RIGHTARG = text, FUNCTION = evil.jsonb_exists);
CREATE OPERATOR evil.>  (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil.tsgt);
CREATE OPERATOR evil.<  (LEFTARG = interval, RIGHTARG = interval, FUNCTION = evil.ivlt);
CREATE TABLE evil_orders (id int PRIMARY KEY, status text);
INSERT INTO evil_orders VALUES (1, 'SHIPPED'), (2, 'CREATED');
SQL
# Each line: expected outcome, role, SQL run with evil first on the path
# (and temp tables shadowing idem's and the catalogs' names).
EVIL_PATH="SET search_path = evil, pg_catalog, public, idemapi;
  CREATE TEMP TABLE IF NOT EXISTS claims (x int); CREATE TEMP TABLE IF NOT EXISTS machines (x int);
  CREATE TEMP TABLE IF NOT EXISTS pg_attribute (x int); CREATE TEMP TABLE IF NOT EXISTS pg_trigger (x int);"
evil() { expect "$1" "$2" $dbb "$EVIL_PATH $3"; }
evil ok    $APP "BEGIN; SELECT idem_claim('e1', 'hostile.evil'); SELECT idem_complete('e1', 'hostile.evil', '{\"v\":1}'); COMMIT"
evil ok    $APP "SELECT 1/count(*) FROM idemapi.idem_claim('e1', 'hostile.evil') WHERE NOT claimed AND state OPERATOR(pg_catalog.=) 'completed'"
evil ok    $APP "SELECT idem_claim('e2', 'hostile.evil', lease => '1 minute'); SELECT idem_checkpoint('e2', 'hostile.evil', 'p'); SELECT idem_fail('e2', 'hostile.evil', '{}')"
evil ok    $APP "SELECT 1/count(*) FROM idem_lookup('e2', 'hostile.evil') WHERE state OPERATOR(pg_catalog.=) 'failed'"
evil ok    $APP "SELECT 1/count(*) FROM idem_consume_token(idem_issue_token('hostile.evil'), 'hostile.evil') t WHERE t"
evil ok    $APP "SELECT 1/(1 OPERATOR(pg_catalog.-) count(*)) FROM idem_consume_token('predictable', 'hostile.evil') t WHERE t"
evil ok    $APP "SELECT 1/count(*) FROM idem_transition('evil_orders', 'id', '1', 'status', 'CREATED', 'hostile.order') r WHERE r OPERATOR(pg_catalog.=) 'stale'"
evil ID002 $APP "SELECT idem_transition('evil_orders', 'id', '1', 'status', 'CANCELLED', 'hostile.order')"
evil ok    $APP "SELECT 1/count(*) FROM idem_transition('evil_orders', 'id', '2', 'status', 'PAID', 'hostile.order') r WHERE r OPERATOR(pg_catalog.=) 'applied'"
evil ok    $APP "SELECT idem_guard('evil_orders', 'status', 'hostile.order')"
evil ID002 $APP "UPDATE evil_orders SET status = 'CREATED' WHERE id = 1"
evil 22023 $APP "SELECT idemapi.idem_classify_transition('hostile.nosuch', 'A', 'B')"
evil ok    $APP "SELECT 1/count(*) FROM idemapi.idem_classify_transition('hostile.order', 'SHIPPED', 'CREATED') r WHERE r OPERATOR(pg_catalog.=) 'stale'"
evil ok    $OPS "SELECT idem_define_machine('hostile.evil', '{\"A\":[\"B\"]}')"
evil ok    $OPS "SELECT idem_maintain()"
evil ok    $OPS "SELECT idem_configure('hostile.evil', '1 hour')"
evil ok    $OPS "SELECT idem_forget('e1', 'hostile.evil')"
calls=$(psql_idem -d $dbb -At -c "SELECT coalesce(string_agg(DISTINCT what || ' as ' || ran_as, '; '), '') FROM evil.calls")
rows=$(psql_idem -d $dbb -At -c "SELECT (SELECT count(*) FROM evil.claims) + (SELECT count(*) FROM evil.tokens) + (SELECT count(*) FROM evil.biz_types) + (SELECT count(*) FROM evil.machines) - 1")
echo "  shadowing objects called: ${calls:-none}; rows written to evil tables: $rows"
[ -z "$calls" ] && ok || bad "idem called objects from the caller's search_path: $calls"
[ "$rows" = 0 ] && ok || bad "idem wrote $rows rows into the caller's look-alike tables"

echo
echo "privileges: $pass passed, $fail failed"
if [ $fail -gt 0 ]; then printf '  - %s\n' "${failures[@]}"; exit 1; fi
