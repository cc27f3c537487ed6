#!/usr/bin/env bash
# The portable edition's steps that tests/scenarios/editions.sh portable runs
# against its pg_tle server (or beside it), each in its own process:
#   bash tests/portable/steps.sh STEP [ARG...]
# STEP: gates, beside_native, environments, pooler, privileges, wraparound
# (each below, with its arguments).

# The portable edition's key locks (gate rows, docs/design.md §14) under
# load and against a hostile role (tests/portable/gates.py): a transaction
# of 100,000 claims while other roles connect to another database and claim
# there, eight sessions of 2,000 claims each with a business row per key, a
# LOGIN role with nothing granted that blocks, watches and forges, a gate
# restored from another cluster that names an xid this one hands out later
# (a plain-script pg_dump carries the gates), and what
# maintenance removes and keeps. The edition is installed through pg_tle by
# the databases' owner, who is not a superuser; the claims are made by
# another role without grants.
#
#   bash tests/portable/gates.sh [SOCKET_DIR [PORT]]     (tests/portable/lib.sh)
#
# GATES_BATCH sets the size of the one-transaction batch: by default 100,000
# on 15 (the number docs/design.md gives) and 20,000 on the other majors,
# still four times the lock-table entries that its control exhausts
# (gates.py), at a fifth of the CPU.
step_gates() {
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DB=portable_gates
OTHER_DB=portable_gates_other
OWNER=portable_gates_owner
APP=portable_gates_app
INTRUDER=portable_gates_intruder
work=$(mktemp -d /tmp/idem-portable-gates.XXXXXX)
trap 'pp_drop "$DB $OTHER_DB" "$APP $INTRUDER $OWNER"; rm -rf "$work"; pp_cleanup_dist' EXIT
pp_drop "$DB $OTHER_DB" "$APP $INTRUDER $OWNER"
pp_roles "$OWNER" "$APP" "$INTRUDER"
pp_tle_install "$DB" "$OWNER"
pp_tle_install "$OTHER_DB" "$OWNER"
timeout 1800 "$IDEM_PY" "$ROOT/tests/portable/gates.py" "$PORTABLE_HOST" "$PORTABLE_PORT" "$DB" "$OTHER_DB" \
  "$OWNER" "$APP" "$INTRUDER" --batch "${GATES_BATCH:-$([ "$PG_MAJOR" = 15 ] && echo 100000 || echo 20000)}" > "$work/gates.log" 2>&1 || true
cat "$work/gates.log"
fails=$((fails + $(grep -c '^FAIL: ' "$work/gates.log" || true)))
grep -q '^summary: ' "$work/gates.log" || fail "gates.py did not finish: $(tail -3 "$work/gates.log")"
finish "portable gates"
}

