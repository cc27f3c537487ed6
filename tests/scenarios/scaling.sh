#!/usr/bin/env bash
# Scaling out: a Citus cluster (coordinator and two workers), a PL/Proxy deployment.
# One scenario per function: bash tests/scenarios/scaling.sh NAME (NAME: citus, plproxy);
# scripts/test.sh runs each as scenario/NAME (tests/lib/scenarios.sh).
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/scenarios.sh"

# Citus for real: a coordinator and two workers (Citus 13.2.2,
# built once from ../shared/vendor by tests/citus/install.sh into a private
# copy of Debian's PostgreSQL 15 made by tests/citus/tree.sh, with this
# build of idem copied there), started here and removed on exit. Runs docs/scaling.md's Citus steps verbatim (read
# from the page: tests/citus/doc_steps.py), ALTER EXTENSION idem UPDATE
# from 0.3.0 after idem_distribute with live claims, a lease and a token
# (tests/citus/upgrade.sh, running the page's upgrade step), the Citus isolation specs
# (tests/citus/specs: call forms that double-claimed under 0.2.0, two-claim
# transactions across workers), then tests/citus/scenario.py: claim
# semantics through the coordinator, every call form, business type
# settings reaching pooled worker sessions, concurrent stress through the
# coordinator and directly on the workers with invariant checks,
# maintenance rotating partitions under load (also under claims in
# multi-statement transactions, and its skips in idem_health), a shard move
# racing a claim, moves under load, replica identity repaired after moves
# (one of them logical), a worker crashed under paying clients who retry
# with the same key, and DROP EXTENSION / reinstall in a fresh database. Without ../shared/vendor/ it fails (Citus is not in
# Debian's archive; the test is not skipped).
#   CITUS_KEEP=1 bash tests/scenarios/scaling.sh citus    leave the cluster running
#   CITUS_PORTS="5560 5561 5562" bash tests/scenarios/scaling.sh citus
#       other ports than 5530-5532 (coordinator, worker 1, worker 2), e.g.
#       beside another checkout's run
#   IDEM_STAGE=target/stage bash tests/scenarios/scaling.sh citus
#       take idem from a staging folder made by `cargo pgrx package
#       --pg-config /usr/lib/postgresql/15/bin/pg_config --out-dir target/stage` instead of the
#       build installed into $PG_CONFIG's server (which then needs no install)
scenario_citus() {
started=$(date +%s)
VENDOR="$(cd "$ROOT/.." && pwd)/shared/vendor"
TARBALL="$VENDOR/citus-13.2.2-pg15.20.tar.gz"
if [ ! -f "$TARBALL" ]; then
  echo "FAIL: $TARBALL is missing. The Citus scenario needs the vendored Citus source in ../shared/vendor/"
  echo "      (relative to the project folder $ROOT); Citus is not in Debian's archive. Not skipped: failed."
  exit 1
fi
# Where this build of idem comes from: the server of $PG_CONFIG (the suite
# installs it there), or IDEM_STAGE, a `cargo pgrx package` staging folder
# (its usr/lib/postgresql/15/lib/idem.so and usr/share/postgresql/15/extension/).
if [ -n "${IDEM_STAGE:-}" ]; then
  IDEM_STAGE="$(cd "$IDEM_STAGE" && pwd)"
  IDEM_LIB="$IDEM_STAGE$("$PG_CONFIG" --pkglibdir)"
  IDEM_SHARE="$IDEM_STAGE$("$PG_CONFIG" --sharedir)"
else
  IDEM_LIB="$("$PG_CONFIG" --pkglibdir)"
  IDEM_SHARE="$("$PG_CONFIG" --sharedir)"
fi
if [ ! -f "$IDEM_SHARE/extension/idem.control" ] || [ ! -f "$IDEM_LIB/idem.so" ]; then
  echo "FAIL: no build of idem in $IDEM_LIB and $IDEM_SHARE/extension"
  echo "      (bash scripts/setup.sh installs it into $PG_CONFIG's server; or IDEM_STAGE=<cargo pgrx package output>)"; exit 1
fi

# Citus and idem go into a private copy of Debian's PostgreSQL 15
# (tests/citus/tree.sh), never into the system's: the build of idem the
# suite installed into $PG_CONFIG's server (or the one in IDEM_STAGE) is
# copied there (same server version, so the same library loads).
SUITE_PG_CONFIG=$PG_CONFIG
say "a private PostgreSQL 15 for Citus (made once, then cached)"
t=$(date +%s)
CITUS_PG_CONFIG=$(bash "$ROOT/tests/citus/tree.sh")
if [ "$("$SUITE_PG_CONFIG" --version)" != "$("$CITUS_PG_CONFIG" --version)" ]; then
  echo "FAIL: the Citus scenario runs on Debian 12's PostgreSQL 15 (the vendored Citus is patched for 15.20);"
  echo "      this build of idem is for $("$SUITE_PG_CONFIG" --version), the private tree is $("$CITUS_PG_CONFIG" --version)"
  exit 1
fi
export PG_CONFIG=$CITUS_PG_CONFIG
PG_BIN="$("$PG_CONFIG" --bindir)"
bash "$ROOT/tests/citus/install.sh"
build_s=$(( $(date +%s) - t ))
if [ "$IDEM_LIB" != "$("$PG_CONFIG" --pkglibdir)" ]; then
  say "this build of idem ($IDEM_LIB) into $("$PG_CONFIG" --pkglibdir)"
  install -m 755 "$IDEM_LIB/idem.so" "$("$PG_CONFIG" --pkglibdir)/idem.so"
  install -m 644 "$IDEM_SHARE"/extension/idem.control \
                 "$IDEM_SHARE"/extension/idem--*.sql "$("$PG_CONFIG" --sharedir)/extension/"
fi
bash "$ROOT/scripts/setup.sh" --tool python

export CITUS_DB=idem_citus PG_BIN
CLUSTER="$ROOT/tests/citus/cluster.sh"
work=$(mktemp -d /tmp/idem-citus-scenario.XXXXXX)
cleanup() {
  rc=$?
  if [ $rc != 0 ]; then
    for n in coord w1 w2; do
      log="$(cluster_dir)/citus/$n/server.log"
      [ -f "$log" ] && { echo "--- $n server.log (tail)"; tail -12 "$log"; }
    done
  fi
  [ "${CITUS_KEEP:-0}" = 1 ] || bash "$CLUSTER" destroy
  rm -rf "$work"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

read -r -a CPORTS <<<"${CITUS_PORTS:-5530 5531 5532}"
say "a fresh cluster: coordinator 127.0.0.1:${CPORTS[0]}, workers :${CPORTS[1]} and :${CPORTS[2]}"
t=$(date +%s)
bash "$CLUSTER" destroy
bash "$CLUSTER" start
cluster_s=$(( $(date +%s) - t ))
C() { bash "$CLUSTER" psql coord "$@"; }

fails=0
check() { # description, then a command whose success is the check
  local what=$1; shift
  if "$@"; then echo "ok - $what"; else echo "FAIL - $what"; fails=$((fails + 1)); fi
}

say "docs/scaling.md's Citus steps, verbatim"
python3 "$ROOT/tests/citus/doc_steps.py" "$ROOT/docs/scaling.md" > "$work/steps.sql"
grep "^.echo '@@step " "$work/steps.sql" | sed "s/^\\\\echo '@@step /  step /; s/'$//"
if C -f "$work/steps.sql" > "$work/steps.out" 2>&1; then echo "ok - the steps ran without error"
else echo "FAIL - a step failed:"; tail -20 "$work/steps.out"; exit 1; fi
check "step 1 before idem_distribute: idem_storage_path() is sql" grep -qx ' sql' "$work/steps.out"
check "step 3: idem.claims hash-distributed by key in 32 shards, co-located with orders" \
  test "$(C -Atc "SELECT format('%s %s %s %s', partmethod, column_to_column_name(logicalrelid, partkey),
                                (SELECT count(*) FROM pg_dist_shard s WHERE s.logicalrelid = p.logicalrelid),
                                colocationid = (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'orders'::regclass))
                    FROM pg_dist_partition p WHERE logicalrelid = 'idem.claims'::regclass")" = "h key 32 t"
check "step 3: idem_storage_path() is citus on the coordinator and both workers" \
  test "$(C -Atc "SELECT string_agg(result, ' ' ORDER BY nodeid) FROM run_command_on_all_nodes('SELECT idem_storage_path()')")" = "citus citus citus"
check "step 5: pay() claimed, then replayed; the refund claimed: 2 payments rows for A-0001, both claims completed" \
  test "$(C -Atc "SELECT (SELECT count(*) FROM payments WHERE order_no = 'A-0001') || ' ' ||
                         (SELECT state FROM idem_lookup('A-0001', 'payment')) || ' ' ||
                         (SELECT state FROM idem_lookup('A-0001', 'refund'))")" = "2 completed completed"
check "step 5: a third pay() replays the first answer" \
  test "$(C -Atc "SELECT outcome || ' ' || (result->>'amount') FROM pay('A-0001', 25.00)")" = "replayed 25.00"
check "step 5: the form that Citus does not delegate is refused with 0A000" \
  bash -c "PGOPTIONS='-c client_min_messages=warning' bash '$CLUSTER' psql coord -v VERBOSITY=verbose -c \"SELECT (idem_claim('A-0001', 'refund')).claimed\" 2>&1 | grep -q 'ERROR:  0A000'"
check "step 6: idem_schedule_maintenance() made the pg_cron job (unscheduled now: the checks run maintenance themselves)" \
  test "$(C -Atc "SELECT count(cron.unschedule(jobid)) FROM cron.job WHERE jobname = 'idem_maintain'")" = 1
check "step 6: maintenance made the partitions of the 30-day TTL class, reaching past 30 days" \
  test "$(C -Atc "SELECT count(*) >= 6 AND max(range_to) > now() + interval '30 days' FROM idem_partitions WHERE ttl_class = idem.ttl_class('30 days')")" = t

say "relations one claim locks on a worker, whatever TTLs the database's types use (the registry on the shard)"
# Claims directly on worker 1 (keys whose shard is elsewhere are refused with
# 0A000 and skipped). first_claims commits 3 claims of a type; claim_locks
# counts idem's relations one claim of a new key holds in pg_locks, rolled
# back (Citus locks its catalogs too; a worker's pg_class hides the shards
# from other sessions' queries, so they are told by name). Each count right
# after a maintenance run: partitions that ended since the last one add two
# each (docs/design.md §1).
W1() { bash "$CLUSTER" psql w1 "$@"; }
first_claims() { # type ttl
  W1 -q <<SQL
DO \$\$
DECLARE n int := 0;
BEGIN
    FOR i IN 1..300 LOOP
        BEGIN
            PERFORM idem_claim('first-$1-' || i, '$1', ttl => interval '$2');
            n := n + 1;
            EXIT WHEN n = 3;
        EXCEPTION WHEN SQLSTATE '0A000' THEN NULL;
        END;
    END LOOP;
END
\$\$;
SQL
}
claim_locks() { # type ttl
  W1 -At <<SQL | tail -1
DO \$\$
DECLARE
    n bigint;
BEGIN
    FOR i IN 1..300 LOOP
        BEGIN
            PERFORM idem_claim('locks-$1-' || i, '$1', ttl => interval '$2');
            SELECT count(DISTINCT l.relation) INTO n FROM pg_locks l
             WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation' AND l.relation::regclass::text LIKE 'idem.%';
            RAISE SQLSTATE 'XX999';
        EXCEPTION
            WHEN SQLSTATE 'XX999' THEN PERFORM set_config('idem_test.locks', n::text, false); RETURN;
            WHEN SQLSTATE '0A000' THEN NULL;
        END;
    END LOOP;
END
\$\$;
SELECT current_setting('idem_test.locks', true);
SQL
}
first_claims lk.1h '1 hour'
C -qAtc "SELECT idem_maintain()" > /dev/null
alone=$(claim_locks lk.1h '1 hour')
for t in "lk.1d 1 day" "lk.30d 30 days" "lk.400d 400 days"; do first_claims ${t%% *} "${t#* }"; done
C -qAtc "SELECT idem_maintain()" > /dev/null
declare -A per_type
for t in "lk.1h 1 hour" "lk.1d 1 day" "lk.30d 30 days" "lk.400d 400 days"; do per_type[${t%% *}]=$(claim_locks ${t%% *} "${t#* }"); done
health=$(C -Atc "SELECT value::int FROM idem_health WHERE check_name = 'claim_locks'")
classes_w1=$(W1 -Atc "SELECT count(DISTINCT ttl_class) FROM idem.claims WHERE biz_type LIKE 'lk.%'")
max=0; for t in "${!per_type[@]}"; do [ "${per_type[$t]:-999}" -gt "$max" ] && max=${per_type[$t]:-999}; done
echo "   a claim on worker 1 locks: lk.1h alone $alone; with 1 h / 1 d / 30 d / 400 d types ($classes_w1 classes on worker 1):" \
     "1 h ${per_type[lk.1h]}, 1 d ${per_type[lk.1d]}, 30 d ${per_type[lk.30d]}, 400 d ${per_type[lk.400d]}; idem_health's claim_locks says $health"
check "a claim of a 1-hour type locks as many relations with 4 types of 4 classes in the database as alone ($alone)" \
  test "${per_type[lk.1h]:-x}" = "${alone:-y}"
check "no claim locks more than the bound of 8 + 2 x 3 x 8 = 56 relations on a worker (max $max)" test "$max" -le 56
check "idem_health's claim_locks sees at least what a worker's claim locks (and the claim locks more than the tables)" \
  test "$max" -le "${health:-0}" -a "${per_type[lk.1h]:-0}" -gt 6
check "each of the registry's 32 shards carries its anchor (its registrations complete)" \
  test "$(C -Atc "SELECT count(DISTINCT biz_type) FROM idem.type_classes WHERE ttl_class = -1")" = 32

say "a shard split: claims on the new shards look into every class until maintenance registers them anew"
# Six keys of one shard claimed with two TTLs (the type's registrations
# are written by its first claims, placed by their keys), the shard split
# in two on its node: the registrations are divided by the keys that wrote
# them, not by the claims they cover, and the new shards have no anchor.
# In a database of its own (the other checks count on 32 shards).
CITUS_DB=idem_split bash "$CLUSTER" start
S() { CITUS_DB=idem_split bash "$CLUSTER" psql coord "$@"; }
S -q >/dev/null <<'SQL'
CREATE EXTENSION idem;
CREATE TABLE s_orders (order_no text PRIMARY KEY);
SELECT create_distributed_table('s_orders', 'order_no');
SELECT idem_distribute('s_orders');
SQL
split_shard=$(S -Atc "SELECT get_shard_id_for_distribution_column('idem.claims', 'split-0')")
split_keys=$(S -Atc "SELECT string_agg(k, ' ') FROM (SELECT 'split-' || i AS k FROM generate_series(0, 5000) i
                      WHERE get_shard_id_for_distribution_column('idem.claims', 'split-' || i) = $split_shard LIMIT 6) s")
n=0; for k in $split_keys; do
  ttl='1 hour'; [ $n -ge 3 ] && ttl='30 days'; n=$((n + 1))
  S -qAtc "SELECT claimed FROM idem_claim('$k', 'split.t', ttl => '$ttl')" > /dev/null
done
S -qAtc "SELECT citus_split_shard_by_split_points($split_shard,
           ARRAY[((shardminvalue::bigint + shardmaxvalue::bigint) / 2)::text],
           ARRAY[(SELECT nodeid FROM pg_dist_placement JOIN pg_dist_node USING (groupid) WHERE shardid = $split_shard),
                 (SELECT nodeid FROM pg_dist_placement JOIN pg_dist_node USING (groupid) WHERE shardid = $split_shard)],
           'block_writes')
           FROM pg_dist_shard WHERE shardid = $split_shard" > /dev/null
again() { for k in $split_keys; do S -Atc "SELECT claimed, state FROM idem_claim('$k', 'split.t', ttl => '1 hour')"; done | sort | uniq -c | xargs; }
check "after the split, the six keys (on $(S -Atc "SELECT count(DISTINCT get_shard_id_for_distribution_column('idem.claims', k)) FROM unnest(string_to_array('$split_keys', ' ')) k") new shards) are each found: completed, none claimed again" \
  test "$(again)" = "6 f|completed"
check "the new shards' registrations are not known complete (no anchor)" test "$(S -Atc "SELECT idem.registry_incomplete()")" = t
split_report=$(S -Atc "SELECT idem_maintain()")
check "idem_maintain registers the claims anew ($(echo "$split_report" | grep -o '"registry_filled": [0-9]*')) and anchors all 33 shards" \
  test "$(S -Atc "SELECT idem.registry_incomplete() || ' ' || count(DISTINCT biz_type) FROM idem.type_classes WHERE ttl_class = -1")" = "false 33"
check "after maintenance, the six keys are still each found" test "$(again)" = "6 f|completed"

say "ALTER EXTENSION idem UPDATE on the cluster, from every shipped version after idem_distribute (tests/citus/upgrade.sh)"
bash "$ROOT/tests/citus/upgrade.sh" || fails=$((fails + $?))

say "a second database for the maintenance checks (short partition widths)"
CITUS_DB=idem_m bash "$CLUSTER" start
CITUS_DB=idem_m bash "$CLUSTER" psql coord >/dev/null <<'SQL'
CREATE EXTENSION idem;
CREATE TABLE m_orders (order_no text PRIMARY KEY);
SELECT create_distributed_table('m_orders', 'order_no');
SELECT idem_distribute('m_orders');
SQL

say "isolation specs against the coordinator (tests/citus/specs)"
if bash "$ROOT/tests/citus/isolation.sh" > "$work/isolation.out" 2>&1; then
  grep -E "^(test|     ) *[a-z_]+ +\.\.\. " "$work/isolation.out" || cat "$work/isolation.out"
  echo "ok - isolation specs"
else
  cat "$work/isolation.out"; d=$(grep -o '/tmp/idem-citus-iso[^ "]*/regression.diffs' "$work/isolation.out" | head -1)
  [ -n "$d" ] && cat "$d"
  echo "FAIL - isolation specs"; fails=$((fails + 1))
fi

say "checks (tests/citus/scenario.py)"
export CITUS_SUMMARY="$IDEM_TARGET/test-out/citus-summary.json"
mkdir -p "$(dirname "$CITUS_SUMMARY")"
"$IDEM_PY" "$ROOT/tests/citus/scenario.py" || fails=$((fails + $?))

total=$(( $(date +%s) - started ))
echo "Citus scenario: $fails failed; $total s in all (Citus build step $build_s s, cluster $cluster_s s); summary in $CITUS_SUMMARY"
[ "$fails" = 0 ]
}

# Sharding with PL/Proxy, for real: three shard clusters (each its own
# initdb, idem installed) and a proxy cluster, all on loopback, started here
# and torn down on exit even on failure. tests/plproxy/driver.py plays the
# traffic and checks the invariants; see docs/scaling.md.
#
# The proxy lives on a fourth, small cluster rather than on shard 0's: the
# failure test stops a shard with `pg_ctl stop -m immediate`, and the proxy
# must stay up whichever shard goes down (as in production, where proxies
# and shards are separate machines).
scenario_plproxy() {
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
}

scenario_main "$@"
