#!/usr/bin/env bash
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
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/assert.sh"
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

say "the exporter: $($exporter --version 2>&1 | head -1)"
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
