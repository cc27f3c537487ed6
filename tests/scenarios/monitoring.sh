#!/usr/bin/env bash
# Monitoring: idem's metrics, the Prometheus exporters' queries with real exporters, the Grafana dashboard.
# One scenario per function: bash tests/scenarios/monitoring.sh NAME (NAME: dashboard, metrics, prometheus, sql_exporter);
# scripts/test.sh runs each as scenario/NAME (tests/lib/scenarios.sh).
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/scenarios.sh"

# The Grafana dashboard (monitoring/idem-dashboard.json) uses only metrics
# and labels that the postgres_exporter queries file
# (monitoring/idem-queries.yaml) exports (tests/monitoring/check_dashboard.py),
# and the checker does catch a dashboard that does not. The live check,
# against a real exporter's scrape: tests/scenarios/monitoring.sh prometheus.
scenario_dashboard() {
check="$ROOT/tests/monitoring/check_dashboard.py"
queries="$ROOT/monitoring/idem-queries.yaml"
dashboard="$ROOT/monitoring/idem-dashboard.json"
work=$(mktemp -d /tmp/idem-dashboard.XXXXXX)
trap 'rm -rf "$work"' EXIT

python3 "$check" "$queries" "$dashboard"

# The checker itself: a misspelt metric, and a label its query lacks.
sed 's/idem_claims_total/idem_claim_total/' "$dashboard" > "$work/bad-metric.json"
sed 's/sum by (biz_type) (rate(idem_waits_total/sum by (key) (rate(idem_waits_total/' "$dashboard" > "$work/bad-label.json"
for bad in bad-metric bad-label; do
  if python3 "$check" "$queries" "$work/$bad.json" > "$work/$bad.out" 2>&1; then
    echo "FAIL: the checker accepted $bad.json"; exit 1
  fi
  echo "the checker refuses $bad.json: $(grep -m1 FAIL "$work/$bad.out")"
done
}

