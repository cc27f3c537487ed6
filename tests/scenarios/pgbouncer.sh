#!/usr/bin/env bash
# idem behind a real PgBouncer (Debian's 1.18, scripts/setup.sh --tool pgbouncer),
# in transaction mode and in session mode, in front of its own small cluster,
# with real clients: psql, psycopg 3, pgjdbc, node-postgres, tokio-postgres.
#   * the lease-stealing attempt with psql: client A takes a lease, client B on the
#     same server session (pool_size 1) tries to checkpoint, complete, fail
#     and take it over without the token: ID003 / in_progress; A, with its
#     token, finishes; duplicates replay A's result;
#   * tests/pooler/pooler.py, once per mode: claim, duplicate, rollback,
#     wait => false, waiting duplicates (seen waiting in pg_stat_activity; a
#     third client seen queued in SHOW POOLS), leases across clients, what
#     session state one client leaves to the next (SET, SET ROLE), prepared
#     statements, 8 clients x 400 claims through pool_size 2;
#   * each driver's protocol-level prepared statements, on one shared server
#     session, with its default and with the setting docs/operations.md gives;
#   * the four example programs' own tests, the programs connected through
#     PgBouncer in transaction mode.
# Synchronization is by observation (pg_stat_activity, SHOW POOLS, a probe's
# "ready" line), never by sleeping. Ends with a summary; exits 1 on any failure.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/cluster.sh"
PG_PORT=5460
TX_PORT=5461
SESSION_PORT=5462
dir="$(cluster_dir)/pgbouncer"
out="$IDEM_TARGET/test-out/pgbouncer"
t_start=$(date +%s%N)
PSQL="$PG_BIN/psql"
coproc_pid=
work=

# Stop what this scenario started: its PgBouncers (by the pid in their pid
# files, after checking that the pid is one of them), a probe left waiting,
# its cluster, its scratch directory.
stop_all() {
  local m p
  if [ -n "$coproc_pid" ]; then kill "$coproc_pid" 2>/dev/null || true; fi
  for m in transaction session; do
    p=$(cat "$dir/pgbouncer-$m.pid" 2>/dev/null) || continue
    if tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -q "pgbouncer.*$dir/pgbouncer-$m.ini"; then
      kill -TERM "$p"
      for _ in $(seq 1 200); do kill -0 "$p" 2>/dev/null || break; sleep 0.02; done
    fi
    rm -f "$dir/pgbouncer-$m.pid"
  done
  pc_stop
  if [ -n "$work" ]; then rm -rf "$work"; fi
  return 0
}
trap stop_all EXIT
stop_all
work=$(mktemp -d /tmp/pgbouncer-scenario.XXXXXX)

checks=0
failed=()
pass() { checks=$((checks + 1)); echo "ok   $*"; }
fail() { checks=$((checks + 1)); failed+=("$*"); echo "FAIL $*"; }
expect() { # description, actual, expected
  if [ "$2" = "$3" ]; then pass "$1: $2"; else fail "$1: got '$2', expected '$3'"; fi
}
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

# ---- the cluster and the two PgBouncers --------------------------------------
rm -rf "$out"
mkdir -p "$out"
pc_init "$dir" "$PG_PORT" "max_connections = 50"
pc_start
direct() { "$PSQL" -X -q -v ON_ERROR_STOP=1 -h "$dir" -p $PG_PORT -U postgres "$@"; }
direct -d postgres -c "CREATE DATABASE pgb" \
  -c "CREATE ROLE app LOGIN NOINHERIT" -c "CREATE ROLE app_a" -c "GRANT app_a TO app"
direct -d pgb -c "CREATE EXTENSION idem"

