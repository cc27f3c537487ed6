# The one cluster library: every test server of the project is made,
# started, stopped, crashed and removed here (initdb and pg_ctl are called
# from this file only, apart from tests/package/in_root.sh, which runs as an
# operator would in a Debian root without sudo or this checkout's scripts).
# Source it after scripts/lib.sh, or run it as a command (below). A cluster
# lives in a folder DIR: its data in DIR/data, its
# log in DIR/server.log, its Unix socket in DIR, trust authentication, user
# postgres; the PostgreSQL whose programs made it is remembered in
# DIR/pg_bin (another tree than $PG_BIN: pg_tle's, an older or newer major).
#
#   pc_initdb BIN DIR PORT [CONF-LINE...]
#                                     initdb (of the server in BIN) into DIR/data,
#                                     listening on a socket in DIR only, fsync off,
#                                     shared_buffers 32MB (PC_INITDB_OPTS: more initdb options),
#                                     a copy of a template made by initdb once (pc_template),
#                                     with these settings too (later lines win);
#                                     DIR must exist
#   pc_fresh DIR                      DIR stopped, removed and made anew (postgres's, 0700)
#   pc_server_start DIR [VAR=VALUE...] / pc_server_stop DIR [MODE]
#                                     start (waits until it accepts connections;
#                                     VAR=VALUE: the postmaster's environment,
#                                     which sudo would otherwise reset) / stop
#                                     (immediate unless MODE; quiet if not running)
#   pc_running DIR                    its server runs
#   pc_ctl DIR PG_CTL-ARGS...         any other pg_ctl command on DIR's cluster
#
# One cluster per scenario (PC_DIR, PC_PORT):
#   pc_init DIR PORT [CONF-LINE...]   DIR made anew, then pc_initdb with $PG_BIN
#   pc_start [VAR=VALUE...] / pc_restart / pc_stop
#                                     (DIR as set by pc_init; pc_stop is immediate)
#   pc_psql ARGS...                   psql to it (ON_ERROR_STOP, no psqlrc)
#   pc_until DB SQL [WHAT]            poll until SQL returns t (a safety limit
#                                     of 120 s fails the test: it waits for a
#                                     state, it never judges by time)
#   session_open NAME DB / session_send NAME SQL / session_close NAME
#                                     a psql session in the background that
#                                     keeps its transaction between sends
#                                     (application_name NAME; output in
#                                     $PC_DIR/NAME.out)
#   session_run NAME SQL              send, and wait until the session has run it
#   session_wait NAME                 wait until everything sent has run
#
# Durable clusters for the crash, failover, replication and retention tests
# (fsync and synchronous_commit on: an acknowledged commit must survive the
# crash), on 127.0.0.1:PORT and a socket in DIR; also as a command, for a
# driver that crashes or fails over a server itself:
#   bash tests/lib/cluster.sh init DIR PORT [primary|crash]
#                                     pc_node_init: "primary": synchronous standby
#                                     'stress_replica', remote_apply; "crash":
#                                     commit_delay (see there)
#   bash tests/lib/cluster.sh start DIR / stop DIR [MODE] / ctl DIR PG_CTL-ARGS...
#   bash tests/lib/cluster.sh crash DIR [N]
#                                     pc_crash: crash number N (1, 2, 3, ...), see
#                                     there; returns once the server accepts
#                                     connections again
#   bash tests/lib/cluster.sh replica PRIMARY_DIR DIR PORT
#                                     pg_basebackup, start as synchronous standby
#   bash tests/lib/cluster.sh failover PRIMARY_DIR REPLICA_DIR
#                                     stop the primary hard, promote the replica
#   bash tests/lib/cluster.sh destroy DIR...
#                                     stop (immediate) and remove
#
# The Citus cluster (tests/scenarios/scaling.sh citus, bench/citus.sh): a
# coordinator and two workers of the PostgreSQL of $PG_CONFIG, which must
# hold Citus (PG_CONFIG=$(bash tests/scenarios/scaling.sh citus --server)),
# each in $(cluster_dir)/citus/NODE (NODE: coord, w1, w2), on 127.0.0.1 and
# a socket there, trust authentication, fsync off; ports CITUS_PORTS
# (default "5530 5531 5532": coordinator, worker 1, worker 2), database
# CITUS_DB (default idem_citus). Also as functions (citus_start, ...):
#   bash tests/lib/cluster.sh citus start
#                                     create (first time) and start all three; create
#                                     $CITUS_DB with Citus on every node and add the
#                                     workers to the coordinator. Idempotent.
#   bash tests/lib/cluster.sh citus stop|status
#                                     stop all three (fast; idempotent) / say which run
#   bash tests/lib/cluster.sh citus reset
#                                     drop and recreate $CITUS_DB on every node (Citus only)
#   bash tests/lib/cluster.sh citus destroy
#                                     stop (immediate) and remove the data
#   bash tests/lib/cluster.sh citus crash NODE
#                                     stop one node as a crash would (immediate: every
#                                     backend ends at once, no shutdown checkpoint, crash
#                                     recovery at the next start); start brings it back
#   bash tests/lib/cluster.sh citus psql NODE [PSQL-ARGS...]
#                                     psql to $CITUS_DB on NODE (citus_sql NODE DB ...: to DB)

