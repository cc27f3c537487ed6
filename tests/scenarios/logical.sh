#!/usr/bin/env bash
# Logical replication (docs/operations.md, "Logical replication and CDC"),
# with two private clusters A and B (wal_level = logical) and idem in both.
#
# (a) FOR ALL TABLES, publish_via_partition_root = true, on A; B subscribes.
#     On A, with partitions 2 s wide rotating under maintenance every 0.3 s
#     on both sides: claims, completes, failures, leases with checkpoints,
#     tokens, forget, TTL and machine settings, claims beyond the premade
#     partitions that maintenance moves out of the default partition, on
#     the direct path and then on the SQL path (idem.storage_access = sql by
#     ALTER SYSTEM + reload). Every call must succeed on A; B's apply worker
#     must keep running with no error, the business rows and every live
#     claim, token and setting must arrive unchanged, B's maintenance
#     reports must stay its own, and idem_publications must report a
#     publication without publish_via_partition_root (and idem_maintain warn).
# (b) A logical migration from A ("blue") to B ("green"): a publication of
#     idem's tables and the business table via the partition root, claims
#     made before and during replication, maintenance rotating partitions on
#     both sides; then the switchover of docs/operations.md (stop writes,
#     wait until green has confirmed blue's LSN, drop the subscription) and,
#     on green, every retry gets the first outcome back: completed, failed,
#     claimed-and-committed, forgotten (claims anew), leases finished or
#     checkpointed with the lease token blue gave out, one-time tokens.
# Every wait polls a reported state with a bound. About a minute.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/assert.sh"
pgsh="$ROOT/tests/lib/cluster.sh"
base="$(cluster_dir)/logical"
adir="$base/a"
bdir="$base/b"
aport=${LOGICAL_PORT_A:-5576}
bport=${LOGICAL_PORT_B:-5577}
work=$(mktemp -d)
chmod 755 "$work"
stop_loops() { touch "$work/stop"; wait 2>/dev/null || true; }
trap 'stop_loops; bash "$pgsh" destroy "$adir" "$bdir"; rm -rf "$work"' EXIT
t_start=$(date +%s)

A() { "$PG_BIN/psql" -X -q -At -v ON_ERROR_STOP=1 -h "$adir" -p "$aport" -U postgres "$@"; }
B() { "$PG_BIN/psql" -X -q -At -v ON_ERROR_STOP=1 -h "$bdir" -p "$bport" -U postgres "$@"; }

mkdir -p "$base"
for side in "a $aport" "b $bport"; do
  set -- $side
  bash "$pgsh" init "$base/$1" "$2"
  cat >> "$base/$1/data/postgresql.conf" <<CONF
wal_level = logical
max_replication_slots = 8
max_wal_senders = 8
wal_sender_timeout = 10s
CONF
  bash "$pgsh" start "$base/$1"
done

# until "$@" prints t, for at most $1 seconds (polled every 0.1 s)
wait_for() { # seconds what command...
  local bound=$1 what=$2
  shift 2
  local end=$(( $(date +%s%N) + bound * 1000000000 ))
  while [ "$(date +%s%N)" -lt $end ]; do
    [ "$("$@" 2>/dev/null)" = t ] && { echo "ok: $what"; return 0; }
    sleep 0.1
  done
  fail "$what: not within $bound s"
  return 1
}

# The schema both sides get: idem, short partitions, a business table, the
# client's notes (what a client keeps: lease tokens, one-time tokens).
setup_db() { # psql-function db
  "$1" -d postgres -c "CREATE DATABASE $2"
  "$1" -d "$2" <<SQL
CREATE EXTENSION idem;
ALTER DATABASE $2 SET idem.partition_width = '2 seconds';
ALTER DATABASE $2 SET idem.default_ttl = '60 seconds';
ALTER DATABASE $2 SET idem.premake_limit = 40;
CREATE TABLE orders (request text PRIMARY KEY, amount int NOT NULL, path text);
CREATE TABLE client_notes (what text, key text, token text, PRIMARY KEY (what, key));
CREATE TABLE shipments (id text PRIMARY KEY, status text NOT NULL);
SQL
}

