# The one way the tests run pg_regress and pg_isolation_regress (source it
# after scripts/lib.sh): scripts/test.sh, scripts/check.sh and the scenarios
# that run the schedules again (storage_sql, environments, portable, Citus).
#
#   regress_run KIND HOST PORT DB INPUTDIR OUTDIR LOG [OPTION... | TEST...]
#       KIND: regress (pg_regress) or isolation (pg_isolation_regress), of
#       the PostgreSQL that PG_CONFIG names; against an existing database DB
#       (--use-existing), as user postgres; the rest goes to the runner as
#       it is (--schedule=FILE, --launcher=..., or test names). Its output in
#       LOG, its results and diffs in OUTDIR. Returns the runner's status.
#   regress_results LOG
#       one line per test: "NAME ok" or "NAME FAILED", from pg_regress's
#       "test NAME ... ok" (PostgreSQL 15) or TAP "ok 1 - NAME" (16 on).
#   regress_diffs OUTDIR [LINES]
#       the diffs of the failed tests, if any (the first LINES lines).

regress_run() {
  local kind=$1 host=$2 port=$3 db=$4 input=$5 out=$6 log=$7 runner
  shift 7
  case "$kind" in
    regress) runner="$PGXS_TEST/regress/pg_regress" ;;
    isolation) runner="$PGXS_TEST/isolation/pg_isolation_regress" ;;
    *) echo "regress_run: unknown kind $kind" >&2; return 2 ;;
  esac
  mkdir -p "$out"
  "$runner" --use-existing --bindir="$PG_BIN" --host="$host" --port="$port" --user=postgres --dbname="$db" \
    --inputdir="$input" --outputdir="$out" "$@" > "$log" 2>&1
}

regress_results() {
  sed -nE 's/^(test +| +)?([A-Za-z0-9_]+) +\.\.\. +(ok|FAILED|failed).*/\2 \3/p
           s/^ok [0-9]+ +[-+] +([A-Za-z0-9_]+).*/\1 ok/p
           s/^not ok [0-9]+ +[-+] +([A-Za-z0-9_]+).*/\1 FAILED/p' "$1" | sed 's/ failed$/ FAILED/'
}

regress_diffs() {
  [ -f "$1/regression.diffs" ] || return 0
  if [ -n "${2:-}" ]; then head -n "$2" "$1/regression.diffs"; else cat "$1/regression.diffs"; fi
}
