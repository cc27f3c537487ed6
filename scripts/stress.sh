#!/usr/bin/env bash
# The full-size stress run: 8 clients x 100,000 claims, about 30 % of them on
# keys already used, each transaction committing, rolling back, failing
# mid-way or claiming with wait => false, while idem_maintain() rotates
# 1-second partitions under a 3-second TTL; then every invariant and amcheck
# (tests/stress/driver.py says what is checked). Several minutes on 2 cores.
#   bash scripts/stress.sh                 install/build what is missing, start the cluster, run
#   bash scripts/stress.sh --no-setup      skip the install/build step (extension already installed)
#   bash scripts/stress.sh --claims 20000  any other option goes to the driver (see --help)
# The suite runs a small version (tests/scenarios/recovery.sh stress). Exit status 0
# when every invariant holds. Summary: target/stress/stress-full.json.
#
#   bash scripts/stress.sh failover [--no-setup]
# The bigger failover run: a primary and its synchronous streaming replica
# (remote_apply) under the stress load for 60 s, then the primary is
# stopped hard and the replica promoted; every claim acknowledged by the old
# primary must be replayed on the new one, every in-flight key is retried,
# and the load goes on for 8 x 10,000 claims on the new primary before the
# invariants and amcheck. Ports 5511 and 5512. About 2 minutes. The suite
# runs a smaller one (tests/scenarios/recovery.sh failover, ~35 s).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [ "${1:-}" = failover ]; then
  [ "${2:-}" = --no-setup ] || bash "$ROOT/scripts/setup.sh" --tests
  mkdir -p "$ROOT/target/stress"
  FAILOVER_TIMEOUT=${FAILOVER_TIMEOUT:-1800} FAILOVER_AT=${FAILOVER_AT:-60} FAILOVER_TTL=${FAILOVER_TTL:-30} FAILOVER_TAIL_CLAIMS=${FAILOVER_TAIL_CLAIMS:-10000} \
    STRESS_OUT="$ROOT/target/stress" exec bash "$ROOT/tests/scenarios/recovery.sh" failover
fi

setup=1
args=()
for a in "$@"; do
  if [ "$a" = --no-setup ]; then setup=0; else args+=("$a"); fi
done
if [ $setup = 1 ]; then bash "$ROOT/scripts/setup.sh" --tests; fi
bash "$ROOT/scripts/cluster.sh" start

db=stress_full
out="$ROOT/target/stress"
mkdir -p "$out"
psql_idem -q -d postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
# (kept for inspection when the run fails; STRESS_KEEP=1 keeps it anyway)
drop() { psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"; }

say "stress: 8 clients x 100,000 claims on database $db (port $IDEM_PORT)"
set +e
"$IDEM_PY" "$ROOT/tests/stress/driver.py" --dsn "host=$(cluster_dir) port=$IDEM_PORT user=postgres dbname=$db" \
  --clients 8 --claims 100000 --ttl 3 --width 1 --progress 30 --summary "$out/stress-full.json" "${args[@]}"
rc=$?
set -e
if [ $rc = 0 ] && [ "${STRESS_KEEP:-0}" != 1 ]; then drop; fi
[ $rc = 0 ] || echo "database $db kept for inspection: psql -h $(cluster_dir) -p $IDEM_PORT -U postgres $db"
exit $rc
