# The machinery of scripts/test.sh (source it after scripts/lib.sh; the
# declaration of what runs where stays in test.sh): records, step times,
# the schedules, the scenarios, the second lane, and the #[pg_test] units
# and other majors' suites run as background jobs, then the summary.
#
#   suite_begin                      $OUT (test-out) made anew; counters zero
#   record NAME STATUS / record_passed COUNT
#                                    one test's verdict (0 = passed) / passed
#                                    tests counted elsewhere (another major's run).
#                                    Inside a lane or job (RECORDS set) they go
#                                    to its record file, counted when it ends
#   step_done STEP [CPU]             one line (wall seconds, step, CPU seconds or "-")
#                                    in $OUT/times.tsv; nothing is decided by it
#   prepare_servers SCRIPT[:ARG]...  tests/servers/SCRIPT [ARG] each, built in the background
#   run_suite regress|isolation      `make installcheck-NAME` against the private cluster
#   scenario_names                   every scenario, by name (tests/lib/scenarios.sh)
#   scenario_file NAME               the file that holds it (nothing if none)
#   run_scenario NAME                that scenario, recorded as scenario/NAME
#   run_lines                        what test.sh declares to run (its lists), the names
#                                    asked for (only) or all: the lanes, regress, isolation
#   run_major LABEL COMMAND...       another major's core suite (test.sh), counted as LABEL/<test>
#   run_recorded NAME LOG COMMAND... a command that passes or fails as one test
#   lane_start NAME... / lane_help   those scenarios in a second lane (a queue, two
#                                    workers); the main line helps when its own are done
#   jobs_start JOB...                major_JOB (pg_test, 16, 17, 18) as background jobs
#   suite_end                        wait for lane and jobs, count their records,
#                                    print the slowest steps (wall, CPU: cpu_begin below)
#                                    and "N passed, N failed"; its status is the verdict
#   regress_run, regress_results, regress_diffs
#                                    pg_regress and pg_isolation_regress (at the end)

suite_begin() {
  passed=0 failed=0 failures=() lane_pids=() prepare_pid= jobs_started=() job_pids=()
  OUT="$IDEM_TARGET/test-out"
  rm -rf "$OUT"
  mkdir -p "$OUT"
  step_started=0 # (SECONDS counts from the script's start: the set-up is the first step)
}

record() { # name status
  if [ -n "${RECORDS:-}" ]; then echo "record $1 $2" >> "$RECORDS"; return; fi
  if [ "$2" = 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); failures+=("$1"); fi
}
record_passed() { # count
  if [ -n "${RECORDS:-}" ]; then echo "passed $1" >> "$RECORDS"; return; fi
  passed=$((passed + $1))
}
# A lane's or job's record file, counted here.
count_records() { # file
  local kind a b
  while read -r kind a b; do
    case "$kind" in record) record "$a" "$b" ;; passed) record_passed "$a" ;; esac
  done < "$1"
}

step_done() { # step [cpu-seconds]
  printf '%s\t%s\t%s\n' "$((SECONDS - step_started))" "$1" "${2:--}" >> "$OUT/times.tsv"
  step_started=$SECONDS
}

