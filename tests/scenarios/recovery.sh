#!/usr/bin/env bash
# Recovery and load: crashes, failover, hot standby, logical replication,
# dump and restore, backtraces of internal errors, stress with faults,
# retention under sustained load.
# One scenario per function: bash tests/scenarios/recovery.sh NAME (NAME: backtraces, crash, dump_restore, failover, hot_standby, logical, redrive, retention, stress);
# scripts/test.sh runs each as scenario/NAME (tests/lib/scenarios.sh).
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/scenarios.sh"

# No Rust backtrace ever reaches a client, whatever the server's
# environment: a cluster of its own (port ${IDEM_BT_PORT:-5473}) whose
# postmaster runs with RUST_BACKTRACE=1 and RUST_LIB_BACKTRACE=1, first
# loading idem on demand, then preloading it (shared_preload_libraries).
# Each time, errors of every kind idem can send, read in psql's verbose
# form (message, DETAIL, HINT, CONTEXT, location):
#   - an internal error (XX000): a damaged lease document;
#   - idem's own SQLSTATEs (ID001, ID003);
#   - PostgreSQL errors raised inside idem's Rust frames, which pgrx
#     re-raises with a backtrace when one was captured: lock_timeout
#     (55P03) and statement_timeout (57014) while waiting for a concurrent
#     claim;
#   - a Rust panic: a lease document whose attempt counter is at its
#     maximum; arithmetic overflow panics where overflow checks are
#     compiled in (debug builds), and wraps in a release build, where the
#     scenario says no panic was reachable.
scenario_backtraces() {
source "$ROOT/tests/lib/scenarios.sh"
source "$ROOT/tests/lib/cluster.sh"
trap pc_stop EXIT
# Signs of a Rust backtrace (std's format: numbered frames, "at file:line").
BACKTRACE='stack backtrace|^ *[0-9]+: |[[:space:]]at [^ ]+\.rs:[0-9]+|rust_begin_unwind|std::panicking|core::panicking|pgrx_pg_sys::'

start() { # extra postgresql.conf lines...
  pc_init "$(cluster_dir)/backtraces" "${IDEM_BT_PORT:-5473}" "$@"
  pc_start RUST_BACKTRACE=1 RUST_LIB_BACKTRACE=1
  local pm
  pm=$(head -1 "$PC_DIR/data/postmaster.pid")
  grep -qx RUST_BACKTRACE=1 <<<"$(tr '\0' '\n' < "/proc/$pm/environ")" \
    || { echo "FAIL: the postmaster's environment lacks RUST_BACKTRACE=1"; exit 1; }
  echo "postmaster $pm runs with $(tr '\0' '\n' < "/proc/$pm/environ" | grep '^RUST' | tr '\n' ' ')"
  pc_psql -q -d postgres -c "CREATE DATABASE bt"
  pc_psql -q -d bt -c "CREATE EXTENSION idem" -c "SELECT idem_maintain()" >/dev/null
}

# check WHAT SQLSTATE SQL: run SQL (its last statement must fail with
# SQLSTATE), and look at everything the client was sent.
check() {
  local what=$1 state=$2 sql=$3 out
  out=$(pc_psql -d bt -v ON_ERROR_STOP=0 -v VERBOSITY=verbose -v SHOW_CONTEXT=always -c '\set QUIET on' -c "$sql" 2>&1 || true)
  if ! grep -q "ERROR:  $state:" <<<"$out"; then
    fail "$what: expected SQLSTATE $state, got: $out"
  elif grep -Eq "$BACKTRACE" <<<"$out"; then
    fail "$what: a backtrace reached the client:"; head -40 <<<"$out"
  else
    echo "ok: $what: $(grep -m1 "ERROR:" <<<"$out" | cut -c1-150)"
    grep -m4 -E "^(DETAIL|CONTEXT|LOCATION):" <<<"$out" | sed 's/^/      /'
  fi
}

errors() {
  pc_psql -q -d bt >/dev/null <<'SQL'
SELECT idem_claim('dmg', 'bt', lease => '1 second');
UPDATE idem.claims SET result = result - 'lease_until_us' WHERE state = 'l' AND key = 'dmg';
BEGIN; SELECT idem_claim('fp', 'bt', fingerprint => 'a'); SELECT idem_complete('fp', 'bt'); COMMIT;
SELECT idem_claim('ovf', 'bt', lease => '1 second');
UPDATE idem.claims SET result = jsonb_set(jsonb_set(result, '{attempt}', '9223372036854775807'),
         '{lease_until_us}', to_jsonb(((extract(epoch FROM now() - interval '1 hour') - 946684800) * 1000000)::bigint))
 WHERE key = 'ovf';
SQL
  check "XX000, a damaged lease document" XX000 "SELECT idem_claim('dmg', 'bt')"
  check "ID001, a fingerprint mismatch" ID001 "SELECT idem_claim('fp', 'bt', fingerprint => 'b')"
  check "ID003, finishing what one does not hold" ID003 "SELECT idem_complete('nobody', 'bt')"
  session_open holder bt
  session_run holder "BEGIN; SELECT claimed FROM idem_claim('held', 'bt');"
  check "55P03, lock_timeout while waiting (a PostgreSQL error inside Rust frames)" 55P03 \
    "SET lock_timeout = '50ms'; SELECT idem_claim('held', 'bt')"
  check "57014, statement_timeout while waiting" 57014 \
    "SET statement_timeout = '50ms'; SELECT idem_claim('held', 'bt')"
  session_run holder "ROLLBACK;"
  session_close holder
  local out
  out=$(pc_psql -d bt -v ON_ERROR_STOP=0 -v VERBOSITY=verbose -v SHOW_CONTEXT=always \
        -c "SELECT claimed, result->>'attempt' AS attempt FROM idem_claim('ovf', 'bt', lease => '1 minute')" 2>&1 || true)
  if grep -q "ERROR:" <<<"$out"; then
    check "a Rust panic (attempt counter overflow)" XX000 "SELECT idem_claim('ovf', 'bt', lease => '1 minute')"
  else
    echo "note: no Rust panic reachable in this build (overflow wraps without overflow checks): $(echo "$out" | tr '\n' ' ' | tr -s ' ')"
  fi
}

say "idem loaded on demand (not preloaded)"
start
errors
pc_stop
say "idem preloaded (shared_preload_libraries = 'idem': loaded by the postmaster)"
start "shared_preload_libraries = 'idem'"
errors
finish "backtrace"
}