pc_bin() { cat "$1/pg_bin" 2>/dev/null || echo "$PG_BIN"; }
pc_ctl() { # DIR PG_CTL-ARGS...
  local dir=$1
  shift
  as_postgres "$(pc_bin "$dir")/pg_ctl" -D "$dir/data" "$@"
}
pc_server_start() { # DIR [VAR=VALUE...]
  local dir=$1
  shift
  # (after a crash pg_ctl warns that "another server might be running": the
  # stale pid file; the server checks it itself)
  as_postgres env "$@" "$(pc_bin "$dir")/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start \
    >/dev/null 2>"$dir/pg_ctl.err" || { cat "$dir/pg_ctl.err" >&2; return 1; }
}
pc_running() { [ -f "$1/data/postmaster.pid" ] && pc_ctl "$1" status >/dev/null 2>&1; } # DIR
pc_server_stop() { # DIR [MODE]
  [ -f "$1/data/postmaster.pid" ] || return 0
  pc_ctl "$1" -m "${2:-immediate}" -w stop >/dev/null 2>&1 || true
}
pc_fresh() { # DIR
  pc_server_stop "$1"
  rm -rf "$1"
  mkdir -p "$1"
  chown postgres:postgres "$1"
  chmod 700 "$1"
}

PC_DIR= PC_PORT=

pc_init() {
  PC_DIR=$1 PC_PORT=$2
  shift 2
  pc_fresh "$PC_DIR"
  pc_initdb "$PG_BIN" "$PC_DIR" "$PC_PORT" "log_min_messages = warning" "$@"
}

pc_initdb() { # BIN DIR PORT [CONF-LINE...]
  local bin=$1 dir=$2 port=$3
  shift 3
  local template
  # (PC_INITDB_OPTS: more options, as --no-data-checksums for an upgrade's new cluster)
  if [ ! -e "$dir/data" ] && template=$(pc_template "$bin"); then
    cp -a "$template" "$dir/data"
  else
    as_postgres "$bin/initdb" -D "$dir/data" --auth=trust --username=postgres -E UTF8 --locale=C.UTF-8 --no-sync \
      ${PC_INITDB_OPTS:-} >/dev/null
  fi
  echo "$bin" > "$dir/pg_bin"
  {
    echo "listen_addresses = ''"
    echo "unix_socket_directories = '$dir'"
    echo "port = $port"
    echo "shared_buffers = 32MB"
    echo "fsync = off"
    printf '%s\n' "$@"
  } >> "$dir/data/postgresql.conf"
}

