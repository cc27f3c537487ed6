#!/usr/bin/env bash
# The inner loop: build and install idem (debug build: quick to compile),
# then run chosen pg_regress / isolation tests against the private cluster,
# in seconds. The whole suite is scripts/test.sh.
#
#   bash scripts/check.sh                       # every pg_regress and isolation test
#   bash scripts/check.sh claim_basic leases    # these tests (found in either suite)
#   bash scripts/check.sh --sql claim_basic     # on the SQL storage path (tests/sql_access)
#   bash scripts/check.sh --no-build ...        # skip the build
#   PG_CONFIG=/path/to/pg_config bash scripts/check.sh ...   # another PostgreSQL
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

build=1 path=direct tests=()
for a in "$@"; do
  case "$a" in
    --no-build) build=0 ;;
    --sql) path=sql ;;
    *) tests+=("$a") ;;
  esac
done

if [ "$build" = 1 ]; then
  (cd "$ROOT" && idem_build "$ROOT" cargo pgrx install --pg-config "$PG_CONFIG" "${PG_FEATURE_ARGS[@]}" 2>&1 |
    grep -E "^(error|warning)|Finished|-->" || true)
fi
bash "$ROOT/scripts/cluster.sh" start
OUT="$ROOT/target/check-out"
rm -rf "$OUT"; mkdir -p "$OUT"

if [ "$path" = sql ]; then
  psql_idem -q -d postgres -c "LOAD 'idem'" -c "ALTER SYSTEM SET idem.storage_access = 'sql'" -c "SELECT pg_reload_conf()"
  trap 'psql_idem -q -d postgres -c "LOAD '\''idem'\''" -c "ALTER SYSTEM RESET idem.storage_access" -c "SELECT pg_reload_conf()"' EXIT
fi

source "$ROOT/tests/lib/suite.sh"

# The schedules of the path (those scripts/test.sh and
# tests/scenarios/hardening.sh storage_sql run); a test named on the command line runs
# from whichever schedule holds it, each schedule in a database of its own
# (with the extension created first).
in_schedule() { # schedule-file: its tests that were asked for (all if none)
  sed -n 's/^test: *//p' "$1" | tr ' ' '\n' | while read -r n; do
    [ -n "$n" ] || continue
    if [ ${#tests[@]} = 0 ] || in_list "$n" "${tests[@]}"; then echo "$n"; fi
  done
}
run() { # kind inputdir schedule
  local kind=$1 dir=$2 name=$(basename "$2")-$(basename "$3") picked
  picked=$(in_schedule "$3")
  [ -n "$picked" ] || return 0
  local db=idem_check_${name//[^a-z_]/_}
  psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
  psql_idem -q -d "$db" -c "SET client_min_messages = warning" -c "CREATE EXTENSION idem"
  regress_run "$kind" "$(cluster_dir)" "$IDEM_PORT" "$db" "$dir" "$OUT/$name" "$OUT/$name.log" $picked || true
  regress_results "$OUT/$name.log" > "$OUT/$name.results"
  [ -s "$OUT/$name.results" ] || cat "$OUT/$name.log"
  grep -v ' ok$' "$OUT/$name.results" || true
  regress_diffs "$OUT/$name"
  echo "$name: $(grep -c ' ok$' "$OUT/$name.results") ok, $(grep -vc ' ok$' "$OUT/$name.results") failed"
}
if [ "$path" = sql ]; then
  run regress "$ROOT/tests/pg_regress" "$ROOT/tests/sql_access/regress_schedule"
  run isolation "$ROOT/tests/isolation" "$ROOT/tests/sql_access/isolation_schedule"
  run isolation "$ROOT/tests/sql_access" "$ROOT/tests/sql_access/schedule"
else
  run regress "$ROOT/tests/pg_regress" "$ROOT/tests/pg_regress/schedule"
  run isolation "$ROOT/tests/isolation" "$ROOT/tests/isolation/schedule"
fi