# idem_metrics on a cluster that preloads idem (its own, port
# ${IDEM_METRICS_PORT:-5471}): a known workload, then every counter checked
# for its exact value. Covers each outcome where the protocol decides it
# (claim, duplicate completed / failed, in_progress, wait on both storage
# paths, ID001, ID003, 40001, takeover, complete, fail, checkpoint), per
# business type and per database, idem_metrics_reset (and its revocation
# from PUBLIC), the overflow row when the table of (database, biz_type)
# slots is full, idem_health's metrics check, and that a restart empties
# the counters. No verdict depends on time: concurrent steps wait for the
# state they need (pg_stat_activity, the session's own output).
scenario_metrics() {
source "$ROOT/tests/lib/scenarios.sh"
source "$ROOT/tests/lib/cluster.sh"
trap pc_stop EXIT
pc_init "$(cluster_dir)/metrics" "${IDEM_METRICS_PORT:-5471}" "shared_preload_libraries = 'idem'"
pc_start
q() { pc_psql -d "$1" -Atc "$2"; }
COLUMNS_SQL="claims, takeovers, duplicates_completed, duplicates_failed, in_progress, waits,
             fingerprint_mismatches, not_held, serialization_failures, completes, fails, checkpoints"
counters() { # db biz_type: the counters as one line a|b|c...
  q "$1" "SELECT concat_ws('|', $COLUMNS_SQL) FROM idem_metrics WHERE biz_type = '$2'"
}

for db in m1 m2 m3; do
  pc_psql -q -d postgres -c "CREATE DATABASE $db"
  pc_psql -q -d $db -c "CREATE EXTENSION idem" -c "SELECT idem_maintain()" >/dev/null
done

say "before any claim: no rows, counters on"
expect "rows" "$(q m1 "SELECT count(*) FROM idem_metrics")" 0
expect "health: metrics" "$(q m1 "SELECT severity || ' ' || value FROM idem_health WHERE check_name = 'metrics'")" "ok 0"

say "workload on biz_type pay (database m1), one session"
pc_psql -q -d m1 >/dev/null <<'SQL'
-- 5 claims completed in their transaction
BEGIN; SELECT idem_claim('p1', 'pay'); SELECT idem_complete('p1', 'pay', '{"n": 1}'); COMMIT;
BEGIN; SELECT idem_claim('p2', 'pay'); SELECT idem_complete('p2', 'pay', '{"n": 2}'); COMMIT;
BEGIN; SELECT idem_claim('p3', 'pay'); SELECT idem_complete('p3', 'pay', '{"n": 3}'); COMMIT;
BEGIN; SELECT idem_claim('p4', 'pay'); SELECT idem_complete('p4', 'pay', '{"n": 4}'); COMMIT;
BEGIN; SELECT idem_claim('p5', 'pay'); SELECT idem_complete('p5', 'pay', '{"n": 5}'); COMMIT;
-- 3 duplicates of completed claims
SELECT idem_claim('p1', 'pay'); SELECT idem_claim('p2', 'pay'); SELECT idem_claim('p3', 'pay');
-- a failure, and 2 duplicates of it
BEGIN; SELECT idem_claim('f1', 'pay'); SELECT idem_fail('f1', 'pay', '{"e": "declined"}'); COMMIT;
SELECT idem_claim('f1', 'pay'); SELECT idem_claim('f1', 'pay');
-- a fingerprint: its duplicate, then a different one (ID001)
BEGIN; SELECT idem_claim('fp1', 'pay', fingerprint => 'a'); SELECT idem_complete('fp1', 'pay'); COMMIT;
SELECT idem_claim('fp1', 'pay', fingerprint => 'a');
\set ON_ERROR_STOP off
SELECT idem_claim('fp1', 'pay', fingerprint => 'b');
-- ID003: finishing a claim nobody made here
SELECT idem_complete('never', 'pay');
\set ON_ERROR_STOP on
-- the caller's own unfinished claim is in_progress; counted though rolled back
BEGIN; SELECT idem_claim('o1', 'pay'); SELECT idem_claim('o1', 'pay'); ROLLBACK;
-- a lease that runs: in_progress for others, ID003 without its token
SELECT idem_claim('l2', 'pay', lease => '1 hour');
SELECT idem_claim('l2', 'pay');
\set ON_ERROR_STOP off
SELECT idem_checkpoint('l2', 'pay', 'step');
\set ON_ERROR_STOP on
-- a lease left to run out, taken over, checkpointed and completed with its token
SELECT idem_claim('l1', 'pay', lease => '1 second');
SELECT pg_sleep(1.1);
SELECT result->>'lease_token' AS token FROM idem_claim('l1', 'pay', lease => '1 hour') \gset
SELECT idem_checkpoint('l1', 'pay', 'step', '{"i": 1}', :'token');
SELECT idem_complete('l1', 'pay', '{"done": true}', :'token');
-- another business type
SELECT idem_claim('x1', 'other'); SELECT idem_claim('x2', 'other');
SQL

say "concurrency: a claim held open, wait => false, a duplicate that waits (direct path)"
session_open A m1
session_open B m1
session_run A "BEGIN; SELECT claimed FROM idem_claim('w1', 'pay');"
expect "wait => false on a held key" "$(q m1 "SELECT state FROM idem_claim('w1', 'pay', wait => false)")" in_progress
session_send B "SELECT 'B got ' || state FROM idem_claim('w1', 'pay');"
pc_until m1 "SELECT count(*) = 1 FROM pg_stat_activity WHERE application_name = 'B' AND wait_event_type = 'Lock'" "B waits for A"
session_run A "SELECT idem_complete('w1', 'pay', '{\"w\": 1}'); COMMIT;"
session_wait B
grep -q "B got completed" "$PC_DIR/B.out" && echo "ok: the waiting duplicate got completed" || fail "B: $(cat "$PC_DIR/B.out")"

say "40001: a REPEATABLE READ snapshot older than the claim"
session_run A "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;"
q m1 "SELECT claimed FROM idem_claim('rr1', 'pay')" >/dev/null
session_run A "SELECT idem_claim('rr1', 'pay'); ROLLBACK;"
grep -q "could not serialize access" "$PC_DIR/A.out" && echo "ok: 40001 raised" || fail "A: $(cat "$PC_DIR/A.out")"

say "a wait on the SQL storage path (idem.storage_access = sql)"
session_close A
session_close B
pc_psql -q -d m1 -c "ALTER SYSTEM SET idem.storage_access = 'sql'" -c "SELECT pg_reload_conf()" >/dev/null
# (sessions that start after the postmaster has reloaded have the new value)
pc_until m1 "SELECT current_setting('idem.storage_access') = 'sql'" "the reload"
session_open A m1
session_open B m1
session_run A "BEGIN; SELECT claimed FROM idem_claim('s1', 'sqlpath');"
session_send B "SELECT 'B got ' || state FROM idem_claim('s1', 'sqlpath');"
pc_until m1 "SELECT count(*) = 1 FROM pg_stat_activity WHERE application_name = 'B' AND wait_event = 'advisory'" "B waits for the key lock"
session_run A "SELECT idem_complete('s1', 'sqlpath'); COMMIT;"
session_wait B
grep -q "B got completed" "$PC_DIR/B.out" && echo "ok: the waiting duplicate got completed (SQL path)" || fail "B: $(cat "$PC_DIR/B.out")"
grep -q "WARNING" "$PC_DIR/B.out" && fail "B: $(cat "$PC_DIR/B.out")"
session_close A
session_close B
pc_psql -q -d m1 -c "ALTER SYSTEM RESET idem.storage_access" -c "SELECT pg_reload_conf()" >/dev/null

say "the counters"
pc_psql -d m1 -c "SELECT biz_type, claims, takeovers AS tko, duplicates_completed AS dup_c, duplicates_failed AS dup_f,
                          in_progress AS inp, waits, round(wait_seconds::numeric, 3) AS wait_s, fingerprint_mismatches AS id001,
                          not_held AS id003, serialization_failures AS \"40001\", completes, fails, checkpoints AS ckpt
                     FROM idem_metrics ORDER BY biz_type"
# claims:      p1-p5, f1, fp1, o1, l2, l1, w1, rr1              12
# takeovers:   l1                                                 1
# dup. compl.: p1-p3, fp1 (a), w1 (B)                             5
# dup. failed: f1 twice                                           2
# in_progress: o1 (own), l2 (lease running), w1 (wait => false)  3
# waits: B on w1; ID001: fp1 (b); ID003: never, l2 without token (2); 40001: rr1
# completes:   p1-p5, fp1, l1, w1                                 8
# fails: f1; checkpoints: l1
expect "pay" "$(counters m1 pay)" "12|1|5|2|3|1|1|2|1|8|1|1"
expect "other" "$(counters m1 other)" "2|0|0|0|0|0|0|0|0|0|0|0"
expect "sqlpath" "$(counters m1 sqlpath)" "1|0|1|0|0|1|0|0|0|1|0|0"
expect "pay: the wait took time" "$(q m1 "SELECT wait_seconds > 0 FROM idem_metrics WHERE biz_type = 'pay'")" t
expect "sqlpath: the wait took time" "$(q m1 "SELECT wait_seconds > 0 FROM idem_metrics WHERE biz_type = 'sqlpath'")" t
expect "no note on counted rows" "$(q m1 "SELECT count(*) FROM idem_metrics WHERE note IS NOT NULL")" 0
expect "stats_since set" "$(q m1 "SELECT bool_and(stats_since <= now()) FROM idem_metrics")" t

say "per database, and idem_metrics_reset"
q m2 "SELECT count(idem_claim('k' || i, 'pay')) FROM generate_series(1, 3) i" >/dev/null
expect "m2 pay" "$(counters m2 pay)" "3|0|0|0|0|0|0|0|0|0|0|0"
expect "m2 sees only its own types" "$(q m2 "SELECT string_agg(biz_type, ',') FROM idem_metrics")" pay
pc_psql -q -d m2 -c "CREATE ROLE plain LOGIN"
err=$(pc_psql -d m2 -c "SET ROLE plain" -c "SELECT idem_metrics_reset()" 2>&1 || true)
[[ "$err" == *"permission denied for function idem_metrics_reset"* ]] && echo "ok: idem_metrics_reset is revoked from PUBLIC" || fail "reset as a plain role: $err"
before=$(q m2 "SELECT stats_since FROM idem_metrics WHERE biz_type = 'pay'")
q m2 "SELECT idem_metrics_reset()" >/dev/null
expect "m2 pay after reset" "$(counters m2 pay)" "0|0|0|0|0|0|0|0|0|0|0|0"
expect "m2 stats_since moved" "$(q m2 "SELECT stats_since > '$before' FROM idem_metrics WHERE biz_type = 'pay'")" t
expect "m1 pay untouched by m2's reset" "$(counters m1 pay)" "12|1|5|2|3|1|1|2|1|8|1|1"
expect "health: metrics" "$(q m1 "SELECT severity || ' ' || value FROM idem_health WHERE check_name = 'metrics'")" "ok 4"

say "an unprivileged role's rolled-back calls on invented types take no slot"
# (On 0.3.0 each of these took a slot of the server's table until restart,
# and the types used after them, in any database, got no row.)
used=$(q m1 "SELECT slots_used FROM idem.metrics_info()")
for db in m4 m5; do
  pc_psql -q -d postgres -c "CREATE DATABASE $db"
  pc_psql -q -d $db -c "CREATE EXTENSION idem" -c "SELECT idem_maintain()" >/dev/null
done
pc_psql -q -d postgres -c "CREATE ROLE nobody LOGIN"  # PUBLIC's rights, nothing more
expect "nobody has no grants" "$(q m4 "SELECT count(*) FROM information_schema.role_routine_grants WHERE grantee = 'nobody'")" 0
{
  # 3000 ID003 refusals (each statement rolls back), 500 claims rolled
  # back, and in one transaction that commits, 1000 claims each undone by
  # a rollback to its savepoint (a PL/pgSQL exception block).
  echo '\set ON_ERROR_STOP off'
  for i in $(seq 1 3000); do echo "SELECT idem_complete('k', 'random-$i');"; done
  for i in $(seq 1 500); do echo "BEGIN; SELECT idem_claim('k', 'undone-$i'); ROLLBACK;"; done
  echo "DO \$\$ BEGIN FOR i IN 1..1000 LOOP BEGIN PERFORM idem_claim('k', 'sp-' || i); RAISE EXCEPTION 'undo'; EXCEPTION WHEN raise_exception THEN NULL; END; END LOOP; END \$\$;"
} | pc_psql -q -d m4 -U nobody >/dev/null 2>"$PC_DIR/nobody.err"
expect "nobody's refusals were ID003" "$(grep -c 'is not claimed by this transaction' "$PC_DIR/nobody.err")" 3000
expect "m4: no row of an invented type" "$(q m4 "SELECT count(*) FROM idem_metrics WHERE biz_type <> '(other types)'")" 0
expect "m4 (other types) counts them" "$(counters m4 '(other types)')" "1500|0|0|0|0|0|0|3000|0|0|0|0"
expect "slots: one, m4's (other types) row" "$(q m1 "SELECT slots_used FROM idem.metrics_info()")" $((used + 1))
expect "health in m4: ok" "$(q m4 "SELECT severity FROM idem_health WHERE check_name = 'metrics'")" ok
pc_psql -q -d m5 -U nobody >/dev/null <<'SQL'
SELECT idem_claim('r1', 'real'); SELECT idem_claim('r2', 'real'); SELECT idem_claim('r1', 'real');
SQL
expect "a real type in another database gets its row" "$(counters m5 real)" "2|0|1|0|0|0|0|0|0|0|0|0"
q m4 "BEGIN; SELECT idem_claim('a', 'used'); SELECT idem_complete('a', 'used'); COMMIT" >/dev/null
expect "and one in m4 itself" "$(counters m4 used)" "1|0|0|0|0|0|0|0|0|1|0|0"
# A type's first calls: kept until the transaction ends, then its row (a
# commit), also for the rolled-back claim before it in the same session.
q m4 "BEGIN; SELECT idem_claim('a', 'late'); COMMIT" >/dev/null
pc_psql -q -d m4 >/dev/null 2>&1 <<'SQL' || true
BEGIN; SELECT idem_claim('b', 'late'); ROLLBACK;
SELECT idem_complete('never', 'late');
SQL
expect "m4 late (a commit, then a rollback and an ID003 on an existing type)" "$(counters m4 late)" "2|0|0|0|0|0|0|1|0|0|0|0"

say "a type with no claim left gives its slot back (idem.metrics_reclaim)"
q m4 "SELECT idem_forget('a', 'used')" >/dev/null
expect "idem.metrics_reclaim(true) frees 1" "$(q m4 "SELECT idem.metrics_reclaim(true)")" 1
expect "m4: no row for used" "$(q m4 "SELECT count(*) FROM idem_metrics WHERE biz_type = 'used'")" 0
expect "its counts moved to (other types)" "$(counters m4 '(other types)')" "1501|0|0|0|0|0|0|3000|0|1|0|0"
expect "late keeps its row (it has a claim)" "$(counters m4 late)" "2|0|0|0|0|0|0|1|0|0|0|0"
err=$(pc_psql -d m4 -U nobody -c "SELECT idem.metrics_reclaim(true)" 2>&1 || true)
[[ "$err" == *"permission denied"* ]] && echo "ok: idem.metrics_reclaim is not for PUBLIC" || fail "reclaim as nobody: $err"

say "a dropped database gives its slots back"
used=$(q m1 "SELECT slots_used FROM idem.metrics_info()")
pc_psql -q -d postgres -c "CREATE DATABASE m6"
pc_psql -q -d m6 -c "CREATE EXTENSION idem" -c "SELECT idem_maintain()" >/dev/null
q m6 "SELECT count(idem_claim('k', 'd' || i)) FROM generate_series(1, 3) i" >/dev/null
expect "m6 took 3 slots" "$(q m1 "SELECT slots_used FROM idem.metrics_info()")" $((used + 3))
pc_psql -q -d postgres -c "DROP DATABASE m6"
q m1 "SELECT idem_maintain()" >/dev/null
expect "idem_maintain gave them back" "$(q m1 "SELECT slots_used FROM idem.metrics_info()")" $used

say "one database holds at most its share of the slots: its (other types) row"
used=$(q m3 "SELECT slots_used FROM idem.metrics_info()")
share=$(q m3 "SELECT share FROM idem.metrics_database()")
expect "share" "$share" 256
q m3 "SELECT count(idem_claim('k', 't' || i)) FROM generate_series(1, 1100) i" >/dev/null
room=$((share - 1))  # the share keeps one slot for (other types)
expect "m3 types with a row of their own" "$(q m3 "SELECT count(*) FROM idem_metrics WHERE biz_type <> '(other types)'")" $room
expect "m3 (other types) claims" "$(q m3 "SELECT claims FROM idem_metrics WHERE biz_type = '(other types)'")" $((1100 - room))
expect "its note says the share was full" "$(q m3 "SELECT note LIKE '%share of 256 slots full%' FROM idem_metrics WHERE biz_type = '(other types)'")" t
expect "m3 holds its share" "$(q m3 "SELECT slots_used FROM idem.metrics_database()")" $share
expect "the table has room for the others" "$(q m3 "SELECT slots_used FROM idem.metrics_info()")" $((used + share))
expect "health in m3: warning" "$(q m3 "SELECT severity FROM idem_health WHERE check_name = 'metrics'")" warning
expect "health in m1: ok" "$(q m1 "SELECT severity FROM idem_health WHERE check_name = 'metrics'")" ok
expect "no global overflow row" "$(q m1 "SELECT count(*) FROM idem_metrics WHERE biz_type IS NULL")" 0
q m3 "SELECT idem_maintain()" >/dev/null
expect "types with claims keep their slots" "$(q m3 "SELECT slots_used FROM idem.metrics_database()")" $share
q m3 "SELECT count(idem_forget('k', 't' || i)) FROM generate_series(1, 1100) i" >/dev/null
q m3 "SELECT idem_maintain()" >/dev/null
expect "idem_maintain frees the slots of types with no claim left" "$(q m3 "SELECT slots_used FROM idem.metrics_database()")" 1
expect "m3's totals never went back: (other types) has them all" "$(q m3 "SELECT claims FROM idem_metrics WHERE biz_type = '(other types)'")" 1100
q m3 "SELECT idem_claim('k', 't1')" >/dev/null
expect "t1 claims again: a new row, counting from 0" "$(counters m3 t1)" "1|0|0|0|0|0|0|0|0|0|0|0"

say "the whole table full: the overflow row, all databases together"
i=0
while [ "$(q m1 "SELECT slots_used FROM idem.metrics_info()")" -lt 1024 ]; do
  i=$((i + 1))
  pc_psql -q -d postgres -c "CREATE DATABASE f$i"
  pc_psql -q -d f$i -c "CREATE EXTENSION idem" -c "SELECT idem_maintain()" >/dev/null
  q f$i "SELECT count(idem_claim('k', 't' || i)) FROM generate_series(1, 300) i" >/dev/null
done
pc_psql -q -d postgres -c "CREATE DATABASE flast"
pc_psql -q -d flast -c "CREATE EXTENSION idem" -c "SELECT idem_maintain()" >/dev/null
q flast "SELECT count(idem_claim('k', 't' || i)) FROM generate_series(1, 5) i" >/dev/null
expect "flast: no row of its own" "$(q flast "SELECT count(*) FROM idem_metrics WHERE biz_type IS NOT NULL")" 0
expect "the overflow row's claims" "$(q flast "SELECT claims FROM idem_metrics WHERE biz_type IS NULL")" 5
expect "the overflow row says so" "$(q flast "SELECT note LIKE 'overflow: all 1024 (database, biz_type) slots%' FROM idem_metrics WHERE biz_type IS NULL")" t
expect "health: metrics" "$(q flast "SELECT severity FROM idem_health WHERE check_name = 'metrics'")" warning
expect "m1 sees the overflow row too (all databases)" "$(q m1 "SELECT claims FROM idem_metrics WHERE biz_type IS NULL")" 5
pc_psql -q -d postgres -c "DROP DATABASE f$i"
q flast "SELECT count(idem_claim('k', 'u' || i)) FROM generate_series(1, 2) i" >/dev/null
expect "a dropped database's slots, released when the table is full" "$(counters flast u1)" "1|0|0|0|0|0|0|0|0|0|0|0"

say "a restart empties the counters (statistics, like pg_stat_*)"
pc_restart
expect "rows after restart" "$(q m1 "SELECT count(*) FROM idem_metrics")" 0
q m1 "SELECT idem_claim('after', 'pay')" >/dev/null
expect "pay after restart" "$(counters m1 pay)" "1|0|0|0|0|0|0|0|0|0|0|0"
expect "the duplicate after restart" "$(q m1 "SELECT state FROM idem_claim('p1', 'pay')")" completed
expect "pay after restart and a duplicate" "$(counters m1 pay)" "1|0|1|0|0|0|0|0|0|0|0|0"

finish "metrics"
}