# CPU time per step, where cgroup v1's cpuacct controller is mounted and
# writable (as root on most machines; else the steps' CPU shows as "-"):
# the run gets a group of its own under the one it started in, each step a
# group inside it, and what a step starts (servers that detach included)
# counts there; a group's usage includes its children's, so the run's
# group counts everything, the other majors' suites too (test.sh run
# again, its groups nested in the job's). The private cluster, which
# every scenario of the main lane uses, gets a group of its own (step
# "cluster"). For the report only: nothing is decided by it.
#   cpu_begin                  the run's group (CPU_RUN), this shell in it
#                              (cpu_end when the shell exits)
#   cpu_group NAME             a new group for a step: its path, or nothing
#   cpu_enter GROUP            this (sub)shell and what it starts into GROUP
#   cpu_seconds GROUP          its CPU seconds so far
#   cpu_step_begin NAME / cpu_step_end
#                              a step's group (CPU_STEP), and its CPU seconds
#                              at its end: in the main line (not a lane or
#                              job) with the private cluster's meanwhile
#   cpu_end                    this shell back to where it started; the groups
#                              of processes still running (the cluster)
#                              handed to that group, the run's groups removed
CPU_ROOT=/sys/fs/cgroup/cpuacct
CPU_RUN=
cpu_begin() {
  local here
  here=$(sed -n 's/^[0-9]*:\([^:]*,\)\{0,1\}cpuacct\(,[^:]*\)\{0,1\}:\(.*\)$/\3/p' /proc/self/cgroup 2>/dev/null | sed -n 1p)
  [ -n "$here" ] && [ -w "$CPU_ROOT${here%/}/tasks" ] || return 0
  CPU_HOME="$CPU_ROOT${here%/}"
  CPU_RUN="$CPU_HOME/idem-run-$$"
  mkdir -p "$CPU_RUN" 2>/dev/null && echo $$ > "$CPU_RUN/tasks" 2>/dev/null || { CPU_RUN=; return 0; }
  trap cpu_end EXIT
}
cpu_group() { # name
  [ -n "$CPU_RUN" ] || return 0
  local g="$CPU_RUN/$(printf '%s' "$1" | tr -c 'A-Za-z0-9_.-' '_')-$BASHPID"
  mkdir -p "$g" 2>/dev/null && echo "$g"
}
cpu_enter() { [ -z "${1:-}" ] || echo "$BASHPID" > "$1/tasks" 2>/dev/null || true; }
cpu_seconds() { # group
  local ns
  ns=$(cat "$1/cpuacct.usage" 2>/dev/null) || { echo -; return; }
  awk -v ns="$ns" 'BEGIN { printf "%.1f", ns / 1e9 }'
}
cpu_step_begin() { # name
  CPU_STEP=$(cpu_group "$1")
  CPU_CLUSTER0=$(cpu_ns "${CPU_CLUSTER:-}")
}
cpu_step_end() {
  [ -n "${CPU_STEP:-}" ] || { echo -; return; }
  local ns
  ns=$(cpu_ns "$CPU_STEP")
  [ -n "${RECORDS:-}" ] || ns=$((ns + $(cpu_ns "${CPU_CLUSTER:-}") - CPU_CLUSTER0))
  awk -v ns="$ns" 'BEGIN { printf "%.1f", ns / 1e9 }'
}
cpu_ns() { cat "$1/cpuacct.usage" 2>/dev/null || echo 0; } # group
cpu_end() {
  [ -n "$CPU_RUN" ] || return 0
  local g p
  echo $$ > "$CPU_HOME/tasks" 2>/dev/null || true
  for g in "$CPU_RUN"/*/ "$CPU_RUN"/; do
    [ -d "$g" ] || continue
    while read -r p; do echo "$p" > "$CPU_HOME/tasks" 2>/dev/null || true; done < "$g/tasks"
  done
  for g in "$CPU_RUN"/*/; do [ ! -d "$g" ] || rmdir "$g" 2>/dev/null || true; done
  rmdir "$CPU_RUN" 2>/dev/null || true
}

# What the other majors and the package test need, built once and cached
# (tests/servers/): made in the background, at the lowest CPU priority, while
# the PostgreSQL 15 suite runs, which leaves the CPU and the network idle
# much of its time (lock waits, fsyncs, sessions that wait on each other).
# Their host packages are installed first, in the foreground: apt lets one
# dpkg run at a time. The script's later call for the same thing waits
# for its lock, then finds it ready (or builds it itself if the background
# build failed, and says why). Nothing here decides a test.
server_argv() { SERVER_ARGV=("$ROOT/tests/servers/${1%%:*}"); [[ "$1" != *:* ]] || SERVER_ARGV+=("${1#*:}"); }
prepare_servers() { # script[:arg]...
  local script
  for script in "$@"; do
    server_argv "$script"
    bash "${SERVER_ARGV[@]}" --host-packages || say "$script: its host packages could not be installed now; its own call tries again"
  done
  (for script in "$@"; do
     echo "== $script"
     server_argv "$script"
     nice -n 19 bash "${SERVER_ARGV[@]}" || echo "== $script failed: its foreground call tries again"
   done) > "$OUT/prepare-in-background.log" 2>&1 &
  prepare_pid=$!
}

