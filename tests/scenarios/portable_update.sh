#!/usr/bin/env bash
# The portable edition's update path (docs/portable.md, "Updates"):
# scripts/portable.py turns each sql/idem--A--B.sql from the first portable
# version on into a pg_tle update path (dist/idem_pg_tle_update.sql) and a
# plain update script (dist/idem_portable--A--B.sql), with the portable
# bodies in place of the C functions the native update restates.
#
# No such update ships yet (0.4.0 is the first portable version), so this
# test writes a synthetic 0.4.1 into a copy of the tree: the version bumped,
# a column and its comment added to idem.biz_types, a new API function, a C
# function restated with a changed portable body (idem_storage_path answers
# 'sql (0.4.1)'), and a portable-only change (portable/updates/: a helper's
# comment), made both in the update file and in the copy's install scripts.
# Then, on the private pg_tle server of tests/portable/tree.sh:
#   - a live 0.4.0 database (pg_tle: CREATE EXTENSION; plain script) with a
#     completed claim and its business row, a failure and a running lease
#     is updated (pg_tle: idem_pg_tle_update.sql, then ALTER EXTENSION idem
#     UPDATE; plain: idem_portable--0.4.0--0.4.1.sql);
#   - the updated database holds 0.4.1 (version, column, function, body,
#     comment) and its schema equals a fresh 0.4.1 install's, the claims
#     still answer (a duplicate replays, the lease token from before the
#     update finishes the lease), new claims work;
#   - the pg_tle registration file runs twice; the plain update refuses a
#     database at another version (55000).
# PostgreSQL 15 only: the pg_tle tree is Debian 12's PostgreSQL 15.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/cluster.sh"
source "$ROOT/tests/lib/assert.sh"
if [ "$PG_MAJOR" != 15 ]; then
  echo "skipped: the portable edition's update path is tested on PostgreSQL 15 (this run is $PG_MAJOR)"
  exit 0
fi
PORT=5551
TLE_CONFIG=$(bash "$ROOT/tests/portable/tree.sh")
TLE_BIN=$("$TLE_CONFIG" --bindir)
base="$IDEM_TARGET/portable_update"
# (under /tmp when the postgres user cannot reach the checkout, as
# scripts/lib.sh does for the suite's cluster)
mkdir -p "$IDEM_TARGET"
sudo -u postgres test -x "$IDEM_TARGET" 2>/dev/null || base="/tmp/idem-portable_update-$(echo "$ROOT" | md5sum | cut -c1-8)"
out="$base/out"
dir="$base/cluster"
stop() { pc_server_stop "$dir"; }
trap stop EXIT
stop
rm -rf "$base"
mkdir -p "$dir" "$out"
chown postgres:postgres "$dir"
chmod 755 "$base" "$dir"

# The shipped tree (0.4.0) and the synthetic 0.4.1.
python3 "$ROOT/scripts/portable.py" --out "$out/dist_old"
old=$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -1)
expect "the shipped version is the first portable one" "$old" 0.4.0
tree="$out/tree"
mkdir -p "$tree"
cp -r "$ROOT/sql" "$ROOT/portable" "$ROOT/Cargo.toml" "$ROOT/idem.control" "$tree/"
sed -i '0,/^version = "0.4.0"/s//version = "0.4.1"/' "$tree/Cargo.toml"
# The change as a fresh 0.4.1 install makes it ...
cat >> "$tree/sql/storage.sql" <<'SQL'

ALTER TABLE idem.biz_types ADD COLUMN note text;
COMMENT ON COLUMN idem.biz_types.note IS 'A note on the business type (synthetic 0.4.1).';
SQL
cat >> "$tree/sql/claim.sql" <<'SQL'

CREATE FUNCTION idem_note(biz_type text) RETURNS text
    STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    LANGUAGE sql AS $fn$ SELECT note FROM idem.biz_types WHERE biz_types.biz_type = idem_note.biz_type $fn$;