# monitoring/idem-queries.yaml with Debian's prometheus-postgres-exporter
# (0.11.1 on Debian 12), for real: a cluster of its own that preloads idem,
# listening on 127.0.0.1:${IDEM_PROM_PG_PORT:-5472}; the exporter on
# 127.0.0.1:${IDEM_PROM_PORT:-9472}, logged in as a role that has only the
# monitoring grants of docs/operations.md (idem_monitor) and pg_monitor; a
# known workload; then /metrics scraped with curl and the values checked:
# counters per business type, counters on, maintenance, health (a stuck
# lease shows as a warning), the queries file loaded without error, and
# every metric the Grafana dashboard uses present in the scrape.
# A second workload and scrape: the counters grew by exactly its claims.
scenario_prometheus() {
source "$ROOT/tests/lib/scenarios.sh"
source "$ROOT/tests/lib/cluster.sh"
exporter=/usr/bin/prometheus-postgres-exporter
[ -x "$exporter" ] || { echo "FAIL: $exporter is missing (bash scripts/setup.sh --tests installs it)"; exit 1; }
pg_port=${IDEM_PROM_PG_PORT:-5472}
web=127.0.0.1:${IDEM_PROM_PORT:-9472}
exporter_pid=
cleanup() {
  [ -z "$exporter_pid" ] || kill "$exporter_pid" 2>/dev/null || true
  pc_stop
}
trap cleanup EXIT
pc_init "$(cluster_dir)/prometheus" "$pg_port" "shared_preload_libraries = 'idem'" "listen_addresses = '127.0.0.1'"
pc_start
q() { pc_psql -d appdb -Atc "$1"; }

pc_psql -q -d postgres -c "CREATE DATABASE appdb"
pc_psql -q -d appdb >/dev/null <<'SQL'
CREATE EXTENSION idem;
SELECT idem_maintain();
-- The monitoring role of docs/operations.md (Grants), and a login for the exporter.
CREATE ROLE idem_monitor NOLOGIN;
GRANT SELECT ON idem_metrics, idem_maintenance, idem_health TO idem_monitor;
CREATE ROLE exporter LOGIN IN ROLE idem_monitor, pg_monitor;
SQL

say "workload 1: payments and refunds"
pc_psql -q -d appdb >/dev/null <<'SQL'
-- payment: 4 claims completed, 3 duplicates, 1 failure and its duplicate, 1 ID001
BEGIN; SELECT idem_claim('p1', 'payment', fingerprint => 'a'); SELECT idem_complete('p1', 'payment', '{"ok": 1}'); COMMIT;
BEGIN; SELECT idem_claim('p2', 'payment'); SELECT idem_complete('p2', 'payment'); COMMIT;
BEGIN; SELECT idem_claim('p3', 'payment'); SELECT idem_complete('p3', 'payment'); COMMIT;
BEGIN; SELECT idem_claim('p4', 'payment'); SELECT idem_fail('p4', 'payment', '{"e": "declined"}'); COMMIT;
SELECT idem_claim('p1', 'payment', fingerprint => 'a');
SELECT idem_claim('p2', 'payment');
SELECT idem_claim('p3', 'payment');
SELECT idem_claim('p4', 'payment');
\set ON_ERROR_STOP off
SELECT idem_claim('p1', 'payment', fingerprint => 'b');
\set ON_ERROR_STOP on
-- refund: 2 claims, one of them a lease left stuck (its end moved 2 hours back)
SELECT idem_claim('r1', 'refund');
SELECT idem_claim('r2', 'refund', lease => '1 hour');
UPDATE idem.claims SET result = jsonb_set(result, '{lease_until_us}',
         to_jsonb(((extract(epoch FROM now() - interval '2 hours') - 946684800) * 1000000)::bigint))
 WHERE biz_type = 'refund' AND key = 'r2';
SQL
# A duplicate that waits for the first claim's transaction.
session_open A appdb
session_open B appdb
session_run A "BEGIN; SELECT claimed FROM idem_claim('p5', 'payment');"
session_send B "SELECT 'B got ' || state FROM idem_claim('p5', 'payment');"
pc_until appdb "SELECT count(*) = 1 FROM pg_stat_activity WHERE application_name = 'B' AND wait_event_type = 'Lock'" "B waits for A"
session_run A "SELECT idem_complete('p5', 'payment'); COMMIT;"
session_wait B
session_close A
session_close B

say "the exporter: $($exporter --version 2>&1 | sed -n 1p)"
DATA_SOURCE_NAME="host=127.0.0.1 port=$pg_port user=exporter dbname=appdb sslmode=disable" \
  "$exporter" --web.listen-address="$web" --extend.query-path="$ROOT/monitoring/idem-queries.yaml" \
  --log.level=warn > "$PC_DIR/exporter.log" 2>&1 &
exporter_pid=$!
scrape() { # FILE: /metrics into FILE, once the exporter answers (it may still be starting)
  local i
  for i in $(seq 1 600); do
    if curl -sf "http://$web/metrics" -o "$1" 2>/dev/null && grep -q "^pg_up" "$1"; then return 0; fi
    kill -0 "$exporter_pid" 2>/dev/null || { echo "FAIL: the exporter exited:"; cat "$PC_DIR/exporter.log"; exit 1; }
    sleep 0.1
  done
  echo "FAIL: no answer from http://$web/metrics in 60 s"; cat "$PC_DIR/exporter.log"; exit 1
}
# value FILE METRIC LABEL=VALUE...: the sample of METRIC whose labels include
# every LABEL=VALUE given (exactly one).
value() {
  local file=$1 metric=$2; shift 2
  python3 - "$file" "$metric" "$@" <<'PY'
import re, sys
path, metric, want = sys.argv[1], sys.argv[2], dict(a.split("=", 1) for a in sys.argv[3:])
found = []
for line in open(path):
    m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)', line)
    if not m or m.group(1) != metric:
        continue
    labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
    if all(labels.get(k) == v for k, v in want.items()):
        found.append(m.group(3))
print(found[0] if len(found) == 1 else f"<{len(found)} samples>")
PY
}
scrape "$PC_DIR/scrape1.txt"
grep -E '^(pg_up|pg_exporter_user_queries_load_error|pg_exporter_last_scrape_error)' "$PC_DIR/scrape1.txt"
expect "pg_up" "$(value "$PC_DIR/scrape1.txt" pg_up)" 1
expect "the queries file loaded" "$(value "$PC_DIR/scrape1.txt" pg_exporter_user_queries_load_error)" 0
expect "no scrape error" "$(value "$PC_DIR/scrape1.txt" pg_exporter_last_scrape_error)" 0
grep '^idem_' "$PC_DIR/scrape1.txt" | grep -E 'biz_type="payment"|counters|health_level|maintenance_(runs|last_skipped|skipped)' | sed 's/^/  /'