# run_suite regress|isolation: `make installcheck-regress` or
# `make installcheck-isolation` (the Makefile: the schedule run the PGXS way,
# as a packager runs it against any server) against the private cluster;
# each test recorded, the diffs of failed ones shown.
run_suite() {
  local name=$1 test result
  cpu_step_begin "$name"
  (cpu_enter "$CPU_STEP"
   export PGHOST="$(cluster_dir)" PGPORT="$IDEM_PORT" PGUSER=postgres
   slot_exec make -C "$ROOT" --no-print-directory "installcheck-$name" PG_CONFIG="$PG_CONFIG" REGRESS_OUT="$OUT") \
    > "$OUT/$name.log" 2>&1 || true
  # (No test result at all: the runner did not run; the suite fails.)
  if [ -z "$(regress_results "$OUT/$name.log")" ]; then record "$name/suite" 1; tail -20 "$OUT/$name.log"; fi
  while read -r test result; do
    echo "$name/$test ... $result"
    if [ "$result" = ok ]; then record "$name/$test" 0; else record "$name/$test" 1; fi
  done < <(regress_results "$OUT/$name.log")
  regress_diffs "$OUT/$name"
  step_done "$name" "$(cpu_step_end)"
}

# The 15 slowest steps of a full run, by wall time (which other streams on
# the machine inflate) and by CPU time (what the step's processes and, in
# the main line, the private cluster's server used; "-" where not known),
# the other majors' suites' steps among them, and the CPU of the whole run.
slowest_steps() { # times.tsv
  echo "the 15 slowest steps (wall and CPU seconds; all in $1):"
  sort -t$'\t' -k1,1rn "$1" | grep -v '(whole)' | sed -n 1,15p \
    | awk -F'\t' '{ printf "  %6s s wall  %8s s CPU  %s\n", $1, ($3 == "" ? "-" : $3), $2 }'
  awk -F'\t' '$2 ~ /\(whole\)$/ { printf "  (%s: %s s wall, %s s CPU)\n", $2, $1, ($3 == "" ? "-" : $3) }' "$1"
  if awk -F'\t' '$3 ~ /^[0-9]/ { found = 1 } END { exit !found }' "$1"; then
    echo "the 15 steps that used the most CPU:"
    awk -F'\t' '$3 ~ /^[0-9]/ && $2 !~ /\(whole\)$/' "$1" | sort -t$'\t' -k3,3rn | sed -n 1,15p \
      | awk -F'\t' '{ printf "  %8s s CPU  %6s s wall  %s\n", $3, $1, $2 }'
  fi
  [ -z "$CPU_RUN" ] || echo "CPU of the whole run: $(cpu_seconds "$CPU_RUN") s (wall $SECONDS s)"
}

# (a loop, not printf | grep -q, where a name on the list could read as
# absent: docs/development.md, Shell pipelines)
in_list() { # word list...
  local w=$1 x
  shift
  for x in "$@"; do [ "$x" != "$w" ] || return 0; done
  return 1
}

