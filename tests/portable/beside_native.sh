#!/usr/bin/env bash
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
# both databases. Run by tests/scenarios/editions.sh portable (step 8).
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
finish "portable beside native"