printf '"postgres" ""\n"app" ""\n' > "$dir/userlist.txt"
for mode in transaction session; do
  port=$([ $mode = transaction ] && echo $TX_PORT || echo $SESSION_PORT)
  {
    echo "[databases]"
    # Aliases of the one database, each its own pool: pool_size 1 makes
    # every client of the alias share one server session.
    for alias in pool1 prep1 psql1 tokio1 tokio2 jdbc1 jdbc0 jdbcc1 jdbcc0 node1; do
      echo "$alias = host=$dir port=$PG_PORT dbname=pgb pool_size=1"
    done
    for alias in pool2 prep2; do
      echo "$alias = host=$dir port=$PG_PORT dbname=pgb pool_size=2"
    done
    echo "* = host=$dir port=$PG_PORT"
    cat <<INI
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
pool_mode = $mode
default_pool_size = 2
max_client_conn = 200
admin_users = postgres
ignore_startup_parameters = extra_float_digits
log_connections = 0
log_disconnections = 0
logfile = $dir/pgbouncer-$mode.log
pidfile = $dir/pgbouncer-$mode.pid
INI
  } > "$dir/pgbouncer-$mode.ini"
  chown postgres:postgres "$dir/pgbouncer-$mode.ini" "$dir/userlist.txt"
  as_postgres /usr/sbin/pgbouncer -d "$dir/pgbouncer-$mode.ini"
  ready=
  for _ in $(seq 1 250); do
    "$PSQL" -X -h 127.0.0.1 -p "$port" -U postgres -d pgbouncer -Atc "SHOW VERSION" >/dev/null 2>&1 && ready=1 && break
    sleep 0.02
  done
  if [ -z "$ready" ]; then
    echo "FAIL PgBouncer ($mode) did not start on 127.0.0.1:$port:"
    tail -5 "$dir/pgbouncer-$mode.log"
    exit 1
  fi
  echo "$(/usr/sbin/pgbouncer --version | sed -n 1p), pool_mode = $mode, on 127.0.0.1:$port"
done

# ---- the issue's attack, with psql (transaction mode, pool_size 1) ---------
echo "== psql: a lease on a server session shared by two clients (transaction mode, pool_size 1) =="
# Each call is a new client connection; psql's LAST_ERROR_SQLSTATE tells the outcome.
client() { # SQL... -> its server session's pid, the statements' output, the last SQLSTATE
  local args=(-c "SELECT pg_backend_pid()")
  for s in "$@"; do args+=(-c "$s"); done
  "$PSQL" -X -At -h 127.0.0.1 -p $TX_PORT -U postgres -d psql1 "${args[@]}" -c '\echo :LAST_ERROR_SQLSTATE' 2>/dev/null
}
IFS='|' read -r pid_a claimed token < <(client "SELECT pg_backend_pid(), claimed, result->>'lease_token'
                                                 FROM idem_claim('L1', 'job', lease => '1 minute')" | sed -n 2p)
expect "client A: idem_claim('L1', 'job', lease => '1 minute') claimed" "$claimed" t
for call in "idem_checkpoint('L1', 'job', 'forged', '{\"by\":\"B\"}')" \
            "idem_complete('L1', 'job', '{\"by\":\"B\"}')" \
            "idem_fail('L1', 'job', '{\"by\":\"B\"}')"; do
  res=$(client "SELECT $call")
  pid_b=$(echo "$res" | sed -n 1p)
  expect "client B (server session $pid_b, A's was $pid_a) without the token: $call" \
    "$([ "$pid_b" = "$pid_a" ] && echo same-session) $(echo "$res" | tail -1)" "same-session ID003"
done
expect "client B: idem_claim('L1', 'job', lease => '1 minute') while A's lease runs" \
  "$(client "SELECT claimed || ' ' || state FROM idem_claim('L1', 'job', lease => '1 minute')" | sed -n 2p)" "false in_progress"
expect "client A, with its token: checkpoint and complete" \
  "$(client "SELECT idem_checkpoint('L1', 'job', 'charged', '{\"charge\":1}', '$token')" \
            "SELECT idem_complete('L1', 'job', '{\"by\":\"A\"}', '$token')" | tail -1)" "00000"
expect "a later duplicate (another client) replays" \
  "$(client "SELECT state || ' ' || result FROM idem_claim('L1', 'job')" | sed -n 2p)" 'completed {"by": "A"}'
expect "stored in the database (read directly)" \
  "$(direct -d pgb -Atc "SELECT state || ' ' || result FROM idem_lookup('L1', 'job')")" 'completed {"by": "A"}'

# After an upgrade, server sessions must load the new library: RECONNECT on
# the console replaces each one once its client releases it.
before=$(client "SELECT 1" | sed -n 1p)
"$PSQL" -X -q -h 127.0.0.1 -p $TX_PORT -U postgres -d pgbouncer -c "RECONNECT psql1"
after=$(client "SELECT 1" | sed -n 1p)
expect "RECONNECT psql1 on PgBouncer's console: the next client's server session (was $before)" \
  "$([ "$after" != "$before" ] && echo new || echo same)" new

# ---- psycopg: both pool modes --------------------------------------------
for mode in transaction session; do
  port=$([ $mode = transaction ] && echo $TX_PORT || echo $SESSION_PORT)
  echo "== psycopg $("$IDEM_PY" -c 'import psycopg; print(psycopg.__version__)'): pool_mode = $mode =="
  t0=$(date +%s%N)
  "$IDEM_PY" "$ROOT/tests/pooler/pooler.py" $mode $port "$dir" $PG_PORT > "$out/pooler-$mode.log" 2>&1 || true
  cat "$out/pooler-$mode.log"
  while read -r line; do
    case "$line" in
      "ok   "*) checks=$((checks + 1)) ;;
      "FAIL "*) checks=$((checks + 1)); failed+=("${line#FAIL }") ;;
    esac
  done < "$out/pooler-$mode.log"
  grep -q "^summary \[$mode\]: 0 failed" "$out/pooler-$mode.log" || fail "pooler.py $mode did not finish cleanly"
  echo "($(ms_since "$t0") ms)"
