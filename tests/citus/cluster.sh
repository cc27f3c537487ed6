#!/usr/bin/env bash
# A Citus 13 cluster for the Citus tests: a coordinator and two workers, each
# its own initdb'd PostgreSQL 15 run as postgres, on 127.0.0.1 and a Unix
# socket in its own folder under the project's cluster dir, trust
# authentication, fsync off. Citus comes from tests/citus/install.sh.
#
#   bash tests/citus/cluster.sh start     create (first time) and start all three; create the
#                                         database $CITUS_DB with Citus on every node and add
#                                         the workers to the coordinator. Idempotent.
#   bash tests/citus/cluster.sh stop      stop all three (fast). Idempotent.
#   bash tests/citus/cluster.sh status
#   bash tests/citus/cluster.sh reset     drop and recreate $CITUS_DB on every node (Citus only)
#   bash tests/citus/cluster.sh destroy   stop (immediate) and remove the data
#   bash tests/citus/cluster.sh crash NODE   stop one node as a crash would (immediate: every
#                                         backend ends at once, no shutdown checkpoint, crash
#                                         recovery at the next start); start brings it back
#   bash tests/citus/cluster.sh psql coord|w1|w2 [psql args...]
#
# Ports: CITUS_PORTS (default "5530 5531 5532": coordinator, worker 1, worker 2).
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/cluster.sh"

read -r -a CPORTS <<<"${CITUS_PORTS:-5530 5531 5532}"
CITUS_DB="${CITUS_DB:-idem_citus}"
NODES=(coord w1 w2)
base="$(cluster_dir)/citus"

port_of() { case $1 in coord) echo "${CPORTS[0]}" ;; w1) echo "${CPORTS[1]}" ;; w2) echo "${CPORTS[2]}" ;; *) echo "unknown node $1" >&2; return 1 ;; esac; }
psql_node() { # node [psql args...]
  local n=$1; shift
  PGOPTIONS="${PGOPTIONS:--c client_min_messages=warning}" "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$base/$n" -p "$(port_of "$n")" -U postgres "$@"
}
running() { pc_running "$base/$1"; }

init_node() { # node
  local n=$1 port; port=$(port_of "$n")
  as_postgres mkdir -p "$base/$n"
  local preload="'citus'"
  # pg_cron on the coordinator only, as docs/scaling.md deploys it.
  [ "$n" = coord ] && preload="'citus,pg_cron'"
  pc_initdb "$PG_BIN" "$base/$n" "$port"
  cat >> "$base/$n/data/postgresql.conf" <<CONF
# idem's Citus test cluster: node $n
listen_addresses = '127.0.0.1'
shared_preload_libraries = $preload   # citus first
cron.database_name = '$CITUS_DB'
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

start() {
  if [ ! -f "$($PG_CONFIG --pkglibdir)/citus.so" ]; then
    echo "citus is not installed into $PG_CONFIG: PG_CONFIG=\$(bash tests/citus/tree.sh) bash tests/citus/install.sh" >&2; exit 1
  fi
  mkdir -p "$base"
  chown postgres:postgres "$(dirname "$base")" "$base"
  chmod 700 "$base"
  for n in "${NODES[@]}"; do
    [ -f "$base/$n/data/PG_VERSION" ] || { say "creating Citus node $n (port $(port_of "$n")) in $base/$n"; init_node "$n"; }
  done
  for n in "${NODES[@]}"; do
    running "$n" || pc_server_start "$base/$n"
  done
  for n in "${NODES[@]}"; do
    if [ "$(psql_node "$n" -d postgres -Atc "SELECT count(*) FROM pg_database WHERE datname = '$CITUS_DB'")" = 0 ]; then
      psql_node "$n" -d postgres -c "CREATE DATABASE $CITUS_DB"
    fi
    psql_node "$n" -d "$CITUS_DB" -c "CREATE EXTENSION IF NOT EXISTS citus"
  done
  psql_node coord -d "$CITUS_DB" -At >/dev/null <<SQL
SELECT citus_set_coordinator_host('127.0.0.1', ${CPORTS[0]});
SELECT citus_add_node('127.0.0.1', p) FROM unnest(ARRAY[${CPORTS[1]}, ${CPORTS[2]}]) p
 WHERE NOT EXISTS (SELECT 1 FROM pg_dist_node WHERE nodename = '127.0.0.1' AND nodeport = p);
SQL
}

stop() {
  for n in "${NODES[@]}"; do
    running "$n" && pc_ctl "$base/$n" -m fast -w stop >/dev/null
  done
  true
}

reset() {
  start
  for n in coord w1 w2; do
    psql_node "$n" -d postgres -c "DROP DATABASE IF EXISTS $CITUS_DB WITH (FORCE)"
  done
  start
}

case "${1:-start}" in
start) start ;;
stop) stop ;;
status)
  for n in "${NODES[@]}"; do
    if running "$n"; then echo "$n: running on port $(port_of "$n") ($base/$n)"; else echo "$n: stopped"; fi
  done ;;
reset) reset ;;
destroy)
  for n in "${NODES[@]}"; do
    running "$n" && pc_ctl "$base/$n" -m immediate -w stop >/dev/null
  done
  rm -rf "$base" ;;
crash)
  n=${2:?node}; port_of "$n" >/dev/null
  running "$n" && pc_ctl "$base/$n" -m immediate -w stop >/dev/null
  true ;;
psql) shift; n=${1:?node}; shift; psql_node "$n" -d "$CITUS_DB" "$@" ;;
*) echo "usage: $0 start|stop|status|reset|destroy|crash NODE|psql NODE [args]" >&2; exit 2 ;;
esac
