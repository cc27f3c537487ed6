#!/usr/bin/env bash
# The whole test suite, on a fresh Debian 12 machine as root:
#   bash scripts/test.sh
# Installs what is missing (scripts/setup.sh --tests: also the tests' own
# tools), builds, starts the private cluster and runs every
# level on PostgreSQL 15: #[pg_test] units, pg_regress, pg_isolation_regress,
# every scenario in tests/scenarios/ (in two lanes: LANE_B below). Beside it,
# the core of the suite again on
# PostgreSQL 18 (built from Debian sid's source, cached), on PostgreSQL 17
# in a Debian 13 root (cached) and on PostgreSQL 16.2 (PyPI's pgserver
# wheel, cached), and pg_upgrade from 15 to 18. Ends with "N passed, N failed".
#
#   IDEM_SUITE=core   only the core (what runs on the other majors): pg_regress
#                     and isolation, the scenarios in CORE_SCENARIOS below
#   IDEM_MAJORS="16 17 18" (default) / "" : which other majors a full run covers
#                     (side by side; IDEM_MAJORS_SERIAL=1: one after another)
#   IDEM_LANES_SERIAL=1  the 15 suite's scenarios in one lane
# Another PostgreSQL: PG_CONFIG=/path/to/pg_config bash scripts/test.sh
# (see lib.sh; its own cluster, port and target/pgNN/test-out).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
IDEM_SUITE="${IDEM_SUITE:-full}"
IDEM_MAJORS="${IDEM_MAJORS-16 17 18}"
# The core: both storage paths' suites (storage_sql), the hardening matrix
# (environments, encodings, catalog_events, two_phase), the upgrade from
# every shipped version, the stress scenario at the suite's size, and the
# portable edition on a pg_tle server of the same major, compared with the
# native edition (portable).
CORE_SCENARIOS=(storage_sql environments encodings catalog_events two_phase upgrade stress wraparound retention portable)

bash "$ROOT/scripts/setup.sh" --tests
idem_locate_cluster
bash "$ROOT/scripts/cluster.sh" start

passed=0
failed=0
failures=()
record() { # name status
  if [ -n "${RECORDS:-}" ]; then echo "record $1 $2" >> "$RECORDS"; return; fi
  if [ "$2" = 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); failures+=("$1"); fi
}
record_passed() { # count: passed tests counted elsewhere (another major's run)
  if [ -n "${RECORDS:-}" ]; then echo "passed $1" >> "$RECORDS"; return; fi
  passed=$((passed + $1))
}

OUT="$IDEM_TARGET/test-out"
rm -rf "$OUT"
mkdir -p "$OUT"
# Where the suite's time goes: one line per step (seconds, step) in
# $OUT/times.tsv, the slowest listed at the end. Nothing is decided by it.
step_started=0 # (SECONDS counts from the script's start: the set-up is the first step)
step_done() { # step
  printf '%s\t%s\n' "$((SECONDS - step_started))" "$1" >> "$OUT/times.tsv"
  step_started=$SECONDS
}
step_done setup-and-cluster

# What the other majors and the package test need, built once and cached
# (tests/servers/): made in the background, at the lowest CPU priority, while
# the PostgreSQL 15 suite runs, which leaves the CPU and the network idle
# much of its time (lock waits, fsyncs, sessions that wait on each other).
# Their host packages are installed first, in the foreground: apt lets one
# dpkg run at a time. The script's later call for the same thing waits
# for its lock, then finds it ready (or builds it itself if the background
# build failed, and says why). Nothing here decides a test.
prepare_pid=
if [ "$IDEM_SUITE" = full ]; then
  prepare=(bookworm.sh)
  for major in $IDEM_MAJORS; do
    case "$major" in 16) prepare+=(pg16.sh) ;; 17) prepare+=(trixie.sh) ;; 18) prepare+=(pg18.sh pg15-upstream.sh) ;; esac
  done
  for script in "${prepare[@]}"; do
    bash "$ROOT/tests/servers/$script" --host-packages || say "$script: its host packages could not be installed now; its own call tries again"
  done
  (for script in "${prepare[@]}"; do
     echo "== $script"
     nice -n 19 bash "$ROOT/tests/servers/$script" || echo "== $script failed: its foreground call tries again"
   done) > "$OUT/prepare-in-background.log" 2>&1 &
  prepare_pid=$!
fi

