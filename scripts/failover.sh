#!/usr/bin/env bash
# The bigger failover run: a primary and its synchronous streaming replica
# (remote_apply) under the stress load for 60 s, then the primary is
# stopped hard and the replica promoted; every claim acknowledged by the old
# primary must be replayed on the new one, every in-flight key is retried,
# and the load goes on for 8 x 10,000 claims on the new primary before the
# invariants and amcheck. Ports 5511 and 5512. About 2 minutes.
#   bash scripts/failover.sh [--no-setup]
# The suite runs a smaller one (tests/scenarios/failover.sh, ~35 s).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[ "${1:-}" = --no-setup ] || bash "$ROOT/scripts/setup.sh" --tests
mkdir -p "$ROOT/target/stress"
FAILOVER_TIMEOUT=${FAILOVER_TIMEOUT:-1800} FAILOVER_AT=${FAILOVER_AT:-60} FAILOVER_TTL=${FAILOVER_TTL:-30} FAILOVER_TAIL_CLAIMS=${FAILOVER_TAIL_CLAIMS:-10000} \
  STRESS_OUT="$ROOT/target/stress" exec bash "$ROOT/tests/scenarios/failover.sh"
