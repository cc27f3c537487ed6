#!/usr/bin/env bash
# Private PostgreSQL clusters for the crash and failover tests (ports 5510-5519).
#   bash tests/stress/pg.sh init DIR PORT [primary|crash]  initdb into DIR/data; "primary": synchronous
#                                                       standby 'stress_replica', remote_apply; "crash":
#                                                       commit_delay (see below)
#   bash tests/stress/pg.sh start DIR
#   bash tests/stress/pg.sh crash DIR [N]               crash number N (1, 2, 3, ...), see below;
#                                                       returns once the server accepts connections again
#   bash tests/stress/pg.sh replica PRIMARY_DIR DIR PORT  pg_basebackup, start as synchronous standby
#   bash tests/stress/pg.sh failover PRIMARY_DIR REPLICA_DIR   stop the primary hard, promote the replica
#   bash tests/stress/pg.sh destroy DIR...              stop (immediate) and remove
# Each cluster listens on 127.0.0.1:PORT and on a Unix socket in DIR only,
# with trust authentication for user postgres. The scripts run as root; the
# server runs as postgres.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"

pg() { as_postgres "$PG_BIN/$@"; }

wait_ready() { # DIR PORT: until the server accepts a query (up to 60 s)
  for _ in $(seq 1 600); do
    "$PG_BIN/psql" -X -h "$1" -p "$2" -U postgres -d postgres -Atc "SELECT 1" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "server in $1 did not come back" >&2
  tail -20 "$1/server.log" >&2
  return 1
}

port_of() { awk -F' *= *' '$1 == "port" { p = $2 } END { print p }' "$1/data/postgresql.conf"; }

elapsed_ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

init() { # DIR PORT [primary|crash]
  local dir=$1 port=$2
  rm -rf "$dir"
  mkdir -p "$dir"
  chown postgres:postgres "$dir"
  chmod 700 "$dir"
  pg initdb -D "$dir/data" --auth=trust --username=postgres -E UTF8 --locale=C.UTF-8 >/dev/null
  # fsync and synchronous_commit stay on: an acknowledged commit must
  # survive the crash.
  cat >> "$dir/data/postgresql.conf" <<CONF
# idem stress/crash/failover test cluster
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
port = $port
max_connections = 40
shared_buffers = 64MB
wal_level = replica
max_wal_senders = 4
restart_after_crash = on
log_min_messages = warning
log_line_prefix = '%m [%p] '
CONF
  if [ "${3:-}" = crash ]; then
    # A commit waits 2 ms between writing its commit record into the WAL
    # buffers and flushing it (group commit), so that a crash often finds
    # COMMITs in flight: some lost with the buffers, some flushed but not
    # yet answered. The guarantee under test is unchanged: a commit is
    # acknowledged only after its flush.
    cat >> "$dir/data/postgresql.conf" <<CONF
commit_delay = 2000
commit_siblings = 1
CONF
  fi
  if [ "${3:-}" = primary ]; then
    cat >> "$dir/data/postgresql.conf" <<CONF
synchronous_standby_names = 'stress_replica'
synchronous_commit = remote_apply
CONF
  fi
}

start() { # DIR
  # (after a crash pg_ctl warns that "another server might be running": the
  # stale pid file; the server checks it itself)
  pg pg_ctl -D "$1/data" -l "$1/server.log" -w -t 60 start >/dev/null 2>"$1/pg_ctl.err" || { cat "$1/pg_ctl.err" >&2; return 1; }
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
crash() { # DIR [N]
  local dir=$1 n=${2:-1} port pm kids alive t0
  port=$(port_of "$dir")
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
    wait_ready "$dir" "$port"
    echo "crash $n: recovered by the postmaster in $(elapsed_ms "$t0") ms"
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
  start "$dir"
  wait_ready "$dir" "$port"
  echo "crash $n: restarted and recovered in $(elapsed_ms "$t0") ms"
}

replica() { # PRIMARY_DIR DIR PORT
  local pdir=$1 dir=$2 port=$3 pport
  pport=$(port_of "$pdir")
  rm -rf "$dir"
  mkdir -p "$dir"
  chown postgres:postgres "$dir"
  chmod 700 "$dir"
  pg pg_basebackup -D "$dir/data" -d "host=127.0.0.1 port=$pport user=postgres" -X stream -R -c fast
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
  start "$dir"
  wait_ready "$dir" "$port"
}

failover() { # PRIMARY_DIR REPLICA_DIR
  local pdir=$1 rdir=$2 t0
  t0=$(date +%s%N)
  pg pg_ctl -D "$pdir/data" -m immediate stop >/dev/null
  echo "failover: primary stopped (immediate)"
  pg pg_ctl -D "$rdir/data" -w -t 60 promote >/dev/null
  for _ in $(seq 1 600); do
    [ "$("$PG_BIN/psql" -X -h "$rdir" -p "$(port_of "$rdir")" -U postgres -d postgres -Atc \
          "SELECT pg_is_in_recovery()" 2>/dev/null)" = f ] && break
    sleep 0.1
  done
  echo "failover: replica promoted in $(elapsed_ms "$t0") ms"
}

destroy() { # DIR...
  for dir in "$@"; do
    if [ -f "$dir/data/postmaster.pid" ]; then
      pg pg_ctl -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
    fi
    # Still there (pg_ctl gave up): kill the postmaster and its children by pid.
    if [ -f "$dir/data/postmaster.pid" ]; then
      local pm
      pm=$(head -1 "$dir/data/postmaster.pid")
      if [ -n "$pm" ] && ps -o args= -p "$pm" 2>/dev/null | grep -qF "$dir/data"; then
        kill -9 "$pm" $(ps -o pid= --ppid "$pm" || true) 2>/dev/null || true
      fi
    fi
    rm -rf "$dir"
  done
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  cmd=$1
  shift
  "$cmd" "$@"
fi