# Another major's run of this script (IDEM_SUITE=core): its tests count
# here as pgNN/<test>.
run_major() { # label command...
  local label=$1 log="$OUT/$1.log"
  shift
  local t0=$SECONDS
  "$@" > "$log" 2>&1 || true
  local summary
  summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -1 || true)
  if [ -z "$summary" ]; then
    record "$label/suite" 1; tail -40 "$log"; return
  fi
  record_passed "${summary%% passed*}"
  while read -r f; do record "$label/$f" 1; done < <(sed -n 's/^failed: //p' "$log")
  echo "$label: $summary ($((SECONDS - t0)) s; log: $log)"
  # That major's own steps, prefixed with its label.
  local times="$ROOT/target/$label/test-out/times.tsv"
  [ ! -f "$times" ] || sed "s|\t|\t$label/|" "$times" >> "$OUT/times.tsv"
  step_done "$label(whole)"
}

if [ "$IDEM_SUITE" = full ]; then
  # The #[pg_test] units: `cargo pgrx test` installs a build with the test
  # functions into the server it runs, here a private copy of Debian's 15
  # (tests/servers/pg15-copy.sh; its own pgrx configuration and cargo target
  # folder), so that they run beside the suite, whose scenarios use the
  # build installed into Debian's 15.
  # (The copy, pgrx's configuration naming it and the run, all under the
  # units' build lock: another checkout's units may refresh the copy.)
  units_on_copy() { # pgdata
    local copy
    copy=$(bash "$ROOT/tests/servers/pg15-copy.sh") || return 1
    mkdir -p "$PGRX_HOME"
    printf '[configs]\npg15 = "%s"\n' "$copy" > "$PGRX_HOME/config.toml"
    cargo pgrx test pg15 --runas postgres --pgdata "$1"
  }
  major_pg_test() {
    say "#[pg_test] units (cargo pgrx test, on a private copy of PostgreSQL 15)"
    PGRX_DATA="$(cluster_dir)/pgrx-test"
    mkdir -p "$PGRX_DATA"
    chown postgres:postgres "$PGRX_DATA"
    if (cd "$ROOT" && export PGRX_HOME="$IDEM_CACHE/pgrx-units" CARGO_TARGET_DIR="$IDEM_CACHE/cargo-target/pg15-units" &&
        idem_build "$ROOT" units_on_copy "$PGRX_DATA/data") > "$OUT/pg_test.log" 2>&1; then :; fi
    grep -E "^test .* \.\.\. (ok|FAILED)" "$OUT/pg_test.log" || tail -40 "$OUT/pg_test.log"
    while read -r line; do
      name=$(echo "$line" | awk '{print $2}')
      if echo "$line" | grep -q "\.\.\. ok$"; then record "pg_test/$name" 0; else record "pg_test/$name" 1; fi
    done < <(grep -E "^test .* \.\.\. (ok|FAILED)" "$OUT/pg_test.log")
    grep -q "test result: ok" "$OUT/pg_test.log" || record "pg_test/suite" 1
    step_done "pg_test(build, run)"
  }
  major_18() {
    say "PostgreSQL 18: the core suite (tests/servers/pg18.sh builds it once, cached)"
    pg18=$(bash "$ROOT/tests/servers/pg18.sh" 2> "$OUT/pg18-build.log") \
      || { record "pg18/build" 1; record "pg_upgrade/15-to-18" 1; tail -20 "$OUT/pg18-build.log"; return; }
    run_major pg18 env PG_CONFIG="$pg18" IDEM_SUITE=core bash "$ROOT/scripts/test.sh"
    major_pg_upgrade
  }
  # After 18's core suite, which installs idem into 18 (the 15 side copies
  # the build installed into Debian's 15, which no scenario replaces).
  major_pg_upgrade() {
    say "pg_upgrade from PostgreSQL 15 to 18 with live claims"
    if PG18_CONFIG="$pg18" bash "$ROOT/tests/versions/pg_upgrade.sh" > "$OUT/pg_upgrade.log" 2>&1; then
      record "pg_upgrade/15-to-18" 0; tail -3 "$OUT/pg_upgrade.log"
    else record "pg_upgrade/15-to-18" 1; tail -30 "$OUT/pg_upgrade.log"; fi
    step_done "pg_upgrade"
  }
  major_17() {
    say "PostgreSQL 17 on Debian 13: the core suite (tests/servers/trixie.sh makes the root once, cached)"
    bash "$ROOT/tests/servers/trixie.sh" > "$OUT/trixie-build.log" 2>&1 || { record "pg17/root" 1; tail -20 "$OUT/trixie-build.log"; return; }
    run_major pg17 bash "$ROOT/tests/servers/in-trixie.sh" env IDEM_SUITE=core bash "$ROOT/scripts/test.sh"
    bash "$ROOT/tests/servers/in-trixie.sh" bash "$ROOT/scripts/cluster.sh" stop > /dev/null 2>&1 || true
    say "PostgreSQL 17 on Debian 13: the postgresql-17-idem package, built, installed, used and purged"
    if bash "$ROOT/tests/servers/in-trixie.sh" bash "$ROOT/tests/versions/package_debian13.sh" > "$OUT/package_debian13.log" 2>&1; then
      record "pg17/package_debian13" 0; tail -1 "$OUT/package_debian13.log"
    else record "pg17/package_debian13" 1; tail -30 "$OUT/package_debian13.log"; fi
    step_done "pg17/package_debian13"
  }
  major_16() {
    say "PostgreSQL 16: the core suite (tests/servers/pg16.sh unpacks 16.2 from PyPI's pgserver wheel once, cached)"
    pg16=$(bash "$ROOT/tests/servers/pg16.sh" 2> "$OUT/pg16-unpack.log") || { record "pg16/unpack" 1; tail -20 "$OUT/pg16-unpack.log"; return; }
    run_major pg16 env PG_CONFIG="$pg16" IDEM_SUITE=core bash "$ROOT/scripts/test.sh"
    # No compiler warning in idem's build for 16 (cargo repeats a cached
    # build's warnings, so this holds when nothing was recompiled too).
    if grep -q "^warning" "$OUT/pg16.log"; then
      record "pg16/no_build_warnings" 1; grep "^warning" "$OUT/pg16.log" | head -20
    else record "pg16/no_build_warnings" 0; fi
    # (Stopped, as 17's: pg16.sh does not swap in a new tree under a running server.)
    PG_CONFIG="$pg16" bash "$ROOT/scripts/cluster.sh" stop > /dev/null 2>&1 || true
  }
  # The units and the other majors run side by side with the PostgreSQL 15
  # suite and with each other (IDEM_MAJORS_SERIAL=1: one after another,
  # before the 15 suite): each is a separate server, build, cluster and set
  # of ports (major_port), and most of a run is spent waiting (locks,
  # fsyncs, sessions waiting on each other; the CPU was idle two thirds of
  # the 15 suite's middle ten minutes when it ran alone), which leaves the
  # CPU to the others. Each job writes its output and records to files,
  # shown and counted at the end in the order of IDEM_MAJORS (the units
  # first).
  # (A job that stops half-way, a command failing under set -e, counts as a
  # failure: its remaining tests would otherwise go unrecorded.)
  major_job() { # major: its output in $OUT/major-N.out, its records in $OUT/major-N.records
    : > "$OUT/major-$1.records"
    (RECORDS="$OUT/major-$1.records"; "major_$1") > "$OUT/major-$1.out" 2>&1 \
      || echo "record $1/job-stopped 1" >> "$OUT/major-$1.records"
  }
  jobs_started=() job_pids=()
  for major in pg_test $IDEM_MAJORS; do
    declare -F "major_$major" >/dev/null || { echo "IDEM_MAJORS: no PostgreSQL $major here"; record "pg$major/unknown" 1; continue; }
    if [ "$major" = pg_test ]; then say "#[pg_test] units$([ "${IDEM_MAJORS_SERIAL:-0}" = 1 ] || echo ', beside the PostgreSQL 15 suite')"
    else say "PostgreSQL $major: the core suite$([ "${IDEM_MAJORS_SERIAL:-0}" = 1 ] || echo ', beside the PostgreSQL 15 suite')"; fi
    if [ "${IDEM_MAJORS_SERIAL:-0}" = 1 ]; then major_job "$major"; else major_job "$major" & job_pids+=($!); fi
    jobs_started+=("$major")
  done