# maintenance every 0.3 s until $work/stop exists; a failed run is recorded
maintain_loop() { # psql-function db name
  while [ ! -e "$work/stop" ]; do
    "$1" -d "$2" -c "SELECT idem_maintain()" >> "$work/maint-$3.log" 2>> "$work/maint-$3.err" \
      || echo "run failed" >> "$work/maint-$3.failed"
    sleep 0.3
  done
}
maint_summary() { # name: created dropped moved runs
  python3 - "$work/maint-$1.log" <<'PY'
import json, sys
c = d = m = n = 0
for line in open(sys.argv[1]):
    line = line.strip()
    if not line.startswith('{'):
        continue
    r = json.loads(line)
    if 'partitions_created' not in r:
        continue
    n += 1
    c += len(r['partitions_created']); d += len(r['partitions_dropped']); m += r['rows_moved_from_default']
print(c, d, m, n)
PY
}

# The client's work: n requests with key prefix p, by outcome (i mod 8):
#   0 completed with the order   1 failed (declined)      2 claimed, committed, not finished
#   3 forgotten by an operator   4 lease, checkpointed, completed with its token
#   5 lease left open, in the default partition (token kept)   6 ttl beyond the premade partitions (default
#   partition, moved out later), completed   7 one-second claim (its partition rotates out)
# and a one-time token per 4 requests, every other one spent.
workload() { # prefix n
  local p=$1 n=$2 i k
  # settings written with the publication in place; a lease that runs out
  # and is taken over (an UPDATE of the lease document)
  echo "SELECT idem_configure('type-$p', '30 seconds');
        SELECT idem_set_owner('type-$p', 'postgres');
        SELECT idem_define_machine('machine-$p', '{\"A\": [\"B\"]}');
        SELECT result->>'lease_token' AS tok FROM idem_claim('$p-takeover', 'pay', lease => '1 second') \\gset
        SELECT pg_sleep(1.1);
        SELECT result->>'lease_token' AS tok FROM idem_claim('$p-takeover', 'pay', lease => '30 seconds') \\gset
        SELECT idem_complete('$p-takeover', 'pay', '{\"attempt\": 2}', :'tok');"
  for i in $(seq 1 "$n"); do
    k="$p-$i"
    case $((i % 8)) in
    0) echo "BEGIN; SELECT claimed FROM idem_claim('$k', 'pay');
             INSERT INTO orders VALUES ('$k', $i, current_setting('idem.storage_access'));
             INSERT INTO shipments VALUES ('$k', 'CREATED');
             SELECT idem_transition('shipments', 'id', '$k', 'status', 'PAID', 'order');
             SELECT idem_complete('$k', 'pay', '{\"order\": \"$k\", \"amount\": $i}'); COMMIT;" ;;
    1) echo "BEGIN; SELECT claimed FROM idem_claim('$k', 'pay', fingerprint => 'fp-$i');
             SELECT idem_fail('$k', 'pay', '{\"reason\": \"declined\", \"i\": $i}'); COMMIT;" ;;
    2) echo "BEGIN; SELECT claimed FROM idem_claim('$k', 'pay'); INSERT INTO orders VALUES ('$k', $i, 'plain'); COMMIT;" ;;
    3) echo "SELECT claimed FROM idem_claim('$k', 'pay');
             SELECT idem_forget('$k', 'pay');" ;;
    4) echo "SELECT result->>'lease_token' AS tok FROM idem_claim('$k', 'pay', lease => '40 seconds') \\gset
             SELECT idem_checkpoint('$k', 'pay', 'charged', '{\"charge\": \"ch-$i\"}', :'tok');
             BEGIN; INSERT INTO orders VALUES ('$k', $i, 'leased');
             SELECT idem_complete('$k', 'pay', '{\"charge\": \"ch-$i\", \"done\": true}', :'tok'); COMMIT;" ;;
    5) echo "SELECT result->>'lease_token' AS tok FROM idem_claim('$k', 'pay', ttl => '5 minutes', lease => '4 minutes') \\gset
             SELECT idem_checkpoint('$k', 'pay', 'started', '{\"step\": 1}', :'tok');
             INSERT INTO client_notes VALUES ('lease', '$k', :'tok');" ;;
    6) echo "BEGIN; SELECT claimed FROM idem_claim('$k', 'pay', ttl => '70 seconds');
             SELECT idem_complete('$k', 'pay', '{\"far\": $i}'); COMMIT;" ;;
    7) echo "BEGIN; SELECT claimed FROM idem_claim('$k', 'blip', ttl => '1 second');
             INSERT INTO orders VALUES ('$k', $i, 'blip'); COMMIT;" ;;
    esac
    if [ $((i % 4)) = 0 ]; then
      echo "INSERT INTO client_notes SELECT 'token', '$k', idem_issue_token('form', '5 minutes');"
      [ $((i % 8)) = 0 ] && echo "SELECT idem_consume_token(token, 'form') FROM client_notes WHERE what = 'token' AND key = '$k';"
    fi
  done
}