# Crash recovery under the stress load: a private cluster (port 5510, fsync
# and synchronous_commit on, commit_delay 2 ms so that crashes catch
# COMMITs in flight) is crashed three times in the middle of the stress run
# -- kill -9 of the postmaster alone; of the postmaster and all its
# children at once; of one busy backend (the postmaster then resets the
# rest) -- and recovers. After each recovery the driver retries every key
# whose COMMIT got no answer (a lost transaction must claim again, a
# surviving one must replay its stored outcome), checks that claimed work
# cut off before COMMIT left nothing, and that every acknowledged claim
# still live replays; at the end, the stress invariants and amcheck. While
# fewer than 4 COMMITs were caught in flight it crashes again (at most 6
# crashes); none at all fails the test. Every fourth new key is claimed
# with a 10-minute TTL, so that acknowledged claims are still live after a
# recovery however long it took on a loaded machine (the others, 6 s, expire
# and rotate partitions during the run). About 35 s.
# Bigger: CRASH_FAULTS=9 CRASH_EVERY=20 CRASH_TIMEOUT=1800 bash tests/scenarios/recovery.sh crash
scenario_crash() {

dir="$(cluster_dir)/stress/crash"
port=5510
faults=${CRASH_FAULTS:-3}
every=${CRASH_EVERY:-7}
out="${STRESS_OUT:-$IDEM_TARGET/test-out/stress}"
mkdir -p "$out" "$(dirname "$dir")"
trap 'bash "$ROOT/tests/lib/cluster.sh" destroy "$dir"' EXIT

bash "$ROOT/tests/lib/cluster.sh" init "$dir" $port crash
bash "$ROOT/tests/lib/cluster.sh" start "$dir"
"$PG_BIN/psql" -X -q -h "$dir" -p $port -U postgres -d postgres -c "CREATE DATABASE stress_crash"
dsn="host=$dir port=$port user=postgres dbname=stress_crash"

set +e
# (timeout: a hung run must not hang the suite)
timeout "${CRASH_TIMEOUT:-300}" "$IDEM_PY" "$ROOT/tests/stress/driver.py" --dsn "$dsn" --fault crash --faults "$faults" --fault-at "$every" \
  --min-inflight "${CRASH_MIN_INFLIGHT:-4}" --max-faults $((faults + 3)) \
  --fault-cmd "bash '$ROOT/tests/lib/cluster.sh' crash '$dir' {n}" \
  --ttl 6 --width 0.5 --long-every 4 --claims 400 --summary "$out/crash.json"
rc=$?
set -e
if [ $rc -ne 0 ]; then
  echo "--- server log (last 40 lines)"
  tail -40 "$dir/server.log"
  exit $rc
fi
# The run must have exercised what it claims to test.
"$IDEM_PY" - "$out/crash.json" "$faults" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
faults = int(sys.argv[2])
tot = {}
for r in s["recoveries"]:
    for k, v in r.items():
        tot[k] = tot.get(k, 0) + v
bad = []
if len(s["recoveries"]) < faults:
    bad.append(f"{len(s['recoveries'])} recoveries, expected {faults}")
if tot.get("in_flight", 0) == 0:
    bad.append("no crash caught a COMMIT in flight: the retry of in-flight keys was not exercised")
if tot.get("acked_live_checked", 0) < 100:
    bad.append("fewer than 100 acknowledged live claims were checked after the crashes")
if s["counts"].get("hit_by_fault", 0) < faults:
    bad.append("the crashes hit fewer transactions than there were crashes")
print(f"crashes: {len(s['recoveries'])}")
print(f"in flight at the crashes: {tot.get('in_flight', 0)} "
      f"(commit survived, replayed: {tot.get('in_flight_committed_replays', 0)}; "
      f"lost, claimed again: {tot.get('in_flight_lost_claims_again', 0)}; "
      f"expired before the retry: {tot.get('in_flight_expired_before_retry', 0)})")
print(f"claimed, crash before COMMIT: {tot.get('claimed_not_committed_at_fault', 0)} (all verified absent)")
print(f"acknowledged live claims after recovery: {tot.get('acked_live_checked', 0)} checked, "
      f"{tot.get('acked_live_replayed', 0)} replayed, {tot.get('acked_live_lost', 0)} lost")
for b in bad:
    print("FAIL:", b)
sys.exit(1 if bad else 0)
PY
}

