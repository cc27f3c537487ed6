#!/usr/bin/env bash
# Operations: the demo, the docs' SQL, pg_cron maintenance, partition rotation, the benchmark's smoke run.
# One scenario per function: bash tests/scenarios/operations.sh NAME (NAME: bench_smoke, cron, cron_completer, demo, docs_sql, rotation);
# scripts/test.sh runs each as scenario/NAME (tests/lib/scenarios.sh).
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/scenarios.sh"

# The benchmark runs end to end on tiny sizes: every section once, from a
# fresh checkout (its own cluster, every variant, the report). No timing is
# asserted (that is the benchmark's job, on a quiet machine); what is checked
# is that each section measured and reported, and the outcomes that do not
# depend on timing: a killed client's claim loses no work and does none
# twice, and a duplicate claim writes no WAL and takes no xid.
scenario_bench_smoke() {
out="$ROOT/target/bench-smoke"
rm -rf "$out"
bash "$ROOT/bench/run.sh" --smoke --out "$out"
for f in raw.json results.csv results.json report.md tps.svg; do
  [ -s "$out/$f" ] || { echo "FAIL: bench/run.sh --smoke wrote no $f"; exit 1; }
done
python3 - "$out/results.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
fails = []
check = lambda ok, msg: ok or fails.append(msg)
sections = "matrix wal bytes sustained scale cleanup ttl handwritten kills portable batch".split()
check(r["meta"]["sections"] == sections, f"sections run: {r['meta']['sections']}")
check(not r["errors"], f"errors: {r['errors']}")
for s in sections + ["ratios", "latency"]:
    check(r["summary"].get(s), f"no summary of {s} in results.json")
for v in "B0 B1 B1r B2 I1 I1c I1f I2 I3".split():
    check(v in (r["summary"].get("matrix") or {}).get("off/2", {}), f"no matrix measurement of {v}")
for ratio in ("I1/B1", "I1c/B1", "I2/B1r", "I3/I1"):
    check(ratio in (r["summary"].get("ratios") or {}), f"no ratio {ratio}")
check(len(r["targets"]) >= 20, f"{len(r['targets'])} targets reported")
for prefix in ("kills:", "I3 (duplicate) writes 0 WAL", "portable: I3 writes 0 WAL"):
    t = [t for t in r["targets"] if t["target"].startswith(prefix)]
    check(t and t[0]["status"] == "PASS", f"target {prefix!r}: {t}")
print("\n".join(f"FAIL: {f}" for f in fails) or f"{len(r['targets'])} targets reported, every section measured")
sys.exit(1 if fails else 0)
PY
grep -q "^## Targets" "$out/report.md" || { echo "FAIL: report.md has no targets table"; exit 1; }
echo ok
}

