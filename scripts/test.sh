#!/usr/bin/env bash
# The whole test suite, on a fresh Debian 12 machine as root:
#   bash scripts/test.sh
# Installs what is missing, builds, starts the private cluster and runs every
# level: #[pg_test] units, pg_regress, pg_isolation_regress, the pg_cron and
# rotation scenarios, and a tiny benchmark run. Ends with "N passed, N failed".
# Another PostgreSQL: PG_CONFIG=/path/to/pg_config bash scripts/test.sh
# (see lib.sh; its own cluster, port and target/pgNN/test-out).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

bash "$ROOT/scripts/setup.sh"
bash "$ROOT/scripts/cluster.sh" start

passed=0
failed=0
failures=()
record() { # name status
  if [ "$2" = 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); failures+=("$1"); fi
}

OUT="$IDEM_TARGET/test-out"
rm -rf "$OUT"
mkdir -p "$OUT"

fresh_db() {
  psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $1 WITH (FORCE)" -c "CREATE DATABASE $1"
}

# pg_regress / pg_isolation_regress: one line per test, "ok" or "FAILED";
# from PostgreSQL 16 on in TAP form ("ok 1 - name", "not ok 2 + name").
REGRESS_LINE='\.\.\. |^(not )?ok [0-9]+ +[-+] '
count_regress_output() { # suite-name file
  while read -r line; do
    if [[ "$line" =~ ^(not\ )?ok\ [0-9]+\ +[-+]\ +([A-Za-z0-9_]+) ]]; then
      if [ -z "${BASH_REMATCH[1]}" ]; then record "$1/${BASH_REMATCH[2]}" 0; else record "$1/${BASH_REMATCH[2]}" 1; fi
      continue
    fi
    name=$(echo "$line" | sed -E 's/^(test|     )? *([A-Za-z0-9_]+) +\.\.\..*/\2/')
    if echo "$line" | grep -q "\.\.\. ok"; then record "$1/$name" 0
    elif echo "$line" | grep -q "\.\.\. FAILED\|\.\.\. failed"; then record "$1/$name" 1
    fi
  done < <(grep -E "\.\.\. (ok|FAILED|failed)|^(not )?ok [0-9]+ +[-+] " "$2")
}

# run_suite NAME RUNNER DB INPUTDIR [psql setup...]: pg_regress or
# pg_isolation_regress against a fresh database of the private cluster.
run_suite() {
  local name=$1 runner=$2 db=$3 dir=$4
  shift 4
  fresh_db "$db"
  [ $# -gt 0 ] && psql_idem -q -d "$db" "$@"
  "$runner" --use-existing --host="$(cluster_dir)" --port="$IDEM_PORT" --user=postgres \
    --dbname="$db" --inputdir="$dir" --outputdir="$OUT/$name" \
    --schedule="$dir/schedule" > "$OUT/$name.log" 2>&1 || true
  grep -E "$REGRESS_LINE" "$OUT/$name.log" || true
  count_regress_output "$name" "$OUT/$name.log"
  if [ -f "$OUT/$name/regression.diffs" ]; then cat "$OUT/$name/regression.diffs"; fi
}

say "pg_regress: SQL API"
run_suite regress "$PGXS_TEST/regress/pg_regress" idem_regress "$ROOT/tests/pg_regress"

say "pg_isolation_regress: concurrency"
run_suite isolation "$PGXS_TEST/isolation/pg_isolation_regress" idem_isolation "$ROOT/tests/isolation" \
  -c "CREATE EXTENSION idem"

# Scenario scripts: each is a bash script that exits 0 on success.
for t in "$ROOT"/tests/scenarios/*.sh; do
  [ -e "$t" ] || continue
  name=$(basename "$t" .sh)
  say "scenario: $name"
  if bash "$t" > "$OUT/scenario-$name.log" 2>&1; then record "scenario/$name" 0; echo "ok"
  else record "scenario/$name" 1; tail -30 "$OUT/scenario-$name.log"; fi
done

say "#[pg_test] units (cargo pgrx test)"
PGRX_DATA="$(cluster_dir)/pgrx-test"
mkdir -p "$PGRX_DATA" && chown postgres:postgres "$PGRX_DATA"
if (cd "$ROOT" && cargo pgrx test "pg$PG_MAJOR" "${PG_FEATURE_ARGS[@]}" --runas postgres --pgdata "$PGRX_DATA/data") > "$OUT/pg_test.log" 2>&1; then :; fi
grep -E "^test .* \.\.\. (ok|FAILED)" "$OUT/pg_test.log" || tail -40 "$OUT/pg_test.log"
while read -r line; do
  name=$(echo "$line" | awk '{print $2}')
  if echo "$line" | grep -q "\.\.\. ok$"; then record "pg_test/$name" 0; else record "pg_test/$name" 1; fi
done < <(grep -E "^test .* \.\.\. (ok|FAILED)" "$OUT/pg_test.log")
grep -q "test result: ok" "$OUT/pg_test.log" || record "pg_test/suite" 1

echo
if [ ${#failures[@]} -gt 0 ]; then printf 'failed: %s\n' "${failures[@]}"; fi
echo "${passed} passed, ${failed} failed"
[ "$failed" = 0 ] && [ "$passed" -gt 0 ]
