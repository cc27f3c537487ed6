#!/usr/bin/env bash
# Requests per second through the Go middleware (clients/go), next to the
# same net/http + pgx handler with hand-written idempotency (INSERT ... ON
# CONFLICT on a dedup table) and with none; the Go counterpart of
# bench/middleware.sh (Python and Node), with its variants a (a new key per
# request), b (replays), c (hand-written), d (no idempotency). Not a test
# (scripts/test.sh never runs it): it measures, and checks only that every
# answer was the expected one. The program is clients/go/test/bench; the
# server and the load client share one process and the machine's cores.
#
#   bash bench/middleware_go.sh [--rounds 5] [--requests 3000] [--concurrency 8] [--warmup 300]
#
# Its own PostgreSQL 15 cluster (port 5592, BENCH_MW_GO_PORT), unix socket
# only, fsync on and synchronous_commit = off as bench/middleware.sh.
# Modules from the cache of scripts/setup.d/80-middleware-go.sh.
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
source "$ROOT/tests/lib/cluster.sh"
source "$ROOT/tests/lib/go.sh"
PG_PORT=${BENCH_MW_GO_PORT:-5592}
dir="$(cluster_dir)/middleware-go-bench"
work=
stop_all() {
  pc_stop
  if [ -n "$work" ]; then rm -rf "$work"; fi
  return 0
}
trap stop_all EXIT
PC_DIR=$dir
stop_all
bash "$ROOT/scripts/setup.d/80-middleware-go.sh"
go_env
work=$(mktemp -d /tmp/middleware-go-bench.XXXXXX)
(cd "$ROOT/clients/go/test" && go build -o "$work/bench" ./bench)
pc_init "$dir" "$PG_PORT" "fsync = on" "synchronous_commit = off" "shared_buffers = 256MB" \
  "max_connections = 40" "max_wal_size = 4GB" "checkpoint_timeout = 30min"
pc_start
pc_psql -d postgres -q -c "CREATE DATABASE bench"
pc_psql -d bench -q -c "CREATE EXTENSION idem"
echo "PostgreSQL $(pc_psql -d bench -Atc 'SHOW server_version'), $(go version), $(nproc) cores"
BENCH_DSN="host=$dir port=$PG_PORT user=postgres dbname=bench pool_max_conns=16" "$work/bench" "$@"