# initdb runs once per server (its programs' folder and build), owner and
# options: its data directory is kept as a template under
# $IDEM_CACHE/initdb, and every cluster made later is a copy of it (cp -a:
# a tenth of initdb's CPU, for each of the many clusters the suite makes). Its path,
# or nothing (status 1) where the cache cannot be written: initdb then
# runs for each cluster. (The copies share one system identifier, which no
# test of the project tells apart: a standby is a copy of its primary
# anyway.)
pc_template() { # BIN
  local bin=$1 base="$IDEM_CACHE/initdb" key tmp
  key=$(printf '%s|%s|%s|%s' "$bin" "$(stat -c '%Y %s' "$bin/postgres" "$bin/initdb" 2>/dev/null)" \
    "$(id -u postgres)" "${PC_INITDB_OPTS:-}" | md5sum | cut -c1-16)
  mkdir -p "$base" 2>/dev/null && [ -w "$base" ] || return 1
  [ -f "$base/$key/PG_VERSION" ] || (
    flock 9
    [ -f "$base/$key/PG_VERSION" ] && exit 0
    tmp="$base/.$key.$$"
    rm -rf "$tmp"
    mkdir -p "$tmp" && chown postgres:postgres "$tmp" && chmod 700 "$tmp"
    as_postgres "$bin/initdb" -D "$tmp/data" --auth=trust --username=postgres -E UTF8 --locale=C.UTF-8 --no-sync \
      ${PC_INITDB_OPTS:-} >/dev/null || { rm -rf "$tmp"; exit 1; }
    mv "$tmp/data" "$base/$key" && rm -rf "$tmp"
  ) 9> "$base/.lock" || return 1
  echo "$base/$key"
}

pc_start() { pc_server_start "$PC_DIR" "$@"; }
pc_restart() { pc_ctl "$PC_DIR" -l "$PC_DIR/server.log" -m fast -w restart >/dev/null; }
pc_stop() { [ -z "$PC_DIR" ] || pc_server_stop "$PC_DIR"; }

pc_psql() { "$PG_BIN/psql" -X -v ON_ERROR_STOP=1 -h "$PC_DIR" -p "$PC_PORT" -U postgres "$@"; }

pc_until() { # DB SQL [WHAT]
  local i
  for i in $(seq 1 2400); do
    [ "$(pc_psql -d "$1" -Atc "$2")" = t ] && return 0
    sleep 0.05
  done
  echo "FAIL: still not true after 120 s: ${3:-$2}" >&2
  exit 1
}

declare -gA SESSION_FD SESSION_PID SESSION_SENT
session_open() { # NAME DB
  local fifo="$PC_DIR/$1.in" fd
  rm -f "$fifo" && mkfifo "$fifo"
  # (without the other sessions' pipes: a session ends when its own closes)
  (
    for fd in "${SESSION_FD[@]}"; do eval "exec $fd>&-"; done
    PGAPPNAME=$1 exec "$PG_BIN/psql" -X -q -h "$PC_DIR" -p "$PC_PORT" -U postgres -d "$2" < "$fifo" > "$PC_DIR/$1.out" 2>&1
  ) &
  SESSION_PID[$1]=$!
  exec {fd}>"$fifo"
  SESSION_FD[$1]=$fd
  pc_until "$2" "SELECT count(*) = 1 FROM pg_stat_activity WHERE application_name = '$1'" "session $1 connects"
}
session_send() {
  SESSION_SENT[$1]=$(( ${SESSION_SENT[$1]:-0} + 1 ))
  printf '%s\n\\echo @@done %s\n' "$2" "${SESSION_SENT[$1]}" >&"${SESSION_FD[$1]}"
}
session_wait() {
  local i
  for i in $(seq 1 2400); do
    grep -qx "@@done ${SESSION_SENT[$1]}" "$PC_DIR/$1.out" && return 0
    sleep 0.05
  done
  echo "FAIL: session $1 did not finish its statements in 120 s; its output:" >&2
  cat "$PC_DIR/$1.out" >&2
  exit 1
}
session_run() { session_send "$1" "$2"; session_wait "$1"; }
session_close() {
  local fd=${SESSION_FD[$1]}
  exec {fd}>&-
  wait "${SESSION_PID[$1]}" 2>/dev/null || true
}

