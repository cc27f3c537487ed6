#!/usr/bin/env bash
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
# Bigger: CRASH_FAULTS=9 CRASH_EVERY=20 CRASH_TIMEOUT=1800 bash tests/scenarios/crash.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"

dir="$(cluster_dir)/stress/crash"
port=5510
faults=${CRASH_FAULTS:-3}
every=${CRASH_EVERY:-7}
out="${STRESS_OUT:-$IDEM_TARGET/test-out/stress}"
mkdir -p "$out" "$(dirname "$dir")"
trap 'bash "$ROOT/tests/stress/pg.sh" destroy "$dir"' EXIT

bash "$ROOT/tests/stress/pg.sh" init "$dir" $port crash
bash "$ROOT/tests/stress/pg.sh" start "$dir"
"$PG_BIN/psql" -X -q -h "$dir" -p $port -U postgres -d postgres -c "CREATE DATABASE stress_crash"
dsn="host=$dir port=$port user=postgres dbname=stress_crash"

set +e
# (timeout: a hung run must not hang the suite)
timeout "${CRASH_TIMEOUT:-300}" "$IDEM_PY" "$ROOT/tests/stress/driver.py" --dsn "$dsn" --fault crash --faults "$faults" --fault-at "$every" \
  --min-inflight "${CRASH_MIN_INFLIGHT:-4}" --max-faults $((faults + 3)) \
  --fault-cmd "bash '$ROOT/tests/stress/pg.sh' crash '$dir' {n}" \
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