COMMENT ON FUNCTION idem_note(text) IS 'The note of a business type (synthetic 0.4.1).';
SQL
sed -i "s/^    SELECT 'sql'::text\$/    SELECT 'sql (0.4.1)'::text/" "$tree/portable/claim.sql"
grep -q "'sql (0.4.1)'" "$tree/portable/claim.sql" || fail "the synthetic body change did not apply"
sed -i "s/^COMMENT ON FUNCTION idem.caller_role() IS .*/COMMENT ON FUNCTION idem.caller_role() IS 'Whose business types a call may use (synthetic 0.4.1).';/" "$tree/portable/claim.sql"
# ... and as the update makes it: the native update restates the C
# function (portable.py gives it the new portable body), the portable-only
# change goes to portable/updates/.
cat > "$tree/sql/idem--0.4.0--0.4.1.sql" <<'SQL'
\echo Use "ALTER EXTENSION idem UPDATE TO '0.4.1'" to load this file. \quit
ALTER TABLE idem.biz_types ADD COLUMN note text;
COMMENT ON COLUMN idem.biz_types.note IS 'A note on the business type (synthetic 0.4.1).';
CREATE FUNCTION idem_note(biz_type text) RETURNS text
    STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    LANGUAGE sql AS $fn$ SELECT note FROM idem.biz_types WHERE biz_types.biz_type = idem_note.biz_type $fn$;
COMMENT ON FUNCTION idem_note(text) IS 'The note of a business type (synthetic 0.4.1).';
CREATE OR REPLACE FUNCTION idem_storage_path() RETURNS text
    VOLATILE PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_storage_path';