# pg_dump / pg_restore of a database that uses idem keeps everything idem
# promises to keep, in both dump formats (custom + pg_restore, and plain SQL
# + psql), restored into fresh databases:
#   - live claims: completed (in a range partition and in the default one),
#     failed, and a running lease with its recovery point; a retry is still
#     a duplicate and gets the stored result back, a different fingerprint
#     is still refused (ID001), the lease still runs and its token still
#     finishes it;
#   - configuration: business type TTLs (and new claims use them), state
#     machines, unspent and spent one-time tokens, EXECUTE grants on admin
#     functions;
#   - guards: the trigger is restored, an illegal UPDATE is refused (ID002),
#     a repeated transition reads "already";
#   - the restored database works: new claims, idem_maintain;
#   - restored where a type's owner role does not exist (dropped after the
#     dump, as on another server): every other type's settings are
#     restored (0.3.0 stored the owner as a regrole, so the whole
#     idem.biz_types COPY failed and every TTL was lost), and the type
#     itself stays closed to all but superusers, naming its role.
scenario_dump_restore() {
pfx=${IDEM_DUMP_DB_PREFIX:-idem_dump}
src=${pfx}_src; dst_c=${pfx}_custom; dst_p=${pfx}_plain; dst_n=${pfx}_norole
role=${pfx}_ops; owner=${pfx}_owner; user=${pfx}_user
tmp=""
pgdsn=(-h "$(cluster_dir)" -p "$IDEM_PORT" -U postgres)

cleanup() {
  for db in $src $dst_c $dst_p $dst_n; do psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true; done
  psql_idem -q -d postgres -c "DROP ROLE IF EXISTS $role, $owner, $user" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
cleanup
tmp=$(mktemp -d)
for db in $src $dst_c $dst_p $dst_n; do psql_idem -q -d postgres -c "CREATE DATABASE $db"; done
psql_idem -q -d postgres -c "CREATE ROLE $role NOLOGIN" -c "CREATE ROLE $owner NOLOGIN" -c "CREATE ROLE $user NOLOGIN IN ROLE $owner"

# The source database: one of everything.
lease_token=$(psql_idem -q -d $src -At <<SQL | tail -1
CREATE EXTENSION idem;
SELECT idem_configure('pay', '2 days');
SELECT idem_configure('short', '1 hour');
SELECT idem_configure('owned', '3 hours');
SELECT idem_set_owner('owned', '$owner');
SELECT idem_define_machine('order', '{"CREATED":["PAID","CANCELLED"],"PAID":["SHIPPED"]}');
SELECT idem_maintain();
GRANT EXECUTE ON FUNCTION idem_forget(text, text) TO $role;
-- completed, in a range partition
BEGIN; SELECT idem_claim('in-range', 'pay', fingerprint => 'fp-1'); SELECT idem_complete('in-range', 'pay', '{"charge_id": 7, "amount": 12.50}'); COMMIT;
-- committed without a result (reads completed, result NULL)
SELECT idem_claim('bare', 'pay');
-- beyond the premade partitions: lives in the default partition
BEGIN; SELECT idem_claim('far', 'pay', ttl => '300 days'); SELECT idem_complete('far', 'pay', '{"ok": 1}'); COMMIT;
-- a deterministic failure
BEGIN; SELECT idem_claim('declined', 'pay'); SELECT idem_fail('declined', 'pay', '{"error": "insufficient_funds"}'); COMMIT;
-- tokens: one spent, one not
CREATE TABLE tok (name text PRIMARY KEY, token text);
INSERT INTO tok VALUES ('unspent', idem_issue_token('form', '1 hour')), ('spent', idem_issue_token('form', '1 hour'));
SELECT idem_consume_token(token, 'form') FROM tok WHERE name = 'spent';
-- a guarded table, one row moved by a guarded transition
CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL);
INSERT INTO orders VALUES (1, 'CREATED'), (2, 'CREATED');
SELECT idem_guard('orders', 'status', 'order');
SELECT idem_transition('orders', 'id', '1', 'status', 'PAID', 'order');
-- a running lease with a recovery point (its token is printed last)
CREATE TEMP TABLE l AS SELECT result->>'lease_token' AS t FROM idem_claim('job-1', 'batch', lease => '10 minutes');
SELECT idem_checkpoint('job-1', 'batch', 'item', '{"last_item": 42}', (SELECT t FROM l));
SELECT t FROM l;
SQL
)
[[ "$lease_token" =~ ^[0-9a-f]{32,}$ ]] || { echo "no lease token from the source database: $lease_token"; exit 1; }
before=$(psql_idem -d $src -At -c "SELECT count(*) FROM idem.claims")

"$PG_BIN/pg_dump" "${pgdsn[@]}" -Fc -f "$tmp/idem.dump" $src
"$PG_BIN/pg_restore" "${pgdsn[@]}" --exit-on-error -d $dst_c "$tmp/idem.dump"
"$PG_BIN/pg_dump" "${pgdsn[@]}" -Fp -f "$tmp/idem.sql" $src
psql_idem -q -d $dst_p -v ON_ERROR_STOP=1 -f "$tmp/idem.sql" >/dev/null
echo "dumped $before claims: custom format $(stat -c %s "$tmp/idem.dump") bytes, plain $(stat -c %s "$tmp/idem.sql") bytes"

fail=0; pass=0
check() {  # check DB NAME EXPECTED SQL  (SQL prints one line; errors print their SQLSTATE)
  local db=$1 name=$2 want=$3 sql=$4 got
  got=$("$PG_BIN/psql" -X -At "${pgdsn[@]}" -d "$db" -v ON_ERROR_STOP=1 -c '\set VERBOSITY sqlstate' -c "$sql" 2>&1 | tail -1 | sed 's/^ERROR:  //' || true)
  if [ "$got" = "$want" ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "  FAIL [$db] $name: got '$got', expected '$want'"; fi
}

verify() {
  local db=$1
  echo "verifying $db"
  check $db "claims restored"           "$before" "SELECT count(*) FROM idem.claims"
  check $db "duplicate replays result"  'false|completed|{"amount": 12.50, "charge_id": 7}' \
        "SELECT claimed || '|' || state || '|' || result::text FROM idem_claim('in-range', 'pay', fingerprint => 'fp-1')"
  check $db "fingerprint still checked" "ID001" "SELECT claimed FROM idem_claim('in-range', 'pay', fingerprint => 'fp-2')"
  check $db "bare claim is completed"   'false|completed|' "SELECT claimed || '|' || state || '|' || coalesce(result::text, '') FROM idem_claim('bare', 'pay')"
  check $db "default-partition claim"   'false|completed|{"ok": 1}' "SELECT claimed || '|' || state || '|' || result::text FROM idem_claim('far', 'pay')"
  check $db "failure replays"           'false|failed|{"error": "insufficient_funds"}' "SELECT claimed || '|' || state || '|' || result::text FROM idem_claim('declined', 'pay')"
  check $db "expiry kept"               "t" "SELECT (SELECT expires_at FROM idem_lookup('far', 'pay')) > now() + interval '299 days'"
  check $db "lease still running"       'false|in_progress' "SELECT claimed || '|' || state FROM idem_claim('job-1', 'batch', lease => '1 minute')"
  check $db "lease refuses a stranger"  "ID003" "SELECT idem_checkpoint('job-1', 'batch', 'x')"
  check $db "recovery point kept"       '{"last_item": 42}' "SELECT (result->'recovery_data')::text FROM idem.claims WHERE key = 'job-1'"
  check $db "lease token finishes it"   "" "SELECT idem_complete('job-1', 'batch', '{\"done\": true}', '$lease_token')"
  check $db "then it replays"           'false|completed|{"done": true}' "SELECT claimed || '|' || state || '|' || result::text FROM idem_claim('job-1', 'batch')"
  check $db "biz_type ttl kept"         "2 days" "SELECT ttl FROM idem.biz_types WHERE biz_type = 'pay'"
  check $db "new claim uses the ttl"    "01:00:00" "SELECT expires_at - first_claimed_at FROM idem_claim('new-short', 'short')"
  check $db "machine kept"              '{"PAID": ["SHIPPED"], "CREATED": ["PAID", "CANCELLED"]}' "SELECT idem_machine('order')->'transitions'"
  check $db "unspent token spends once" "true,false" "SELECT idem_consume_token(token, 'form') || ',' || idem_consume_token(token, 'form') FROM tok WHERE name = 'unspent'"
  check $db "spent token stays spent"   "f" "SELECT idem_consume_token(token, 'form') FROM tok WHERE name = 'spent'"
  check $db "guard trigger restored"    "1" "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'orders'::regclass AND tgname = 'idem_guard_status'"
  check $db "guard refuses illegal"     "ID002" "UPDATE orders SET status = 'CREATED' WHERE id = 1"
  check $db "guard refuses premature"   "ID002" "UPDATE orders SET status = 'SHIPPED' WHERE id = 2"
  check $db "repeat transition: already" "already" "SELECT idem_transition('orders', 'id', '1', 'status', 'PAID', 'order')"
  check $db "stale transition"          "stale" "SELECT idem_transition('orders', 'id', '1', 'status', 'CREATED', 'order')"
  check $db "illegal transition"        "ID002" "SELECT idem_transition('orders', 'id', '1', 'status', 'CANCELLED', 'order')"
  check $db "legal transition applies"  "applied" "SELECT idem_transition('orders', 'id', '2', 'status', 'PAID', 'order')"
  check $db "admin grant kept"          "true|false" "SELECT has_function_privilege('$role', 'idem_forget(text,text)', 'EXECUTE') || '|' || has_function_privilege('public', 'idem_forget(text,text)', 'EXECUTE')"
  check $db "new key claims"            "t" "SELECT claimed FROM idem_claim('fresh', 'pay')"
  check $db "maintenance runs"          "t" "SELECT (idem_maintain() ? 'partitions_created')"
  check $db "claims survive maintenance" 'false|completed' "SELECT claimed || '|' || state FROM idem_claim('far', 'pay')"
}
verify $dst_c
verify $dst_p
check $dst_c "owner role kept"         "$owner" "SELECT owner FROM idem.biz_types WHERE biz_type = 'owned'"
check $dst_c "owner's member claims"   "t" "SET ROLE $user; SELECT claimed FROM idem_claim('o-1', 'owned')"

# Restored where the owner role does not exist.
psql_idem -q -d postgres -c "DROP ROLE $user, $owner"
echo "verifying $dst_n (restored without role $owner)"
"$PG_BIN/pg_restore" "${pgdsn[@]}" --exit-on-error -d $dst_n "$tmp/idem.dump" && pass=$((pass + 1)) ||
  { fail=$((fail + 1)); echo "  FAIL [$dst_n] pg_restore failed without the owner role"; }
check $dst_n "other types' TTLs kept"   "2 days|01:00:00" "SELECT string_agg(ttl::text, '|' ORDER BY biz_type) FROM idem.biz_types WHERE biz_type IN ('pay', 'short')"
check $dst_n "the type's TTL kept"      "03:00:00" "SELECT ttl FROM idem.biz_types WHERE biz_type = 'owned'"
check $dst_n "claims restored"          "$before" "SELECT count(*) FROM idem.claims"
check $dst_n "type closed"             "42501" "SET ROLE $role; SELECT claimed FROM idem_claim('o-2', 'owned')"
msg=$("$PG_BIN/psql" -X -At "${pgdsn[@]}" -d $dst_n -c "SET ROLE $role" -c "SELECT claimed FROM idem_claim('o-2', 'owned')" 2>&1 | grep '^ERROR' || true)
if [ "$msg" = "ERROR:  idem: permission denied for biz_type \"owned\": it is reserved for role \"$owner\", which does not exist on this server" ]; then
  pass=$((pass + 1))
else fail=$((fail + 1)); echo "  FAIL [$dst_n] the refusal names the missing role: $msg"; fi
check $dst_n "a superuser opens it"     "t" "SELECT idem_set_owner('owned', NULL); SET ROLE $role; SELECT claimed FROM idem_claim('o-2', 'owned')"
echo "dump/restore: $pass passed, $fail failed"
[ $fail -eq 0 ]
}

# Failover under the stress load: a primary (port 5511) with a streaming
# replica made by pg_basebackup (port 5512) as its synchronous standby,
# synchronous_commit = remote_apply. In the middle of the run the primary is
# stopped hard (pg_ctl -m immediate) and the replica promoted. Against the
# new primary the driver retries every key whose COMMIT got no answer, and
# checks that every claim whose COMMIT was acknowledged by the old primary
# (and is still live) is replayed, not claimed again; then the load goes on
# against the new primary, and the stress invariants and amcheck run there.
# Every fourth new key has a 10-minute TTL: a slow promotion cannot leave
# the check without live claims to look for. About 35 s. Bigger: bash scripts/stress.sh failover
scenario_failover() {

pdir="$(cluster_dir)/stress/primary"
rdir="$(cluster_dir)/stress/replica"
pport=${FAILOVER_PRIMARY_PORT:-5511}
rport=${FAILOVER_REPLICA_PORT:-5512}
at=${FAILOVER_AT:-12}
ttl=${FAILOVER_TTL:-8}
claims=${FAILOVER_TAIL_CLAIMS:-400}
out="${STRESS_OUT:-$IDEM_TARGET/test-out/stress}"
mkdir -p "$out" "$(dirname "$pdir")"
pgsh="$ROOT/tests/lib/cluster.sh"
trap 'bash "$pgsh" destroy "$pdir" "$rdir"' EXIT

bash "$pgsh" init "$pdir" "$pport" primary
bash "$pgsh" start "$pdir"
bash "$pgsh" replica "$pdir" "$rdir" "$rport"
# Commits on the primary wait for the standby from here on.
for _ in $(seq 1 100); do
  state=$("$PG_BIN/psql" -X -h "$pdir" -p "$pport" -U postgres -d postgres -Atc \
    "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'stress_replica'")
  [ "$state" = sync ] && break
  sleep 0.1
done
[ "$state" = sync ] || { echo "FAIL: the replica is not a synchronous standby ($state)"; exit 1; }
echo "replica streaming, sync_state = $state, synchronous_commit = $("$PG_BIN/psql" -X -h "$pdir" -p "$pport" -U postgres -d postgres -Atc "SHOW synchronous_commit")"
"$PG_BIN/psql" -X -q -h "$pdir" -p "$pport" -U postgres -d postgres -c "CREATE DATABASE stress_failover"

set +e
# (timeout: commits wait for the standby; a dead standby must not hang the suite)
timeout "${FAILOVER_TIMEOUT:-300}" "$IDEM_PY" "$ROOT/tests/stress/driver.py" \
  --dsn "host=$pdir port=$pport user=postgres dbname=stress_failover" \
  --dsn-after "host=$rdir port=$rport user=postgres dbname=stress_failover" \
  --fault failover --fault-at "$at" --fault-cmd "bash '$pgsh' failover '$pdir' '$rdir'" \
  --ttl "$ttl" --width 0.5 --long-every 4 --claims "$claims" --summary "$out/failover.json" ${FAILOVER_ARGS:-}
rc=$?
set -e
if [ $rc -ne 0 ]; then
  echo "--- primary log (last 20 lines)"; tail -20 "$pdir/server.log"
  echo "--- replica log (last 20 lines)"; tail -20 "$rdir/server.log"
  exit $rc
fi
"$IDEM_PY" - "$out/failover.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
r = s["recoveries"][0] if s["recoveries"] else {}
bad = []
if not s["recoveries"]:
    bad.append("no failover happened")
if r.get("acked_live_checked", 0) < 100:
    bad.append("fewer than 100 acknowledged live claims were checked on the new primary")
print(f"acknowledged on the old primary and live at the check: {r.get('acked_live_checked', 0)}; "
      f"replayed on the new primary: {r.get('acked_live_replayed', 0)}; claimed again (lost): {r.get('acked_live_lost', 0)}")
print(f"COMMITs in flight at the failover: {r.get('in_flight', 0)} "
      f"(on the new primary, replayed: {r.get('in_flight_committed_replays', 0)}; "
      f"lost, claimed again: {r.get('in_flight_lost_claims_again', 0)}; "
      f"expired before the retry: {r.get('in_flight_expired_before_retry', 0)})")
print(f"claimed, failover before COMMIT: {r.get('claimed_not_committed_at_fault', 0)} (all verified absent)")
for b in bad:
    print("FAIL:", b)
sys.exit(1 if bad else 0)
PY
}

# idem on a hot standby: a primary (port 5513) with a streaming replica
# (port 5514) as its synchronous standby, synchronous_commit =
# remote_apply, so that a commit on the primary has been replayed on the
# replica when it returns. On the replica, idem_lookup answers from the
# replicated claims (committed outcomes, and in_progress for a claim whose
# transaction is still open on the primary); every writer fails with 25006
# and a hint to claim on the primary (0.2.0: an xid-assignment error). Both
# storage paths. Then the primary is stopped hard and the standby promoted:
# there, duplicates replay, a lease taken on the old primary is honoured
# (its token finishes it, a caller without it gets ID003), new claims work.
scenario_hot_standby() {
source "$ROOT/tests/lib/scenarios.sh"

pdir="$(cluster_dir)/standby/primary"
rdir="$(cluster_dir)/standby/replica"
pport=5513
rport=5514
mkdir -p "$(dirname "$pdir")"
pgsh="$ROOT/tests/lib/cluster.sh"
cleanup() {
  [ -n "${holder:-}" ] && kill "$holder" 2>/dev/null
  bash "$pgsh" destroy "$pdir" "$rdir"
}
trap cleanup EXIT
set +e

bash "$pgsh" init "$pdir" "$pport" primary
bash "$pgsh" start "$pdir"
bash "$pgsh" replica "$pdir" "$rdir" "$rport"
primary() { "$PG_BIN/psql" -X -At -v ON_ERROR_STOP=1 -h "$pdir" -p "$pport" -U postgres "$@"; }
replica() { "$PG_BIN/psql" -X -At -h "$rdir" -p "$rport" -U postgres "$@"; }
# Commits on the primary wait for the standby from here on (a state the
# primary reports, waited for with a bound).
for _ in $(seq 1 100); do
  state=$(primary -d postgres -c "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'stress_replica'")
  [ "$state" = sync ] && break
  sleep 0.1
done
[ "$state" = sync ] || { echo "FAIL: the replica is not a synchronous standby ($state)"; exit 1; }

primary -q -d postgres -c "CREATE DATABASE standby"
primary -q -d standby >/dev/null <<'SQL'
CREATE EXTENSION idem;
BEGIN; SELECT idem_claim('done', 'pay'); SELECT idem_complete('done', 'pay', '{"charge": 7}'); COMMIT;
BEGIN; SELECT idem_claim('declined', 'pay'); SELECT idem_fail('declined', 'pay', '{"reason": "card"}'); COMMIT;
SQL
lease_token=$(primary -d standby -c "SELECT result->>'lease_token' FROM idem_claim('job', 'batch', lease => '1 hour')")
# A claim whose transaction stays open on the primary. The holder signals
# that it has claimed by taking an advisory lock the script can see.
coproc HOLDER { primary -d standby; }
holder=$HOLDER_PID
echo "BEGIN; SELECT idem_claim('open', 'pay'); SELECT pg_advisory_lock(4242); SELECT 'claimed';" >&"${HOLDER[1]}"
# (read's timeout only bounds a hang; the verdict is the line itself)
while read -r -t 60 line <&"${HOLDER[0]}"; do [ "$line" = claimed ] && break; done
[ "$line" = claimed ] || { echo "FAIL: the holder did not claim: $line"; exit 1; }
# Its insert is replayed on the standby once a later commit has been: make one.
primary -q -d standby -c "SELECT idem_configure('sync.marker', '1 hour')"

for path in direct sql; do
  replica -d postgres -c "LOAD 'idem'" -c "ALTER SYSTEM SET idem.storage_access = '$path'" -c "SELECT pg_reload_conf()" >/dev/null
  expect "$path: replica in recovery" "$(replica -d standby -c "SELECT pg_is_in_recovery()")" t
  expect "$path: lookup of a completed claim" "$(replica -d standby -c "SELECT state || '|' || result::text FROM idem_lookup('done', 'pay')")" 'completed|{"charge": 7}'
  expect "$path: lookup of a failed claim" "$(replica -d standby -c "SELECT state || '|' || result::text FROM idem_lookup('declined', 'pay')")" 'failed|{"reason": "card"}'
  expect "$path: lookup of an unknown key" "$(replica -d standby -c "SELECT state FROM idem_lookup('never', 'pay')")" absent
  # The SQL path cannot see an uncommitted claim, nor its key lock (a
  # primary's lock is not on the standby): absent there, in_progress on the
  # direct path, which sees the replayed row and its running transaction.
  want=in_progress; [ "$path" = sql ] && want=absent
  expect "$path: lookup of a claim still open on the primary" "$(replica -d standby -c "SELECT state FROM idem_lookup('open', 'pay')")" "$want"
  for call in "idem_claim('new', 'pay')" "idem_claim('done', 'pay')" "idem_complete('done', 'pay')" \
              "idem_fail('done', 'pay', '{}')" "idem_checkpoint('done', 'pay', 'p')" "idem_release('done', 'pay', 'x')" \
              "idem_claim_many(ARRAY['new'], 'pay')" "idem_forget('done', 'pay')" \
              "idem_configure('pay', '1 hour')" "idem_set_owner('pay', NULL)"; do
    got=$(replica -d standby -c "\\set VERBOSITY verbose" -c "SELECT $call" 2>&1 | (grep -E "^ERROR|^HINT" || true) | tr '\n' ' ')
    case "$got" in
      *"ERROR:  25006: cannot execute idem_"*"in a read-only transaction"*"HINT:  This server is a hot standby: claim on the primary"*)
        echo "ok: $path: $call refused with 25006 and the hint" ;;
      *) echo "FAIL: $path: $call on the standby: $got"; fails=$((fails + 1)) ;;
    esac
  done
