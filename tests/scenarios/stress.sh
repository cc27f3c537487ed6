#!/usr/bin/env bash
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
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
db=stress_suite
out="${STRESS_OUT:-$IDEM_TARGET/test-out/stress}"
mkdir -p "$out"
psql_idem -q -d postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
trap 'psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" || true' EXIT

# (timeout: a hung run must not hang the suite)
timeout 300 "$IDEM_PY" "$ROOT/tests/stress/driver.py" --dsn "host=$(cluster_dir) port=$IDEM_PORT user=postgres dbname=$db" \
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