# PgBouncer in transaction mode in front of the cluster (pc_init's DIR and
# PORT), for every database, on 127.0.0.1:LISTEN_PORT; its files in $PC_DIR.
#   pgb_start LISTEN_PORT [POOL_SIZE]   start it; returns once it answers
#   pgb_stop                            stop it (only this cluster's, by its pid file)
pgb_start() {
  local listen=$1 pool=${2:-40} ready= i
  printf '"postgres" ""\n' > "$PC_DIR/userlist.txt"
  cat > "$PC_DIR/pgbouncer.ini" <<INI
[databases]
* = host=$PC_DIR port=$PC_PORT
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $listen
unix_socket_dir =
auth_type = trust
auth_file = $PC_DIR/userlist.txt
pool_mode = transaction
default_pool_size = $pool
max_client_conn = $((pool * 5))
admin_users = postgres
ignore_startup_parameters = extra_float_digits
log_connections = 0
log_disconnections = 0
logfile = $PC_DIR/pgbouncer.log
pidfile = $PC_DIR/pgbouncer.pid
INI
  chown postgres:postgres "$PC_DIR/pgbouncer.ini" "$PC_DIR/userlist.txt"
  as_postgres /usr/sbin/pgbouncer -d "$PC_DIR/pgbouncer.ini"
  for i in $(seq 1 250); do
    "$PG_BIN/psql" -X -h 127.0.0.1 -p "$listen" -U postgres -d pgbouncer -Atc "SHOW VERSION" >/dev/null 2>&1 && ready=1 && break
    sleep 0.02
  done
  [ -n "$ready" ] || { tail -5 "$PC_DIR/pgbouncer.log" >&2; echo "FAIL: PgBouncer did not start on 127.0.0.1:$listen" >&2; exit 1; }
}
pgb_stop() {
  local p
  [ -n "$PC_DIR" ] || return 0
  p=$(cat "$PC_DIR/pgbouncer.pid" 2>/dev/null) || p=
  if [ -n "$p" ] && grep -q "pgbouncer.*$PC_DIR/pgbouncer.ini" <<<"$(tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null)"; then
    kill -TERM "$p"
    for _ in $(seq 1 200); do kill -0 "$p" 2>/dev/null || break; sleep 0.02; done
  fi
  rm -f "$PC_DIR/pgbouncer.pid"
}

pc_wait_ready() { # DIR PORT: until the server accepts a query (up to 60 s)
  for _ in $(seq 1 600); do
    "$PG_BIN/psql" -X -h "$1" -p "$2" -U postgres -d postgres -Atc "SELECT 1" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "server in $1 did not come back" >&2
  tail -20 "$1/server.log" >&2
  return 1
}

pc_port_of() { awk -F' *= *' '$1 == "port" { p = $2 } END { print p }' "$1/data/postgresql.conf"; }

pc_elapsed_ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

pc_node_init() { # DIR PORT [primary|crash]
  local dir=$1 port=$2 extra=()
  # fsync and synchronous_commit stay on: an acknowledged commit must
  # survive the crash.
  case "${3:-}" in
  crash)
    # A commit waits 2 ms between writing its commit record into the WAL
    # buffers and flushing it (group commit), so that a crash often finds
    # COMMITs in flight: some lost with the buffers, some flushed but not
    # yet answered. The guarantee under test is unchanged: a commit is
    # acknowledged only after its flush.
    extra=("commit_delay = 2000" "commit_siblings = 1") ;;
  primary) extra=("synchronous_standby_names = 'stress_replica'" "synchronous_commit = remote_apply") ;;
  esac
  pc_fresh "$dir"
  pc_initdb "$PG_BIN" "$dir" "$port" "fsync = on" "listen_addresses = '127.0.0.1'" "max_connections = 40" \
    "shared_buffers = 64MB" "wal_level = replica" "max_wal_senders = 4" "restart_after_crash = on" \
    "log_min_messages = warning" "log_line_prefix = '%m [%p] '" "${extra[@]}"
}

