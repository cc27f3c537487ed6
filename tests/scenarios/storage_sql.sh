#!/usr/bin/env bash
# idem.storage_access = sql: the claim path that reaches idem.claims through
# SQL on the logical table (src/storage/sql.rs; a Citus-distributed
# idem.claims never takes it: storage/citus.rs reaches the shard directly), run
# against its own small cluster configured with it. The pg_regress and
# isolation tests listed in tests/sql_access/*schedule run unchanged against
# their usual expected output (tests/pg_regress, tests/isolation), so both
# paths must answer alike; tests/sql_access/ adds what differs (REPEATABLE
# READ is refused with 0A000; the key lock is held to the end).
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/cluster.sh"
PORT=5541
out="$IDEM_TARGET/test-out/sql_access"
trap pc_stop EXIT
rm -rf "$out"
mkdir -p "$out"
pc_init "$(cluster_dir)/sqlpath" "$PORT" \
  "max_prepared_transactions = 10" \
  "idem.storage_access = sql"
pc_start
dir=$PC_DIR
psql_sql() { pc_psql -q "$@"; }

fails=0
source "$ROOT/tests/lib/regress.sh"
run() { # name kind db schedule inputdir [psql setup]
  local name=$1 kind=$2 db=$3 schedule=$4 input=$5
  shift 5
  psql_sql -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
  [ $# -gt 0 ] && psql_sql -d "$db" "$@"
  if ! regress_run "$kind" "$dir" "$PORT" "$db" "$input" "$out/$name" "$out/$name.log" --schedule="$schedule"; then
    fails=$((fails + 1))
    regress_diffs "$out/$name" 150
  fi
  regress_results "$out/$name.log" | grep . || cat "$out/$name.log"
}
run regress regress idem_regress "$ROOT/tests/sql_access/regress_schedule" "$ROOT/tests/pg_regress"
run isolation isolation idem_isolation "$ROOT/tests/sql_access/isolation_schedule" \
  "$ROOT/tests/isolation" -c "CREATE EXTENSION idem"
run sql_only isolation idem_isolation "$ROOT/tests/sql_access/schedule" \
  "$ROOT/tests/sql_access" -c "CREATE EXTENSION idem"
# Databases in other encodings: tests/scenarios/encodings.sh, on both paths.
echo "storage_access=sql suites failed: $fails"
[ "$fails" = 0 ]