done
# The holder commits; the standby then reads the claim as completed.
echo "COMMIT; SELECT 'committed';" >&"${HOLDER[1]}"
while read -r -t 60 line <&"${HOLDER[0]}"; do [ "$line" = committed ] && break; done
primary -q -d standby -c "SELECT idem_configure('sync.marker', '2 hours')"
expect "lookup after the primary committed" "$(replica -d standby -c "SELECT state FROM idem_lookup('open', 'pay')")" completed

kill "$holder" 2>/dev/null; holder=
# A standby session that has read a type keeps what it read of its TTL
# classes only while nothing can change them under it: the primary's
# registrations reach a standby as replayed rows, with no message to its
# sessions, so a session that looked 'pay' up before the primary put a claim
# of 'pay' into a new class must still find that claim (on each path: a
# class of its own).
# (Another type takes the class first, so that its partitions exist and
# 'pay''s claim writes a registration and a row, no DDL, whose replayed
# invalidations would reach the session anyway.)
claim_far() { # key type ttl: claimed and completed on the primary, then
  # replayed (a new standby session finds it; the bound only stops a hang)
  primary -q -d standby -c "BEGIN" -c "SELECT idem_claim('$1', '$2', ttl => '$3')" \
    -c "SELECT idem_complete('$1', '$2', '{\"far\": 1}')" -c "COMMIT" >/dev/null
  for _ in $(seq 1 300); do
    [ "$(replica -d standby -c "SELECT state FROM idem_lookup('$1', '$2')")" = completed ] && break
    sleep 0.1
  done
}
primary -q -d standby -c "ALTER DATABASE standby SET idem.partition_width = '1 second'"
for path in direct sql; do
  replica -d postgres -c "ALTER SYSTEM SET idem.storage_access = '$path'" -c "SELECT pg_reload_conf()" >/dev/null
  ttl='400 days'; [ "$path" = sql ] && ttl='30 days'
  claim_far "first-$path" spare "$ttl"
  coproc READER { replica -d standby; }
  echo "SELECT 'read:' || state FROM idem_lookup('done', 'pay');" >&"${READER[1]}"
  while read -r -t 60 line <&"${READER[0]}"; do [[ $line == read:* ]] && break; done
  claim_far "far-$path" pay "$ttl"
  echo "SELECT 'far:' || state FROM idem_lookup('far-$path', 'pay');" >&"${READER[1]}"
  while read -r -t 60 line <&"${READER[0]}"; do [[ $line == far:* ]] && break; done
  expect "$path: a standby session that read the type before finds its claim in a class added since" "$line" far:completed
  # The same session, once a claim of a class the type is in needs a
  # registration reaching further than the one it read (a 1-minute TTL's
  # class is 11 s wide at the 1-second partition width set below: its
  # registrations reach the next 11 s boundary past a claim's expiry).
  claim_far "tick-$path-1" "tick-$path" '1 minute'
  echo "SELECT 'read:' || state FROM idem_lookup('tick-$path-1', 'tick-$path');" >&"${READER[1]}"
  while read -r -t 60 line <&"${READER[0]}"; do [[ $line == read:* ]] && break; done
  # (waiting for the clock to pass what is registered: a state the primary reports)
  for _ in $(seq 1 600); do
    [ "$(primary -d standby -c "SELECT clock_timestamp() + interval '1 minute' > max(until) FROM idem.type_classes WHERE biz_type = 'tick-$path'")" = t ] && break
    sleep 0.1
  done
  claim_far "tick-$path-2" "tick-$path" '1 minute'
  echo "SELECT 'tick:' || state FROM idem_lookup('tick-$path-2', 'tick-$path');" >&"${READER[1]}"
  while read -r -t 60 line <&"${READER[0]}"; do [[ $line == tick:* ]] && break; done
  expect "$path: the same session finds a claim registered past what it read" "$line" tick:completed
  kill "$READER_PID" 2>/dev/null; wait "$READER_PID" 2>/dev/null