# The crash, by number, so that one run sees each way a server dies:
#   1, 4, ...  kill -9 of the postmaster alone: its backends notice and exit
#              by themselves (a backend inside a COMMIT finishes it first);
#              then the server is started again and runs crash recovery.
#   2, 5, ...  kill -9 of the postmaster and every process it started, in
#              one kill(1) call: every backend dies wherever it is, as in a
#              power cut that spares the disk. (Each child runs in its own
#              session, so there is no process group to signal.)
#   3, 6, ...  kill -9 of one busy client backend: the postmaster itself
#              resets every other backend and runs crash recovery.
pc_crash() { # DIR [N]
  local dir=$1 n=${2:-1} port pm kids alive t0
  port=$(pc_port_of "$dir")
  pm=$(head -1 "$dir/data/postmaster.pid")
  kids=$(ps -o pid= --ppid "$pm" | tr -d ' ' | tr '\n' ' ' || true)
  t0=$(date +%s%N)
  case $(( (n - 1) % 3 )) in
  0)
    kill -9 "$pm"
    echo "crash $n: kill -9 of the postmaster ($pm)"
    ;;
  1)
    kill -9 "$pm" $kids
    echo "crash $n: kill -9 of the postmaster ($pm) and its $(echo $kids | wc -w) children at once"
    ;;
  2)
    local victim
    victim=$("$PG_BIN/psql" -X -h "$dir" -p "$port" -U postgres -d postgres -Atc \
      "SELECT pid FROM pg_stat_activity WHERE application_name = 'stress-worker' AND state <> 'idle'
        ORDER BY random() LIMIT 1")
    [ -n "$victim" ] || victim=$("$PG_BIN/psql" -X -h "$dir" -p "$port" -U postgres -d postgres -Atc \
      "SELECT pid FROM pg_stat_activity WHERE application_name = 'stress-worker' LIMIT 1")
    [ -n "$victim" ] || { echo "crash $n: no client backend to kill" >&2; return 1; }
    local resets
    resets=$(grep -c "all server processes terminated; reinitializing" "$dir/server.log" || true)
    kill -9 "$victim"
    echo "crash $n: kill -9 of client backend $victim; the postmaster resets the others"
    # The postmaster stays up and runs crash recovery itself: wait for its
    # reset, then for connections.
    for _ in $(seq 1 100); do
      [ "$(grep -c "all server processes terminated; reinitializing" "$dir/server.log" || true)" -gt "$resets" ] && break
      sleep 0.1
    done
    pc_wait_ready "$dir" "$port"
    echo "crash $n: recovered by the postmaster in $(pc_elapsed_ms "$t0") ms"
    return 0
    ;;
  esac
  # Every old process must be gone before a new postmaster can start (they
  # hold the old shared memory). Orphaned backends exit when they notice the
  # postmaster's death; after 10 s the rest are killed.
  local waited=0
  for _ in $(seq 1 100); do
    alive=""
    for k in $kids; do
      # (a zombie has exited: only its reaping is missing)
      case "$(ps -o stat= -p "$k" 2>/dev/null)" in ""|Z*) ;; *) alive="$alive $k" ;; esac
    done
    [ -z "$alive" ] && break
    sleep 0.1
    waited=$((waited + 1))
  done
  if [ -n "$alive" ]; then
    echo "crash $n: processes still alive 10 s after the postmaster died:$alive (killed)"
    kill -9 $alive 2>/dev/null || true
  elif [ $waited -gt 0 ]; then
    echo "crash $n: the orphaned processes exited by themselves within $((waited * 100)) ms"
  fi
  # A new postmaster refuses to start while the old one's pid exists, even
  # as a zombie: wait until init has reaped them all.
  for _ in $(seq 1 300); do
    alive=""
    for k in $pm $kids; do kill -0 "$k" 2>/dev/null && alive="$alive $k"; done
    [ -z "$alive" ] && break
    sleep 0.1
  done
  pc_server_start "$dir"
  pc_wait_ready "$dir" "$port"
  echo "crash $n: restarted and recovered in $(pc_elapsed_ms "$t0") ms"
}