# What a side holds, for comparison: business rows, live claims (expiring
# after the cutoff: neither side's maintenance can drop them meanwhile),
# tokens, business types, machines.
digest() { # psql-function db cutoff
  "$1" -d "$2" -F ' ' <<SQL
SELECT 'orders', count(*), md5(coalesce(string_agg(request || ':' || amount || ':' || path, ',' ORDER BY request), '')) FROM orders;
SELECT 'claims', count(*), md5(coalesce(string_agg(concat_ws('|', biz_type, key, state, claimed_at, expires_at, fingerprint, result),
                                               ',' ORDER BY biz_type, key, claimed_at), ''))
  FROM idem.claims WHERE expires_at > '$3';
SELECT 'tokens', count(*), md5(coalesce(string_agg(concat_ws('|', token_sha256, biz_type, issued_at, expires_at, spent_at), ',' ORDER BY token_sha256), ''))
  FROM idem.tokens WHERE expires_at > '$3';
SELECT 'biz_types', count(*), md5(coalesce(string_agg(concat_ws('|', biz_type, ttl, owner), ',' ORDER BY biz_type), '')) FROM idem.biz_types;
SELECT 'machines', count(*), md5(coalesce(string_agg(m::text, ',' ORDER BY m.name), '')) FROM idem.machines m;
SQL
}

# Caught up: the subscriber confirmed (flushed, so applied) everything up to
# the publisher's current WAL position.
wait_caught_up() { # db slot what
  local lsn
  lsn=$(A -d "$1" -c "SELECT pg_current_wal_lsn()")
  wait_for 30 "$3 $2 confirmed $lsn" A -d "$1" -c \
    "SELECT coalesce(confirmed_flush_lsn >= '$lsn', false) FROM pg_replication_slots WHERE slot_name = '$2'"
}

# The subscription's apply worker runs and has not failed.
apply_running() { # db sub what
  expect "$3 apply worker running, no apply or sync error" \
    "$(B -d "$1" -c "SELECT count(s.pid) || '/' || sum(st.apply_error_count + st.sync_error_count)
                       FROM pg_stat_subscription s JOIN pg_stat_subscription_stats st USING (subid)
                      WHERE s.subname = '$2' AND s.relid IS NULL")" "1/0"
}

echo "=== (a) FOR ALL TABLES publication on A, B subscribes"
setup_db A app
setup_db B app
A -d app > /dev/null <<'SQL'
SELECT idem_configure('pay', '60 seconds');
SELECT idem_define_machine('order', '{"CREATED": ["PAID"], "PAID": ["SHIPPED"]}');
SELECT idem_guard('shipments', 'status', 'order');
BEGIN; SELECT claimed FROM idem_claim('before-sub', 'pay'); SELECT idem_complete('before-sub', 'pay', '{"early": true}'); COMMIT;
CREATE PUBLICATION all_tables FOR ALL TABLES WITH (publish_via_partition_root = true);
SQL
A -d app -c "SELECT idem_maintain()" > /dev/null
B -d app -c "CREATE SUBSCRIPTION all_tables CONNECTION 'host=127.0.0.1 port=$aport user=postgres dbname=app' PUBLICATION all_tables" 2>/dev/null
wait_for 30 "(a) initial copy of every table done" B -d app -c \
  "SELECT count(*) = count(*) FILTER (WHERE srsubstate = 'r') AND count(*) > 0 FROM pg_subscription_rel"
expect "(a) idem_publications on A: what all_tables publishes, no problem" \
  "$(A -d app -c "SELECT via_root, tables, problems FROM idem_publications")" \
  "t|{idem.biz_types,idem.claims,idem.machines,idem.maintenance_lock,idem.maintenance_runs,idem.tokens,idem.type_classes}|{}"