SQL
mkdir -p "$tree/portable/updates"
cat > "$tree/portable/updates/idem--0.4.0--0.4.1.sql" <<'SQL'
COMMENT ON FUNCTION idem.caller_role() IS 'Whose business types a call may use (synthetic 0.4.1).';
SQL
python3 "$ROOT/scripts/portable.py" --root "$tree" --out "$out/dist_new"
expect "the generator wrote the plain update" "$(ls "$out/dist_new" | grep -c '^idem_portable--0.4.0--0.4.1.sql$')" 1
expect "the pg_tle file registers the update path" \
  "$(grep -c "pgtle.install_update_path('idem', '0.4.0', '0.4.1'" "$out/dist_new/idem_pg_tle_update.sql")" 1
expect "no C function is left in the updates" \
  "$(cat "$out/dist_new/idem_pg_tle_update.sql" "$out/dist_new/idem_portable--0.4.0--0.4.1.sql" | grep -c "MODULE_PATHNAME" || true)" 0
# A restated C function without a portable body is refused.
cp -r "$tree" "$out/tree_bad"
printf "CREATE OR REPLACE FUNCTION idem.nothing() RETURNS int LANGUAGE c AS 'MODULE_PATHNAME', 'idem_nothing';\n" \
  >> "$out/tree_bad/sql/idem--0.4.0--0.4.1.sql"
if python3 "$ROOT/scripts/portable.py" --root "$out/tree_bad" --out "$out/dist_bad" 2> "$out/bad.err"; then
  fail "the generator accepted an update's C function without a portable body"
else
  expect "the generator refuses an update's C function without a body" \
    "$(grep -c "sql/idem--0.4.0--0.4.1.sql: no portable body for C function idem_nothing" "$out/bad.err")" 1
fi
chmod -R a+rX "$out"

pc_initdb "$TLE_BIN" "$dir" "$PORT" \
  "max_connections = 30" \
  "shared_preload_libraries = 'pg_tle'"
pc_server_start "$dir"
psql_as() { local role=$1 db=$2; shift 2; "$TLE_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$dir" -p $PORT -U "$role" -d "$db" "$@"; }
psql_as postgres postgres -c "CREATE ROLE tle_admin LOGIN NOSUPERUSER" -c "CREATE ROLE plain_owner LOGIN NOSUPERUSER"

tle_db() { # db dist
  psql_as postgres postgres -c "CREATE DATABASE $1 OWNER tle_admin"
  psql_as postgres "$1" -c "SET client_min_messages = warning" -c "CREATE EXTENSION pg_tle" -c "GRANT pgtle_admin TO tle_admin"
  psql_as tle_admin "$1" -f "$2/idem_pg_tle.sql" >/dev/null
  psql_as tle_admin "$1" -c "CREATE EXTENSION idem"
}
plain_db() { # db dist
  psql_as postgres postgres -c "CREATE DATABASE $1 OWNER plain_owner"
  psql_as plain_owner "$1" -f "$2/idem_portable.sql" >/dev/null
}
populate() { # role db; prints the lease token
  psql_as "$1" "$2" -At <<'SQL' | tail -1
SELECT idem_configure('pay', '2 days');
SELECT idem_maintain();
CREATE TABLE payments (key text PRIMARY KEY, charge_id int NOT NULL);
BEGIN; SELECT idem_claim('p-1', 'pay', fingerprint => 'fp-1'); INSERT INTO payments VALUES ('p-1', 7);
SELECT idem_complete('p-1', 'pay', '{"charge_id": 7}'); COMMIT;
BEGIN; SELECT idem_claim('p-2', 'pay'); SELECT idem_fail('p-2', 'pay', '{"error": "declined"}'); COMMIT;
CREATE TEMP TABLE l AS SELECT result->>'lease_token' AS t FROM idem_claim('job-1', 'batch', lease => '30 minutes');
SELECT t FROM l;
SQL
}
check() { # role db what want sql  (one line; an error shows its SQLSTATE)
  local got
  got=$(psql_as "$1" "$2" -At -c '\set VERBOSITY sqlstate' -c "$5" 2>&1 | tail -1 | sed 's/^ERROR:  //' || true)
  expect "[$2] $3" "$got" "$4"
}
# The schema as far as the update touches it, and every function's
# definition and comment in schemas idem and public.
schema_sql="SELECT 'column', attname, format_type(atttypid, atttypmod), col_description(attrelid, attnum)
              FROM pg_attribute WHERE attrelid = 'idem.biz_types'::regclass AND attnum > 0 AND NOT attisdropped
            UNION ALL
            SELECT 'function', p.oid::regprocedure::text, md5(pg_get_functiondef(p.oid)), obj_description(p.oid, 'pg_proc')
              FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname IN ('idem', 'public') AND p.proname <> 'portable_version' AND p.prokind <> 'a'
            ORDER BY 1, 2"
after_update() { # role db token
  local role=$1 db=$2 token=$3
  check "$role" "$db" "the restated C function has its new portable body" "sql (0.4.1)" "SELECT idem_storage_path()"
  check "$role" "$db" "the new function and column" "on hold" \
    "UPDATE idem.biz_types SET note = 'on hold' WHERE biz_type = 'pay'; SELECT idem_note('pay')"
  check "$role" "$db" "the portable-only change" "Whose business types a call may use (synthetic 0.4.1)." \
    "SELECT obj_description('idem.caller_role()'::regprocedure, 'pg_proc')"
  check "$role" "$db" "a duplicate replays, as the business row says" "false|completed|true" \
    "SELECT r.claimed || '|' || r.state || '|' || ((r.result->>'charge_id')::int = p.charge_id)
       FROM idem_claim('p-1', 'pay', fingerprint => 'fp-1') r, payments p WHERE p.key = 'p-1'"
  check "$role" "$db" "a different fingerprint is refused" "ID001" "SELECT claimed FROM idem_claim('p-1', 'pay', fingerprint => 'fp-2')"
  check "$role" "$db" "the failure replays" 'false|failed|{"error": "declined"}' "SELECT claimed || '|' || state || '|' || result::text FROM idem_claim('p-2', 'pay')"
  check "$role" "$db" "the lease still runs" "false|in_progress" "SELECT claimed || '|' || state FROM idem_claim('job-1', 'batch')"
  check "$role" "$db" "the lease refuses a stranger" "ID003" "SELECT idem_complete('job-1', 'batch', '{}')"
  check "$role" "$db" "the lease token from before the update finishes it" "" "SELECT idem_complete('job-1', 'batch', '{\"done\": true}', '$token')"
  check "$role" "$db" "then it replays" 'false|completed|{"done": true}' "SELECT claimed || '|' || state || '|' || result::text FROM idem_claim('job-1', 'batch')"
  check "$role" "$db" "a new claim" "t" "SELECT claimed FROM idem_claim('p-3', 'pay')"
  check "$role" "$db" "maintenance runs" "t" "SELECT (idem_maintain() ? 'partitions_created')"
}

echo "== pg_tle: 0.4.0, live claims, then idem_pg_tle_update.sql and ALTER EXTENSION idem UPDATE"
tle_db tle_upd "$out/dist_old"
token=$(populate tle_admin tle_upd)
[[ "$token" =~ ^[0-9a-f]{32,}$ ]] || fail "no lease token: $token"
check tle_admin tle_upd "the version before" "0.4.0" "SELECT extversion FROM pg_extension WHERE extname = 'idem'"
psql_as tle_admin tle_upd -f "$out/dist_new/idem_pg_tle_update.sql" >/dev/null
psql_as tle_admin tle_upd -f "$out/dist_new/idem_pg_tle_update.sql" >/dev/null && echo "ok: the registration file runs twice" ||
  fail "the registration file does not run twice"
check tle_admin tle_upd "the update path is registered" "0.4.0--0.4.1" \
  "SELECT path FROM pgtle.extension_update_paths('idem') WHERE source = '0.4.0' AND target = '0.4.1'"
psql_as tle_admin tle_upd -c "ALTER EXTENSION idem UPDATE"
check tle_admin tle_upd "the version after" "0.4.1" "SELECT extversion FROM pg_extension WHERE extname = 'idem'"
after_update tle_admin tle_upd "$token"
tle_db tle_fresh "$out/dist_new"
check tle_admin tle_fresh "a fresh install is 0.4.1" "0.4.1" "SELECT extversion FROM pg_extension WHERE extname = 'idem'"
# (the listing sees the update: the new function is in it, among the rest)
expect "[tle] the schema listing covers the update (more than 50 lines)" \
  "$(psql_as tle_admin tle_upd -At -c "$schema_sql" | grep -c '^function|idem_note(text)|')|$(($(psql_as tle_admin tle_upd -At -c "$schema_sql" | wc -l) > 50))" "1|1"
expect "[tle] the updated schema equals a fresh 0.4.1 install's" \
  "$(diff <(psql_as tle_admin tle_upd -At -c "$schema_sql") <(psql_as tle_admin tle_fresh -At -c "$schema_sql") | head -5)" ""
# A registration with nothing to update from is refused.
psql_as postgres postgres -c "CREATE DATABASE tle_none OWNER tle_admin"
psql_as postgres tle_none -c "SET client_min_messages = warning" -c "CREATE EXTENSION pg_tle"
expect "[tle] the update file refuses a database without a registration (55000)" \
  "$(psql_as tle_admin tle_none -v VERBOSITY=sqlstate -f "$out/dist_new/idem_pg_tle_update.sql" 2>&1 | grep -o 55000 | head -1)" 55000

echo "== plain script: 0.4.0, live claims, then idem_portable--0.4.0--0.4.1.sql"
plain_db plain_upd "$out/dist_old"
token=$(populate plain_owner plain_upd)
[[ "$token" =~ ^[0-9a-f]{32,}$ ]] || fail "no lease token: $token"
check plain_owner plain_upd "the version before" "0.4.0" "SELECT idem.portable_version()"
psql_as plain_owner plain_upd -f "$out/dist_new/idem_portable--0.4.0--0.4.1.sql" >/dev/null
check plain_owner plain_upd "the version after" "0.4.1" "SELECT idem.portable_version()"
after_update plain_owner plain_upd "$token"
expect "[plain] the update refuses a database at another version (55000)" \
  "$(psql_as plain_owner plain_upd -v VERBOSITY=sqlstate -f "$out/dist_new/idem_portable--0.4.0--0.4.1.sql" 2>&1 | grep -o 55000 | head -1)" 55000
check plain_owner plain_upd "and changed nothing" "0.4.1|sql (0.4.1)" "SELECT idem.portable_version() || '|' || idem_storage_path()"
plain_db plain_fresh "$out/dist_new"
expect "[plain] the updated schema equals a fresh 0.4.1 install's" \
  "$(diff <(psql_as plain_owner plain_upd -At -c "$schema_sql") <(psql_as plain_owner plain_fresh -At -c "$schema_sql") | head -5)" ""
finish portable_update