done

# Failover: the standby becomes the primary.
bash "$pgsh" failover "$pdir" "$rdir" >/dev/null
expect "promoted: out of recovery" "$(replica -d standby -c "SELECT pg_is_in_recovery()")" f
for path in direct sql; do
  replica -d postgres -c "ALTER SYSTEM SET idem.storage_access = '$path'" -c "SELECT pg_reload_conf()" >/dev/null
  expect "promoted, $path: a duplicate replays" "$(replica -d standby -c "SELECT claimed || '|' || state || '|' || result::text FROM idem_claim('done', 'pay')")" \
    'false|completed|{"charge": 7}'
  expect "promoted, $path: the lease still runs" "$(replica -d standby -c "SELECT claimed || '|' || state FROM idem_claim('job', 'batch')")" \
    'false|in_progress'
  expect "promoted, $path: finishing the lease without its token" "$(replica -d standby -c '\set VERBOSITY sqlstate' -c "SELECT idem_checkpoint('job', 'batch', 'p')" 2>&1 | sed -n 's/^ERROR:  //p')" \
    ID003
done
expect "promoted: the lease token finishes the lease" "$(replica -d standby -c "SELECT idem_complete('job', 'batch', '{\"done\": true}', lease_token => '$lease_token')" -c "SELECT state FROM idem_lookup('job', 'batch')" | tail -1)" \
  "completed"
expect "promoted: a new claim" "$(replica -d standby -c "SELECT claimed FROM idem_claim('after-failover', 'pay')")" t
finish "hot standby"
}

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
scenario_logical() {
source "$ROOT/tests/lib/scenarios.sh"
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
}