# pg_cron for real: the test cluster preloads Debian's pg_cron (1.4), whose
# database is idem_cron. idem_schedule_maintenance registers one job; we wait
# for pg_cron to run it and check that the run did maintenance (dropped the
# partitions that expired since scheduling) and that pg_cron saw it succeed.
scenario_cron() {
db=idem_cron
grep -q 1 <<<"$(psql_idem -q -d postgres -tc "SELECT 1 FROM pg_database WHERE datname = '$db'")" \
  || psql_idem -q -d postgres -c "CREATE DATABASE $db"
psql_idem -q -d $db <<'SQL'
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS idem CASCADE;
CREATE EXTENSION IF NOT EXISTS pg_cron;
SELECT cron.unschedule(jobid) FROM cron.job WHERE jobname = 'idem_maintain';
DELETE FROM cron.job_run_details;
-- one-second partitions and short TTLs, so that a minute later there is
-- plenty to drop; pg_cron's sessions read these database settings too
ALTER DATABASE idem_cron SET idem.partition_width = '1 second';
ALTER DATABASE idem_cron SET idem.default_ttl = '2 seconds';
CREATE EXTENSION idem;
SQL
psql_idem -d $db -v ON_ERROR_STOP=1 <<'SQL'
-- scheduling twice under one name updates the job, and runs maintenance once now
SELECT idem_schedule_maintenance('*/5 * * * *') AS job \gset
SELECT idem_schedule_maintenance('* * * * *') = :job AS same_job;
SELECT schedule, command, active FROM cron.job WHERE jobname = 'idem_maintain';
SELECT count(*) AS job_count FROM cron.job WHERE jobname = 'idem_maintain';
SELECT claimed FROM idem_claim('order-1', 'cron.test');
SQL
scheduled_at=$(psql_idem -d $db -Atc "SELECT now()")
echo "waiting for pg_cron to run the job (it fires at the start of each minute)"
ok=0
for i in $(seq 1 150); do
  n=$(psql_idem -d $db -Atc "SELECT count(*) FROM cron.job_run_details d JOIN cron.job j USING (jobid)
                              WHERE j.jobname = 'idem_maintain' AND d.status = 'succeeded'
                                AND d.start_time > '$scheduled_at'")
  if [ "$n" -ge 1 ]; then ok=1; break; fi
  sleep 1
done
psql_idem -d $db -c "SELECT status, return_message, command FROM cron.job_run_details ORDER BY start_time DESC LIMIT 3"
[ $ok = 1 ] || { echo "FAIL: pg_cron did not run idem_maintain within 150 s"; exit 1; }
# the cron run left its report; it dropped the partitions that expired in between
dropped=$(psql_idem -d $db -Atc "SELECT jsonb_array_length(report->'partitions_dropped') FROM idem.maintenance_runs
                                  WHERE started_at > '$scheduled_at' ORDER BY run_id DESC LIMIT 1")
echo "partitions dropped by the cron run: $dropped"
[ -n "$dropped" ] && [ "$dropped" -ge 1 ] || { echo "FAIL: the cron run did no maintenance"; exit 1; }
psql_idem -q -d $db -c "SELECT cron.unschedule('idem_maintain')" >/dev/null
echo "ok"
}

# The completer recipe of docs/patterns.md ("A completer for leases nobody
# came back for") under pg_cron, run from its documented blocks as they are
# written (tests/docs/sql_blocks.py block): the superuser's set-up of the
# role that owns the type, the queue and procedures created by that role,
# and the job scheduled by it, twice (the second time under another name):
# two schedulers at once, each running as charge_owner, not a superuser.
# 150 leases of the type are run out (idem_release). So that both runs are
# surely under way at once, the test holds a SHARE lock on the queue
# table while the jobs start: each takes its leases over, then waits at its
# first INSERT; once two runs wait there (pg_locks: a state, not a clock)
# the lock goes and both commit. Verdicts: both runs succeeded, as
# charge_owner; each of the 150 leases was handed to redrive_charge exactly
# once (one queue row per key, attempt 2; rows of both runs), and every
# lease is running again (attempt 2, none run out). Both editions, one
# after the other, in the cluster's pg_cron database (each waits for
# pg_cron's next minute). Skipped on a PostgreSQL without pg_cron.
scenario_cron_completer() {
if [ ! -f "$("$PG_CONFIG" --pkglibdir)/pg_cron.so" ]; then
  echo "skipped: no pg_cron for PostgreSQL $PG_MAJOR here (scripts/cluster.sh runs its cluster without it)"
  exit 0
fi
[ "$(psql_idem -d postgres -Atc "SELECT current_setting('shared_preload_libraries') ~ 'pg_cron'")" = t ] \
  || { echo "FAIL: the test cluster does not preload pg_cron (bash scripts/cluster.sh start turns it on)"; exit 1; }
db=$(psql_idem -d postgres -Atc "SHOW cron.database_name")
heading="A completer for leases nobody came back for"
block() { python3 "$ROOT/tests/docs/sql_blocks.py" block "$ROOT/docs/patterns.md" "$heading" "$1"; }
recipe=$(block 1) setup=$(block 2) schedule=$(block 3)
grep -q "cron.schedule('charge-completer'" <<< "$schedule" || { echo "FAIL: the documented schedule is not where it was: $schedule"; exit 1; }
work="$IDEM_TARGET/cron_completer"
rm -rf "$work"; mkdir -p "$work"
python3 "$ROOT/scripts/portable.py" --out "$work/dist" > /dev/null
export PGHOST="$(cluster_dir)" PGPORT="$IDEM_PORT"
as_owner() { "$PG_BIN/psql" -X -v ON_ERROR_STOP=1 -h "$(cluster_dir)" -p "$IDEM_PORT" -U charge_owner -d "$db" "$@"; }
# Leaves the cron database without idem, the jobs, the role or the
# database settings the cron scenario gives it (a 2-second default TTL,
# under which the recipe's 1-hour leases are refused).
reset_db() {
  psql_idem -q -d "$db" > /dev/null <<SQL
SET client_min_messages = warning;
ALTER DATABASE "$db" RESET ALL;
SELECT cron.unschedule(jobid) FROM cron.job WHERE jobname LIKE 'charge-completer%';
DROP SCHEMA IF EXISTS charge_owner CASCADE;
DROP EXTENSION IF EXISTS idem CASCADE;
SQL
  if [ -n "$(psql_idem -d "$db" -Atc "SELECT 1 FROM pg_namespace WHERE nspname = 'idem'")" ]; then
    psql_idem -q -d "$db" -f "$work/dist/idem_portable_uninstall.sql" > /dev/null
  fi
  psql_idem -q -d "$db" -c "SET client_min_messages = warning" \
    -c "DO \$\$ BEGIN IF to_regrole('charge_owner') IS NOT NULL THEN DROP OWNED BY charge_owner; DROP ROLE charge_owner; END IF; END \$\$"
}
trap reset_db EXIT
grep -q 1 <<<"$(psql_idem -q -d postgres -tc "SELECT 1 FROM pg_database WHERE datname = '$db'")" \
  || psql_idem -q -d postgres -c "CREATE DATABASE $db"
psql_idem -q -d "$db" -c "SET client_min_messages = warning" -c "CREATE EXTENSION IF NOT EXISTS pg_cron"

for edition in native portable; do
  say "$edition edition"
  reset_db
  if [ $edition = native ]; then psql_idem -q -d "$db" -c "CREATE EXTENSION idem"
  else psql_idem -q -d "$db" -f "$work/dist/idem_portable.sql" > /dev/null; fi
  # The documented blocks: the superuser's set-up, then the recipe as the role.
  echo "$setup" | psql_idem -q -d "$db" > /dev/null
  echo "$recipe" | as_owner -q
  as_owner -q -c "SELECT count(*) FROM (SELECT idem_release(k, 'charge', (SELECT result->>'lease_token'
                    FROM idem_claim(k, 'charge', lease => '1 hour'))) FROM generate_series(1, 150) g, format('order-%s', g) k) r" > /dev/null
  expect "$edition: run-out leases before the jobs" \
    "$(psql_idem -d "$db" -Atc "SELECT count(*) FILTER (WHERE ran_out) FROM idem_leases WHERE biz_type = 'charge'")" 150
  # Two jobs, both held at the queue until both run; then let go.
  "$IDEM_PY" - "$db" "$schedule" <<'PY' || fail "$edition: the two jobs did not run as they should"
