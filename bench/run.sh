#!/usr/bin/env bash
# idem's benchmark suite. One command:
#
#   bash bench/run.sh --full     # the targets' sizes (10 M live keys, cleanup of
#                                # 10 M rows, 5-minute sustained runs): ~1.5 h on 2 cores
#   bash bench/run.sh            # default run (1 M live keys; ~1 h on 2 cores)
#   bash bench/run.sh --smoke    # tiny sizes, < 3 min, proves the script works
#   bash bench/run.sh --help     # every option
# It prints its estimated duration when it starts.
#
# Starts its own cluster of the PostgreSQL of PG_CONFIG (default Debian's 15,
# as scripts/lib.sh; port 5498, unix socket only, under bench/out/cluster;
# tests/lib/cluster.sh), and its own redis-server (unix socket) for variant B3,
# runs every section, writes bench/out/{results.csv,results.json,report.md,
# tps.svg} and prints the targets with PASS/MISS. See bench/README.md.
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
# Tuned like a small production server, not like a test cluster: fsync and
# full_page_writes stay on (synchronous_commit is set per session by the
# benchmark), and checkpoints are spaced so that none lands inside a
# measurement (the benchmark issues CHECKPOINT between sections itself).
# (These lines come after pc_initdb's, and win.)
mapfile -t conf <<CONF
max_connections = 50
shared_buffers = 1GB
huge_pages = try
work_mem = 16MB
maintenance_work_mem = 512MB
wal_buffers = 16MB
max_wal_size = 32GB
min_wal_size = 2GB
checkpoint_timeout = 60min
checkpoint_completion_target = 0.9
fsync = on
full_page_writes = on
synchronous_commit = on
wal_level = replica
effective_cache_size = 8GB
random_page_cost = 1.1
autovacuum = on
track_io_timing = on
log_min_messages = warning
log_checkpoints = on
log_autovacuum_min_duration = 0
CONF
pc_initdb "$PG_BIN" "$CLUSTER" "$PORT" "${conf[@]}"
pc_server_start "$CLUSTER"

# ---- redis (variant B3) -----------------------------------------------------
REDIS_SOCK=""
if [ "$NO_REDIS" = 0 ]; then
  if ! command -v redis-server >/dev/null; then
    say "installing redis-server for variant B3"
    (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null 2>&1) || true
  fi
  if command -v redis-server >/dev/null; then
    RDIR="$OUT/redis"
    rm -rf "$RDIR"; mkdir -p "$RDIR"
    REDIS_SOCK="$RDIR/redis.sock"
    # No TCP, no persistence (like synchronous_commit = off at best: a
    # redis crash forgets keys), one server for the whole run.
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