maintain_loop A app a &
maintain_loop B app b &
A -d postgres -c "LOAD 'idem'" -c "ALTER SYSTEM SET idem.storage_access = 'direct'" -c "SELECT pg_reload_conf()" > /dev/null
t0=$(date +%s.%N)
workload direct 96 > "$work/wl-direct.sql"
A -d app -f "$work/wl-direct.sql" > "$work/wl-direct.out"
expect "(a) the direct path ran it" "$(A -d app -c "SELECT DISTINCT path FROM orders WHERE request LIKE 'direct-%' AND path NOT IN ('plain', 'leased', 'blip')")" "direct"
A -d postgres -c "LOAD 'idem'" -c "ALTER SYSTEM SET idem.storage_access = 'sql'" -c "SELECT pg_reload_conf()" > /dev/null
workload sql 96 > "$work/wl-sql.sql"
A -d app -f "$work/wl-sql.sql" > "$work/wl-sql.out"
expect "(a) the SQL path ran it" "$(A -d app -c "SELECT DISTINCT path FROM orders WHERE request LIKE 'sql-%' AND path NOT IN ('plain', 'leased', 'blip')")" "sql"
A -d postgres -c "LOAD 'idem'" -c "ALTER SYSTEM RESET idem.storage_access" -c "SELECT pg_reload_conf()" > /dev/null
echo "(a) workload of 192 requests on both paths: $(python3 -c "import time; print(round(time.time() - $t0, 1))") s"
# Moves out of the default partition: the 70 s claims are beyond the premade
# partitions (now + 62 s) and are moved when maintenance reaches them.
wait_for 30 "(a) A's maintenance moved the far claims out of the default partition" A -d app -c \
  "SELECT NOT EXISTS (SELECT 1 FROM idem.claims_default WHERE result ? 'far')"
wait_caught_up app all_tables "(a)"
apply_running app all_tables "(a)"
cutoff=$(A -d app -c "SELECT now() + interval '5 seconds'")
digest A app "$cutoff" > "$work/a.digest"
digest B app "$cutoff" > "$work/b.digest"
if diff "$work/a.digest" "$work/b.digest" > /dev/null; then
  echo "ok: (a) B holds what A holds:"; sed 's/^/    /' "$work/a.digest"
else
  fail "(a) B differs from A:"; diff "$work/a.digest" "$work/b.digest" || true
fi
expect "(a) live claims compared" "$(awk '$1 == "claims" { print ($2 >= 100) }' "$work/a.digest")" 1
expect "(a) on B, a completed claim replays" \
  "$(B -d app -c "SELECT state || ' ' || result::text FROM idem_lookup('direct-8', 'pay')")" 'completed {"order": "direct-8", "amount": 8}'
expect "(a) on B, the leases taken over on both paths" \
  "$(B -d app -c "SELECT string_agg(state || ' ' || result::text, ', ') FROM (SELECT (idem_lookup(p || '-takeover', 'pay')).* FROM unnest('{direct,sql}'::text[]) p) l")" \
  'completed {"attempt": 2}, completed {"attempt": 2}'
expect "(a) on B, the guarded transitions" "$(B -d app -c "SELECT string_agg(DISTINCT status, ',') FROM shipments")" "PAID"
expect "(a) on B, the claim made before the subscription (initial copy)" \
  "$(B -d app -c "SELECT state || ' ' || result::text FROM idem_lookup('before-sub', 'pay')")" 'completed {"early": true}'
expect "(a) every partition on both sides has REPLICA IDENTITY FULL" \
  "$(A -d app -c "SELECT bool_and(relreplident = 'f') FROM pg_class WHERE oid IN (SELECT partition FROM idem.partition_bounds)")$(B -d app -c "SELECT bool_and(relreplident = 'f') FROM pg_class WHERE oid IN (SELECT partition FROM idem.partition_bounds)")" "tt"
A -d app -c "SELECT started_at FROM idem.maintenance_runs ORDER BY 1" > "$work/a.runs"
B -d app -c "SELECT started_at FROM idem.maintenance_runs ORDER BY 1" > "$work/b.runs"
expect "(a) B's maintenance reports are its own (none of A's: $(wc -l < "$work/a.runs") on A, $(wc -l < "$work/b.runs") on B)" \
  "$(comm -12 "$work/a.runs" "$work/b.runs" | wc -l)" 0

echo "--- a publication without publish_via_partition_root, and one with a column list"
A -d app -c "CREATE PUBLICATION leaf_names FOR ALL TABLES" -c "CREATE PUBLICATION some_columns FOR TABLE idem.biz_types (biz_type)" \
  -c "CREATE PUBLICATION no_classes FOR TABLE idem.claims WITH (publish_via_partition_root = true)"