p() { value "$PC_DIR/$1" "$2" datname=appdb biz_type="$3"; }
# payment: claims p1-p5; duplicates completed p1-p3 and p5 (B); failed p4; ID001 p1 (b); waits 1
expect "idem_claims_total payment" "$(p scrape1.txt idem_claims_total payment)" 5
expect "idem_duplicates_completed_total payment" "$(p scrape1.txt idem_duplicates_completed_total payment)" 4
expect "idem_duplicates_failed_total payment" "$(p scrape1.txt idem_duplicates_failed_total payment)" 1
expect "idem_fingerprint_mismatches_total payment" "$(p scrape1.txt idem_fingerprint_mismatches_total payment)" 1
expect "idem_completes_total payment" "$(p scrape1.txt idem_completes_total payment)" 4
expect "idem_fails_total payment" "$(p scrape1.txt idem_fails_total payment)" 1
expect "idem_waits_total payment" "$(p scrape1.txt idem_waits_total payment)" 1
expect "idem_wait_seconds_total payment > 0" "$(python3 -c "print(float('$(p scrape1.txt idem_wait_seconds_total payment)') > 0)")" True
expect "idem_claims_total refund" "$(p scrape1.txt idem_claims_total refund)" 2
expect "idem_counters_enabled" "$(value "$PC_DIR/scrape1.txt" idem_counters_enabled datname=appdb)" 1
expect "idem_maintenance_runs_recorded" "$(value "$PC_DIR/scrape1.txt" idem_maintenance_runs_recorded datname=appdb)" 1
expect "idem_maintenance_last_skipped" "$(value "$PC_DIR/scrape1.txt" idem_maintenance_last_skipped datname=appdb)" 0
h() { value "$PC_DIR/$1" idem_health_level datname=appdb check_name="$2"; }
expect "health maintenance_overdue" "$(h scrape1.txt maintenance_overdue)" 0
expect "health stuck_leases (warning)" "$(h scrape1.txt stuck_leases)" 2
expect "stuck leases measured" "$(value "$PC_DIR/scrape1.txt" idem_health_value datname=appdb check_name=stuck_leases)" 1
expect "health metrics" "$(h scrape1.txt metrics)" 0
python3 "$ROOT/tests/monitoring/check_dashboard.py" "$ROOT/monitoring/idem-queries.yaml" \
  "$ROOT/monitoring/idem-dashboard.json" "$PC_DIR/scrape1.txt" || fails=$((fails + 1))

