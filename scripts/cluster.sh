#!/usr/bin/env bash
# start | stop | restart | status of idem's private PostgreSQL cluster
# (port $IDEM_PORT, default 5499, socket and data under the project folder,
# or under /tmp when the postgres user cannot reach it: lib.sh, cluster_dir).
# Each PostgreSQL major version has its own (lib.sh: PG_CONFIG picks it).
#   bash scripts/cluster.sh psql [DB] [PSQL-ARGS...]   psql to it, as postgres
#                                                     (DB: postgres by default)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

dir="$(cluster_dir)"
data="$dir/data"

case "${1:-start}" in
start)
  mkdir -p "$dir"
  chown postgres:postgres "$dir"
  chmod 700 "$dir"
  if [ ! -f "$data/PG_VERSION" ]; then
    say "creating the cluster in $data"
    as_postgres "$PG_BIN/initdb" -D "$data" --auth=trust --username=postgres -E UTF8 --locale=C.UTF-8 >/dev/null
    # pg_cron when this PostgreSQL has it (a source-built one may not).
    cron="shared_preload_libraries = 'pg_cron'"
    if [ ! -f "$("$PG_CONFIG" --pkglibdir)/pg_cron.so" ]; then
      echo "note: no pg_cron for this PostgreSQL; the cluster runs without it" >&2
      cron="# (no pg_cron: $("$PG_CONFIG" --pkglibdir)/pg_cron.so is missing)
#$cron"
    fi
    cat >> "$data/postgresql.conf" <<CONF
# idem's test cluster
listen_addresses = ''
unix_socket_directories = '$dir'
port = $IDEM_PORT
$cron
cron.database_name = 'idem_cron'
cron.use_background_workers = on
max_worker_processes = 16
max_prepared_transactions = 10
fsync = off
log_min_messages = warning
CONF
  fi
  # pg_cron installed after the cluster was made (a cluster made by an older
  # demo, whose set-up did not install it): turn it on, restarting if need be.
  if grep -q "^# (no pg_cron: " "$data/postgresql.conf" && [ -f "$("$PG_CONFIG" --pkglibdir)/pg_cron.so" ]; then
    say "pg_cron is installed now: preloading it in the cluster"
    sed -i -e "/^# (no pg_cron: /d" -e "s/^#shared_preload_libraries = 'pg_cron'$/shared_preload_libraries = 'pg_cron'/" "$data/postgresql.conf"
    if as_postgres "$PG_BIN/pg_ctl" -D "$data" status >/dev/null 2>&1; then
      as_postgres "$PG_BIN/pg_ctl" -D "$data" -m fast -w restart -l "$dir/server.log" >/dev/null
    fi
  fi
  if ! as_postgres "$PG_BIN/pg_ctl" -D "$data" status >/dev/null 2>&1; then
    say "starting PostgreSQL on port $IDEM_PORT"
    as_postgres "$PG_BIN/pg_ctl" -D "$data" -l "$dir/server.log" -w start >/dev/null
  fi
  ;;
stop)
  as_postgres "$PG_BIN/pg_ctl" -D "$data" -m fast -w stop >/dev/null 2>&1 || true
  ;;
restart)
  as_postgres "$PG_BIN/pg_ctl" -D "$data" -m fast -w restart -l "$dir/server.log" >/dev/null
  ;;
status)
  as_postgres "$PG_BIN/pg_ctl" -D "$data" status
  ;;
psql)
  shift
  db=${1:-postgres}
  [ $# = 0 ] || shift
  exec "$PG_BIN/psql" -h "${IDEM_HOST:-$dir}" -p "$IDEM_PORT" -U postgres -d "$db" "$@"
  ;;
*)
  echo "usage: $0 start|stop|restart|status|psql [DB] [PSQL-ARGS...]" >&2; exit 2 ;;
esac