fi

source "$ROOT/tests/lib/regress.sh"

# run_suite regress|isolation: `make installcheck-regress` or
# `make installcheck-isolation` (the Makefile: the schedule run the PGXS way,
# as a packager runs it against any server) against the private cluster;
# each test recorded, the diffs of failed ones shown.
run_suite() {
  local name=$1
  PGHOST="$(cluster_dir)" PGPORT="$IDEM_PORT" PGUSER=postgres \
    make -C "$ROOT" --no-print-directory "installcheck-$name" PG_CONFIG="$PG_CONFIG" REGRESS_OUT="$OUT" \
    > "$OUT/$name.log" 2>&1 || true
  # (No test result at all: the runner did not run; the suite fails.)
  if [ -z "$(regress_results "$OUT/$name.log")" ]; then record "$name/suite" 1; tail -20 "$OUT/$name.log"; fi
  while read -r test result; do
    echo "$name/$test ... $result"
    if [ "$result" = ok ]; then record "$name/$test" 0; else record "$name/$test" 1; fi
  done < <(regress_results "$OUT/$name.log")
  regress_diffs "$OUT/$name"
  step_done "$name"
}

in_list() { # word list...
  local w=$1
  shift
  printf '%s\n' "$@" | grep -qx -- "$w"
}

run_scenario() { # name
  say "scenario: $1"
  step_started=$SECONDS
  if bash "$ROOT/tests/scenarios/$1.sh" > "$OUT/scenario-$1.log" 2>&1; then
    record "scenario/$1" 0; echo "ok ($((SECONDS - step_started)) s)"
  else record "scenario/$1" 1; tail -30 "$OUT/scenario-$1.log"; fi
  step_done "scenario/$1"
}