expect "(a) idem_publications reports the three" \
  "$(A -d app -c "SELECT publication || ': ' || split_part(problems[1], ':', 1) FROM idem_publications WHERE problems <> '{}' ORDER BY 1")" \
  "leaf_names: publishes the partitions of idem.claims under their own names (publish_via_partition_root = false)
no_classes: publishes idem.claims without idem.type_classes
some_columns: publishes only some columns of idem.biz_types (a column list)"
# (The background maintenance loop may hold maintenance at that moment:
# idem_maintain then says it did nothing; call again until a call ran.)
for attempt in $(seq 1 200); do
  # (An error is reported by the check below, not by set -e; sed reads
  # everything, where head could close the pipe on psql.)
  warn=$( (A -d app -c "SELECT idem_maintain() IS NOT NULL" 2>&1 >/dev/null || true) | sed -n 1p)
  case "$warn" in *"already running in another session"*) continue ;; *) break ;; esac
done
expect "(a) idem_maintain warns" "${warn:0:80}" "WARNING:  idem_maintain: publications that include idem's tables need a change: "
A -d app -c "DROP PUBLICATION leaf_names, some_columns, no_classes"
stop_loops
rm -f "$work/stop"
echo "--- a partition without REPLICA IDENTITY FULL (made by hand, or restored from an old dump)"
part=$(A -d app -c "SELECT partition FROM idem.partition_bounds WHERE NOT is_default ORDER BY range_to DESC LIMIT 1")
A -d app -c "ALTER TABLE $part REPLICA IDENTITY DEFAULT"
expect "(a) idem_publications reports it" \
  "$(A -d app -c "SELECT split_part(problems[1], ':', 1) FROM idem_publications")" "$part has no REPLICA IDENTITY FULL"
# The direct path refuses a claim before anything is written (55000), the
# SQL path's UPDATE is refused by PostgreSQL itself: either way the
# business transaction rolls back, nothing diverges on the subscriber.
out=$(A -d app -v VERBOSITY=verbose -c "BEGIN" -c "INSERT INTO orders VALUES ('gap-direct', 1, 'x')" \
        -c "SELECT idem_claim('gap-direct', 'pay')" -c "COMMIT" 2>&1 || true)
expect "(a) direct path: the claim is refused" "$(grep -o 'ERROR:  55000: idem: [^,]*' <<<"$out")" \
  "ERROR:  55000: idem: $part has no REPLICA IDENTITY FULL"
A -d postgres -c "LOAD 'idem'" -c "ALTER SYSTEM SET idem.storage_access = 'sql'" -c "SELECT pg_reload_conf()" > /dev/null
out=$(A -d app -v VERBOSITY=verbose -c "BEGIN" -c "INSERT INTO orders VALUES ('gap-sql', 1, 'x')" \
        -c "SELECT idem_claim('gap-sql', 'pay', ttl => (SELECT range_from + (range_to - range_from) / 2 - now()
                                                        FROM idem.partition_bounds WHERE partition = '$part'::regclass))" \
        -c "SELECT idem_complete('gap-sql', 'pay')" -c "COMMIT" 2>&1 || true)
expect "(a) SQL path: PostgreSQL refuses the update" "$(grep -o 'ERROR:  55000: cannot update table' <<<"$out")" \
  "ERROR:  55000: cannot update table"
