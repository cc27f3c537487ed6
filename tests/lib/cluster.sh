# Helpers for scenarios that run a private cluster of their own (source it
# after scripts/lib.sh). The cluster listens on a Unix socket in its folder
# (and on 127.0.0.1 when asked), trust authentication, user postgres.
#
#   pc_initdb BIN DIR PORT [CONF-LINE...]
#                                     initdb (of the server in BIN) into DIR/data,
#                                     listening on a socket in DIR only, with
#                                     these settings too; DIR must exist. For a
#                                     scenario that runs servers of its own
#                                     (another tree, or two at once)
#   pc_init DIR PORT [CONF-LINE...]   DIR made anew, then pc_initdb with $PG_BIN
#   pc_start [VAR=VALUE...] / pc_restart / pc_stop
#                                     (DIR as set by pc_init; pc_stop is immediate;
#                                     VAR=VALUE: the postmaster's environment, which
#                                     sudo would otherwise reset)
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

PC_DIR= PC_PORT=

pc_init() {
  PC_DIR=$1 PC_PORT=$2
  shift 2
  as_postgres "$PG_BIN/pg_ctl" -D "$PC_DIR/data" -m immediate -w stop >/dev/null 2>&1 || true
  rm -rf "$PC_DIR"
  mkdir -p "$PC_DIR"
  chown postgres:postgres "$PC_DIR"
  chmod 700 "$PC_DIR"
  pc_initdb "$PG_BIN" "$PC_DIR" "$PC_PORT" "log_min_messages = warning" "$@"
}

pc_initdb() { # BIN DIR PORT [CONF-LINE...]
  local bin=$1 dir=$2 port=$3
  shift 3
  as_postgres "$bin/initdb" -D "$dir/data" --auth=trust --username=postgres -E UTF8 --locale=C.UTF-8 --no-sync >/dev/null
  {
    echo "listen_addresses = ''"
    echo "unix_socket_directories = '$dir'"
    echo "port = $port"
    echo "shared_buffers = 32MB"
    echo "fsync = off"
    printf '%s\n' "$@"
  } >> "$dir/data/postgresql.conf"
}

pc_start() { as_postgres env "$@" "$PG_BIN/pg_ctl" -D "$PC_DIR/data" -l "$PC_DIR/server.log" -w start >/dev/null; }
pc_restart() { as_postgres "$PG_BIN/pg_ctl" -D "$PC_DIR/data" -l "$PC_DIR/server.log" -m fast -w restart >/dev/null; }
pc_stop() { [ -z "$PC_DIR" ] || as_postgres "$PG_BIN/pg_ctl" -D "$PC_DIR/data" -m immediate -w stop >/dev/null 2>&1 || true; }

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

declare -A SESSION_FD SESSION_PID SESSION_SENT
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
  if [ -n "$p" ] && tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -q "pgbouncer.*$PC_DIR/pgbouncer.ini"; then
    kill -TERM "$p"
    for _ in $(seq 1 200); do kill -0 "$p" 2>/dev/null || break; sleep 0.02; done
  fi
  rm -f "$PC_DIR/pgbouncer.pid"
}

# kill_matching REGEX: KILL every process whose command line matches (a
# test server a driver that died left behind; name it by a path of its own
# run, so nothing else matches).
kill_matching() {
  local p
  for p in /proc/[0-9]*; do
    if tr '\0' ' ' 2>/dev/null < "$p/cmdline" | grep -q "$1"; then kill -KILL "${p#/proc/}" 2>/dev/null || true; fi
  done
}