# The portable edition on a server whose shared_preload_libraries has the
# native idem, beside a database of the native edition (docs/portable.md,
# "Do not mix the editions in one database"): a private cluster of the
# suite's PostgreSQL of this major (where the native build is installed),
# port ${PORTABLE_NATIVE_PORT:-5554} (+100 per major above 15). The plain
# script is installed by a database owner who is not a superuser; then, in
# both databases, the same round trip: claim, duplicate in the claiming
# transaction, complete, duplicate after commit, a lease finished with its
# token and refused without it, lookups, forget, maintenance, and the
# library's settings (idem.default_ttl set in the session is obeyed; a bad
# value refused by the library when set). The answers must be the same in
# both databases. With NATIVE_EQUALITY_OUT=DIR, then also the native
# edition's answers to tests/portable/equality.sql and signatures.sql
# (DIR/NAME.native), in a database of their own on the server restarted
# without the library preloaded, which editions.sh portable compares with
# the portable edition's. Run by tests/scenarios/editions.sh portable (step 8).
step_beside_native() {
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/scenarios.sh"
source "$ROOT/tests/lib/cluster.sh"
[ -f "$("$PG_CONFIG" --pkglibdir)/idem.so" ] || { echo "FAILED: no native idem for PostgreSQL $PG_MAJOR in $("$PG_CONFIG" --pkglibdir)"; exit 1; }
work=$(mktemp -d /tmp/idem-portable-beside.XXXXXX)
trap 'pc_stop; rm -rf "$work"' EXIT
python3 "$ROOT/scripts/portable.py" --out "$work/dist" >/dev/null
chmod -R a+rX "$work"
pc_init "$(cluster_dir)/portable-beside-native" "${PORTABLE_NATIVE_PORT:-$(major_port 5554)}" "shared_preload_libraries = 'idem'"
pc_start
expect "the server preloads the native library" "$(pc_psql -d postgres -Atc "SHOW shared_preload_libraries")" "idem"
pc_psql -q -d postgres -c "CREATE ROLE beside_owner LOGIN NOSUPERUSER" -c "CREATE DATABASE beside_native" \
  -c "CREATE DATABASE beside_portable OWNER beside_owner"
pc_psql -q -d beside_native -c "CREATE EXTENSION idem" -c "GRANT USAGE ON SCHEMA idem TO beside_owner" >/dev/null
"$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$PC_DIR" -p "$PC_PORT" -U beside_owner -d beside_portable -f "$work/dist/idem_portable.sql" >/dev/null
expect "the portable edition installed beside it (no library in that database)" \
  "$(pc_psql -d beside_portable -Atc "SELECT idem_storage_path() || ' ' || (SELECT count(*) FROM pg_proc WHERE probin LIKE '%idem%')")" "sql 0"

round() { # db user
  "$PG_BIN/psql" -X -At -v ON_ERROR_STOP=0 -h "$PC_DIR" -p "$PC_PORT" -U "$2" -d "$1" 2>&1 <<'SQL'
\set VERBOSITY sqlstate
BEGIN;
SELECT 'claim ' || claimed || ' ' || state FROM idem_claim('k1', 'beside');
SELECT 'own ' || claimed || ' ' || state FROM idem_claim('k1', 'beside');
SELECT 'complete' FROM idem_complete('k1', 'beside', '{"n": 1}');
COMMIT;
SELECT 'duplicate ' || claimed || ' ' || state || ' ' || result FROM idem_claim('k1', 'beside');
SELECT result->>'lease_token' AS token FROM idem_claim('k2', 'beside', lease => '1 hour') \gset
SELECT 'lookup ' || state FROM idem_lookup('k2', 'beside');
SELECT 'without token' FROM idem_complete('k2', 'beside', '{}');
SELECT 'with token' FROM idem_complete('k2', 'beside', '{"n": 2}', :'token');
SELECT 'lookup ' || state || ' ' || result FROM idem_lookup('k2', 'beside');
SELECT 'absent ' || state FROM idem_lookup('k3', 'beside');
SELECT 'forget ' || idem_forget('k1', 'beside');
SET idem.default_ttl = '2 hours';
SELECT 'ttl ' || (expires_at - first_claimed_at) FROM idem_claim('k4', 'beside');
SET idem.default_ttl = 'banana';
RESET idem.default_ttl;
SELECT 'maintain ' || (idem_maintain() ? 'partitions_created');
SQL
}
pc_psql -q -d beside_native -c "GRANT EXECUTE ON FUNCTION idem_maintain(), idem_forget(text, text) TO beside_owner" >/dev/null
native=$(round beside_native postgres)
portable=$(round beside_portable beside_owner)
echo "$portable" | sed 's/^/    /'
expect "the portable database answers as the native one, on a server that preloads idem" "$portable" "$native"
expect "and the round trip is what it should be" "$(echo "$portable" | grep -c '^\(claim true new\|own false in_progress\|complete\|duplicate false completed {"n": 1}\|lookup in_progress\|ERROR:  ID003\|with token\|lookup completed {"n": 2}\|absent absent\|forget true\|ttl 02:00:00\|ERROR:  22023\|maintain true\)$')" 13
# The native side of editions.sh portable's comparison (step 4), on this
# server restarted without the library preloaded: its counters off, as
# the portable edition's always are.
if [ -n "${NATIVE_EQUALITY_OUT:-}" ]; then
  echo "shared_preload_libraries = ''" >> "$PC_DIR/data/postgresql.conf"
  pc_restart
  pc_psql -q -d postgres -c "CREATE DATABASE native_equality"
  pc_psql -q -d native_equality -c "CREATE EXTENSION idem"
  for f in equality signatures; do
    pc_psql -q -d native_equality -At -f "$ROOT/tests/portable/$f.sql" > "$NATIVE_EQUALITY_OUT/$f.native"
  done
fi
finish "portable beside native"
}