# Long retention at the price of short: business types at 1 hour, 1 day,
# 30 days and 400 days live in one database, each with claims spread over
# 90% of its TTL (as a database that has been claiming for that long holds
# them; the last tenth kept so that none expires before it is checked), on
# a throw-away cluster with PostgreSQL's default max_locks_per_transaction
# (64) and 120 connections.
#
# Checks, per type:
#   * a claim locks a bounded number of relations, the same for 1 hour as
#     for 400 days (0.3.0: 133 at 30 days, up to 1,216 at 400 days): at
#     most 21 lock entries (idem.claims, the default partition and its
#     index, idem.type_classes and its index, two per partition of the class
#     that can hold the key: at most 8);
#   * duplicates of claims anywhere in the TTL's span are found (claimed =
#     false, the stored result), new keys are claimed;
# a change of idem.partition_width loses no claim; and then 100 sessions
# that each hold an open claim of the 400-day type
# and, in the same transaction, claim a 30-day key and repeat an old
# 400-day one: no error (0.3.0: 53200 "out of shared memory" once 19-38
# sessions held a claim), one business row per key; a second wave of the
# same keys writes no business row.
#
# The aged claims are written into idem.claims as claims of that age would
# have left them (claimed_at, expires_at, ttl_class, the type registered in
# its class), then idem_maintain() moves them into their class's partitions.
scenario_retention() {
source "$ROOT/tests/lib/scenarios.sh"
dir="$(cluster_dir)/retention"
port=$(major_port 5516)
pgsh="$ROOT/tests/lib/cluster.sh"
trap 'bash "$pgsh" destroy "$dir"' EXIT

bash "$pgsh" destroy "$dir" 2>/dev/null || true
bash "$pgsh" init "$dir" $port
cat >> "$dir/data/postgresql.conf" <<CONF
max_connections = 120
max_locks_per_transaction = 64
CONF
bash "$pgsh" start "$dir"
q() { as_postgres psql -X -q -v ON_ERROR_STOP=1 -h "$dir" -p $port -d retention "$@"; }
as_postgres psql -X -q -h "$dir" -p $port -d postgres -c "CREATE DATABASE retention"

q <<'SQL'
CREATE EXTENSION idem;
CREATE TABLE business (key text PRIMARY KEY, by_session int NOT NULL);
SELECT idem_configure('t1h', '1 hour'), idem_configure('t1d', '1 day'),
       idem_configure('t30d', '30 days'), idem_configure('t400d', '400 days');
-- 20,000 claims per type, claimed at times spread over 90% of its TTL:
-- the oldest still has a tenth of its TTL to live (6 minutes for 1 hour),
-- so that none expires before the checks below, however slowly the
-- machine gets to them (spread over the whole TTL, the oldest probed claim
-- of t1h expired 3 s after this, and a loaded run missed it).
INSERT INTO idem.claims (expires_at, claimed_at, ttl_class, state, biz_type, key, result)
SELECT c.at + t.ttl, c.at, idem.ttl_class(t.ttl), 'c', t.biz_type, 'old-' || g, jsonb_build_object('n', g)
  FROM idem.biz_types t, generate_series(1, 20000) g,
       LATERAL (SELECT now() - t.ttl * 0.9 * (g / 20001.0) AS at) c;
INSERT INTO idem.type_classes (biz_type, ttl_class, until)
SELECT biz_type, ttl_class, max(expires_at) FROM idem.claims GROUP BY 1, 2;
SELECT idem_maintain() IS NOT NULL;
SQL
expect "no claim left in the default partition" "$(q -At -c "SELECT count(*) FROM idem.claims_default")" 0
expect "one TTL class per type" "$(q -At -c "SELECT count(DISTINCT ttl_class) FROM idem.claims")" 4

# Relations one claim locks, per type: bounded, and the same whatever the TTL.
locks=()
for t in t1h t1d t30d t400d; do
  # (A first claim in the session fills its caches, which reads more.)
  n=$(q -At <<SQL | tail -1
BEGIN;
SELECT 1 FROM idem_claim('lock-probe', '$t');
ROLLBACK;
BEGIN;
SELECT 1 FROM idem_claim('lock-probe', '$t');
SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'relation' AND relation <> 'pg_locks'::regclass;
ROLLBACK;
SQL
)
  echo "   a claim of $t locks $n relations"
  locks+=("$n")
  expect "a claim of $t locks at most 21 relations" "$([ "$n" -le 21 ] && echo true || echo false)" true
done
spread=$(printf '%s\n' "${locks[@]}" | sort -n | sed -n '1p;$p' | paste -sd' ' | awk '{print $2 - $1}')
expect "lock counts of 1 hour and 400 days differ by at most 4" "$([ "$spread" -le 4 ] && echo true || echo false)" true

# Duplicates of claims anywhere in each type's span are found.
for t in t1h t1d t30d t400d; do
  found=$(q -At -c "SELECT count(*) FILTER (WHERE NOT r.claimed AND r.state = 'completed' AND r.result = jsonb_build_object('n', g))
                      FROM generate_series(1, 20000, 97) g, LATERAL idem_claim('old-' || g, '$t') r")
  expect "duplicates of $t found across 90% of its TTL" "$found" 207
done

q -At -c "SELECT check_name || '=' || severity FROM idem_health WHERE check_name IN ('claim_locks', 'partition_horizon', 'default_partition') ORDER BY 1" > "$dir/health.txt"
expect "idem_health" "$(paste -sd' ' "$dir/health.txt")" "claim_locks=ok default_partition=ok partition_horizon=ok"

# A change of idem.partition_width moves coming claims to other classes and
# loses none: claims made at one width are found at another, before and
# after maintenance makes the new widths' partitions.
q -At > "$dir/width.txt" <<'SQL'
SELECT claimed FROM idem_claim('w-1', 't1h');
SET idem.partition_width = '10 minutes';
SELECT claimed FROM idem_claim('w-1', 't1h');
SELECT claimed FROM idem_claim('w-2', 't1h');
SELECT idem_maintain() IS NOT NULL;
SELECT claimed FROM idem_claim('w-1', 't1h');
RESET idem.partition_width;
SELECT claimed FROM idem_claim('w-2', 't1h');
SELECT count(DISTINCT ttl_class) FROM idem.claims WHERE biz_type = 't1h' AND key LIKE 'w-%';
SQL
expect "claims across a change of idem.partition_width" "$(paste -sd' ' "$dir/width.txt")" "t f t t f f 2"

# A type's TTL changed while its claims are live: the old claims (in the old
# TTL's class) answer duplicates, new ones go to the new class. (The
# isolation spec claim_partition_race has two classes of one key in flight.)
q -At > "$dir/ttl.txt" <<'SQL'
SELECT claimed FROM idem_claim('c-1', 'tchange');
SELECT idem_configure('tchange', '30 days');
SELECT claimed FROM idem_claim('c-1', 'tchange');
SELECT claimed FROM idem_claim('c-2', 'tchange');
SELECT idem_configure('tchange', '5 minutes');
SELECT claimed FROM idem_claim('c-2', 'tchange');
SELECT claimed FROM idem_claim('c-1', 'tchange');
SELECT count(DISTINCT ttl_class) FROM idem.type_classes WHERE biz_type = 'tchange';
SQL
expect "claims across changes of the type's TTL (1 day, 30 days, 5 minutes)" "$(grep -v '^$' "$dir/ttl.txt" | paste -sd' ')" "t f t f f 2"

# 100 sessions, each holding an open 400-day claim, then claiming more.
cat > "$dir/sessions.py" <<'PY'
import sys, threading, psycopg
dsn, wave = sys.argv[1], sys.argv[2]
n = 100
conns = [psycopg.connect(dsn, autocommit=False) for _ in range(n)]
errors, new = [], []
def step(i, sql, args=()):
    try:
        return conns[i].execute(sql, args).fetchone()
    except Exception as e:
        errors.append(f"{i}: {getattr(e, 'sqlstate', '')} {e}")
        return None
# Phase 1: every session claims its 400-day key and writes its business row;
# all 100 transactions stay open (the locks are held together).
for i in range(n):
    r = step(i, "SELECT claimed FROM idem_claim(%s, 't400d')", (f"s-{i}",))
    if r and r[0]:
        new.append(i)
        step(i, "INSERT INTO business VALUES (%s, %s) RETURNING 1", (f"s-{i}", i))
# Phase 2, with every transaction still open: a 30-day claim and a
# duplicate of an old 400-day claim in each.
dup = 0
for i in range(n):
    step(i, "SELECT claimed FROM idem_claim(%s, 't30d')", (f"m-{wave}-{i}",))
    r = step(i, "SELECT claimed, state FROM idem_claim(%s, 't400d')", (f"old-{1 + i * 199}",))
    if r and not r[0] and r[1] == "completed":
        dup += 1
for c in conns:
    try:
        c.commit()
    except Exception as e:
        errors.append(str(e))
    c.close()
print(f"errors={len(errors)} new={len(new)} dup={dup}")
for e in errors[:5]:
    print("  ", e)
PY
dsn="host=127.0.0.1 port=$port dbname=retention user=postgres"
out1=$("$IDEM_PY" "$dir/sessions.py" "$dsn" 1)
echo "   first wave: $out1"
expect "100 sessions holding 400-day claims: no error, 100 claimed, 100 old duplicates found" "${out1%%$'\n'*}" "errors=0 new=100 dup=100"
out2=$("$IDEM_PY" "$dir/sessions.py" "$dsn" 2)
echo "   second wave: $out2"
expect "the same keys again: no error, none claimed" "${out2%%$'\n'*}" "errors=0 new=0 dup=100"
expect "one business row per key" "$(q -At -c "SELECT count(*), count(DISTINCT key) FROM business" | tr '|' ' ')" "100 100"

finish "retention"
}

# Stress with faults, small: 8 clients x 5,000 claims (about 30 % on keys
# already used) against the shared cluster, each transaction committing,
# rolling back, failing mid-way, claiming with wait => false or inside a
# rolled-back savepoint, while idem_maintain() rotates 1-second partitions
# under a 3-second TTL (with random pauses, and one hold that lasts until
# the default partition holds a live claim, which the next run moves out). Checks, and prints as counts: one committed claim per key per
# TTL window, claims against business rows both ways, no claim gone before
# its expiry, the client's acknowledged commits against the server's rows,
# no unexpected SQLSTATE, amcheck on every index and heap. Then a negative
# control: a short run with 5 claims evicted behind the clients' backs must
# fail. About 25 s.
# Full size (8 x 100,000): bash scripts/stress.sh
scenario_stress() {
db=stress_suite
out="${STRESS_OUT:-$IDEM_TARGET/test-out/stress}"
mkdir -p "$out"
psql_idem -q -d postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
trap 'psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" || true' EXIT

# (timeout: a hung run must not hang the suite. It is a bound against a
# hang, not a verdict: about a minute of work on a quiet machine; 300 s
# killed a sound run on 2 cores at load 60-110.)
timeout 1200 "$IDEM_PY" "$ROOT/tests/stress/driver.py" --dsn "host=$(cluster_dir) port=$IDEM_PORT user=postgres dbname=$db" \
  --clients 8 --claims "${STRESS_CLAIMS:-5000}" --ttl 3 --width 1 --summary "$out/stress.json"

# The run must have exercised what it claims to test.
"$IDEM_PY" - "$out/stress.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
c, m, k = s["counts"], s["maintenance"], s["checks"]
need = {
    "claims committed": c.get("committed_complete", 0) + c.get("committed_fail", 0) + c.get("committed_bare", 0),
    "duplicates replayed": c.get("replay_completed", 0) + c.get("replay_failed", 0),
    "rollbacks and mid-way errors": c.get("rolled_back", 0) + c.get("error_midway", 0),
    "keys claimed again after expiry": k.get("keys_committed_more_than_once_after_expiry", 0),
    "partitions dropped": m.get("partitions_dropped", 0),
    "claims moved out of the default partition": m.get("rows_moved_from_default", 0),
    "indexes checked by amcheck": k.get("amcheck_indexes_checked", 0),
}
bad = [name for name, v in need.items() if v <= 0]
for name, v in need.items():
    print(f"{name}: {v}")
for b in bad:
    print("FAIL: the run had no", b)
sys.exit(1 if bad else 0)
PY

# Negative control: the same checks, on a short run in which 5 live
# acknowledged claims are evicted behind the clients' backs (idem_forget),
# must fail and count exactly those 5. (The victims are among the claims
# of every second new key, which have a 10-minute TTL, over the run's 5-minute
# timeout: a slow run cannot let them expire before the final count, as a
# 30 s TTL did on a loaded machine.)
neg=stress_suite_neg
psql_idem -q -d postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $neg WITH (FORCE)" -c "CREATE DATABASE $neg"
trap 'psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "DROP DATABASE IF EXISTS $neg WITH (FORCE)" || true' EXIT
set +e
timeout 300 "$IDEM_PY" "$ROOT/tests/stress/driver.py" --dsn "host=$(cluster_dir) port=$IDEM_PORT user=postgres dbname=$neg" \
  --clients 8 --claims 1000 --ttl 30 --width 1 --long-every 2 --sabotage 5 --summary "$out/stress-neg.json" > "$out/stress-neg.log" 2>&1
rc=$?
set -e
"$IDEM_PY" - "$out/stress-neg.json" "$rc" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
missing = s["checks"].get("live_business_rows_without_claim", 0)
print(f"negative control (5 live claims evicted mid-run): exit status {sys.argv[2]}, "
      f"live business rows without their claim {missing}, {len(s['failures'])} problems reported")
if sys.argv[2] != "1" or missing != 5:
    print("FAIL: the checks did not catch the evicted claims")
    sys.exit(1)
PY
}

# A payment whose worker dies at every phase and that no client ever asks
# for again: the completer of docs/patterns.md ("A completer for leases
# nobody came back for"; the scenario runs that section's SQL as it is
# written, tests/docs/sql_blocks.py block) takes each run-out lease over
# and a re-drive worker finishes it from its recovery point. Real parts: a
# charge server on 127.0.0.1 (Python's http.server) that counts the calls
# it gets and honours the Idempotency-Key header as a provider does (a key
# seen before gets the same charge back, no new one), and a worker in
# Python with psycopg, written as a user would: a claim with a lease whose
# transaction also keeps the request as the first recovery point
# ('received'), the charge with the claim id as the provider's key, a
# checkpoint of the charge id ('charged', merged into the request), then the
# payment row and idem_complete in one transaction. One order per phase,
# its worker SIGKILLed when it says it got there:
#   claimed       the claim and its request committed, nothing charged
#   charged       charged, the answer not recorded
#   checkpointed  the charge id recorded, not completed
#   completing    the payment row and idem_complete written, not committed
#   completed     committed (the control: nothing to re-drive)
# The leases are short (2 s) so that they run out; the test waits for
# idem_leases to say so (a state, not a clock), runs the completer, then
# the re-drive worker, which has nothing but the queue's row to go by (the
# order and amount come from the recovery data). Verdicts, per order: one
# payment row with the request's amount, one charge made at the provider
# (its distinct effects) under the claim's id, its charge in the payment
# row, the key completed and no lease left; the provider called twice only
# for "charged" (the re-drive cannot know the charge was made, and asks
# again under the same key) and once otherwise; nothing left to re-drive.
# Both editions: the native one, and the portable one's plain script in a
# database of its own on the same cluster.
scenario_redrive() {
work="$IDEM_TARGET/redrive"
rm -rf "$work"; mkdir -p "$work"
recipe=$(python3 "$ROOT/tests/docs/sql_blocks.py" block "$ROOT/docs/patterns.md" "A completer for leases nobody came back for" 1)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for db in redrive_native redrive_portable; do
    psql_idem -q -d postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" || true
  done
}
trap cleanup EXIT

cat > "$work/provider.py" <<'PY'
# A payment provider: POST /charges {order, amount_cents} with an
# Idempotency-Key header makes one charge per key (a key seen before gets
# its charge back); GET /stats: the requests per key and the charges made.
import json, threading
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
lock = threading.Lock()
requests, charges = {}, {}

class Provider(BaseHTTPRequestHandler):
    def reply(self, status, doc):
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        key = self.headers.get("Idempotency-Key")
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/charges" or not key:
            return self.reply(400, {"error": "POST /charges with an Idempotency-Key"})
        with lock:
            requests[key] = requests.get(key, 0) + 1
            charge = charges.get(key)
            if charge is None:
                charge = charges[key] = {"id": f"ch_{len(charges) + 1}", "order": req["order"],
                                         "amount_cents": req["amount_cents"]}
            elif (charge["order"], charge["amount_cents"]) != (req["order"], req["amount_cents"]):
                return self.reply(422, {"error": "the key was used for another charge"})
        self.reply(200, charge)

    def do_GET(self):
        with lock:
            self.reply(200, {"requests": requests, "charges": charges})

    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", 0), Provider)
print(server.server_address[1], flush=True)
server.serve_forever()
PY

cat > "$work/worker.py" <<'PY'
# The payment worker: worker.py pay ORDER AMOUNT [DIE_AT] takes a request,
# worker.py redrive finishes what the completer queued in charge_redrives.
# With DIE_AT it stops at that phase, says so and waits to be killed.
import json, os, signal, sys, urllib.request
import psycopg
from psycopg.types.json import Jsonb

TYPE = "charge"
PROVIDER = os.environ["CHARGE_URL"]

def phase(name, die_at):
    print("phase", name, flush=True)
    while name == die_at:
        print("waiting to be killed", flush=True)
        signal.pause()

def charge(claim_id, request):
    call = urllib.request.Request(PROVIDER + "/charges", method="POST", data=json.dumps(request).encode(),
                                  headers={"Content-Type": "application/json", "Idempotency-Key": str(claim_id)})
    with urllib.request.urlopen(call, timeout=60) as answer:
        return json.load(answer)

def drive(conn, key, token, claim_id, point, data, die_at=None):
    """From a recovery point to the end: the first run and every re-drive."""
    if point == "received":
        made = charge(claim_id, data["request"])
        phase("charged", die_at)
        conn.execute("SELECT idem_checkpoint(%s, %s, 'charged', %s, %s, merge => true)",
                     (key, TYPE, Jsonb({"charge_id": made["id"]}), token))
        data = {**data, "charge_id": made["id"]}
        phase("checkpointed", die_at)
    request = data["request"]
    with conn.transaction():
        conn.execute("INSERT INTO payments (order_no, amount_cents, charge_id) VALUES (%s, %s, %s)",
                     (request["order"], request["amount_cents"], data["charge_id"]))
        conn.execute("SELECT idem_complete(%s, %s, %s, %s)", (key, TYPE, Jsonb({"charge_id": data["charge_id"]}), token))
        phase("completing", die_at)
    phase("completed", die_at)

def pay(conn, order, amount, die_at):
    key = f"{order}:charge"
    request = {"order": order, "amount_cents": amount}
    with conn.transaction():
        claimed, state, result, claim_id = conn.execute(
            "SELECT claimed, state, result, idem_claim_id(%s, %s, first_claimed_at)"
            "  FROM idem_claim(%s, %s, lease => '2 seconds')", (key, TYPE, key, TYPE)).fetchone()
        if not claimed:
            print("not claimed:", state, result, flush=True)
            return
        token = result["lease_token"]
        # The request, kept for whoever takes the lease over.
        conn.execute("SELECT idem_checkpoint(%s, %s, 'received', %s, %s)", (key, TYPE, Jsonb({"request": request}), token))
    phase("claimed", die_at)
    drive(conn, key, token, claim_id, "received", {"request": request}, die_at)

def redrive(conn):
    done = 0
    while True:
        with conn.transaction():
            row = conn.execute(
                "DELETE FROM charge_redrives r"
                "  USING (SELECT key, attempt FROM charge_redrives ORDER BY key, attempt LIMIT 1 FOR UPDATE SKIP LOCKED) q"
                " WHERE (r.key, r.attempt) = (q.key, q.attempt)"
                " RETURNING r.key, r.recovery_point, r.recovery_data, r.lease_token, r.claim_id").fetchone()
        if row is None:
            break
        key, point, data, token, claim_id = row
        print("re-drive", key, "from", point, flush=True)
        drive(conn, key, token, claim_id, point, data)
        done += 1
    print("re-driven", done, flush=True)

with psycopg.connect(autocommit=True, application_name="redrive-worker") as conn:
    if sys.argv[1] == "pay":
        pay(conn, sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else None)
    else:
        redrive(conn)
PY

"$IDEM_PY" "$work/provider.py" > "$work/provider.port" 2> "$work/provider.log" &
pids+=($!)
for i in $(seq 1 100); do [ -s "$work/provider.port" ] && break; sleep 0.1; done
[ -s "$work/provider.port" ] || { cat "$work/provider.log"; echo "FAIL: the charge server did not start"; exit 1; }
export CHARGE_URL="http://127.0.0.1:$(cat "$work/provider.port")"
export PGHOST="$(client_host)" PGPORT="$(client_port)" PGUSER=postgres
python3 "$ROOT/scripts/portable.py" --out "$work/dist" > /dev/null

phases=(claimed charged checkpointed completing completed)
for edition in native portable; do
  say "$edition edition"
  db=redrive_$edition
  export PGDATABASE=$db
  psql_idem -q -d postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
  if [ $edition = native ]; then psql_idem -q -d $db -c "CREATE EXTENSION idem"
  else psql_idem -q -d $db -f "$work/dist/idem_portable.sql" > /dev/null; fi
  psql_idem -q -d $db -c "CREATE TABLE payments (id bigserial PRIMARY KEY, order_no text NOT NULL, amount_cents int NOT NULL, charge_id text NOT NULL)"
  # The completer, as documented (its CALL finds nothing yet).
  echo "$recipe" | psql_idem -q -d $db

  # One order per phase, amounts of their own; each worker is killed where it says it is.
  n=0
  for ph in "${phases[@]}"; do
    n=$((n + 1))
    order="$edition-$ph"
    log="$work/$order.log"
    : > "$log"
    "$IDEM_PY" -u "$work/worker.py" pay "$order" $((1000 + n)) "$ph" > "$log" 2>&1 &
    wpid=$!
    for i in $(seq 1 600); do
      grep -q "waiting to be killed" "$log" && break
      kill -0 $wpid 2>/dev/null || break
      sleep 0.1
    done
    grep -q "waiting to be killed" "$log" || { cat "$log"; fail "$order: the worker did not get to $ph"; continue; }
    kill -KILL $wpid
    wait $wpid 2>/dev/null || true
  done
  # The dead workers' backends end (rolling back "completing") ...
  for i in $(seq 1 300); do
    [ "$(psql_idem -d $db -Atc "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'redrive-worker'")" = 0 ] && break
    sleep 0.1
  done
  # ... and their leases run out: a state idem_leases reports.
  for i in $(seq 1 300); do
    [ "$(psql_idem -d $db -Atc "SELECT count(*) FILTER (WHERE ran_out) = 4 AND count(*) = 4 FROM idem_leases WHERE biz_type = 'charge'")" = t ] && break
    sleep 0.1
  done
  expect "$edition: leases run out, one per dead worker but the one that committed" \
    "$(psql_idem -d $db -Atc "SELECT count(*) FILTER (WHERE ran_out) FROM idem_leases WHERE biz_type = 'charge'")" 4
  expect "$edition: before the completer, no payment but the committed one" \
    "$(psql_idem -d $db -Atc "SELECT string_agg(order_no, ',') FROM payments")" "$edition-completed"

  # The completer's run (pg_cron's, in production), then the re-drive worker.
  psql_idem -q -d $db -c "CALL complete_charges()"
  expect "$edition: what the completer queued (key, attempt, recovery point, the request in the recovery data)" \
    "$(psql_idem -d $db -Atc "SELECT string_agg(format('%s/%s/%s/%s', key, attempt, recovery_point, recovery_data->'request'->>'amount_cents'), ' ' ORDER BY key) FROM charge_redrives")" \
    "$edition-charged:charge/2/received/1002 $edition-checkpointed:charge/2/charged/1003 $edition-claimed:charge/2/received/1001 $edition-completing:charge/2/charged/1004"
  "$IDEM_PY" -u "$work/worker.py" redrive > "$work/$edition-redrive.log" 2>&1 || { cat "$work/$edition-redrive.log"; fail "$edition: the re-drive worker failed"; }
  sed 's/^/  /' "$work/$edition-redrive.log"
  psql_idem -q -d $db -c "CALL complete_charges()"
  expect "$edition: nothing left to re-drive (a second completer run takes nothing)" \
    "$(psql_idem -d $db -Atc "SELECT count(*) FROM charge_redrives")" 0

  # The verdicts, per order: the database and the provider side by side.
  psql_idem -d $db -At > "$work/$edition-db.json" <<SQL
SELECT json_object_agg(o, json_build_object(
  'claim_id', idem_claim_id(o || ':charge', 'charge', (SELECT first_claimed_at FROM idem_lookup(o || ':charge', 'charge'))),
  'state', (SELECT state FROM idem_lookup(o || ':charge', 'charge')),
  'result', (SELECT result FROM idem_lookup(o || ':charge', 'charge')),
  'payments', (SELECT coalesce(json_agg(json_build_object('amount_cents', amount_cents, 'charge_id', charge_id)), '[]') FROM payments WHERE order_no = o),
  'leases', (SELECT count(*) FROM idem_leases WHERE key = o || ':charge')))
  FROM unnest(ARRAY['$(printf "$edition-%s','" "${phases[@]}" | sed "s/','\$//")']) AS o;
SQL
  out=$("$IDEM_PY" - "$work/$edition-db.json" "$edition" "${phases[@]}" <<'PY'
import json, os, sys, urllib.request
with urllib.request.urlopen(os.environ["CHARGE_URL"] + "/stats") as answer:
    stats = json.load(answer)
db = json.load(open(sys.argv[1]))
edition, phases = sys.argv[2], sys.argv[3:]
for n, ph in enumerate(phases, 1):
    order = f"{edition}-{ph}"
    d = db[order]
    made = [c for c in stats["charges"].values() if c["order"] == order]
    calls = stats["requests"].get(d["claim_id"], 0)
    pay = d["payments"]
    print(f"{order}: {len(pay)} payment row(s) {[p['amount_cents'] for p in pay]}, {len(made)} charge(s) made, "
          f"{calls} call(s) under the claim id, key {d['state']}, {d['leases']} lease(s) left")
    want_calls = 2 if ph == "charged" else 1
    ok = (len(pay) == 1 and pay[0]["amount_cents"] == 1000 + n and len(made) == 1
          and stats["charges"].get(d["claim_id"]) == made[0] and pay[0]["charge_id"] == made[0]["id"]
          and d["result"] == {"charge_id": made[0]["id"]} and calls == want_calls
          and d["state"] == "completed" and d["leases"] == 0)
    print(("ok: " if ok else "FAIL: ") + f"{order}: one payment, one charge under the claim id, {want_calls} call(s), completed")
PY
)
  echo "$out"
  fails=$((fails + $(grep -c "^FAIL" <<< "$out" || true)))
  expect "$edition: payment rows in all" "$(psql_idem -d $db -Atc "SELECT count(*) FROM payments")" ${#phases[@]}
done
finish redrive
}

scenario_main "$@"