pc_replica() { # PRIMARY_DIR DIR PORT
  local pdir=$1 dir=$2 port=$3 pport
  pport=$(pc_port_of "$pdir")
  pc_fresh "$dir"
  as_postgres "$PG_BIN/pg_basebackup" -D "$dir/data" -d "host=127.0.0.1 port=$pport user=postgres" -X stream -R -c fast
  # The copy carries the primary's settings: later lines win.
  cat >> "$dir/data/postgresql.conf" <<CONF
# streaming replica of $pdir
unix_socket_directories = '$dir'
port = $port
synchronous_standby_names = ''
hot_standby = on
primary_conninfo = 'host=127.0.0.1 port=$pport user=postgres application_name=stress_replica'
CONF
  # pg_basebackup -R wrote its own primary_conninfo there (it would override ours).
  sed -i '/^primary_conninfo/d' "$dir/data/postgresql.auto.conf"
  pc_server_start "$dir"
  pc_wait_ready "$dir" "$port"
}

pc_failover() { # PRIMARY_DIR REPLICA_DIR
  local pdir=$1 rdir=$2 t0
  t0=$(date +%s%N)
  pc_ctl "$pdir" -m immediate stop >/dev/null
  echo "failover: primary stopped (immediate)"
  pc_ctl "$rdir" -w -t 60 promote >/dev/null
  for _ in $(seq 1 600); do
    [ "$("$PG_BIN/psql" -X -h "$rdir" -p "$(pc_port_of "$rdir")" -U postgres -d postgres -Atc \
          "SELECT pg_is_in_recovery()" 2>/dev/null)" = f ] && break
    sleep 0.1
  done
  echo "failover: replica promoted in $(pc_elapsed_ms "$t0") ms"
}

pc_destroy() { # DIR...
  local dir
  for dir in "$@"; do
    pc_server_stop "$dir"
    # Still there (pg_ctl gave up): kill the postmaster and its children by pid.
    if [ -f "$dir/data/postmaster.pid" ]; then
      local pm
      pm=$(head -1 "$dir/data/postmaster.pid")
      if [ -n "$pm" ] && grep -qF "$dir/data" <<<"$(ps -o args= -p "$pm" 2>/dev/null)"; then
        kill -9 "$pm" $(ps -o pid= --ppid "$pm" || true) 2>/dev/null || true
      fi
    fi
    rm -rf "$dir"
  done
}

# kill_matching REGEX: KILL every process whose command line matches (a
# test server a driver that died left behind; name it by a path of its own
# run, so nothing else matches).
kill_matching() {
  local p
  for p in /proc/[0-9]*; do
    if grep -q "$1" <<<"$(tr '\0' ' ' 2>/dev/null < "$p/cmdline")"; then kill -KILL "${p#/proc/}" 2>/dev/null || true; fi
  done
}

# The Citus cluster (see the top).
CITUS_NODES=(coord w1 w2)
citus_base() { echo "$(cluster_dir)/citus"; }
citus_port() { # NODE
  local ports
  read -r -a ports <<<"${CITUS_PORTS:-5530 5531 5532}"
  case $1 in coord) echo "${ports[0]}" ;; w1) echo "${ports[1]}" ;; w2) echo "${ports[2]}" ;; *) echo "unknown Citus node $1" >&2; return 1 ;; esac
}
citus_sql() { # NODE DB [psql args...]
  local n=$1 db=$2 port
  shift 2
  port=$(citus_port "$n") || return 1
  PGOPTIONS="${PGOPTIONS:--c client_min_messages=warning}" "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$(citus_base)/$n" -p "$port" -U postgres -d "$db" "$@"
}
citus_psql() { local n=$1; shift; citus_sql "$n" "${CITUS_DB:-idem_citus}" "$@"; } # NODE [psql args...]
citus_running() { pc_running "$(citus_base)/$1"; } # NODE

citus_init_node() { # NODE
  local n=$1 base preload="'citus'"
  base=$(citus_base)
  as_postgres mkdir -p "$base/$n"
  # pg_cron on the coordinator only, as docs/scaling.md deploys it.
  [ "$n" = coord ] && preload="'citus,pg_cron'"
  pc_initdb "$PG_BIN" "$base/$n" "$(citus_port "$n")"
  cat >> "$base/$n/data/postgresql.conf" <<CONF
# idem's Citus test cluster: node $n
listen_addresses = '127.0.0.1'
shared_preload_libraries = $preload   # citus first
cron.database_name = '${CITUS_DB:-idem_citus}'
citus.local_hostname = '127.0.0.1'
max_connections = 100
max_prepared_transactions = 100        # Citus commits multi-node transactions with 2PC
max_worker_processes = 32
wal_level = logical                    # shard moves use logical replication
max_wal_senders = 10
max_replication_slots = 10
shared_buffers = 64MB
full_page_writes = off
log_min_messages = warning
log_line_prefix = '%m [%p] $n '
CONF
}

