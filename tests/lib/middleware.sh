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
#   mw_roundtrips LABEL NEW REPLAY README -- COMMAND...
#                            the server COMMAND starts, behind a counting proxy in front of
#                            mw_cluster's socket (tests/middleware/roundtrips.py: {pgport},
#                            {httpport}), must take exactly NEW round trips to PostgreSQL per
#                            new key and REPLAY per replay (README: where its client says why)
#   free_port, ms_since T0 (milliseconds since date +%s%N T0), fail MESSAGE (exits 1)
#   go_env [online], go_new_enough   the Go toolchain and its module cache (at the end)

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
  MW_DB=$db
}

mw_roundtrips() { # LABEL NEW REPLAY README -- COMMAND...
  local label=$1 new=$2 replay=$3 readme=$4
  shift 5
  "$IDEM_PY" "$ROOT/tests/middleware/roundtrips.py" --upstream "$dir/.s.PGSQL.$PC_PORT" \
    --check "host=$dir port=$PC_PORT user=postgres dbname=$MW_DB" --label "$label" --new "$new" --replay "$replay" \
    --regression "A regression: a statement that travelled with another (BEGIN with the claim, the stored response with COMMIT) now takes a round trip of its own, or the middleware sends a new one per request; the counts are documented in $readme, \"Round trips to PostgreSQL\"; change them there and here together." \
    -- "$@"
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

# The Go toolchain and module cache of the Go client's test and benchmark
# (and of scripts/setup.sh --tool middleware_go, which fills the cache from
# the Go module proxy; tests/scenarios/clients.sh middleware_go and
# bench/middleware.sh go build offline from it).
#   go_env [online]   exports GOROOT's PATH, GOMODCACHE, GOCACHE and, unless
#                     "online", GOPROXY=off (every module must be cached)
GO_CACHE_DIR=/var/cache/idem/go
GO_MIN=1.25   # clients/go/go.mod's go line
# Where a machine without Go (or with an older one, as Debian 12's 1.19)
# gets one: the toolchain module the go command itself would take from the
# Go module proxy (golang.org/toolchain), unpacked in the module cache.
GO_TOOLCHAIN=v0.0.1-go1.26.8.linux-amd64

go_env() {
  local goroot
  if [ -f "$GO_CACHE_DIR/goroot" ]; then
    goroot=$(cat "$GO_CACHE_DIR/goroot")
    PATH="$goroot/bin:$PATH"
  elif ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then
    PATH="/usr/local/go/bin:$PATH"
  fi
  export PATH GOMODCACHE="$GO_CACHE_DIR/mod" GOCACHE="$GO_CACHE_DIR/build" GOTOOLCHAIN=local GOFLAGS=-mod=readonly
  if [ "${1:-}" = online ]; then
    export GOPROXY=https://proxy.golang.org GOFLAGS=-mod=mod
  else
    export GOPROXY=off
  fi
}

# go_new_enough: the go on PATH is GO_MIN or newer.
go_new_enough() {
  local have
  have=$(go env GOVERSION 2>/dev/null | sed 's/^go//') || return 1
  [ -n "$have" ] && [ "$(printf '%s\n%s\n' "$GO_MIN" "$have" | sort -V | sed -n 1p)" = "$GO_MIN" ]
}
