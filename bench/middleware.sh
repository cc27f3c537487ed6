#!/usr/bin/env bash
# HTTP requests per second through the middleware beside the same handler with hand-written
# idempotency and with none (bench/README.md): idem-http (FastAPI on uvicorn, Django's
# runserver), idem-pg (Express, Fastify), or `go` / `java`. Checks only the answers.
#
#   bash bench/middleware.sh [go|java] [--rounds 5] [--requests 3000] [--concurrency 8] [--warmup 300]
#                            [--profile] [--out DIR]       (--profile, --out: Python and Node only)
#
# Variants, on one connection pool: a the middleware, a new key per request;
# b the middleware replaying a's keys; c hand-written: INSERT INTO dedup ... ON
# CONFLICT DO NOTHING RETURNING, the business insert, UPDATE dedup SET
# response, one transaction; d no idempotency (the floor). Rounds interleave
# them, a CHECKPOINT before each run. Its own cluster (port BENCH_MW_PORT
# 5590, BENCH_MW_GO_PORT 5592, BENCH_MW_JAVA_PORT 5445), fsync on,
# synchronous_commit = off: CPU and round trips, not the disk. Packages as
# users get them (a wheel in a fresh venv, npm pack). --profile: one more run
# of a and c under pyinstrument and node --cpu-prof, with pg_stat_statements.
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
source "$ROOT/tests/lib/cluster.sh"
source "$ROOT/tests/lib/middleware.sh"

# Go: one program (clients/go/test/bench) serves net/http on a pgx pool and drives it.
bench_go() {
  PG_PORT=${BENCH_MW_GO_PORT:-5592}
  mw_begin middleware-go-bench
  bash "$ROOT/scripts/setup.sh" --tool middleware_go
  go_env
  (cd "$ROOT/clients/go/test" && go build -o "$work/bench" ./bench)
  mw_cluster "$PG_PORT" bench "fsync = on" "synchronous_commit = off" "shared_buffers = 256MB" \
    "max_connections = 40" "max_wal_size = 4GB" "checkpoint_timeout = 30min"
  echo "PostgreSQL $(pc_psql -d bench -Atc 'SHOW server_version'), $(go version), $(nproc) cores"
  BENCH_DSN="host=$dir port=$PG_PORT user=postgres dbname=bench pool_max_conns=16" "$work/bench" "$@"
}

ARGS="$*" LANGS="python django node fastify" WARMUP=300 PG_PORT=${BENCH_MW_PORT:-5590}
case "${1:-}" in
  go) shift; bench_go "$@"; exit ;;
  # Java: clients/java/conformance-server's jar (Spring Boot, HikariCP, its own JVM), /bench/{a,c,d}
  java) shift; LANGS=java WARMUP=2000 PG_PORT=${BENCH_MW_JAVA_PORT:-5445} ;;
esac
ROUNDS=5 REQUESTS=3000 CONCURRENCY=8 PROFILE=0
OUT="$ROOT/bench/out/middleware$([ "$LANGS" != java ] || echo -java)"
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --requests) REQUESTS=$2; shift 2 ;;
    --concurrency) CONCURRENCY=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --profile) PROFILE=1; shift ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,/^source/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[ "$PG_MAJOR" = 15 ] || { echo "bench/middleware.sh runs on Debian's PostgreSQL 15 (PG_CONFIG=$PG_CONFIG)" >&2; exit 2; }
HERE="$ROOT/bench/middleware"
WHEELHOUSE="$ROOT/.venv-wheels$IDEM_OS_SUFFIX/middleware-python"
BENCH_WHEELS="$ROOT/.venv-wheels$IDEM_OS_SUFFIX/middleware-bench"
PY_PORT=$(free_port) DJ_PORT=$(free_port) NODE_PORT=$(free_port) FY_PORT=$(free_port)
JAVA_PORT=
py_pid= dj_pid= node_pid= fy_pid= java_pid=
mw_stop_hook() { # the servers, by their pids
  local p
  for p in $py_pid $dj_pid $node_pid $fy_pid $java_pid; do
    kill -TERM "$p" 2>/dev/null || true
  done
  for p in $py_pid $dj_pid $node_pid $fy_pid $java_pid; do
    for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
    kill -KILL "$p" 2>/dev/null || true
  done
}
sfx=$([ "$LANGS" != java ] || echo -java)
MW_OUT=$OUT mw_begin "middleware-bench$sfx" "idem-mwbench$sfx"
MW_KILL+=("$work/conformance-server/")
exec > >(tee "$OUT/run.log") 2>&1
started=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
echo "bench/middleware.sh: $started; $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "load average at start: $load_start"
echo "rounds $ROUNDS, $REQUESTS requests per run, $CONCURRENCY connections, warm-up $WARMUP per variant"

