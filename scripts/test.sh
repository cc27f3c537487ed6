#!/usr/bin/env bash
# The whole test suite, on a fresh Debian 12 machine as root:
#   bash scripts/test.sh
# Installs what is missing (scripts/setup.sh --tests: also the tests' own
# tools), builds, starts the private cluster and runs every level on
# PostgreSQL 15: #[pg_test] units, pg_regress, pg_isolation_regress, every
# scenario in tests/scenarios/ (in two lanes: LANE_B below). Beside it, the
# core of the suite again on PostgreSQL 18 (built from Debian sid's source,
# cached), on PostgreSQL 17 in a Debian 13 root (cached) and on PostgreSQL
# 16.2 (PyPI's pgserver wheel, cached), and pg_upgrade from 15 to 18. Ends
# with "N passed, N failed". The machinery is tests/lib/suite.sh.
#
#   bash scripts/test.sh TEST...   only these on this PostgreSQL (regress,
#                     isolation, scenario names), no other major, no units
#   IDEM_SUITE=core   only the core (what runs on the other majors): pg_regress
#                     and isolation, the scenarios in CORE_SCENARIOS below
#   IDEM_MAJORS="16 17 18" (default) / "" : which other majors a full run covers
#                     (side by side; IDEM_MAJORS_SERIAL=1: one after another)
#   IDEM_LANES_SERIAL=1  all scenarios in one line (no second lane: LANE_B below)
#   IDEM_SLOTS=N      at most N tests at once on the machine, all majors (default 5; 0: no limit)
#   IDEM_SETUP=0      skip scripts/setup.sh (what it installs is there already)
# Another PostgreSQL: PG_CONFIG=/path/to/pg_config bash scripts/test.sh
# (see lib.sh; its own cluster, port and target/pgNN/test-out).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$ROOT/tests/lib/suite.sh"
IDEM_SUITE="${IDEM_SUITE:-full}"
IDEM_MAJORS="${IDEM_MAJORS-16 17 18}"
# The core: both storage paths' suites (storage_sql), the hardening matrix
# (environments, encodings, catalog_events, two_phase), the upgrade from
# every shipped version, the stress scenario at the suite's size, and the
# portable edition on a pg_tle server of the same major, compared with the
# native edition (portable).
CORE_SCENARIOS=(storage_sql environments encodings catalog_events two_phase upgrade stress wraparound retention portable)
# The scenarios that use only servers of their own (no database of the
# shared cluster, no write into this PostgreSQL's installed files; each its
# own ports and folders): a second lane, two workers taking them from a
# queue (IDEM_LANE_B_WORKERS), beside pg_regress, isolation and the other
# scenarios, which share the private cluster and change its settings (the
# storage path, roles, pg_cron's database) and so stay in one line, which
# then helps with the queue. In the core suite too (on the other majors:
# environments, storage_sql, retention, wraparound and portable beside the rest).
LANE_B=(backtraces bench_smoke citus crash dashboard environments failover hot_standby java_spring logical metrics middleware_go
        middleware_node middleware_python package pgbouncer pgxn plproxy portable portable_move portable_update prometheus
        retention sql_exporter sqlstates storage_sql wraparound)
# The longest scenarios, taken first in each line (run_lines in suite.sh),
# by their CPU and wall in the runs before (a full run's summary lists both).
LONGEST_FIRST=(portable citus java_spring environments middleware_python bench_smoke middleware_node storage_sql
               middleware_go logical stress hostile_input hot_standby retention crash failover)
# What each other major needs built (tests/servers/, in the background while
# 15 runs), and its job: its core suite, and what runs only there.
declare -A PREPARE=([16]="pg16.sh" [17]="debian-root.sh:trixie" [18]="pg18.sh pg15-upstream.sh")
major_18() {
  say "PostgreSQL 18: the core suite (tests/servers/pg18.sh builds it once, cached)"
  pg18=$(bash "$ROOT/tests/servers/pg18.sh" 2> "$OUT/pg18-build.log") \
    || { record "pg18/build" 1; record "pg_upgrade/15-to-18" 1; tail -20 "$OUT/pg18-build.log"; return; }
  run_major pg18 env PG_CONFIG="$pg18" IDEM_SUITE=core bash "$ROOT/scripts/test.sh"
  # (after 18's core suite, which installs idem into 18)
  say "pg_upgrade from PostgreSQL 15 to 18 with live claims"
  run_recorded pg_upgrade/15-to-18 "$OUT/pg_upgrade.log" env PG18_CONFIG="$pg18" bash "$ROOT/tests/versions/majors.sh" pg_upgrade
}
major_17() {
  say "PostgreSQL 17 on Debian 13: the core suite (tests/servers/debian-root.sh makes the root once, cached)"
  bash "$ROOT/tests/servers/debian-root.sh" trixie > "$OUT/trixie-build.log" 2>&1 || { record "pg17/root" 1; tail -20 "$OUT/trixie-build.log"; return; }
  run_major pg17 bash "$ROOT/tests/servers/in-trixie.sh" env IDEM_SUITE=core bash "$ROOT/scripts/test.sh"
  bash "$ROOT/tests/servers/in-trixie.sh" bash "$ROOT/scripts/cluster.sh" stop > /dev/null 2>&1 || true
  say "PostgreSQL 17 on Debian 13: the postgresql-17-idem package, built, installed, used and purged"
  run_recorded pg17/package_debian13 "$OUT/package_debian13.log" bash "$ROOT/tests/servers/in-trixie.sh" bash "$ROOT/tests/versions/majors.sh" package_debian13
}
major_16() {
  say "PostgreSQL 16: the core suite (tests/servers/pg16.sh unpacks 16.2 from PyPI's pgserver wheel once, cached)"
  pg16=$(bash "$ROOT/tests/servers/pg16.sh" 2> "$OUT/pg16-unpack.log") || { record "pg16/unpack" 1; tail -20 "$OUT/pg16-unpack.log"; return; }
  run_major pg16 env PG_CONFIG="$pg16" IDEM_SUITE=core bash "$ROOT/scripts/test.sh"
  # No compiler warning in idem's build for 16 (cargo repeats a cached build's warnings).
  if grep -q "^warning" "$OUT/pg16.log"; then record "pg16/no_build_warnings" 1; grep -m20 "^warning" "$OUT/pg16.log"
  else record "pg16/no_build_warnings" 0; fi
  # (stopped, as 17's: pg16.sh does not swap in a new tree under a running server)
  PG_CONFIG="$pg16" bash "$ROOT/scripts/cluster.sh" stop > /dev/null 2>&1 || true
}

cpu_begin
[ "${IDEM_SETUP:-1}" = 0 ] || bash "$ROOT/scripts/setup.sh" --tests
idem_locate_cluster
CPU_CLUSTER=$(cpu_group cluster)
(cpu_enter "$CPU_CLUSTER"; exec bash "$ROOT/scripts/cluster.sh" start)
suite_begin
step_done setup-and-cluster "$(cpu_seconds "${CPU_RUN:-none}")"
only=("$@")
if [ "$IDEM_SUITE" = full ] && [ ${#only[@]} = 0 ]; then
  prepare=(debian-root.sh:bookworm)
  for major in $IDEM_MAJORS; do prepare+=(${PREPARE[$major]:-}); done
  prepare_servers "${prepare[@]}"
  jobs_start pg_test $IDEM_MAJORS
fi
run_lines
suite_end "$IDEM_SUITE"