say "workload 2: 3 more payments, 2 duplicates; the counters grow by exactly that"
q "SELECT count(idem_claim('q' || i, 'payment')) FROM generate_series(1, 3) i" >/dev/null
q "SELECT count(idem_claim('p' || i, 'payment')) FROM generate_series(2, 3) i" >/dev/null
scrape "$PC_DIR/scrape2.txt"
expect "idem_claims_total payment" "$(p scrape2.txt idem_claims_total payment)" 8
expect "idem_duplicates_completed_total payment" "$(p scrape2.txt idem_duplicates_completed_total payment)" 6
expect "idem_claims_total refund" "$(p scrape2.txt idem_claims_total refund)" 2

finish "prometheus"
}

# monitoring/sql_exporter/*.collector.yml, sql_exporter's collector files:
# the maintained way to export idem's metrics (postgres_exporter's
# --extend.query-path, which monitoring/idem-queries.yaml is for, has been
# deprecated since its 0.13). The sql_exporter binary is not packaged in
# Debian or the package registries this project's machines reach, so the
# binary is not run here; tests/monitoring/check_collector.py runs every
# query of the collector files against a live cluster of its own that
# preloads idem (port ${IDEM_SQLX_PG_PORT:-5476}), logged in as a role with
# only the monitoring grants of docs/operations.md (idem_monitor) and
# pg_monitor, after a known workload, and checks that they export exactly
# the metrics, labels and values of postgres_exporter's queries file, with
# no NULL sql_exporter could not scan. Then the checker is shown to refuse
# broken collector files.
scenario_sql_exporter() {
source "$ROOT/tests/lib/cluster.sh"
python3 -c "import yaml" 2>/dev/null || { echo "FAIL: PyYAML is missing (bash scripts/setup.sh --tests installs python3-yaml)"; exit 1; }
check="$ROOT/tests/monitoring/check_collector.py"
queries="$ROOT/monitoring/idem-queries.yaml"
collectors=("$ROOT"/monitoring/sql_exporter/*.collector.yml)
trap pc_stop EXIT
pc_init "$(cluster_dir)/sql_exporter" "${IDEM_SQLX_PG_PORT:-5476}" "shared_preload_libraries = 'idem'"
pc_start
work="$PC_DIR/work"
mkdir -p "$work"

pc_psql -q -d postgres -c "CREATE DATABASE appdb"
pc_psql -q -d appdb >/dev/null <<'SQL'
CREATE EXTENSION idem;
SELECT idem_maintain();
CREATE ROLE idem_monitor NOLOGIN;
GRANT SELECT ON idem_metrics, idem_maintenance, idem_health TO idem_monitor;
CREATE ROLE exporter LOGIN IN ROLE idem_monitor, pg_monitor;
SQL

say "a workload that moves every counter"
pc_psql -q -d appdb >/dev/null <<'SQL'
BEGIN; SELECT idem_claim('p1', 'payment', fingerprint => 'a'); SELECT idem_complete('p1', 'payment', '{"ok": 1}'); COMMIT;
BEGIN; SELECT idem_claim('p2', 'payment'); SELECT idem_fail('p2', 'payment', '{"e": "declined"}'); COMMIT;
SELECT idem_claim('p1', 'payment', fingerprint => 'a');
SELECT idem_claim('p2', 'payment');
\set ON_ERROR_STOP off
SELECT idem_claim('p1', 'payment', fingerprint => 'b');
SELECT idem_complete('p1', 'payment');
\set ON_ERROR_STOP on
-- a lease, its checkpoint, then one that ran out and is taken over
CREATE TABLE tok AS SELECT result->>'lease_token' AS t FROM idem_claim('r1', 'refund', lease => '1 hour');
SELECT idem_checkpoint('r1', 'refund', 'sent', '{}', t) FROM tok;
SELECT idem_claim('r1', 'refund', wait => false);
UPDATE idem.claims SET result = jsonb_set(result, '{lease_until_us}',
         to_jsonb(((extract(epoch FROM now() - interval '2 hours') - 946684800) * 1000000)::bigint))
 WHERE biz_type = 'refund' AND key = 'r1';
SELECT idem_claim('r1', 'refund');
SQL
# A duplicate that waits for the first claim's transaction, and a
# serialization failure (a snapshot older than the claim it meets).
session_open A appdb
session_open B appdb
session_run A "BEGIN; SELECT claimed FROM idem_claim('p3', 'payment');"
session_send B "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1; SELECT 'B got ' || state FROM idem_claim('p3', 'payment');"
pc_until appdb "SELECT count(*) = 1 FROM pg_stat_activity WHERE application_name = 'B' AND wait_event_type = 'Lock'" "B waits for A"
session_run A "SELECT idem_complete('p3', 'payment'); COMMIT;"
session_wait B
session_run B "ROLLBACK;"
session_close A
session_close B
pc_psql -d appdb -Atc "SELECT biz_type, claims, duplicates_completed, waits, serialization_failures, takeovers, not_held
                         FROM idem_metrics WHERE biz_type IN ('payment', 'refund') ORDER BY 1" | sed 's/^/  /'

say "the collector files against the live server, as the exporter's role"
conn=(-h "$PC_DIR" -p "$PC_PORT" -U exporter -d appdb)
fails=0
python3 "$check" "$queries" "${collectors[@]}" -- "${conn[@]}" || fails=$((fails + 1))

say "the checker refuses broken collector files"
main="$ROOT/monitoring/sql_exporter/idem.collector.yml"
health="$ROOT/monitoring/sql_exporter/idem_health.collector.yml"
sed 's/values: \[claims_total\]/values: [claim_total]/' "$main" > "$work/bad-column.collector.yml"
sed 's/coalesce(last_duration_ms \/ 1000, 0)::float8 AS last_duration_seconds/NULL::float8 AS last_duration_seconds/' "$main" > "$work/bad-null.collector.yml"
sed 's/metric_name: idem_fails_total/metric_name: idem_failures_total/' "$main" > "$work/bad-name.collector.yml"
sed 's/key_labels: \[datname, check_name\]/key_labels: [datname]/' "$health" > "$work/bad-labels.collector.yml"
for bad in bad-column bad-null bad-name bad-labels; do
  if [ "$bad" = bad-labels ]; then files=("$main" "$work/$bad.collector.yml"); else files=("$work/$bad.collector.yml" "$health"); fi
  cmp -s "${files[0]}" "$main" && cmp -s "${files[1]}" "$health" && { echo "FAIL: $bad: the sed changed nothing"; fails=$((fails + 1)); continue; }
  if python3 "$check" "$queries" "${files[@]}" -- "${conn[@]}" > "$work/$bad.out" 2>&1; then
    echo "FAIL: the checker accepted $bad"; fails=$((fails + 1))
  else
    echo "the checker refuses $bad: $(grep -m1 FAIL "$work/$bad.out")"
  fi
done
echo "sql_exporter checks failed: $fails"
[ "$fails" = 0 ]
}

scenario_main "$@"