import sys, time
import psycopg
db, schedule = sys.argv[1:]
lock = psycopg.connect(dbname=db, user="postgres")
lock.execute("LOCK TABLE charge_owner.charge_redrives IN SHARE MODE")
with psycopg.connect(dbname=db, user="charge_owner", autocommit=True) as owner:
    owner.execute(schedule)
    owner.execute(schedule.replace("'charge-completer'", "'charge-completer-2'"))
    jobs = [r[0] for r in owner.execute("SELECT jobid FROM cron.job WHERE jobname LIKE 'charge-completer%' AND username = 'charge_owner'")]
    print(f"two jobs scheduled as charge_owner: {len(jobs) == 2}; waiting for pg_cron's next minute", flush=True)
    watch = psycopg.connect(dbname=db, user="postgres", autocommit=True)
    waiting = 0
    for _ in range(1500):  # a bound, not a verdict: the state decides
        waiting = watch.execute("SELECT count(*) FROM pg_locks WHERE NOT granted"
                                "   AND relation = 'charge_owner.charge_redrives'::regclass").fetchone()[0]
        if waiting >= 2:
            break
        time.sleep(0.1)
    print(f"completer runs waiting at the queue at once: {waiting}", flush=True)
    lock.rollback()
    states = []
    for _ in range(600):
        states = watch.execute("SELECT status, username FROM cron.job_run_details WHERE jobid = ANY(%s)"
                               " AND status IN ('succeeded', 'failed')", (jobs,)).fetchall()
        if len(states) >= 2:
            break
        time.sleep(0.1)
    for r in watch.execute("SELECT jobid, status, username, return_message FROM cron.job_run_details WHERE jobid = ANY(%s)", (jobs,)):
        print("  run:", *r, flush=True)
    for j in jobs:
        owner.execute("SELECT cron.unschedule(%s)", (j,))
    sys.exit(0 if len(jobs) == 2 and waiting == 2 and len(states) >= 2 and all(s == ("succeeded", "charge_owner") for s in states) else 1)
