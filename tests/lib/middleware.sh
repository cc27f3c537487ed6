# The start-up and clean-up that the middleware scenarios
# (tests/scenarios/middleware_{python,node,go}.sh) and bench/middleware.sh
# share: a cluster of the run's own (a Unix socket in its folder only, so
# its port number meets nobody else's), a scratch folder, PgBouncer if
# asked, and on exit everything of this run stopped and removed, test
# servers that a driver which died left behind included. Source it after
# scripts/lib.sh and tests/lib/cluster.sh.
#
#   mw_begin NAME [SCRATCH]  dir=$(cluster_dir)/NAME (PC_DIR), out=$IDEM_TARGET/test-out/NAME
#                            or $MW_OUT (emptied), work=a new folder /tmp/SCRATCH.XXXXXX (SCRATCH:
#                            NAME); a previous run's cluster and PgBouncer stopped; mw_stop
#                            runs on EXIT
#   MW_KILL+=(REGEX)         this run's servers, killed by mw_stop (name them by $work, so
#                            that nothing else matches); mw_stop_hook, if defined, runs first
#   mw_cluster PORT DB [CONF-LINE...]
#                            the cluster made (PORT: its socket's number) and started,
#                            database DB with idem in it
#   mw_bouncer POOL_SIZE     PgBouncer (transaction mode) on a free loopback port: PGB_PORT
#   mw_bouncer_xacts DB      transactions PgBouncer passed to DB
#   free_port, ms_since T0 (milliseconds since date +%s%N T0), fail MESSAGE (exits 1)

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
fail() { echo "FAIL $*"; exit 1; }

MW_KILL=()
work=

mw_stop() {
  local p
  if declare -F mw_stop_hook >/dev/null; then mw_stop_hook; fi
  pgb_stop
  for p in "${MW_KILL[@]}"; do kill_matching "$p"; done
  pc_stop
  if [ -n "$work" ]; then rm -rf "$work"; fi
  return 0
}

mw_begin() { # NAME [SCRATCH]
  dir="$(cluster_dir)/$1"
  out=${MW_OUT:-$IDEM_TARGET/test-out/$1}
  PC_DIR=$dir
  trap mw_stop EXIT
  mw_stop
  work=$(mktemp -d "/tmp/${2:-$1}.XXXXXX")
  rm -rf "$out"
  mkdir -p "$out"
}

mw_cluster() { # PORT DB [CONF-LINE...]
  local port=$1 db=$2
  shift 2
  pc_init "$dir" "$port" "$@"
  pc_start
  pc_psql -q -d postgres -c "CREATE DATABASE $db"
  pc_psql -q -d "$db" -c "CREATE EXTENSION idem"
}

mw_bouncer() { # POOL_SIZE
  [ -x /usr/sbin/pgbouncer ] || fail "pgbouncer missing: run bash scripts/setup.sh --tool pgbouncer"
  PGB_PORT=$(free_port)
  pgb_start "$PGB_PORT" "$1"
  echo "$(/usr/sbin/pgbouncer --version | sed -n 1p), pool_mode = transaction, on 127.0.0.1:$PGB_PORT"
}

mw_bouncer_xacts() { # DB
  "$PG_BIN/psql" -X -h 127.0.0.1 -p "$PGB_PORT" -U postgres -d pgbouncer -Atc "SHOW STATS" -F '|' \
    | awk -F'|' -v db="$1" '$1 == db {print $2}'
}
