# Helpers for scenarios that run a private cluster of their own (source it
# after scripts/lib.sh). The cluster listens on a Unix socket in its folder
# (and on 127.0.0.1 when asked), trust authentication, user postgres.
#
#   pc_init DIR PORT [CONF-LINE...]   initdb into DIR/data with these settings
#   pc_start / pc_restart / pc_stop   (DIR as set by pc_init; pc_stop is immediate)
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
  as_postgres "$PG_BIN/initdb" -D "$PC_DIR/data" --auth=trust --username=postgres -E UTF8 --locale=C.UTF-8 >/dev/null
  {
    echo "listen_addresses = ''"
    echo "unix_socket_directories = '$PC_DIR'"
    echo "port = $PC_PORT"
    echo "shared_buffers = 32MB"
    echo "fsync = off"
    echo "log_min_messages = warning"
    printf '%s\n' "$@"
  } >> "$PC_DIR/data/postgresql.conf"
}

pc_start() { as_postgres "$PG_BIN/pg_ctl" -D "$PC_DIR/data" -l "$PC_DIR/server.log" -w start >/dev/null; }
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
