#!/usr/bin/env bash
# A claim in a prepared transaction (two-phase commit, as transaction
# managers and Citus use it) blocks a waiting duplicate until COMMIT
# PREPARED or ROLLBACK PREPARED, issued from another session, decides it;
# the duplicate then gets the outcome, or claims. The isolation spec
# claim_two_phase covers the non-waiting answers (isolationtester cannot
# see a wait for a prepared transaction); this one waits, and sees the
# wait in pg_stat_activity. Both storage paths.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
bash "$ROOT/scripts/cluster.sh" start >/dev/null
db=idem_two_phase
psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
psql_idem -q -d "$db" -c "CREATE EXTENSION idem"
cleanup() {
  psql_idem -q -d "$db" -c "ROLLBACK PREPARED 'idem_tp'" >/dev/null 2>&1 || true
  psql_idem -q -d postgres -c "LOAD 'idem'" -c "ALTER SYSTEM RESET idem.storage_access" -c "SELECT pg_reload_conf()" >/dev/null
}
trap cleanup EXIT
fails=0

# waiter KEY: a duplicate claim in the background, tagged by application_name.
waiter() {
  PGAPPNAME=idem_tp_waiter psql_idem -At -d "$db" -c "SELECT claimed || '|' || state || '|' || coalesce(result::text, '') FROM idem_claim('$1', 'tp')" > "$out" 2>&1 &
  wpid=$!
}
# Until the waiter reports waiting for a lock (a state the server reports;
# the loop's bound only stops a hang).
wait_blocked() {
  for _ in $(seq 1 300); do
    ev=$(psql_idem -At -d "$db" -c "SELECT wait_event_type || '/' || wait_event FROM pg_stat_activity WHERE application_name = 'idem_tp_waiter' AND state = 'active'")
    case "$ev" in Lock/*) echo "$ev"; return 0 ;; esac
    sleep 0.05
  done
  echo "never blocked"; return 1
}
out=$(mktemp)

for path in direct sql; do
  psql_idem -q -d postgres -c "LOAD 'idem'" -c "ALTER SYSTEM SET idem.storage_access = '$path'" -c "SELECT pg_reload_conf()" >/dev/null
  for decision in COMMIT ROLLBACK; do
    key="k-$path-$decision"
    psql_idem -q -d "$db" >/dev/null <<SQL
BEGIN;
SELECT idem_claim('$key', 'tp');
SELECT idem_complete('$key', 'tp', '{"by": "prepared"}');
PREPARE TRANSACTION 'idem_tp';
SQL
    waiter "$key"
    ev=$(wait_blocked)
    psql_idem -q -d "$db" -c "$decision PREPARED 'idem_tp'"
    wait "$wpid"
    got=$(cat "$out")
    want='false|completed|{"by": "prepared"}'; [ "$decision" = ROLLBACK ] && want='true|new|'
    if [ "$got" = "$want" ] && [[ "$ev" == Lock/* ]]; then
      echo "ok: $path path: the duplicate waited ($ev) for the prepared claim; after $decision PREPARED: $got"
    else
      echo "FAIL: $path path, $decision PREPARED: waited: $ev; duplicate got '$got', want '$want'"
      fails=$((fails + 1))
    fi
  done
done
rm -f "$out"
echo "two-phase checks failed: $fails"
[ "$fails" = 0 ]