# The scenarios that use only servers of their own (no database of the
# shared cluster, no write into this PostgreSQL's installed files) run in a
# second lane, one after another, beside pg_regress, isolation and the
# other scenarios, which share the private cluster and change its settings
# (the storage path, roles, pg_cron's database) and so stay in one line.
# Only in the full run (the other majors' core suites run beside it
# already); IDEM_LANES_SERIAL=1 runs everything in one line. The lane's
# output is shown, and its records counted, when it is done.
LANE_B=(backtraces bench_smoke citus crash dashboard failover hot_standby logical metrics middleware_go
        middleware_node middleware_python package pgbouncer pgxn plproxy portable_move portable_update prometheus retention
        sql_exporter sqlstates storage_sql wraparound)
lane_b_pid=
if [ "$IDEM_SUITE" = full ] && [ "${IDEM_LANES_SERIAL:-0}" != 1 ]; then
  : > "$OUT/lane-b.records"
  (RECORDS="$OUT/lane-b.records"
   step_started=$SECONDS
   for name in "${LANE_B[@]}"; do [ ! -e "$ROOT/tests/scenarios/$name.sh" ] || run_scenario "$name"; done
  ) > "$OUT/lane-b.out" 2>&1 &
  lane_b_pid=$!
fi

say "pg_regress: SQL API (make installcheck-regress)"
run_suite regress

say "pg_isolation_regress: concurrency (make installcheck-isolation)"
run_suite isolation

# Scenario scripts: each is a bash script that exits 0 on success.
for t in "$ROOT"/tests/scenarios/*.sh; do
  [ -e "$t" ] || continue
  name=$(basename "$t" .sh)
  if [ "$IDEM_SUITE" = core ] && ! in_list "$name" "${CORE_SCENARIOS[@]}"; then continue; fi
  if [ -n "$lane_b_pid" ] && in_list "$name" "${LANE_B[@]}"; then continue; fi
  run_scenario "$name"
done

if [ -n "$lane_b_pid" ]; then
  wait "$lane_b_pid" || echo "record lane-b/stopped 1" >> "$OUT/lane-b.records"
  cat "$OUT/lane-b.out"
  while read -r kind a b; do record "$a" "$b"; done < "$OUT/lane-b.records"
fi

if [ "$IDEM_SUITE" = full ]; then
  for pid in "${job_pids[@]}"; do wait "$pid" || true; done
  for major in "${jobs_started[@]}"; do
    cat "$OUT/major-$major.out"
    while read -r kind a b; do
      case "$kind" in record) record "$a" "$b" ;; passed) record_passed "$a" ;; esac
    done < "$OUT/major-$major.records"
  done
fi

[ -z "$prepare_pid" ] || wait "$prepare_pid" || true
echo
if [ "$IDEM_SUITE" = full ] && [ -f "$OUT/times.tsv" ]; then
  echo "the slowest steps (seconds; all in $OUT/times.tsv):"
  sort -rn "$OUT/times.tsv" | head -12 | sed 's/^/  /'
fi
if [ ${#failures[@]} -gt 0 ]; then printf 'failed: %s\n' "${failures[@]}"; fi
echo "${passed} passed, ${failed} failed"
[ "$failed" = 0 ] && [ "$passed" -gt 0 ]