expect "(a) neither business row was written" "$(A -d app -c "SELECT count(*) FROM orders WHERE request LIKE 'gap-%'")" 0
expect "(a) idem_maintain sets it" "$(A -d app -c "SELECT idem_maintain()->'replica_identity_set'")" "[\"$part\"]"
expect "(a) and the problem is gone" "$(A -d app -c "SELECT problems FROM idem_publications")" "{}"
A -d app -c "BEGIN" -c "SELECT idem_claim('gap-sql', 'pay')" -c "SELECT idem_complete('gap-sql', 'pay')" -c "COMMIT" > /dev/null
A -d postgres -c "LOAD 'idem'" -c "ALTER SYSTEM RESET idem.storage_access" -c "SELECT pg_reload_conf()" > /dev/null
A -d app -c "BEGIN" -c "SELECT idem_claim('gap-direct', 'pay')" -c "SELECT idem_complete('gap-direct', 'pay')" -c "COMMIT" > /dev/null
echo "ok: (a) after it, both paths claim and complete again"
expect "(a) no maintenance run failed on A or B" "$(cat "$work"/maint-*.failed 2>/dev/null | wc -l)" 0
read -r ca da ma na <<<"$(maint_summary a)"
read -r cb db mb nb <<<"$(maint_summary b)"
echo "(a) maintenance on A: $na runs, $ca partitions created, $da dropped, $ma claims moved out of the default partition"
echo "(a) maintenance on B: $nb runs, $cb partitions created, $db dropped, $mb claims moved out of the default partition"
[ "$da" -gt 0 ] && [ "$db" -gt 0 ] && [ "$ca" -gt 0 ] && [ "$cb" -gt 0 ] || fail "(a) partitions did not rotate on both sides"
[ "$ma" -gt 0 ] || fail "(a) A's maintenance moved no claim out of the default partition"
# (expected: the refusals above)
expected_errors="idem_maintain is already running\|has no REPLICA IDENTITY FULL\|cannot update table"
grep -h "ERROR" "$adir/server.log" "$bdir/server.log" | grep -v "$expected_errors" \
  && fail "(a) errors in the server logs" || echo "ok: (a) no unexpected ERROR in either server log"
B -d app -c "DROP SUBSCRIPTION all_tables"
: > "$work/maint-a.log"; : > "$work/maint-b.log"

echo "=== (b) migration from A (blue) to B (green), with switchover"
setup_db A shop
setup_db B shop
A -d shop > /dev/null <<'SQL'
SELECT idem_configure('pay', '60 seconds');
SELECT idem_configure('blip', '2 seconds');
SELECT idem_define_machine('order', '{"CREATED": ["PAID"], "PAID": ["SHIPPED"]}');
CREATE PUBLICATION migration FOR TABLE idem.claims, idem.type_classes, idem.biz_types, idem.tokens, idem.machines, orders
  WITH (publish_via_partition_root = true);
SQL
workload before 24 > "$work/wl-before.sql"
A -d shop -c "SELECT idem_maintain()" -f "$work/wl-before.sql" > /dev/null
B -d shop -c "SELECT idem_maintain()" > /dev/null
B -d shop -c "CREATE SUBSCRIPTION migration CONNECTION 'host=127.0.0.1 port=$aport user=postgres dbname=shop' PUBLICATION migration" 2>/dev/null
wait_for 30 "(b) initial copy done" B -d shop -c \
  "SELECT count(*) = count(*) FILTER (WHERE srsubstate = 'r') AND count(*) > 0 FROM pg_subscription_rel"
maintain_loop A shop a &
maintain_loop B shop b &
workload during 96 > "$work/wl-during.sql"
A -d shop -f "$work/wl-during.sql" > /dev/null
wait_for 30 "(b) blue's maintenance moved the far claims out of the default partition" A -d shop -c \
  "SELECT NOT EXISTS (SELECT 1 FROM idem.claims_default WHERE result ? 'far')"
apply_running shop migration "(b)"

echo "--- switchover"
# 1. stop writes on blue (and its maintenance), 2. wait until green has
# confirmed blue's current LSN, 3. drop the subscription, 4. send the
# clients to green.
touch "$work/stop"; wait 2>/dev/null || true; rm -f "$work/stop"
A -d shop -c "ALTER DATABASE shop SET default_transaction_read_only = on" \
  -c "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = 'shop' AND backend_type = 'client backend' AND pid <> pg_backend_pid()" > /dev/null
t_sw=$(date +%s%N)
wait_caught_up shop migration "(b) switchover"
echo "(b) caught up $(( ($(date +%s%N) - t_sw) / 1000000 )) ms after writes stopped"
apply_running shop migration "(b) at switchover"
cutoff=$(A -d shop -c "SELECT now() + interval '5 seconds'")
digest A shop "$cutoff" > "$work/blue.digest"
digest B shop "$cutoff" > "$work/green.digest"
B -d shop -c "DROP SUBSCRIPTION migration"
if diff "$work/blue.digest" "$work/green.digest" > /dev/null; then
  echo "ok: (b) green holds what blue held:"; sed 's/^/    /' "$work/blue.digest"
else
  fail "(b) green differs from blue:"; diff "$work/blue.digest" "$work/green.digest" || true
fi
A -d shop -c "SELECT what, key, token FROM client_notes" -F ' ' > "$work/notes"