PY
  expect "$edition: leases handed to redrive_charge (queue rows, distinct keys, attempts)" \
    "$(psql_idem -d "$db" -Atc "SELECT format('%s %s %s', count(*), count(DISTINCT key), string_agg(DISTINCT attempt::text, ',')) FROM charge_owner.charge_redrives")" \
    "150 150 2"
  # (max_leases is 100: the first run cannot take all 150, so the second
  # took some too; the rows of two transactions)
  expect "$edition: runs that wrote queue rows" \
    "$(psql_idem -d "$db" -Atc "SELECT count(DISTINCT xmin::text) FROM charge_owner.charge_redrives")" 2
  expect "$edition: every lease running again as attempt 2 (none run out, none taken twice)" \
    "$(psql_idem -d "$db" -Atc "SELECT format('%s %s %s', count(*), count(*) FILTER (WHERE ran_out), string_agg(DISTINCT attempt::text, ',')) FROM idem_leases WHERE biz_type = 'charge'")" \
    "150 0 2"
done
finish cron_completer
}

# The README's demo plays to the end on the test cluster: scripts/demo.sh
# without its set-up (DEMO_SKIP_SETUP=1: the build under test is installed
# already), so that a change to idem that breaks what the demo shows (a
# payment replayed, ID001, a key that expires and is claimed again, the
# pg_cron job that drops the expired partition) fails the suite. The demo
# itself waits for each state it shows and exits non-zero when one does not
# come. It plays in the cluster's pg_cron database (idem_cron, as the cron
# scenario) and waits for pg_cron's next minute; its job is unscheduled
# afterwards so that it does not run under the scenarios after it.
scenario_demo() {
[ "$(psql_idem -d postgres -Atc "SELECT current_setting('shared_preload_libraries') ~ 'pg_cron'")" = t ] \
  || { echo "FAIL: the test cluster does not preload pg_cron (bash scripts/cluster.sh start turns it on once postgresql-15-cron is installed)"; exit 1; }
db=$(psql_idem -d postgres -Atc "SHOW cron.database_name")
unschedule() {
  psql_idem -q -d "$db" -c "SELECT cron.unschedule(jobid) FROM cron.job WHERE jobname = 'idem_maintain'" >/dev/null 2>&1 || true
}
trap unschedule EXIT
out="$IDEM_TARGET/test-out/demo.log"
mkdir -p "$(dirname "$out")"
if ! DEMO_SKIP_SETUP=1 bash "$ROOT/scripts/demo.sh" > "$out" 2>&1; then
  tail -40 "$out"; echo "FAIL: the demo did not play to the end (log: $out)"; exit 1
fi
sed 's/\x1b\[[0-9;]*m//g' "$out" | grep -E '^==>|^== ' | sed 's/^/  /'
fails=0
check() { # WHAT PATTERN: the demo's output shows it
  if grep -qE "$2" "$out"; then echo "ok: $1"; else echo "FAIL: the demo's output lacks $1"; fails=$((fails + 1)); fi
}
check "the retry's replayed answer" 'duplicate of a request first seen at'
check "ID001 for a reused key" 'first claimed with a different fingerprint'
check "the card charged once" '^ +1 \| A-1001 +\| +2500$'
check "the expired key claimed again" 'Expired: the same key can be claimed again'
check "the expired claim's partition dropped" '^ +[0-9]+ \| t$'
gone=$(grep -A2 -E '^ +is_it_still_there *$' "$out" | tail -1 | tr -d ' ')
if [ "$gone" = 0 ]; then echo "ok: the partition gone"; else echo "FAIL: the demo's partition check shows '$gone', not 0"; fails=$((fails + 1)); fi
check "the end" 'maintenance dropped its partition'
if grep -q 'the claim is in the default partition' "$out"; then
  echo "FAIL: the demo's new claim went to the default partition, so the partition dropped is not the one that held it"; fails=$((fails + 1))
else echo "ok: the partition dropped is the one that held the claim"; fi
# The README's follow-up, as it is written: psql into the demo's database,
# wherever the cluster lives (under the checkout, or /tmp for a checkout
# under /root).
charged=$(bash "$ROOT/scripts/cluster.sh" psql "$db" -X -Atc "SELECT count(*) FROM charges WHERE order_no = 'A-1001'" 2>&1 || true)
if [ "$charged" = 1 ]; then echo "ok: bash scripts/cluster.sh psql $db reaches the demo's database"
else echo "FAIL: bash scripts/cluster.sh psql $db answered '$charged', not the demo's one charge"; fails=$((fails + 1)); fi
echo "demo checks failed: $fails"
[ "$fails" = 0 ]
}

