#!/usr/bin/env bash
# Sharding with PL/Proxy, for real: three shard clusters (each its own
# initdb, idem installed) and a proxy cluster, all on loopback, started here
# and torn down on exit even on failure. tests/plproxy/driver.py plays the
# traffic and checks the invariants; see docs/scaling.md.
#
# The proxy lives on a fourth, small cluster rather than on shard 0's: the
# failure test stops a shard with `pg_ctl stop -m immediate`, and the proxy
# must stay up whichever shard goes down (as in production, where proxies
# and shards are separate machines).
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/cluster.sh"
started=$(date +%s.%N)

base="$(cluster_dir)/shard"
PROXY_PORT=5520
SHARD_PORTS=(5521 5522 5523)
nodes=(proxy s0 s1 s2)
ports=("$PROXY_PORT" "${SHARD_PORTS[@]}")

# Each node is a cluster of the cluster library (tests/lib/cluster.sh) in
# $base/NODE: PC_DIR names it for pc_start and pc_stop.
stop_all() {
  for n in "${nodes[@]}"; do
    [ ! -f "$base/$n/data/postmaster.pid" ] || (PC_DIR="$base/$n"; pc_stop)
  done
  true
}
cleanup() {
  rc=$?
  stop_all
  if [ $rc != 0 ]; then
    for n in "${nodes[@]}"; do
      [ -f "$base/$n/server.log" ] && { echo "--- $n server.log (tail)"; tail -15 "$base/$n/server.log"; }
    done
  fi
  rm -rf "$base"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

stop_all             # leftovers of an interrupted run
rm -rf "$base"
mkdir -p "$base"
chown postgres:postgres "$base"
chmod 700 "$base"

say "creating 4 clusters under $base (proxy :$PROXY_PORT, shards :${SHARD_PORTS[*]})"
for i in "${!nodes[@]}"; do
  n=${nodes[$i]}
  as_postgres mkdir -p "$base/$n"
  # synchronous_commit stays on: an acknowledged commit must survive the
  # immediate stop below (fsync off is fine, the kernel keeps the writes).
  # TCP only: no socket path length limit.
  conf=("listen_addresses = '127.0.0.1'" "unix_socket_directories = ''" "shared_buffers = 16MB"
        "max_connections = 40" "max_wal_senders = 0" "wal_level = minimal" "full_page_writes = off"
        "max_worker_processes = 8" "log_min_messages = warning")
  [ "$n" = proxy ] || conf+=("shared_preload_libraries = 'pg_cron'" "cron.database_name = 'orders_${n#s}'")
  pc_initdb "$PG_BIN" "$base/$n" "${ports[$i]}" "${conf[@]}"
done
for n in "${nodes[@]}"; do
  (PC_DIR="$base/$n"; pc_start) &
done
wait

psql_at() { # port db [psql args...]
  local port=$1 db=$2; shift 2
  PGOPTIONS="-c client_min_messages=warning" "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d "$db" "$@"
}

# (Re)create the shard databases and the proxy database from the SQL files.
make_dbs() {
  for i in 0 1 2; do
    psql_at "${SHARD_PORTS[$i]}" postgres -c "DROP DATABASE IF EXISTS orders_$i WITH (FORCE)" \
      -c "CREATE DATABASE orders_$i"
    psql_at "${SHARD_PORTS[$i]}" "orders_$i" -c "CREATE EXTENSION idem" -c "CREATE EXTENSION pg_cron" \
      -f "$ROOT/tests/plproxy/shard.sql"
  done
  psql_at $PROXY_PORT postgres -c "DROP DATABASE IF EXISTS proxy WITH (FORCE)" -c "CREATE DATABASE proxy"
  psql_at $PROXY_PORT proxy -f "$ROOT/tests/plproxy/proxy.sql"
}

# docs/scaling.md shows the deployment's SQL; it must be this SQL, verbatim.
"$IDEM_PY" - "$ROOT" <<'PY'
import sys, pathlib
root = pathlib.Path(sys.argv[1])
doc = (root / "docs/scaling.md").read_text()
for f in ("tests/plproxy/shard.sql", "tests/plproxy/proxy.sql"):
    if (root / f).read_text().strip() not in doc:
        sys.exit(f"FAIL: docs/scaling.md does not contain {f} verbatim")
print("docs/scaling.md shows shard.sql and proxy.sql verbatim")
PY

# The storage paths to run the traffic under: the default, and the SQL path
# (idem.storage_access = sql, the one Citus needs) when this build has it.
# PLPROXY_MODES="direct" (or "sql") runs one path only.
modes=(direct)
if psql_at "${SHARD_PORTS[0]}" postgres -Atc "LOAD 'idem'; SELECT 1 FROM pg_settings WHERE name = 'idem.storage_access'" \
   | grep -q 1; then
  modes+=(sql)
else
  echo "note: this build of idem has no idem.storage_access; the SQL storage path is not exercised"
fi

[ -n "${PLPROXY_MODES:-}" ] && read -r -a modes <<< "$PLPROXY_MODES"
failed_modes=()
for mode in "${modes[@]}"; do
  for i in 0 1 2; do
    if [ "$mode" != direct ] || [ "${#modes[@]}" -gt 1 ]; then
      psql_at "${SHARD_PORTS[$i]}" postgres -c "LOAD 'idem'" -c "ALTER SYSTEM SET idem.storage_access = '$mode'" \
        -c "SELECT pg_reload_conf()" >/dev/null
    fi
  done
  make_dbs
  if [ "$mode" = sql ]; then
    # proof that the SQL path is the one running: it refuses REPEATABLE READ
    st=$(psql_at "${SHARD_PORTS[0]}" orders_0 -v VERBOSITY=verbose -c "BEGIN ISOLATION LEVEL REPEATABLE READ" \
           -c "SELECT idem_claim('rr-probe', 'probe')" 2>&1 | grep -o "0A000" | head -1 || true)
    echo "idem.storage_access = sql on the shards; a claim under REPEATABLE READ: ${st:+refused with }${st:-accepted}"
    [ -n "$st" ] || { echo "FAIL: the SQL storage path is not in effect"; exit 1; }
  fi
  say "traffic through the proxy ($mode storage path): retries, key scopes, lost answers, a shard stopped and restarted"
  # a failing path does not hide the next one's numbers; the run fails at the end
  BASE="$base" PROXY_PORT=$PROXY_PORT SHARD_PORTS="${SHARD_PORTS[*]}" PG_BIN="$PG_BIN" \
    "$IDEM_PY" "$ROOT/tests/plproxy/driver.py" || failed_modes+=("$mode")
done

say "retention and maintenance, per shard"
psql_at $PROXY_PORT proxy -c "SELECT * FROM set_payment_ttl('7 days') ORDER BY 1" \
  -c "SELECT shard, report->'partitions_created' IS NOT NULL AS maintained FROM maintain_claims() ORDER BY 1"
for i in 0 1 2; do
  # pg_cron on each shard node, in the shard's database (cron.database_name)
  job=$(psql_at "${SHARD_PORTS[$i]}" "orders_$i" -Atc "SELECT idem_schedule_maintenance();")
  jobs=$(psql_at "${SHARD_PORTS[$i]}" "orders_$i" -Atc \
    "SELECT count(*) FROM cron.job WHERE jobname = 'idem_maintain' AND command LIKE '%idem_maintain()%'")
  ttl=$(psql_at "${SHARD_PORTS[$i]}" "orders_$i" -Atc "SELECT ttl FROM idem.biz_types WHERE biz_type = 'payment'")
  echo "orders_$i: pg_cron job $job scheduled ($jobs job named idem_maintain), payment ttl $ttl"
  [ "$jobs" = 1 ] && [ "$ttl" = "7 days" ] || { echo "FAIL: per-shard maintenance/retention on orders_$i"; exit 1; }
done

awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "run time: %.1f s\n", b - a }'
if [ ${#failed_modes[@]} -gt 0 ]; then
  echo "FAIL: invariants broken under the storage path(s): ${failed_modes[*]}"
  exit 1
fi
echo "ok"