citus_start() {
  local base n db=${CITUS_DB:-idem_citus}
  base=$(citus_base)
  if [ ! -f "$("$PG_CONFIG" --pkglibdir)/citus.so" ]; then
    echo "citus is not installed into $PG_CONFIG: PG_CONFIG=\$(bash tests/scenarios/scaling.sh citus --server)" >&2; return 1
  fi
  mkdir -p "$base"
  chown postgres:postgres "$(dirname "$base")" "$base"
  chmod 700 "$base"
  for n in "${CITUS_NODES[@]}"; do
    [ -f "$base/$n/data/PG_VERSION" ] || { say "creating Citus node $n (port $(citus_port "$n")) in $base/$n"; citus_init_node "$n"; }
  done
  for n in "${CITUS_NODES[@]}"; do
    citus_running "$n" || pc_server_start "$base/$n" || return 1
  done
  for n in "${CITUS_NODES[@]}"; do
    if [ "$(citus_sql "$n" postgres -Atc "SELECT count(*) FROM pg_database WHERE datname = '$db'")" = 0 ]; then
      citus_sql "$n" postgres -c "CREATE DATABASE $db"
    fi
    citus_sql "$n" "$db" -c "CREATE EXTENSION IF NOT EXISTS citus"
  done
  citus_sql coord "$db" -At >/dev/null <<SQL
SELECT citus_set_coordinator_host('127.0.0.1', $(citus_port coord));
SELECT citus_add_node('127.0.0.1', p) FROM unnest(ARRAY[$(citus_port w1), $(citus_port w2)]) p
 WHERE NOT EXISTS (SELECT 1 FROM pg_dist_node WHERE nodename = '127.0.0.1' AND nodeport = p);
SQL
}

citus_stop() { # [MODE] (fast)
  local n
  for n in "${CITUS_NODES[@]}"; do
    ! citus_running "$n" || pc_ctl "$(citus_base)/$n" -m "${1:-fast}" -w stop >/dev/null
  done
}

citus_reset() {
  local n
  citus_start
  for n in "${CITUS_NODES[@]}"; do
    citus_sql "$n" postgres -c "DROP DATABASE IF EXISTS ${CITUS_DB:-idem_citus} WITH (FORCE)"
  done
  citus_start
}

citus_status() {
  local n
  for n in "${CITUS_NODES[@]}"; do
    if citus_running "$n"; then echo "$n: running on port $(citus_port "$n") ($(citus_base)/$n)"; else echo "$n: stopped"; fi
  done
}

citus_destroy() { citus_stop immediate; rm -rf "$(citus_base)"; }

citus_crash() { # NODE
  citus_port "${1:?node}" >/dev/null || return 1
  ! citus_running "$1" || pc_ctl "$(citus_base)/$1" -m immediate -w stop >/dev/null
}

# As a command (see the top): bash tests/lib/cluster.sh init|start|stop|ctl|crash|replica|failover|destroy|citus ARGS...
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
  cmd=${1:-}
  shift || true
  case "$cmd" in
  init) pc_node_init "$@" ;;
  start) pc_server_start "$@" ;;
  stop) pc_server_stop "$@" ;;
  ctl) pc_ctl "$@" ;;
  crash|replica|failover|destroy) "pc_$cmd" "$@" ;;
  citus)
    sub=${1:-}
    shift || true
    case "$sub" in
    start|stop|status|reset|destroy|crash|psql) "citus_$sub" "$@" ;;
    *) echo "usage: bash $0 citus start|stop|status|reset|destroy|crash NODE|psql NODE [ARGS...]" >&2; exit 2 ;;
    esac ;;
  *) echo "usage: bash $0 init|start|stop|ctl|crash|replica|failover|destroy|citus ARGS..." >&2; exit 2 ;;
  esac
fi
