#!/usr/bin/env bash
# idem's benchmark (bench/README.md): bash bench/run.sh [--smoke|--full] [--sections a,b] [--help]
# Its own cluster of the PostgreSQL of PG_CONFIG (port BENCH_PORT, 5498; unix
# socket only) and redis-server (unix socket, variant B3 and the kills), then
# bench.py (the measurements: OUT/raw.json) and report.py (report.md,
# results.csv, results.json, tps.svg).
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
source "$ROOT/tests/lib/cluster.sh"
BENCH="$ROOT/bench"
PORT="${BENCH_PORT:-5498}"
COMMAND_LINE="bash bench/run.sh $*"

OUT=""
KEEP=0
NO_REDIS=0
SMOKE=0
PY_ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --out=*) OUT="${1#--out=}"; shift ;;
    --keep-cluster) KEEP=1; shift ;;
    --no-redis) NO_REDIS=1; PY_ARGS+=("$1"); shift ;;
    --smoke) SMOKE=1; PY_ARGS+=("$1"); shift ;;
    -h|--help) exec python3 "$BENCH/bench.py" --help ;;
    *) PY_ARGS+=("$1"); shift ;;
  esac
done
if [ -z "$OUT" ]; then
  if [ "$SMOKE" = 1 ]; then OUT="$BENCH/out/smoke"; else OUT="$BENCH/out"; fi
fi
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

# ---- prerequisites -------------------------------------------------------
for b in postgres psql pgbench; do
  [ -x "$PG_BIN/$b" ] || { echo "missing $PG_BIN/$b (PostgreSQL server)" >&2; exit 1; }
done
command -v python3 >/dev/null || { echo "python3 is required" >&2; exit 1; }
[ -f "$("$PG_BIN/pg_config" --sharedir)/extension/idem.control" ] ||
  { echo "the idem extension is not installed into this PostgreSQL (run scripts/setup.sh)" >&2; exit 1; }

# ---- the cluster -----------------------------------------------------------
# Under bench/out/cluster unless the postgres user cannot reach that folder
# (a checkout under /root, say): then under /tmp.
CLUSTER="$BENCH/out/cluster"
if ! (cd / && sudo -u postgres test -x "$BENCH/out" 2>/dev/null) || ! (cd / && sudo -u postgres test -x "$BENCH" 2>/dev/null); then
  CLUSTER="/tmp/idem-bench-cluster-$(echo "$ROOT" | md5sum | cut -c1-8)"
fi

REDIS_PID=""
cleanup() {
  if [ -n "$REDIS_PID" ]; then kill "$REDIS_PID" 2>/dev/null || true; wait "$REDIS_PID" 2>/dev/null || true; fi
  if [ "$KEEP" = 0 ]; then pc_server_stop "$CLUSTER" fast; fi
}
trap cleanup EXIT

# (pc_fresh first stops what a previous run that was killed left behind)
pc_fresh "$CLUSTER"
say "creating the benchmark cluster in $CLUSTER (port $PORT)"
# Tuned like a small production server: fsync and full_page_writes on
# (synchronous_commit is set per session), checkpoints spaced so that none
# lands inside a measurement (the benchmark issues CHECKPOINT itself).
conf=("max_connections = 50" "shared_buffers = 1GB" "huge_pages = try" "work_mem = 16MB" "maintenance_work_mem = 512MB"
  "wal_buffers = 16MB" "max_wal_size = 32GB" "min_wal_size = 2GB" "checkpoint_timeout = 60min"
  "checkpoint_completion_target = 0.9" "fsync = on" "full_page_writes = on" "synchronous_commit = on" "wal_level = replica"
  "effective_cache_size = 8GB" "random_page_cost = 1.1" "autovacuum = on" "track_io_timing = on"
  "log_min_messages = warning" "log_checkpoints = on" "log_autovacuum_min_duration = 0")
pc_initdb "$PG_BIN" "$CLUSTER" "$PORT" "${conf[@]}"
pc_server_start "$CLUSTER"

# ---- redis (variant B3, the kills) ----------------------------------------------
REDIS_SOCK=""
if [ "$NO_REDIS" = 0 ]; then
  if ! command -v redis-server >/dev/null; then
    apt_install "redis-server, for variant B3" redis-server || say "could not install redis-server: no variant B3 (NO_REDIS=1 skips it)"
  fi
  if command -v redis-server >/dev/null; then
    RDIR="$OUT/redis"
    rm -rf "$RDIR"; mkdir -p "$RDIR"
    REDIS_SOCK="$RDIR/redis.sock"
    # No TCP, no persistence (a restart forgets keys), one server for the run.
    redis-server --port 0 --unixsocket "$REDIS_SOCK" --unixsocketperm 700 \
      --save '' --appendonly no --dir "$RDIR" --daemonize no \
      --logfile "$RDIR/redis.log" &
    REDIS_PID=$!
    for _ in $(seq 50); do [ -S "$REDIS_SOCK" ] && break; sleep 0.1; done
    [ -S "$REDIS_SOCK" ] || { echo "redis-server did not start; B3 will be skipped" >&2; REDIS_SOCK=""; }
  else
    echo "redis-server is not available; B3 will be skipped" >&2
  fi
fi

rm -f "$OUT/raw.json" "$OUT/results.csv" "$OUT/results.json" "$OUT/report.md" "$OUT/tps.svg"
say "running the benchmark (raw output in $OUT)"
rc=0
python3 "$BENCH/bench.py" --out "$OUT" --host "$CLUSTER" --port "$PORT" --pg-bin "$PG_BIN" \
  --redis-sock "$REDIS_SOCK" --redis-pid "${REDIS_PID:-0}" --command "$COMMAND_LINE" "${PY_ARGS[@]}" || rc=$?
if [ -f "$OUT/raw.json" ]; then
  python3 "$BENCH/report.py" "$OUT" || rc=$?
fi
exit $rc