if [ "$LANGS" = java ]; then
  tar -C "$ROOT/clients/java" --exclude=target -cf - . | tar -C "$work" -xf -
  (cd "$work" && mvn_idem -o -q package -DskipTests -pl conformance-server -am) || fail "the build failed"
  bash "$ROOT/scripts/setup.sh" --tool middleware_node   # node runs the load client
  LOAD="$HERE/load.js"
else
  # ---- Python: idem-http's wheel in a fresh venv
  bash "$ROOT/scripts/setup.sh" --tool middleware_python
  say "idem-http: wheel, fresh venv (FastAPI, uvicorn, Django, psycopg, psycopg-pool)"
  venv="$work/venv"
  python3 -m venv "$venv"
  if [ ! -f "$BENCH_WHEELS/.complete-1" ]; then
    # Two packages the middleware scenario does not need: the connection pool
    # an application would use, and the profiler of --profile.
    mkdir -p "$BENCH_WHEELS"
    "$venv/bin/pip" download -q --disable-pip-version-check --only-binary=:all: -d "$BENCH_WHEELS" \
      "psycopg-pool==3.2.*" "pyinstrument==5.*"
    touch "$BENCH_WHEELS/.complete-1"
  fi
  export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELHOUSE $BENCH_WHEELS" PIP_DISABLE_PIP_VERSION_CHECK=1
  "$venv/bin/pip" install -q build
  cp -r "$ROOT/clients/python" "$work/pysrc"
  "$venv/bin/python" -m build --wheel --outdir "$work/dist" "$work/pysrc" > "$OUT/build.log" 2>&1 || { cat "$OUT/build.log"; exit 1; }
  "$venv/bin/pip" install -q "$(ls "$work"/dist/idem_http-*.whl)[fastapi,django]" "psycopg[binary]" psycopg-pool uvicorn pyinstrument
  unset PIP_NO_INDEX PIP_FIND_LINKS
  py_versions=$("$venv/bin/python" -c "from importlib.metadata import version as v
print(', '.join(n + ' ' + v(n) for n in ['idem-http', 'fastapi', 'starlette', 'uvicorn', 'django', 'psycopg', 'psycopg-binary', 'psycopg-pool']))")
  echo "$py_versions (Python $("$venv/bin/python" -c 'import platform; print(platform.python_version())'))"

  # ---- Node: idem-pg packed and installed with express and pg --------------------------
  bash "$ROOT/scripts/setup.sh" --tool middleware_node
  say "idem-pg: npm pack, npm install with express, fastify and pg"
  mkdir -p "$work/pack" "$work/app"
  tarball=$(cd "$ROOT/clients/node" && npm pack --silent --pack-destination "$work/pack")
  cp "$HERE/package.json" "$HERE/server.js" "$HERE/load.js" "$work/app/"
  (cd "$work/app" && npm install --prefer-offline --no-audit --no-fund --loglevel=error "$work/pack/$tarball" >/dev/null)
  node_versions=$(cd "$work/app" && node -p "['idem-pg','express','fastify','pg'].map(n => n + ' ' + require(n + '/package.json').version).join(', ')")
  echo "$node_versions (Node $(node --version))"
  LOAD="$work/app/load.js"
fi

# ---- the cluster ------------------------------------------------------------------
say "PostgreSQL cluster on port $PG_PORT (synchronous_commit = off)"
mw_cluster "$PG_PORT" mw "fsync = on" "synchronous_commit = off" "shared_buffers = 256MB" \
  "max_connections = 40" "max_wal_size = 4GB" "checkpoint_timeout = 30min" \
  "shared_preload_libraries = 'pg_stat_statements'" "pg_stat_statements.track = none" "listen_addresses = '127.0.0.1'"
pc_psql -q -d mw <<'SQL'
-- Statement times for --profile only (tracking is off for the measured runs).
CREATE EXTENSION pg_stat_statements;
CREATE TABLE orders (
    id         bigserial PRIMARY KEY,
    key        text,
    amount     int NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
-- The hand-written variant's store: key, when, and the response to replay.
CREATE TABLE dedup (
    key        text PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now(),
    response   jsonb
);
-- The Java server's (clients/java/conformance-server)
CREATE TABLE bench_orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, amount int NOT NULL);
CREATE TABLE bench_dedup (key text PRIMARY KEY, response jsonb);
SQL
pg_version=$(pc_psql -d mw -Atc "SHOW server_version")
idem_version=$(pc_psql -d mw -Atc "SELECT extversion FROM pg_extension WHERE extname = 'idem'")
idem_build=release
if grep -q debug_info <<<"$(readelf -S /usr/lib/postgresql/15/lib/idem.so 2>/dev/null)"; then idem_build="debug (DWARF sections)"; fi
echo "PostgreSQL $pg_version, idem $idem_version ($idem_build build of $(stat -c %y /usr/lib/postgresql/15/lib/idem.so | cut -d. -f1))"

# ---- the servers --------------------------------------------------------------------
conninfo="host=$dir port=$PG_PORT dbname=mw user=postgres"
wait_port() { # PORT PID WHAT
  for _ in $(seq 1 600); do
    kill -0 "$2" 2>/dev/null || { echo "$3 exited"; tail -20 "$OUT/$3.log"; exit 1; }
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "$3 does not listen on 127.0.0.1:$1"; exit 1
}
start_python() { # [launcher...]: uvicorn, one worker
  (cd "$work" && BENCH_CONNINFO="$conninfo" BENCH_POOL=$CONCURRENCY exec "$@" -m uvicorn --app-dir "$HERE" app:app \
     --host 127.0.0.1 --port "$PY_PORT" --workers 1 --no-access-log --log-level warning) > "$OUT/python.log" 2>&1 &
  py_pid=$!
  wait_port "$PY_PORT" "$py_pid" python
}
start_node() { # [node options...]: Express (profiled with those options), then Fastify
  local env=(PGHOST="$dir" PGPORT=$PG_PORT PGUSER=postgres PGDATABASE=mw BENCH_POOL=$CONCURRENCY)
  (cd "$work/app" && exec env "${env[@]}" node "$@" server.js "$NODE_PORT" express) > "$OUT/node.log" 2>&1 &
  node_pid=$!; wait_port "$NODE_PORT" "$node_pid" node
  (cd "$work/app" && exec env "${env[@]}" node server.js "$FY_PORT" fastify) > "$OUT/fastify.log" 2>&1 &
  fy_pid=$!; wait_port "$FY_PORT" "$fy_pid" fastify
}
start_django() { # runserver (a thread per connection), a pool of CONCURRENCY connections
  (cd "$HERE" && BENCH_CONNINFO="$conninfo" BENCH_POOL=$CONCURRENCY exec "$venv/bin/python" -m django runserver \
     --noreload --settings=django_app "127.0.0.1:$DJ_PORT") > "$OUT/django.log" 2>&1 &
  dj_pid=$!; wait_port "$DJ_PORT" "$dj_pid" django
}
stop_server() { # PID: SIGINT (pyinstrument writes its profile on an interrupt, not on SIGTERM)
  kill -INT "$1" 2>/dev/null || true
  for _ in $(seq 1 1200); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.05; done
  kill -KILL "$1" 2>/dev/null || true
}
if [ "$LANGS" = java ]; then
  java -XX:+UseParallelGC -jar "$work/conformance-server/target/idem-conformance-server.jar" --server.port=0 \
    --spring.datasource.url="jdbc:postgresql://127.0.0.1:$PG_PORT/mw?user=postgres" \
    --spring.datasource.hikari.maximum-pool-size=16 > "$OUT/java.log" 2>&1 &
  java_pid=$!
  for _ in $(seq 1 1200); do
    JAVA_PORT=$(sed -n 's/.*Tomcat started on port[^0-9]*\([0-9][0-9]*\).*/\1/p' "$OUT/java.log" | sed -n 1p)
    [ -n "$JAVA_PORT" ] && break
    kill -0 "$java_pid" 2>/dev/null || { cat "$OUT/java.log"; exit 1; }
    sleep 0.2
  done
  [ -n "$JAVA_PORT" ] || fail "the Java server did not start"
  echo "$(java -version 2>&1 | sed -n 1p), Spring Boot $(grep -o 'Spring Boot :: *(v[0-9.]*)' "$OUT/java.log" | grep -o '[0-9.]*[0-9]') on 127.0.0.1:$JAVA_PORT"
else
  start_python "$venv/bin/python"
  start_django
  start_node
  echo "servers: FastAPI (uvicorn) on 127.0.0.1:$PY_PORT, Django on $DJ_PORT, Express on $NODE_PORT, Fastify on $FY_PORT; pools of $CONCURRENCY connections"
fi

# ---- the runs ------------------------------------------------------------------------
path_of() { # LANG VARIANT
  if [ "$1" = java ]; then echo "/bench/${2/b/a}"; else case $2 in a|b) echo /mw ;; c) echo /hand ;; d) echo /plain ;; esac; fi
}
run() { # LANG VARIANT ROUND REQUESTS [JSONL]
  local port server_pid keys save=
  case $1 in python) port=$PY_PORT server_pid=$py_pid ;; django) port=$DJ_PORT server_pid=$dj_pid ;;
             node) port=$NODE_PORT server_pid=$node_pid ;; fastify) port=$FY_PORT server_pid=$fy_pid ;;
             java) port=$JAVA_PORT server_pid=$java_pid ;; esac
  case $2 in
    a) keys=fresh save="$work/keys-$1" ;;
    b) keys="file:$work/keys-$1" ;;
    c) keys=fresh ;;
    d) keys=none ;;
  esac
  pc_psql -q -d mw -c CHECKPOINT
  local line cpu0 cpu1
  cpu0=$(python3 "$HERE/cpu.py" "$server_pid" "$(head -1 "$dir/data/postmaster.pid")")
  line=$(BENCH_TENANT=$([ "$1" != java ] || echo bench) node "$LOAD" "http://127.0.0.1:$port$(path_of "$1" "$2")" "$4" "$CONCURRENCY" "$keys" $save) || {
    echo "FAIL $1 $2 round $3: $line"; exit 1; }
  cpu1=$(python3 "$HERE/cpu.py" "$server_pid" "$(head -1 "$dir/data/postmaster.pid")")
  if [ -n "${5:-}" ]; then
    echo "{\"server\": \"$1\", \"variant\": \"$2\", \"round\": $3, \"loadavg\": \"$(cut -d' ' -f1 /proc/loadavg)\", \"cpu_before\": $cpu0, \"cpu_after\": $cpu1, \"result\": $line}" >> "$5"
  fi
  printf '  %-6s %s round %s: %s\n' "$1" "$2" "$3" "$(echo "$line" | python3 -c "import json, sys; r = json.load(sys.stdin); print('%7.1f req/s  p50 %s us  p99 %s us  %s' % (r['rps'], r['p50_us'], r['p99_us'], r['statuses']))")"
}
say "warm-up: $WARMUP requests per variant and server (not counted)"
for lang in $LANGS; do for v in a c d b; do run $lang $v 0 "$WARMUP"; done; done
say "$ROUNDS rounds of $REQUESTS requests per variant"
t0=$(date +%s)
for r in $(seq 1 "$ROUNDS"); do
  for lang in $LANGS; do
    for v in a c d b; do run $lang $v "$r" "$REQUESTS" "$OUT/results.jsonl"; done
  done