echo "--- retries on green"
maintain_loop B shop b &
replays=0
for p in before during; do
  n=$([ $p = before ] && echo 24 || echo 96)
  for i in $(seq 1 "$n"); do
    k="$p-$i"
    case $((i % 8)) in
    0) want="false|completed|{\"order\": \"$k\", \"amount\": $i}" ;;
    1) want="false|failed|{\"i\": $i, \"reason\": \"declined\"}" ;;
    2) want="false|completed|" ;;
    3) want="true|new|" ;;
    4) want="false|completed|{\"done\": true, \"charge\": \"ch-$i\"}" ;;
    5) want="false|in_progress|" ;;
    6) want="false|completed|{\"far\": $i}" ;;
    7) continue ;;   # one-second claims: expired
    esac
    fp=""; [ $((i % 8)) = 1 ] && fp=", fingerprint => 'fp-$i'"
    got=$(B -d shop -c "SELECT claimed || '|' || state || '|' || coalesce(result::text, '') FROM idem_claim('$k', 'pay'$fp)")
    [ "$got" = "$want" ] || fail "(b) retry of $k on green: got '$got', want '$want'"
    replays=$((replays + 1))
  done
done
echo "ok: (b) $replays retries on green checked"
# Open leases: the token blue gave out finishes them on green.
leases=0
while read -r what key tok; do
  [ "$what" = lease ] || continue
  # the token is still the proof: without it, ID003
  err=$(B -d shop -v VERBOSITY=verbose -c "SELECT idem_complete('$key', 'pay', '{}')" 2>&1 || true)
  [[ "$err" == *"ID003"* ]] || fail "(b) lease $key completed on green without its token: $err"
  B -d shop -c "SELECT idem_checkpoint('$key', 'pay', 'resumed', '{\"on\": \"green\"}', '$tok')" \
            -c "SELECT idem_complete('$key', 'pay', '{\"finished_on\": \"green\"}', '$tok')" > /dev/null \
    || fail "(b) lease $key: its token did not finish it on green"
  got=$(B -d shop -c "SELECT state || ' ' || result::text FROM idem_claim('$key', 'pay')")
  [ "$got" = 'completed {"finished_on": "green"}' ] || fail "(b) lease $key after completion on green: $got"
  leases=$((leases + 1))
done < "$work/notes"
expect "(b) open leases finished with blue's tokens on green" "$leases" 15
tokens_ok=0
while read -r what key tok; do
  [ "$what" = token ] || continue
  i=${key##*-}
  if [ $((i % 8)) = 0 ]; then want="f f"; else want="t f"; fi
  got=$(B -d shop -c "SELECT idem_consume_token('$tok', 'form')" -c "SELECT idem_consume_token('$tok', 'form')" | tr '\n' ' ' | sed 's/ $//')
  [ "$got" = "$want" ] || fail "(b) token of $key on green: got '$got', want '$want'"
  tokens_ok=$((tokens_ok + 1))
done < "$work/notes"
expect "(b) one-time tokens from blue: spent ones stay spent, the others spend once on green" "$tokens_ok" 30
expect "(b) TTL settings carried: a new claim on green" \
  "$(B -d shop -c "SELECT expires_at - first_claimed_at FROM idem_claim('after-switch', 'pay')")" "00:01:00"
expect "(b) machine carried" "$(B -d shop -c "SELECT idem_classify_transition('order', 'CREATED', 'PAID')")" "allowed"
touch "$work/stop"; wait 2>/dev/null || true
expect "(b) no maintenance run failed" "$(cat "$work"/maint-*.failed 2>/dev/null | wc -l)" 0
read -r ca da ma na <<<"$(maint_summary a)"
read -r cb db mb nb <<<"$(maint_summary b)"
echo "(b) maintenance on blue: $na runs, $ca partitions created, $da dropped, $ma claims moved out of the default partition"
echo "(b) maintenance on green: $nb runs, $cb partitions created, $db dropped, $mb claims moved out of the default partition"
[ "$da" -gt 0 ] && [ "$db" -gt 0 ] && [ "$ca" -gt 0 ] && [ "$cb" -gt 0 ] || fail "(b) partitions did not rotate on both sides"
grep -h "ERROR" "$adir/server.log" "$bdir/server.log" | grep -v "$expected_errors\|is leased: pass the lease_token" \
  && fail "(b) errors in the server logs" || echo "ok: (b) no unexpected ERROR in either server log"

echo "logical replication scenario: $(( $(date +%s) - t_start )) s, failures: $fails"
[ "$fails" = 0 ]
