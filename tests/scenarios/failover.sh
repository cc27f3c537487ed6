#!/usr/bin/env bash
# Failover under the stress load: a primary (port 5511) with a streaming
# replica made by pg_basebackup (port 5512) as its synchronous standby,
# synchronous_commit = remote_apply. In the middle of the run the primary is
# stopped hard (pg_ctl -m immediate) and the replica promoted. Against the
# new primary the driver retries every key whose COMMIT got no answer, and
# checks that every claim whose COMMIT was acknowledged by the old primary
# (and is still live) is replayed, not claimed again; then the load goes on
# against the new primary, and the stress invariants and amcheck run there.
# Every fourth new key has a 10-minute TTL: a slow promotion cannot leave
# the check without live claims to look for. About 35 s. Bigger: bash scripts/failover.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"

pdir="$(cluster_dir)/stress/primary"
rdir="$(cluster_dir)/stress/replica"
pport=${FAILOVER_PRIMARY_PORT:-5511}
rport=${FAILOVER_REPLICA_PORT:-5512}
at=${FAILOVER_AT:-12}
ttl=${FAILOVER_TTL:-8}
claims=${FAILOVER_TAIL_CLAIMS:-400}
out="${STRESS_OUT:-$IDEM_TARGET/test-out/stress}"
mkdir -p "$out" "$(dirname "$pdir")"
pgsh="$ROOT/tests/stress/pg.sh"
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