# A scenario is a file tests/scenarios/NAME.sh, or a function scenario_NAME
# in a file of several (tests/lib/scenarios.sh).
scenario_names() {
  local f names
  for f in "$ROOT"/tests/scenarios/*.sh; do
    names=$(sed -n 's/^scenario_\([a-z0-9_]*\)() {$/\1/p' "$f")
    if [ -n "$names" ]; then echo "$names"; else basename "$f" .sh; fi
  done | sort
}
scenario_file() { # name
  if [ -e "$ROOT/tests/scenarios/$1.sh" ]; then echo "$ROOT/tests/scenarios/$1.sh"; return; fi
  grep -l "^scenario_$1() {\$" "$ROOT"/tests/scenarios/*.sh 2> /dev/null | sed -n 1p || true
}

run_scenario() { # name
  local file
  say "scenario: $1"
  step_started=$SECONDS
  file=$(scenario_file "$1")
  # (a file of several gets the scenario's name; a file that is one
  # scenario, no argument)
  local args=("$1") cpu
  [ "$file" != "$ROOT/tests/scenarios/$1.sh" ] || args=()
  cpu_step_begin "scenario-$1"
  local rc=0
  if [ -z "$file" ]; then echo "no scenario $1" > "$OUT/scenario-$1.log"; rc=127
  else (cpu_enter "$CPU_STEP"; slot_exec bash "$file" "${args[@]}") > "$OUT/scenario-$1.log" 2>&1 || rc=$?; fi
  cpu=$(cpu_step_end)
  if [ "$rc" = 0 ]; then
    record "scenario/$1" 0; echo "ok ($((SECONDS - step_started)) s, CPU $cpu s)"
  else
    record "scenario/$1" 1; tail -30 "$OUT/scenario-$1.log"
    # (a scenario that ends under set -e says nothing itself: its status
    # does, 141 being a SIGPIPE, docs/development.md "Shell pipelines")
    echo "(scenario $1: exit status $rc$([ "$rc" -le 128 ] || echo ", signal $((rc - 128))"))"
  fi
  step_done "scenario/$1" "$cpu"
}

# A test (a scenario, pg_regress, isolation) runs holding one of
# IDEM_SLOTS (default 5; 0: no limit) slots of the machine, the same for
# this run's lines and for the other majors' runs it starts (the Debian 13
# root's too: the slots are files in /dev/shm, which in-trixie.sh binds
# there), so that at most that many run at once; the others wait for a
# slot. With every line and major at once (load averages of 60-110 on 2
# cores), a test took about three times the CPU it took on a quieter
# machine (the portable scenario 135-147 CPU s against 46-47, the
# environment matrix 104-160 against 42-50): servers and clients
# busy-waiting on locks whose holders were off the CPU, polling loops
# that ran longer. (The slot is held on a descriptor of this shell, which
# the test does not inherit: some of its children outlive it for a moment.
# Not `flock -n -E CODE FILE COMMAND`: a test that exited with CODE would
# read as a busy slot, and run again.)
SLOT_DIR=/dev/shm/idem-test-slots
slot_exec() { # command...: run it, holding a slot; its exit status
  local n=${IDEM_SLOTS:-5} i fd rc
  [ "$n" -gt 0 ] || { "$@"; return; }
  mkdir -p "$SLOT_DIR"
  while :; do
    for i in $(seq 1 "$n"); do
      exec {fd}>>"$SLOT_DIR/$i"
      if flock -n "$fd"; then
        rc=0
        "$@" {fd}>&- || rc=$?
        exec {fd}>&-
        return "$rc"
      fi
      exec {fd}>&-
    done
    sleep 1
  done
}

# What a run of test.sh runs, given its declarations (CORE_SCENARIOS,
# LANE_B, LONGEST_FIRST, IDEM_SUITE) and the names asked for (only): the
# second lane started with its scenarios, then pg_regress, isolation and
# the main line's scenarios, then the main line helps the lane. Each line
# takes the longest scenarios first (LONGEST_FIRST's order, the rest by
# name after them): the run ends when its last line does, and a line that
# ends on a long scenario leaves a core idle meanwhile.
run_lines() {
  local lane=() name
  if [ "${IDEM_LANES_SERIAL:-0}" != 1 ]; then
    for name in $(longest_first "${LANE_B[@]}"); do ! taken "$name" || lane+=("$name"); done
    [ ${#lane[@]} = 0 ] || lane_start "${lane[@]}"
  fi
  ! wanted regress || { say "pg_regress: SQL API (make installcheck-regress)"; run_suite regress; }
  ! wanted isolation || { say "pg_isolation_regress: concurrency (make installcheck-isolation)"; run_suite isolation; }
  for name in $(longest_first $(scenario_names)); do
    taken "$name" || continue
    [ ${#lane[@]} = 0 ] || ! in_list "$name" "${lane[@]}" || continue
    run_scenario "$name"
  done
  [ ${#lane[@]} = 0 ] || lane_help
}
longest_first() { # name...: these, those of LONGEST_FIRST first, in its order
  local name
  for name in "${LONGEST_FIRST[@]}"; do ! in_list "$name" "$@" || echo "$name"; done
  for name in "$@"; do in_list "$name" "${LONGEST_FIRST[@]}" || echo "$name"; done
}
wanted() { [ ${#only[@]} = 0 ] || in_list "$1" "${only[@]}"; } # name: asked for (or nothing was)
taken() { wanted "$1" && { [ "$IDEM_SUITE" != core ] || in_list "$1" "${CORE_SCENARIOS[@]}"; }; } # scenario: this run's

# The second lane: scenarios that use servers of their own only, taken
# one at a time from a queue (in the order given) by IDEM_LANE_B_WORKERS
# workers (default 2) beside the main line, each worker one after another;
# the main line takes from the same queue once its own scenarios are done
# (lane_help). Their scenarios' ports and folders are their own, so any two
# can run at once. The workers' output is shown, and their records counted,
# when they are done (suite_end).
lane_start() { # name...
  local w
  printf '%s\n' "$@" > "$OUT/lane-b.queue"
  : > "$OUT/lane-b.records"
  for w in $(seq 1 "${IDEM_LANE_B_WORKERS:-2}"); do
    (RECORDS="$OUT/lane-b.records"
     step_started=$SECONDS
     while name=$(lane_take); do run_scenario "$name"; done
    ) > "$OUT/lane-b-$w.out" 2>&1 &
    lane_pids+=($!)
  done
}
lane_take() { # the next scenario of the queue (status 1: none left)
  local name
  while [ -s "$OUT/lane-b.queue" ]; do
    name=$( (flock 9; head -1 "$OUT/lane-b.queue"; sed -i 1d "$OUT/lane-b.queue") 9> "$OUT/lane-b.lock")
    [ -z "$name" ] || [ -z "$(scenario_file "$name")" ] || { echo "$name"; return 0; }
  done
  return 1
}
lane_help() { # the main line: what is left in the queue
  # (their CPU without the private cluster's, which they do not use)
  local name CPU_CLUSTER=
  while name=$(lane_take); do run_scenario "$name"; done
}

# Another major's run of test.sh (IDEM_SUITE=core): its tests count here as
# LABEL/<test>, its steps' times are added with that prefix.
run_major() { # label command...
  local label=$1 log="$OUT/$1.log" t0=$SECONDS summary f
  shift
  cpu_step_begin "$label"
  (cpu_enter "$CPU_STEP"; exec "$@") > "$log" 2>&1 || true
  summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -1 || true)
  if [ -z "$summary" ]; then
    record "$label/suite" 1; tail -40 "$log"; return
  fi
  record_passed "${summary%% passed*}"
  while read -r f; do record "$label/$f" 1; done < <(sed -n 's/^failed: //p' "$log")
  echo "$label: $summary ($((SECONDS - t0)) s; log: $log)"
  local times="$ROOT/target/$label/test-out/times.tsv"
  [ ! -f "$times" ] || sed "s|\t|\t$label/|" "$times" >> "$OUT/times.tsv"
  step_done "$label(whole)" "$(cpu_step_end)"
}
# A step that passes or fails as one test, its output in LOG.
run_recorded() { # name log command...
  local name=$1 log=$2
  shift 2
  cpu_step_begin "$name"
  if (cpu_enter "$CPU_STEP"; exec "$@") > "$log" 2>&1; then record "$name" 0; tail -3 "$log"; else record "$name" 1; tail -30 "$log"; fi
  step_done "$name" "$(cpu_step_end)"
}

# The #[pg_test] units: `cargo pgrx test` installs a build with the test
# functions into the server it runs, here a private copy of Debian's 15
# (tests/servers/pg15-copy.sh; its own pgrx configuration and cargo target
# folder), so that they run beside the suite, whose scenarios use the
# build installed into Debian's 15.
# (The copy, pgrx's configuration naming it and the run, all under the
# units' build lock: another checkout's units may refresh the copy.)
# (The configuration is written only when it changes: pgrx-pg-sys's build
# script runs bindgen again, and pgrx-pg-sys, pgrx, pgrx-tests and idem
# compile again, in both of cargo pgrx test's builds, whenever that file is
# newer than its last run.)
# (Built without debug information, CARGO_PROFILE_DEV_DEBUG=0: a failing
# unit names its assertion's file and line all the same, and the two builds
# take about a tenth less CPU, 197 against 218 CPU s from nothing.)
units_on_copy() { # pgdata
  local copy config
  copy=$(bash "$ROOT/tests/servers/pg15-copy.sh") || return 1
  mkdir -p "$PGRX_HOME"
  config=$(printf '[configs]\npg15 = "%s"' "$copy")
  [ "$(cat "$PGRX_HOME/config.toml" 2>/dev/null)" = "$config" ] || echo "$config" > "$PGRX_HOME/config.toml"
  cargo pgrx test pg15 --runas postgres --pgdata "$1"
}
major_pg_test() {
  local line name
  say "#[pg_test] units (cargo pgrx test, on a private copy of PostgreSQL 15)"
  PGRX_DATA="$(cluster_dir)/pgrx-test"
  mkdir -p "$PGRX_DATA"
  chown postgres:postgres "$PGRX_DATA"
  cpu_step_begin pg_test
  if (cpu_enter "$CPU_STEP" && cd "$ROOT" && export PGRX_HOME="$IDEM_CACHE/pgrx-units" CARGO_TARGET_DIR="$IDEM_CACHE/cargo-target/pg15-units" \
        CARGO_PROFILE_DEV_DEBUG=0 IDEM_SEED_FROM= &&
      idem_build "$ROOT" units_on_copy "$PGRX_DATA/data") > "$OUT/pg_test.log" 2>&1; then :; fi
  grep -E "^test .* \.\.\. (ok|FAILED)" "$OUT/pg_test.log" || tail -40 "$OUT/pg_test.log"
  while read -r line; do
    name=$(echo "$line" | awk '{print $2}')
    if grep -q "\.\.\. ok$" <<<"$line"; then record "pg_test/$name" 0; else record "pg_test/$name" 1; fi
  done < <(grep -E "^test .* \.\.\. (ok|FAILED)" "$OUT/pg_test.log")
  grep -q "test result: ok" "$OUT/pg_test.log" || record "pg_test/suite" 1
  step_done "pg_test(build, run)" "$(cpu_step_end)"
}

# The units and the other majors run side by side with the PostgreSQL 15
# suite and with each other (IDEM_MAJORS_SERIAL=1: one after another,
# before the 15 suite): each is a separate server, build, cluster and set
# of ports (major_port), and much of a test is spent waiting (locks,
# fsyncs, sessions waiting on each other, pg_cron's minute), which leaves
# the CPU to the others; how many tests run at once is slot_exec's (below).
# Each job writes its output and records to files,
# shown and counted at the end in the order given (the units first).
# (A job that stops half-way, a command failing under set -e, counts as a
# failure: its remaining tests would otherwise go unrecorded.)
major_job() { # job: its output in $OUT/major-JOB.out, its records in $OUT/major-JOB.records
  : > "$OUT/major-$1.records"
  (RECORDS="$OUT/major-$1.records"; "major_$1") > "$OUT/major-$1.out" 2>&1 \
    || echo "record $1/job-stopped 1" >> "$OUT/major-$1.records"
}
jobs_start() { # job...
  local major beside
  [ "${IDEM_MAJORS_SERIAL:-0}" = 1 ] || beside=', beside the PostgreSQL 15 suite'
  for major in "$@"; do
    declare -F "major_$major" >/dev/null || { echo "IDEM_MAJORS: no PostgreSQL $major here"; record "pg$major/unknown" 1; continue; }
    if [ "$major" = pg_test ]; then say "#[pg_test] units${beside:-}"
    else say "PostgreSQL $major: the core suite${beside:-}"; fi
    if [ "${IDEM_MAJORS_SERIAL:-0}" = 1 ]; then major_job "$major"; else major_job "$major" & job_pids+=($!); fi
    jobs_started+=("$major")
  done
}

suite_end() { # full|core
  local pid major
  if [ ${#lane_pids[@]} -gt 0 ]; then
    local w
    for w in "${!lane_pids[@]}"; do
      wait "${lane_pids[$w]}" || echo "record lane-b/stopped 1" >> "$OUT/lane-b.records"
      cat "$OUT/lane-b-$((w + 1)).out"
    done
    count_records "$OUT/lane-b.records"
  fi
  for pid in "${job_pids[@]}"; do wait "$pid" || true; done
  for major in "${jobs_started[@]}"; do
    cat "$OUT/major-$major.out"
    count_records "$OUT/major-$major.records"
  done
  [ -z "$prepare_pid" ] || wait "$prepare_pid" || true
  echo
  if [ "$1" = full ] && [ -f "$OUT/times.tsv" ]; then slowest_steps "$OUT/times.tsv"; fi
  if [ ${#failures[@]} -gt 0 ]; then printf 'failed: %s\n' "${failures[@]}"; fi
  echo "${passed} passed, ${failed} failed"
  [ "$failed" = 0 ] && [ "$passed" -gt 0 ]
}

# The one way the tests run pg_regress and pg_isolation_regress: scripts/test.sh,
# scripts/check.sh and the scenarios that run the schedules again
# (storage_sql, environments, portable, Citus), which source this file for it.
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