done
seconds=$(( $(date +%s) - t0 ))
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
rows=$(pc_psql -d mw -Atc "SELECT (SELECT count(*) FROM orders) || ' orders, ' || (SELECT count(*) FROM dedup) || ' dedup rows, ' || (SELECT count(*) FROM idem.claims) || ' claims'")
echo "measured runs took $seconds s; tables now: $rows"
echo "load average at end: $load_end"

python3 "$HERE/report.py" "$OUT/results.jsonl" \
  --meta "date=$started" "command=bash bench/middleware.sh${ARGS:+ $ARGS}" "machine=$(nproc) cores, $(free -g | awk '/^Mem:/ {print $2}') GiB" \
         "load_start=$load_start" "load_end=$load_end" "postgres=PostgreSQL $pg_version, idem $idem_version ($idem_build build)" \
         "python=${py_versions:-}" "node=${node_versions:-}, Node $(node --version)" \
         "setup=rounds $ROUNDS x $REQUESTS requests, $CONCURRENCY connections, synchronous_commit = off, fsync on" \
  > "$OUT/report.md"
cat "$OUT/report.md"

# ---- where the time goes (--profile) ----------------------------------------------------------
# Not measured runs: each profiler slows its server down. pyinstrument samples
# the Python server (flat self time, and the tree under the middleware);
# node --cpu-prof the Node one (bench/middleware/cpuprof.js summarises it);
# pg_stat_statements (switched on for these runs only) gives the database's
# side: execution time per statement.
if [ "$PROFILE" = 1 ] && [ "$LANGS" != java ]; then
  say "profiles: one run of a and one of c per server, each in a server of its own"
  stop_server "$py_pid"; py_pid=
  stop_server "$node_pid"; stop_server "$fy_pid"; node_pid= fy_pid=
  pc_psql -q -d mw -c "ALTER SYSTEM SET pg_stat_statements.track = top" -c "SELECT pg_reload_conf()" >/dev/null
  statements() { # FILE: what the database spent per statement since the reset
    pc_psql -d mw -P pager=off -c "SELECT calls, round((total_exec_time * 1000 / calls)::numeric, 1) AS mean_exec_us,
        round(total_exec_time::numeric, 1) AS total_ms, left(regexp_replace(query, '\s+', ' ', 'g'), 110) AS statement
      FROM pg_stat_statements WHERE calls >= $REQUESTS / 2 ORDER BY total_exec_time DESC" > "$1"
  }
  for v in a c; do
    start_python "$venv/bin/pyinstrument" -r pyisession -o "$work/python-$v.pyisession"
    pc_psql -q -d mw -c "SELECT pg_stat_statements_reset()" >/dev/null
    run python $v p "$REQUESTS"
    statements "$OUT/statements-python-$v.txt"
    stop_server "$py_pid"; py_pid=
    "$venv/bin/pyinstrument" --load "$work/python-$v.pyisession" -r text -p flat=true -p flat_time=self --show-all \
      -o "$OUT/pyinstrument-$v-flat.txt"
    "$venv/bin/pyinstrument" --load "$work/python-$v.pyisession" -r text --show '*/idem_http/*' \
      -o "$OUT/pyinstrument-$v-tree.txt"
    start_node --cpu-prof --cpu-prof-dir="$work/node-cpuprof-$v"
    pc_psql -q -d mw -c "SELECT pg_stat_statements_reset()" >/dev/null
    run node $v p "$REQUESTS"
    statements "$OUT/statements-node-$v.txt"
    stop_server "$node_pid"; stop_server "$fy_pid"; node_pid= fy_pid=
    node "$HERE/cpuprof.js" "$(ls "$work/node-cpuprof-$v"/*.cpuprofile)" 30 > "$OUT/node-cpuprof-$v.txt"
  done
  pc_psql -q -d mw -c "ALTER SYSTEM RESET pg_stat_statements.track" -c "SELECT pg_reload_conf()" >/dev/null
  echo "profiles in $OUT: pyinstrument-{a,c}-{flat,tree}.txt, node-cpuprof-{a,c}.txt, statements-{python,node}-{a,c}.txt"
fi
