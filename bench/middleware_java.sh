#!/usr/bin/env bash
# Requests per second through the Spring MVC filter (clients/java,
# @IdempotentRequest), next to the same Spring MVC + JdbcTemplate handler
# with hand-written idempotency (INSERT ... ON CONFLICT on a dedup table)
# and with none; the Java counterpart of bench/middleware_go.sh, with its
# variants a (a new key per request), b (replays), c (hand-written), d (no
# idempotency). Not a test (scripts/test.sh never runs it): it measures,
# and checks only that every answer was the expected one. The server is
# clients/java/conformance-server's jar (Spring Boot 3.5, its own JVM,
# HikariCP); the load client bench/middleware_java/Load.java (Java's
# source launcher) shares the machine's cores with it.
#
#   bash bench/middleware_java.sh [--rounds 5] [--requests 3000] [--concurrency 8] [--warmup 2000]
#
# Its own PostgreSQL 15 cluster (port 5445, BENCH_MW_JAVA_PORT), unix
# socket only, fsync on and synchronous_commit = off as the other
# middleware benchmarks. Maven's repository from scripts/setup.sh --tool java.
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
source "$ROOT/tests/lib/cluster.sh"
PG_PORT=${BENCH_MW_JAVA_PORT:-5445}
rounds=5 requests=3000 concurrency=8 warmup=2000
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2;; --requests) requests=$2; shift 2;;
    --concurrency) concurrency=$2; shift 2;; --warmup) warmup=$2; shift 2;;
    *) echo "unknown option $1"; exit 2;;
  esac
done
dir="$(cluster_dir)/middleware-java-bench"
work= server=
stop_all() {
  [ -z "$server" ] || { kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true; }
  pc_stop
  if [ -n "$work" ]; then rm -rf "$work"; fi
  return 0
}
trap stop_all EXIT
trap "exit 1" INT TERM
PC_DIR=$dir
work=$(mktemp -d /tmp/middleware-java-bench.XXXXXX)
tar -C "$ROOT/clients/java" --exclude=target -cf - . | tar -C "$work" -xf -
(cd "$work" && mvn_idem -o -q package -DskipTests -pl conformance-server -am) || { echo "the build failed"; exit 1; }
pc_init "$dir" "$PG_PORT" "fsync = on" "synchronous_commit = off" "shared_buffers = 256MB" \
  "max_connections = 40" "max_wal_size = 4GB" "checkpoint_timeout = 30min" "listen_addresses = '127.0.0.1'"
pc_start
pc_psql -d postgres -q -c "CREATE DATABASE bench"
pc_psql -d bench -q <<'SQL'
CREATE EXTENSION idem;
CREATE TABLE bench_orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, amount int NOT NULL);
CREATE TABLE bench_dedup (key text PRIMARY KEY, response jsonb);
SQL
java -XX:+UseParallelGC -jar "$work/conformance-server/target/idem-conformance-server.jar" --server.port=0 \
  --spring.datasource.url="jdbc:postgresql://127.0.0.1:$PG_PORT/bench?user=postgres" \
  --spring.datasource.hikari.maximum-pool-size=16 > "$work/server.log" 2>&1 &
server=$!
port=
for _ in $(seq 1 1200); do
  port=$(sed -n 's/.*Tomcat started on port[^0-9]*\([0-9][0-9]*\).*/\1/p' "$work/server.log" | head -1)
  [ -n "$port" ] && break
  kill -0 "$server" 2>/dev/null || { cat "$work/server.log"; exit 1; }
  sleep 0.2
done
[ -n "$port" ] || { echo "the server did not start"; exit 1; }
echo "PostgreSQL $(pc_psql -d bench -Atc 'SHOW server_version'), $(java -version 2>&1 | head -1), Spring Boot $(grep -o 'Spring Boot :: *(v[0-9.]*)' "$work/server.log" | grep -o '[0-9.]*[0-9]'), $(nproc) cores"
java "$ROOT/bench/middleware_java/Load.java" "http://127.0.0.1:$port" "$rounds" "$requests" "$concurrency" "$warmup"