# Session settings against the portable edition, as
# tests/scenarios/hardening.sh environments runs the native one: the round trip
# (claim, complete, fail, lookup, leases and checkpoints, forget, TTLs from
# arguments, configured types and idem.default_ttl, tokens, transitions and
# guards) and every view, tests/portable/environments.sql, first under the
# server's defaults and then in each environment below, each in a new
# database where the edition is installed through pg_tle by a role that is
# not a superuser; every output must equal the default run's. The views are
# also compared within each run: read under the environment's settings,
# then under the defaults, in one transaction.
#
#   name      DateStyle      TimeZone            abbreviations IntervalStyle     isolation (*)    other settings
#   kolkata   Postgres, MDY  Asia/Kolkata        Default       sql_standard      read committed   lc_time C
#   sydney    SQL, DMY       Australia/Sydney    Australia     iso_8601          repeatable read  bytea_output escape, extra_float_digits -15
#   chatham   German, DMY    Pacific/Chatham     Default       postgres          serializable     standard_conforming_strings off, transform_null_equals on
#   posix     ISO, DMY       IST-1 (POSIX)       Australia     postgres_verbose  read committed   plpgsql.extra_errors all, lc_numeric POSIX, extra_float_digits 3
#   kiritimati ISO, YMD      Pacific/Kiritimati  Default       iso_8601          read committed   plpgsql.extra_warnings all, lc_monetary C
#
# (*) default_transaction_isolation. The round trip writes in READ
# COMMITTED transactions; a claim, its duplicate and its completion in a
# transaction of the session's default level are checked too (every level
# is supported). Every environment also has
# search_path = public, idem_lookalike: a schema with tables and functions
# named like the edition's own, which its SQL must never reach.
#
#   bash tests/portable/environments.sh [SOCKET_DIR [PORT]]     (tests/portable/lib.sh)
#
# PORTABLE_BREAK=interval_text runs the negative control: idem.interval_text
# loses its pinned IntervalStyle, so idem_health's texts follow the
# session's; the run must then fail.
step_environments() {
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
P=portable_env
ADMIN=${P}_admin
environments=(
  "default|||||||"
  "kolkata|Postgres, MDY|Asia/Kolkata|Default|sql_standard|read committed|-c lc_time=C"
  "sydney|SQL, DMY|Australia/Sydney|Australia|iso_8601|repeatable read|-c bytea_output=escape -c extra_float_digits=-15"
  "chatham|German, DMY|Pacific/Chatham|Default|postgres|serializable|-c standard_conforming_strings=off -c transform_null_equals=on"
  "posix|ISO, DMY|IST-1|Australia|postgres_verbose|read committed|-c plpgsql.extra_errors=all -c lc_numeric=POSIX -c extra_float_digits=3"
  "kiritimati|ISO, YMD|Pacific/Kiritimati|Default|iso_8601|read committed|-c plpgsql.extra_warnings=all -c client_min_messages=error -c lc_monetary=C"
)
DBS=$(for e in "${environments[@]}"; do printf '%s_%s ' $P "${e%%|*}"; done)
out=$(mktemp -d /tmp/idem-portable-env.XXXXXX)
trap 'pp_drop "$DBS" "$ADMIN"; rm -rf "$out"; pp_cleanup_dist' EXIT
pp_drop "$DBS" "$ADMIN"
pp_roles "$ADMIN"
esc() { printf '%s' "$1" | sed 's/ /\\ /g'; }

for env in "${environments[@]}"; do
  IFS='|' read -r name datestyle tz abbrevs intervalstyle isolation other <<<"$env"
  db=${P}_$name
  pp_tle_install "$db" "$ADMIN"
  pp_psql "$ADMIN" "$db" >/dev/null <<'SQL'
CREATE SCHEMA idem_lookalike;
CREATE TABLE idem_lookalike.claims (LIKE idem.claims);
CREATE TABLE idem_lookalike.biz_types (biz_type text, ttl interval, owner regrole);
INSERT INTO idem_lookalike.biz_types VALUES ('env.pay', '1 second', NULL);
CREATE TABLE idem_lookalike.type_classes (biz_type text, class int);
CREATE FUNCTION idem_lookalike.key_hash(text, text) RETURNS bigint LANGUAGE sql AS 'SELECT 0::bigint';
CREATE FUNCTION idem_lookalike.ttl_class(interval) RETURNS int LANGUAGE sql AS 'SELECT 0';
CREATE FUNCTION idem_lookalike.check_name(text, text) RETURNS void LANGUAGE sql AS 'SELECT';
CREATE FUNCTION idem_lookalike.interval_text(interval) RETURNS text LANGUAGE sql AS 'SELECT ''lookalike''';
GRANT USAGE ON SCHEMA idem_lookalike TO PUBLIC;
SQL
  if [ -n "${PORTABLE_BREAK:-}" ] && [ "$name" != default ]; then
    [ "$PORTABLE_BREAK" = interval_text ] || { echo "PORTABLE_BREAK=$PORTABLE_BREAK: unknown" >&2; exit 2; }
    pp_psql "$ADMIN" "$db" -c "ALTER FUNCTION idem.interval_text(interval) RESET IntervalStyle" >/dev/null
  fi
  opts=
  if [ "$name" != default ]; then
    opts="-c DateStyle=$(esc "$datestyle") -c TimeZone=$(esc "$tz") -c timezone_abbreviations=$abbrevs"
    opts+=" -c IntervalStyle=$intervalstyle -c default_transaction_isolation=$(esc "$isolation")"
    opts+=" -c search_path=public,idem_lookalike $other"
  fi
  PGOPTIONS="$opts" pp_psql "$ADMIN" "$db" -At -F ' | ' -f "$ROOT/tests/portable/environments.sql" > "$out/$name.out" 2>&1 ||
    fail "$name: environments.sql stopped: $(tail -3 "$out/$name.out")"
  # The settings took effect (the server took them from PGOPTIONS).
  got=$(PGOPTIONS="$opts" pp_psql "$ADMIN" "$db" -At -c "SELECT current_setting('DateStyle') || ' / ' || current_setting('TimeZone') || ' / ' || current_setting('IntervalStyle') || ' / ' || current_setting('transaction_isolation')")
  if [ "$name" = default ]; then
    echo "default: the server's settings: $got"
    grep -q . "$out/default.out" || fail "default: no output"
    continue
  fi
  expect "$name: the session's settings" "$got" "$datestyle / $tz / $intervalstyle / $isolation"
  expect "$name ($datestyle; $tz; $abbrevs; $intervalstyle; $isolation;$(echo " $other" | sed 's/ -c /; /g; s/^; //')): every answer equals the default run's" \
    "$(diff "$out/default.out" "$out/$name.out" | sed -n 1,20p)" ""
  # A claim, its duplicate and its completion in a transaction of the
  # session's default level.
  expect "$name: a claim under default_transaction_isolation = $isolation" \
    "$(PGOPTIONS="$opts" pp_psql "$ADMIN" "$db" -At -c "BEGIN" -c "SELECT (SELECT claimed FROM idem_claim('iso-$name', 'env.iso'))
         || ' ' || (SELECT state FROM idem_claim('iso-$name', 'env.iso')) || ' ' || current_setting('transaction_isolation')" \
       -c "SELECT idem_complete('iso-$name', 'env.iso', '{}')" -c "COMMIT" \
       -c "SELECT state FROM idem_lookup('iso-$name', 'env.iso')" 2>&1 | grep -v '^\(BEGIN\|COMMIT\|\)$' | tr '\n' ' ')" \
    "true in_progress $isolation completed "
done
echo "the default run's output ($(wc -l < "$out/default.out") lines):"
sed 's/^/  /' "$out/default.out"
finish "portable environments"
}

