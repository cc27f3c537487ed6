#!/usr/bin/env bash
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
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
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
