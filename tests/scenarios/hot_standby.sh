#!/usr/bin/env bash
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
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/assert.sh"

pdir="$(cluster_dir)/standby/primary"
rdir="$(cluster_dir)/standby/replica"
pport=5513
rport=5514
mkdir -p "$(dirname "$pdir")"
pgsh="$ROOT/tests/stress/pg.sh"
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

# Failover: the standby becomes the primary.
kill "$holder" 2>/dev/null; holder=
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
