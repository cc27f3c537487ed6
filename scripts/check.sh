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
  (cd "$ROOT" && cargo pgrx install --pg-config "$PG_CONFIG" "${PG_FEATURE_ARGS[@]}" 2>&1 |
    grep -E "^(error|warning)|Finished|-->" || true)
fi
bash "$ROOT/scripts/cluster.sh" start
OUT="$ROOT/target/check-out"
rm -rf "$OUT"; mkdir -p "$OUT"

if [ "$path" = sql ]; then
  psql_idem -q -d postgres -c "LOAD 'idem'" -c "ALTER SYSTEM SET idem.storage_access = 'sql'" -c "SELECT pg_reload_conf()"
  trap 'psql_idem -q -d postgres -c "LOAD '\''idem'\''" -c "ALTER SYSTEM RESET idem.storage_access" -c "SELECT pg_reload_conf()"' EXIT
fi

# A test named on the command line runs from whichever suite holds it,
# each suite in a database of its own (with the extension created first).
run() { # runner inputdir tests...
  local runner=$1 dir=$2 db=idem_check_$(basename "$2"); shift 2
  [ $# -gt 0 ] || return 0
  psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
  psql_idem -q -d "$db" -c "SET client_min_messages = warning" -c "CREATE EXTENSION idem"
  "$runner" --use-existing --bindir="$PG_BIN" --host="$(cluster_dir)" --port="$IDEM_PORT" --user=postgres --dbname="$db" \
    --inputdir="$dir" --outputdir="$OUT/$(basename "$dir")" "$@" || true
  [ -f "$OUT/$(basename "$dir")/regression.diffs" ] && cat "$OUT/$(basename "$dir")/regression.diffs"
  return 0
}
pick() { # dir file-ext: tests of the dir that were asked for (all if none)
  local dir=$1 ext=$2
  for f in "$dir"/*."$ext"; do
    n=$(basename "$f" ."$ext")
    if [ ${#tests[@]} = 0 ] || printf '%s\n' "${tests[@]}" | grep -qx "$n"; then echo "$n"; fi
  done
}
run "$PGXS_TEST/regress/pg_regress" "$ROOT/tests/pg_regress" $(pick "$ROOT/tests/pg_regress/sql" sql)
run "$PGXS_TEST/isolation/pg_isolation_regress" "$ROOT/tests/isolation" $(pick "$ROOT/tests/isolation/specs" spec)
if [ "$path" = sql ]; then
  run "$PGXS_TEST/regress/pg_regress" "$ROOT/tests/sql_access" $(pick "$ROOT/tests/sql_access/sql" sql 2>/dev/null)
  run "$PGXS_TEST/isolation/pg_isolation_regress" "$ROOT/tests/sql_access" $(pick "$ROOT/tests/sql_access/specs" spec)
fi
