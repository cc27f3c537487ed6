#!/usr/bin/env bash
# Property test (tests/fuzz/sessions.py, hypothesis, derandomized): random
# sequences of claims, finishes, forgets and lookups through three sessions
# with random DateStyle / TimeZone / abbreviations / IntervalStyle and
# isolation levels, interleaved with catalog events (REINDEX CONCURRENTLY,
# VACUUM FULL, maintenance with a new width, DROP + CREATE EXTENSION); after
# every step no key has two live claims and every lookup equals the model.
# Both storage paths (the SQL path under READ COMMITTED only).
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
bash "$ROOT/scripts/cluster.sh" start >/dev/null
db=idem_sessions_property
restore() {
  psql_idem -q -d postgres -c "LOAD 'idem'" -c "ALTER SYSTEM RESET idem.storage_access" -c "SELECT pg_reload_conf()" >/dev/null || true
  psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" || true
}
trap restore EXIT
psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
dsn="host=$(cluster_dir) port=$IDEM_PORT user=postgres dbname=$db"
"$IDEM_PY" "$ROOT/tests/fuzz/sessions.py" --dsn "$dsn" --path direct --examples "${SESSIONS_EXAMPLES:-100}" --steps 40
psql_idem -q -d postgres -c "LOAD 'idem'" -c "ALTER SYSTEM SET idem.storage_access = 'sql'" -c "SELECT pg_reload_conf()" >/dev/null
"$IDEM_PY" "$ROOT/tests/fuzz/sessions.py" --dsn "$dsn" --path sql --examples "${SESSIONS_EXAMPLES:-60}" --steps 40