done

# ---- each driver's prepared statements (transaction mode, pool_size 1) --------
echo "== tokio-postgres: Client::query (named statement) vs query_typed (unnamed) =="
rust_dir="$ROOT/examples/rust-batch"
t0=$(date +%s%N)
(cd "$ROOT/tests/pooler/tokio_probe" && cargo build --locked --quiet --target-dir "$rust_dir/target")
echo "(probe built in $(ms_since "$t0") ms)"
probe="$rust_dir/target/debug/idem-pooler-probe"
export PGHOST=127.0.0.1 PGPORT=$TX_PORT PGUSER=postgres
coproc HOLD { PGDATABASE=tokio1 exec "$probe" hold; }
coproc_pid=$HOLD_PID
hold_pid=
while read -r line <&"${HOLD[0]}"; do
  echo "  client A (prepare, then wait): $line"
  case "$line" in "pid "*) hold_pid=${line#pid } ;; ready|error*) break ;; esac
done
q=$(PGDATABASE=tokio1 "$probe" query)
echo "$q" | sed 's/^/  client B, Client::query: /'
expect "tokio-postgres Client::query while A holds its prepared \"s0\" on the same session ($hold_pid)" \
  "$(echo "$q" | sed -n 's/^pid //p') $(echo "$q" | tail -1)" "$hold_pid error 42P05: prepared statement \"s0\" already exists"
q=$(PGDATABASE=tokio1 "$probe" typed)
echo "$q" | sed 's/^/  client B, Client::query_typed: /'
expect "tokio-postgres Client::query_typed on the same session" "$(echo "$q" | tail -1)" \
  "result: statement of the second client: y"
a_result="(client A had ended)"
if [ -n "${HOLD[1]:-}" ]; then
  echo go >&"${HOLD[1]}"
  a_result=$(cat <&"${HOLD[0]}")
fi
wait "$coproc_pid" 2>/dev/null || true
coproc_pid=
expect "tokio-postgres: A then runs its own prepared statement" "$a_result" "result: statement of the first client: x"
q1=$(PGDATABASE=tokio2 "$probe" leftover)
q2=$(PGDATABASE=tokio2 "$probe" leftover)
echo "$q1" | sed 's/^/  client C, query_typed of a composite: /'
echo "$q2" | sed 's/^/  client D, the same: /'
expect "tokio-postgres query_typed returning a non-built-in type leaves named statements (type lookup)" \
  "$(echo "$q1" | tail -1)" "result: named statements left on the server session: [s0,s1]"
expect "... and the next such client on that session collides with them" \
  "$(echo "$q2" | sed -n 2p)" "error 42P05: prepared statement \"s0\" already exists"

echo "== pgjdbc (Debian's /usr/share/java/postgresql.jar): prepareThreshold =="
javac -d "$work" "$ROOT/tests/pooler/JdbcProbe.java"
jdbc() { # alias, URL options, mode
  local r pids
  r=$(java -cp "$work:/usr/share/java/postgresql.jar" JdbcProbe "jdbc:postgresql://127.0.0.1:$TX_PORT/$1?user=postgres$2" "$3")
  echo "$r" | sed "s/^/  $3, ${2:-default}: /" >&2
  pids=$(echo "$r" | sed -n 's/^pids //p')
  echo "$([ "${pids% *}" = "${pids#* }" ] && echo shared || echo "not shared ($pids)")" \
       "$(echo "$r" | sed -n 's/^[AB] //p' | paste -sd' ')"
}
# B's first named statement is "S_1", like A's: 42P05; its later
# executions go through again (pgjdbc prepares the statement anew).
expect "pgjdbc default (prepareThreshold=5), a statement run 7 times by A, then by B" \
  "$(jdbc jdbc1 "" repeat)" "shared 00000,00000,00000,00000,00000,00000,00000 00000,00000,00000,00000,42P05,00000,00000"
expect "pgjdbc default, autocommit off: A's commit(), then B's first commit()" \
  "$(jdbc jdbcc1 "" commit)" "shared 00000 42P05"
expect "pgjdbc prepareThreshold=0: the same statements" "$(jdbc jdbc0 "&prepareThreshold=0" repeat)" \
  "shared 00000,00000,00000,00000,00000,00000,00000 00000,00000,00000,00000,00000,00000,00000"
expect "pgjdbc prepareThreshold=0: the same commits" "$(jdbc jdbcc0 "&prepareThreshold=0" commit)" "shared 00000 00000"

echo "== node-postgres $(node -p "require('$ROOT/examples/node-consumer/node_modules/pg/package.json').version"): named vs unnamed queries =="
r=$(NODE_PATH="$ROOT/examples/node-consumer/node_modules" PGDATABASE=node1 node "$ROOT/tests/pooler/node_probe.js")
echo "$r" | sed 's/^/  /'
pids=$(echo "$r" | sed -n 's/^pids //p')
expect "node-postgres: two clients, one server session; unnamed queries of both" \
  "$([ "${pids% *}" = "${pids#* }" ] && echo shared) $(echo "$r" | sed -n 's/^unnamed [AB] //p' | paste -sd' ')" \
  "shared 00000,00000,00000 00000,00000,00000"
expect "node-postgres: a query with a name (named prepared statement), second client" \
  "$(echo "$r" | sed -n 's/^named B //p')" "42P05,42P05,42P05"
unset PGHOST PGPORT PGUSER

# ---- the four examples through PgBouncer (transaction mode) -----------------
for ex in python node rust java; do
  echo "== example $ex through PgBouncer (transaction mode, pool_size 2) =="
  t0=$(date +%s%N)
  if IDEM_HOST="$dir" IDEM_PORT=$PG_PORT IDEM_CLIENT_HOST=127.0.0.1 IDEM_CLIENT_PORT=$TX_PORT \
      bash "$ROOT/tests/scenarios/examples.sh" "$ex" > "$out/example-$ex.log" 2>&1; then
    status=0
  else
    status=1
  fi
  secs=$(ms_since "$t0")
  xacts=$("$PSQL" -X -h 127.0.0.1 -p $TX_PORT -U postgres -d pgbouncer -Atc "SHOW STATS" -F '|' \
            | awk -F'|' -v db="ex_$ex" '$1 == db {print $2}')
  grep -E "^summary|FAIL" "$out/example-$ex.log" | sed 's/^/  /' || true
  if [ "$status" = 0 ] && [ "${xacts:-0}" -gt 0 ]; then
    pass "example $ex passes its own test through PgBouncer: $xacts transactions went through it, $secs ms"
  else
    tail -20 "$out/example-$ex.log"
    fail "example $ex through PgBouncer (exit $status, ${xacts:-0} transactions through it)"
  fi
done

# ---- summary ---------------------------------------------------------------
echo
echo "summary: $checks checks, ${#failed[@]} failed, $(ms_since "$t_start") ms in all" \
     "(PgBouncer $(/usr/sbin/pgbouncer --version | awk 'NR == 1 {print $2}'), transaction and session mode)"
if [ ${#failed[@]} -gt 0 ]; then
  printf 'failed: %s\n' "${failed[@]}"
  exit 1
fi
