#!/usr/bin/env bash
# Where the portable edition's claim spends its time (docs/performance.md,
# "Portable edition"): on a running cluster of the benchmark (bench/run.sh
# --keep-cluster, or any cluster of the system's PostgreSQL), makes a database
# with the portable edition's plain script and runs, one client at a time,
# N transactions of each of I1 (new key: claim + business insert), I2 (I1 +
# idem_complete) and I3 (duplicate claim), with track_functions = all, then
# prints per function: calls per transaction, total and self time per
# transaction (µs). When the cluster preloads pg_stat_statements, the same
# runs with pg_stat_statements.track = all give the time of every statement,
# nested ones included. Last, the digest (idem.key_hash) alone on 32-character
# keys, per call.
#
#   bash bench/profile_portable.sh HOST PORT [N]
set -euo pipefail
BENCH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$BENCH/.." && pwd)"
PG_BIN="${PG_BIN:-/usr/lib/postgresql/15/bin}"
HOST="$1"; PORT="$2"; N="${3:-2000}"
DB=bench_profile_portable
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
q() { "$PG_BIN/psql" -X -A -t -q -v ON_ERROR_STOP=1 -h "$HOST" -p "$PORT" -U postgres -d "$1" -c "$2"; }

python3 "$ROOT/scripts/portable.py" --out "$OUT" >/dev/null
q postgres "DROP DATABASE IF EXISTS $DB WITH (FORCE)"
q postgres "CREATE DATABASE $DB"
"$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$HOST" -p "$PORT" -U postgres -d $DB \
  -f "$BENCH/sql/schema.sql" -f "$OUT/idem_portable.sql" >/dev/null
pgss=$(q $DB "SELECT count(*) FROM pg_settings WHERE name = 'pg_stat_statements.track'")
[ "$pgss" = 1 ] && q $DB "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"
q $DB "SELECT idem_claim('bench-setup', 'bench'); SELECT idem_maintain()" >/dev/null
q $DB "SELECT count(*) FROM generate_series(1, $N) g, LATERAL idem_claim(md5('p' || g::text), 'bench') c" >/dev/null
q $DB "VACUUM ANALYZE"

run=0
for v in i1 i2 i3; do
  run=$((run + 1))
  q $DB "SELECT pg_stat_reset()" >/dev/null
  [ "$pgss" = 1 ] && q $DB "SELECT pg_stat_statements_reset()" >/dev/null
  PGOPTIONS="-c synchronous_commit=off -c track_functions=all -c pg_stat_statements.track=all" \
    "$PG_BIN/pgbench" -n -M prepared -c 1 -j 1 -t "$N" -D n=0 -D run=$((900 + run)) -D prefill="$N" \
    -f "$BENCH/sql/$v.sql" -h "$HOST" -p "$PORT" -U postgres $DB | grep -E "^(tps|latency average)"
  # the backend flushed its counters when pgbench disconnected
  echo "== $v: per function, per transaction ($N transactions)"
  q $DB "SELECT format('%-28s %6s calls %9s µs total %9s µs self', schemaname || '.' || funcname,
                       round(calls::numeric / $N, 1), round((total_time * 1000 / $N)::numeric, 1),
                       round((self_time * 1000 / $N)::numeric, 1))
           FROM pg_stat_user_functions ORDER BY self_time DESC LIMIT 25"
  if [ "$pgss" = 1 ]; then
    echo "== $v: per statement (pg_stat_statements, track = all), per transaction"
    q $DB "SELECT format('%9s µs %6s calls  %s', round((total_exec_time * 1000 / $N)::numeric, 1),
                         round(calls::numeric / $N, 1), left(regexp_replace(query, '\s+', ' ', 'g'), 110))
             FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
            ORDER BY total_exec_time DESC LIMIT 30"
  fi
done
echo "== the digest alone: idem.key_hash('bench', 32-character key), per call"
q $DB "EXPLAIN (ANALYZE, TIMING OFF, SUMMARY ON)
       SELECT idem.key_hash('bench', md5(g::text)) FROM generate_series(1, 20000) g" |
  sed -n 's/^Execution Time: \([0-9.]*\) ms/\1/p' | awk '{ printf "%.1f µs per call (20000 calls)\n", $1 * 1000 / 20000 }'
echo "== the same loop with md5() alone (the loop's own cost)"
q $DB "EXPLAIN (ANALYZE, TIMING OFF, SUMMARY ON)
       SELECT md5(g::text) FROM generate_series(1, 20000) g" |
  sed -n 's/^Execution Time: \([0-9.]*\) ms/\1/p' | awk '{ printf "%.1f µs per call (20000 calls)\n", $1 * 1000 / 20000 }'
q postgres "DROP DATABASE $DB WITH (FORCE)"