# The portable edition behind PgBouncer (Debian's, transaction pooling), as
# tests/scenarios/clients.sh pgbouncer runs the native one: the edition installed
# through pg_tle by a role that is not a superuser, clients that are not
# superusers either, and tests/portable/pooler.py's checks (the same keys
# claimed at the same moment with business rows counted, duplicates
# answered with the first outcome, the key lock gone when the transaction
# ends, for the next client of a shared server session too, and a lease
# that only its token finishes).
#
#   bash tests/portable/pooler.sh [SOCKET_DIR [PORT]]     (tests/portable/lib.sh)
#
# PgBouncer listens on 127.0.0.1:$POOLER_PORT (default PORT + 1000).
# PORTABLE_BREAK=no_lock runs the negative control (the key lock taken
# out): the run must then fail.
step_pooler() {
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
POOLER_PORT="${POOLER_PORT:-$((PORTABLE_PORT + 1000))}"
DB=portable_pooler
ADMIN=portable_pooler_admin
APP=portable_pooler_app
work=$(mktemp -d /tmp/idem-portable-pooler.XXXXXX)
chown postgres:postgres "$work"

stop_all() {
  local p
  p=$(cat "$work/pgbouncer.pid" 2>/dev/null) || p=
  # Only the PgBouncer this script started (its pid file names it).
  if [ -n "$p" ] && grep -q "pgbouncer.*$work/pgbouncer.ini" <<<"$(tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null)"; then
    kill -TERM "$p"
    for _ in $(seq 1 250); do kill -0 "$p" 2>/dev/null || break; sleep 0.02; done
  fi
  pp_drop "$DB" "$APP $ADMIN"
  rm -rf "$work"
  pp_cleanup_dist
}
trap stop_all EXIT

pp_roles "$ADMIN" "$APP"
pp_tle_install "$DB" "$ADMIN"
pp_psql "$ADMIN" "$DB" -c "CREATE TABLE pooler_payments (id bigserial PRIMARY KEY, key text NOT NULL, paid_by int NOT NULL)" \
  -c "GRANT ALL ON pooler_payments, pooler_payments_id_seq TO $APP" -c "GRANT USAGE ON SCHEMA public TO $APP"

printf '"postgres" ""\n"%s" ""\n' "$APP" > "$work/userlist.txt"
cat > "$work/pgbouncer.ini" <<INI
[databases]
pp1 = host=$PORTABLE_HOST port=$PORTABLE_PORT dbname=$DB pool_size=1
pp3 = host=$PORTABLE_HOST port=$PORTABLE_PORT dbname=$DB pool_size=3
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $POOLER_PORT
unix_socket_dir =
auth_type = trust
auth_file = $work/userlist.txt
pool_mode = transaction
max_client_conn = 100
admin_users = postgres
ignore_startup_parameters = extra_float_digits
log_connections = 0
log_disconnections = 0
logfile = $work/pgbouncer.log
pidfile = $work/pgbouncer.pid
INI
chown postgres:postgres "$work"/*
as_postgres /usr/sbin/pgbouncer -d "$work/pgbouncer.ini"
ready=
for _ in $(seq 1 250); do
  "$PG_BIN/psql" -X -h 127.0.0.1 -p "$POOLER_PORT" -U postgres -d pgbouncer -Atc "SHOW VERSION" >/dev/null 2>&1 && ready=1 && break
  sleep 0.02
done
[ -n "$ready" ] || { fail "PgBouncer did not start on 127.0.0.1:$POOLER_PORT: $(tail -3 "$work/pgbouncer.log")"; finish "portable pooler"; exit 1; }
echo "$(/usr/sbin/pgbouncer --version | sed -n 1p), pool_mode = transaction, on 127.0.0.1:$POOLER_PORT, in front of $PORTABLE_HOST:$PORTABLE_PORT"

timeout 600 "$IDEM_PY" "$ROOT/tests/portable/pooler.py" "$POOLER_PORT" "$PORTABLE_HOST" "$PORTABLE_PORT" "$DB" "$APP" \
  ${PORTABLE_BREAK:+--break "$PORTABLE_BREAK"} > "$work/pooler.log" 2>&1 || true
cat "$work/pooler.log"
fails=$((fails + $(grep -c '^FAIL: ' "$work/pooler.log" || true)))
grep -q '^summary: ' "$work/pooler.log" || fail "pooler.py did not finish: $(tail -3 "$work/pooler.log")"
xacts=$("$PG_BIN/psql" -X -h 127.0.0.1 -p "$POOLER_PORT" -U postgres -d pgbouncer -Atc "SHOW STATS" -F '|' \
          | awk -F'|' '$1 == "pp3" || $1 == "pp1" {n += $2} END {print n + 0}')
expect "the clients' transactions went through PgBouncer" "$([ "$xacts" -gt 300 ] && echo yes || echo "no ($xacts)")" yes
finish "portable pooler"
}

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
step_privileges() {
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
}

# The portable edition after transaction-id wraparound, on a throw-away
# cluster of the pg_tle tree (tests/portable/tree.sh) aged on purpose: the
# counterpart of tests/scenarios/hardening.sh wraparound.
#
# SQL shows only a row's raw xmin, which a frozen row keeps; after the
# 32-bit xid counter wraps, a new transaction (or subtransaction) can be
# given that very number. Judged from the raw xmin, a frozen claim then read
# as this transaction's own (another worker's lease completed without its
# token, a duplicate answered in_progress, an expired claim never claimed
# anew), and a raw xmin that maps past the next xid made pg_xact_status
# fail ("transaction ID is in the future").
#
# Here: claims are made in one transaction T (a pending one, a leased one,
# one with a 1-second TTL, one with a 1-second lease) and in the next one, T+1 (a pending one and a
# 1-second one); every database is frozen, the cluster is stopped and
# pg_resetwal moves the xid counter one epoch on, to T itself (what ~4
# billion transactions would do). The next transaction is checked to have
# T's 32-bit id (else the test proves nothing and fails), and in it:
# duplicates read completed, idem_complete and idem_checkpoint of the
# leased claim without its token are refused with ID003, the lookup reads
# the lease in_progress, the expired claims are claimed anew (a business
# row written for each), also from a subtransaction whose xid is T+1; the
# rows this transaction writes are its own (the lease run out is taken
# over and completed without the token; a new claim reads in_progress to a
# duplicate and is completed); nothing else was written. Afterwards the lease holder still completes
# with its token. Runs on its own (bash tests/portable/wraparound.sh) and
# from tests/scenarios/editions.sh portable.
# The session under test also sets every setting the edition's first 0.4.0
# builds read to tell their own rows (idem.xact_claimed_since_us at 0:
# "every claim since 2000 is mine"; idem.xact_rewritten naming every stored
# version): they must change nothing, and no stored claim may differ after
# the round from before it.
step_wraparound() {
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/scenarios.sh"
source "$ROOT/tests/lib/cluster.sh"
port="${PORTABLE_WRAP_PORT:-$(major_port 5552)}"  # (the majors run side by side)
TLE_CONFIG=$(bash "$ROOT/tests/portable/tree.sh")
TLE_BIN=$("$TLE_CONFIG" --bindir)
dir="$(cluster_dir)/portable-wraparound"
work="$IDEM_TARGET/test-out/portable-wraparound"
stop() { pc_server_stop "$dir"; }
trap 'stop; rm -rf "$dir"' EXIT
stop
rm -rf "$dir" "$work"
mkdir -p "$dir" "$work"
chown postgres:postgres "$dir"
chmod 700 "$dir"
python3 "$ROOT/scripts/portable.py" --out "$work/dist" >/dev/null
chmod -R a+rX "$work"
# Nothing may take an xid behind the test's back between the reset and the
# transaction under test.
pc_initdb "$TLE_BIN" "$dir" "$port" "autovacuum = off"
start() { pc_server_start "$dir"; }
sql() { "$TLE_BIN/psql" -X -At -v ON_ERROR_STOP=1 -h "$dir" -p "$port" -U postgres -d wrap "$@"; }
start
"$TLE_BIN/psql" -X -q -h "$dir" -p "$port" -U postgres -d postgres -c "CREATE DATABASE wrap"
sql -q -f "$work/dist/idem_portable.sql" >/dev/null
sql -q -c "CREATE TABLE payments (key text PRIMARY KEY)"
read -r t token < <(sql -q -F ' ' <<'SQL'
BEGIN;
SELECT claimed FROM idem_claim('pending', 'wrap') \g /dev/null
SELECT claimed FROM idem_claim('expired', 'wrap', ttl => '1 second') \g /dev/null
SELECT result->>'lease_token' AS token FROM idem_claim('leased', 'wrap', lease => '1 hour') \gset
SELECT claimed FROM idem_claim('short_lease', 'wrap', lease => '1 second') \g /dev/null
SELECT xmin, :'token' FROM idem.claims WHERE biz_type = 'wrap' AND key = 'pending';
COMMIT;
SQL
)
t_next=$(sql -q <<'SQL'
BEGIN;
SELECT claimed FROM idem_claim('later', 'wrap') \g /dev/null
SELECT claimed FROM idem_claim('later_expired', 'wrap', ttl => '1 second') \g /dev/null
SELECT xmin FROM idem.claims WHERE biz_type = 'wrap' AND key = 'later';
COMMIT;
SQL
)
echo "claims made by transactions $t and $t_next"
expect "the second claims' transaction is the next one" "$t_next" "$((t + 1))"
# The 1-second claims must have expired before the round (a state waited
# for: nothing below depends on how long anything takes).
until [ "$(sql -c "SELECT bool_and(clock_timestamp() > expires_at) FROM idem.claims WHERE biz_type = 'wrap' AND key IN ('expired', 'later_expired')")" = t ] &&
      [ "$(sql -c "SELECT clock_timestamp() > idem.lease_until(result) FROM idem.claims WHERE biz_type = 'wrap' AND key = 'short_lease'")" = t ]; do
  sleep 0.2
done

# Every row frozen, then the counter moved one epoch on, to T.
"$TLE_BIN/vacuumdb" -h "$dir" -p "$port" -U postgres --all --freeze -q
sql -c "CHECKPOINT" >/dev/null
pc_ctl "$dir" -m fast -w stop >/dev/null
as_postgres "$TLE_BIN/pg_resetwal" -e 1 -x "$t" -D "$dir/data" >/dev/null
start

# The transaction whose id is T again. Every check runs in a savepoint
# rolled back after it, so that an error ends only its own check; the
# first write in a savepoint gives it the next xid: T+1, the second
# claims' raw xmin, then T+2, ...
stored="SELECT md5(string_agg(key || ' ' || state::text || ' ' || coalesce(result::text, '') || ' ' || expires_at, ',' ORDER BY key))
        FROM idem.claims WHERE biz_type = 'wrap'"
stored_before=$(sql -c "$stored")
out=$(sql <<'SQL' 2>&1
\set ON_ERROR_STOP 0
\set VERBOSITY sqlstate
SELECT set_config('idem.xact_claimed_since_us', '0', false) IS NOT NULL AS forged \g /dev/null
SELECT set_config('idem.xact_rewritten', string_agg(tableoid::oid || ':' || ctid, ' '), false) IS NOT NULL AS forged
  FROM idem.claims \g /dev/null
BEGIN;
SELECT 'xid=' || (txid_current() % 4294967296);
SAVEPOINT s;
SELECT 'duplicate=' || state FROM idem_claim('pending', 'wrap');
ROLLBACK TO s;
SELECT 'lookup=' || state FROM idem_lookup('leased', 'wrap');
ROLLBACK TO s;
SELECT 'expired_before=' || bool_and(expires_at < statement_timestamp()) FROM idem.claims WHERE biz_type = 'wrap' AND key IN ('expired', 'later_expired');
WITH c AS (SELECT claimed FROM idem_claim('later_expired', 'wrap')),
     w AS (INSERT INTO payments SELECT 'later_expired' FROM c WHERE claimed)
SELECT 'later_expired_claimed=' || claimed FROM c;
SELECT 'subxact_xid=' || xmin FROM idem.claims WHERE biz_type = 'wrap' AND key = 'later_expired' AND expires_at > statement_timestamp();
SELECT 'later_duplicate=' || state FROM idem_claim('later', 'wrap');
SELECT 'later_lookup=' || state FROM idem_lookup('later', 'wrap');
ROLLBACK TO s;
WITH c AS (SELECT claimed FROM idem_claim('expired', 'wrap')),
     w AS (INSERT INTO payments SELECT 'expired' FROM c WHERE claimed)
SELECT 'expired_claimed=' || claimed FROM c;
SELECT 'payments=' || count(*) FROM payments;
ROLLBACK TO s;
SELECT 'complete_without_token=done' FROM idem_complete('leased', 'wrap', '{"forged": true}');
ROLLBACK TO s;
SELECT 'checkpoint_without_token=done' FROM idem_checkpoint('leased', 'wrap', 'forged');
ROLLBACK TO s;
SELECT 'fail_without_token=done' FROM idem_fail('leased', 'wrap', '{"forged": true}');
ROLLBACK TO s;
SELECT 'takeover=' || claimed FROM idem_claim('short_lease', 'wrap');
SELECT 'takeover_completed=done' FROM idem_complete('short_lease', 'wrap', '{"by": "taker"}');
SELECT 'takeover_after=' || state FROM idem_lookup('short_lease', 'wrap');
ROLLBACK TO s;
SELECT 'fresh=' || claimed FROM idem_claim('fresh', 'wrap');
SELECT 'fresh_duplicate=' || state FROM idem_claim('fresh', 'wrap');
SELECT 'fresh_completed=done' FROM idem_complete('fresh', 'wrap', '{}');
ROLLBACK TO s;
SELECT 'rows=' || count(*) || ',' || count(*) FILTER (WHERE state = 'l') || ',' || count(*) FILTER (WHERE state = 'p') FROM idem.claims WHERE biz_type = 'wrap';
SELECT 'payments_after=' || count(*) FROM payments;
COMMIT;
SQL
)
echo "$out" | sed 's/^/    /'
echo "$out" > "$work/round.log"
expect "the transaction under test has the claims' 32-bit xid" "$(echo "$out" | grep '^xid=')" "xid=$t"
expect "a duplicate of the committed claim" "$(echo "$out" | grep '^duplicate=')" "duplicate=completed"
expect "the lease as others see it" "$(echo "$out" | grep '^lookup=')" "lookup=in_progress"
expect "the 1-second claims have expired (a precondition)" "$(echo "$out" | grep '^expired_before=')" "expired_before=true"
expect "an expired claim whose raw xmin lies past the next xid is claimed anew" \
  "$(echo "$out" | grep '^later_expired_claimed=')" "later_expired_claimed=true"
expect "that claim's subtransaction has the second claims' 32-bit xid" \
  "$(echo "$out" | grep '^subxact_xid=')" "subxact_xid=$t_next"
expect "a duplicate of a claim whose raw xmin is this subtransaction's" \
  "$(echo "$out" | grep '^later_duplicate=')" "later_duplicate=completed"
expect "its lookup" "$(echo "$out" | grep '^later_lookup=')" "later_lookup=completed"
expect "an expired claim whose raw xmin is this transaction's is claimed anew" \
  "$(echo "$out" | grep '^expired_claimed=')" "expired_claimed=true"
expect "one business row per expired claim claimed anew" "$(echo "$out" | grep '^payments=')" "payments=1"
expect "idem_complete, idem_checkpoint and idem_fail without the lease token refused (ID003)" \
  "$(echo "$out" | grep -c '^ERROR:  ID003')" "3"
expect "nothing finished without the token" "$(echo "$out" | grep -c '_without_token=done')" "0"
expect "no other error" "$(echo "$out" | grep '^ERROR' | grep -v '^ERROR:  ID003' || true)" ""
expect "a lease run out is taken over" "$(echo "$out" | grep '^takeover=')" "takeover=true"
expect "the transaction that took it over completes it without the token (its own row)" \
  "$(echo "$out" | grep -c '^takeover_completed=done')" "1"
expect "completed" "$(echo "$out" | grep '^takeover_after=')" "takeover_after=completed"
expect "a new claim" "$(echo "$out" | grep '^fresh=')" "fresh=true"
expect "its duplicate in the claiming transaction" "$(echo "$out" | grep '^fresh_duplicate=')" "fresh_duplicate=in_progress"
expect "the claiming transaction completes it" "$(echo "$out" | grep -c '^fresh_completed=done')" "1"
expect "the six claims still there, the leases unchanged, four pending" "$(echo "$out" | grep '^rows=')" "rows=6,2,4"
expect "no business row kept" "$(echo "$out" | grep '^payments_after=')" "payments_after=0"

expect "no stored claim changed in the round" "$(sql -c "$stored")" "$stored_before"

# After the wrap, the lease's holder still finishes it with its token, and
# new claims work.
sql -q -c "SELECT idem_complete('leased', 'wrap', '{\"done\": true}', lease_token => '$token')"
expect "the lease holder completes with its token" "$(sql -c "SELECT state FROM idem_lookup('leased', 'wrap')")" "completed"
expect "a new claim after the wrap" "$(sql -c "SELECT claimed FROM idem_claim('after', 'wrap')")" "t"
finish "portable wraparound"
}

case "${1:-}" in
gates|beside_native|environments|pooler|privileges|wraparound) step=$1; shift; "step_$step" "$@" ;;
*) echo "usage: bash tests/portable/steps.sh gates|beside_native|environments|pooler|privileges|wraparound [ARG...]" >&2; exit 2 ;;
esac