# The SQL in the documentation runs. Every fenced block whose info string is
# `sql` in README.md, docs/*.md and examples/*.md is run, file by file, in a
# fresh database with CREATE EXTENSION idem, in order, in one psql session
# with ON_ERROR_STOP; a failure names the file and line. `sql norun` blocks
# are shown only (other engines, placeholders, pg_cron: this cluster's cron
# database is idem_cron, which belongs to the cron scenario); `sql error`
# blocks must raise an error (`sql error ID001`: that SQLSTATE).
# tests/docs/sql_blocks.py does the parsing and the line mapping. Then
# tests/docs/names.py: every idem.* setting and SQLSTATE the pages name
# exists (pg_settings with the library loaded; idem's objects; the README's
# SQLSTATE table, src/errors.rs or PostgreSQL's codes). And tests/docs/paths.py:
# the files, links, `bash …` and `make …` commands and the project layout
# that README.md and docs/development.md name exist. And tests/docs/rules.py:
# every restatement of the input rules (TTL range, default TTL, partition
# width, biz_type pattern, key length) in sql/, portable/ and the README
# agrees with its one home in src/. And tests/docs/pipelines.py: no pipeline
# in the shell code ends in a reader that may stop early (docs/development.md,
# Shell pipelines).
scenario_docs_sql() {
export PGHOST="$(cluster_dir)" PGPORT="$IDEM_PORT" PGUSER=postgres PG_BIN
export DOC_LOG="$ROOT/target/docs_sql.log"
mkdir -p "$ROOT/target"
: > "$DOC_LOG"
helper="$ROOT/tests/docs/sql_blocks.py"

# Docs may create roles (grants examples); roles are cluster-wide, so the
# ones that did not exist before this run are dropped after it.
roles_before=$(psql_idem -d postgres -Atc "SELECT string_agg(quote_literal(rolname), ',') FROM pg_roles")
dbs=()
drop_new_roles() {
  psql_idem -q -d postgres -Atc "SELECT format('DROP ROLE %I;', rolname) FROM pg_roles
                                 WHERE rolname NOT IN ($roles_before)" \
    | psql_idem -q -d postgres
}
cleanup() {
  for db in "${dbs[@]}"; do
    psql_idem -q -d postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" || true
  done
  drop_new_roles || true
}
trap cleanup EXIT

files=0 runnable=0 failed=0
for md in "$ROOT"/README.md "$ROOT"/docs/*.md "$ROOT"/examples/*.md; do
  [ -f "$md" ] || continue
  rel=${md#"$ROOT"/}
  read -r n_run n_norun n_error n_bad < <(python3 "$helper" count "$md")
  [ $((n_run + n_norun + n_error + n_bad)) -gt 0 ] || continue
  files=$((files + 1))
  runnable=$((runnable + n_run + n_error))
  slug=$(echo "$rel" | tr 'A-Z' 'a-z' | sed -E 's/\.md$//; s/[^a-z0-9]+/_/g')
  db="doc_${slug}"
  dbs+=("$db")
  psql_idem -q -d postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
  psql_idem -q -d "$db" -c "CREATE EXTENSION idem"
  say "$rel (database $db)"
  # Relative paths in messages: the reader's editor opens README.md:42.
  if ! (cd "$ROOT" && python3 "$helper" run "$rel" "$db"); then failed=$((failed + 1)); fi
  # Drop the database, then the roles its docs created: the next file may
  # create roles of the same names.
  psql_idem -q -d postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"
  drop_new_roles
done

# The settings and SQLSTATEs the pages name exist (tests/docs/names.py).
say "settings and SQLSTATEs named in the docs"
dbs+=(doc_names)
psql_idem -q -d postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS doc_names WITH (FORCE)" -c "CREATE DATABASE doc_names"
psql_idem -q -d doc_names -c "CREATE EXTENSION idem"
PG_CONFIG="$PG_CONFIG" python3 "$ROOT/tests/docs/names.py" "$ROOT" doc_names || failed=$((failed + 1))

say "files, links and commands named in the README and the development guide"
python3 "$ROOT/tests/docs/paths.py" "$ROOT" || failed=$((failed + 1))

say "the input rules restated in SQL and the README agree with src/"
python3 "$ROOT/tests/docs/rules.py" "$ROOT" || failed=$((failed + 1))

say "no shell pipeline into a reader that may stop early (SIGPIPE under pipefail)"
python3 "$ROOT/tests/docs/pipelines.py" "$ROOT" || failed=$((failed + 1))

echo
echo "$files files with sql blocks, $runnable blocks to run, $failed files failed (psql output: $DOC_LOG)"
# The README has runnable examples; finding none means the parser broke.
[ "$runnable" -gt 0 ] || { echo "FAIL: no runnable sql block found"; exit 1; }
[ "$failed" = 0 ]
}

# Hundreds of partition rotations (250, at 100 ms partitions and a 1 s TTL:
# about half a minute), with claims and maintenance committed separately, as in production.
# Proves: no live claim is lost across rotations, storage stays bounded and
# the catalog does not grow.
scenario_rotation() {
report="$IDEM_TARGET/test-out/rotation.out"   # (per checkout and major, not /tmp: runs go side by side)
mkdir -p "$(dirname "$report")"
db=idem_rotation
psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
psql_idem -q -d $db <<'SQL'
CREATE EXTENSION idem;
ALTER DATABASE idem_rotation SET idem.partition_width = '100 milliseconds';
ALTER DATABASE idem_rotation SET idem.default_ttl = '1 second';
SELECT idem_configure('rot', '1 second');
CREATE TABLE rot_log (it int, dropped int, live_checked int, lost int, partitions int, idem_relations int, idem_bytes bigint);
CREATE TABLE claimed (key text PRIMARY KEY, expires_at timestamptz);
CREATE PROCEDURE rotate(rotations int, max_iterations int) LANGUAGE plpgsql AS $$
DECLARE
  lost int; checked int; k text; r record; rep jsonb; it int := 0; dropped_total int := 0;
BEGIN
  -- Until enough partitions have rotated out (the count per second depends
  -- on the machine's speed, not the test's).
  WHILE dropped_total < rotations AND it < max_iterations LOOP
    it := it + 1;
    -- ten new claims, committed
    INSERT INTO claimed SELECT 'it' || it || '-' || g, (idem_claim('it' || it || '-' || g, 'rot')).expires_at
      FROM generate_series(1, 10) g;
    COMMIT;
    rep := idem_maintain();
    dropped_total := dropped_total + jsonb_array_length(rep->'partitions_dropped');
    COMMIT;
    -- every claim still live (with a margin for this loop's own duration)
    -- must be found by a duplicate
    checked := 0; lost := 0;
    FOR r IN SELECT key FROM claimed WHERE expires_at > clock_timestamp() + interval '200 milliseconds' LOOP
      checked := checked + 1;
      IF (idem_claim(r.key, 'rot')).claimed THEN lost := lost + 1; END IF;
    END LOOP;
    DELETE FROM claimed WHERE expires_at < clock_timestamp() - interval '1 second';
    INSERT INTO rot_log SELECT it, jsonb_array_length(rep->'partitions_dropped'), checked, lost,
      (SELECT count(*) FROM idem_partitions),
      (SELECT count(*) FROM pg_class WHERE relnamespace = 'idem'::regnamespace),
      (SELECT sum(bytes) FROM idem_partitions);
    COMMIT;
    PERFORM pg_sleep(0.05);
  END LOOP;
END $$;
SQL
start=$(date +%s.%N)
psql_idem -q -d $db -c "SET idem.partition_width = '100 milliseconds'" -c "CALL rotate(250, 3000)"
end=$(date +%s.%N)
psql_idem -d $db -At -F ' ' <<'SQL' > "$report"
SELECT 'iterations', count(*) FROM rot_log;
SELECT 'lost', sum(lost) FROM rot_log;
SELECT 'checked', sum(live_checked) FROM rot_log;
SELECT 'dropped_total', sum(dropped) FROM rot_log;
-- after warm-up (first 50 iterations) the catalog and the storage stay level
SELECT 'relations_min_max', min(idem_relations), max(idem_relations) FROM rot_log WHERE it > 50;
SELECT 'relations_first_last', (SELECT idem_relations FROM rot_log WHERE it = 51), (SELECT idem_relations FROM rot_log ORDER BY it DESC LIMIT 1);
SELECT 'bytes_max_after_warmup', max(idem_bytes) FROM rot_log WHERE it > 50;
SELECT 'bytes_max_second_half', max(idem_bytes) FROM rot_log WHERE it > (SELECT max(it) / 2 FROM rot_log);
SELECT 'live_keys', count(*) FROM idem.claims WHERE expires_at > now();
SELECT 'all_rows', count(*) FROM idem.claims;
SQL
cat "$report"
echo "elapsed: $(echo "$end - $start" | bc) s"
val() { awk -v k="$1" '$1 == k { print $2 }' "$report"; }
val2() { awk -v k="$1" '$1 == k { print $3 }' "$report"; }
fail=0
[ "$(val iterations)" -ge 200 ] || { echo "FAIL: too few iterations ran"; fail=1; }
[ "$(val lost)" = 0 ] || { echo "FAIL: live claims were lost across rotations"; fail=1; }
[ "$(val checked)" -ge 3000 ] || { echo "FAIL: too few live claims were checked"; fail=1; }
[ "$(val dropped_total)" -ge 250 ] || { echo "FAIL: fewer than 250 partitions rotated out"; fail=1; }
# the partition count moves by a partition or two as ranges come and go
[ $(( $(val2 relations_min_max) - $(val relations_min_max) )) -le 12 ] || { echo "FAIL: catalog grows"; fail=1; }
[ "$(val2 relations_first_last)" -le $(( $(val relations_first_last) + 8 )) ] || { echo "FAIL: catalog grows"; fail=1; }
[ "$(val bytes_max_second_half)" -le $(( $(val bytes_max_after_warmup) * 3 / 2 + 1 )) ] || { echo "FAIL: storage grows"; fail=1; }
# (second half: iterations past the middle of the run)
# Only ~1 s of claims (~1.3 s with the partition and run lag) may remain.
[ "$(val all_rows)" -le 400 ] || { echo "FAIL: expired rows accumulate"; fail=1; }
exit $fail
}

scenario_main "$@"
