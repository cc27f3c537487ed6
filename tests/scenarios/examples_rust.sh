#!/usr/bin/env bash
# examples/rust-batch against the shared cluster (tokio-postgres): a batch
# job that claims its run with a lease and checkpoints every item in the
# item's own transaction. The test kills it (SIGKILL) mid-batch, runs it
# again and checks from the database: every item settled exactly once, the
# checkpoint at the kill equal to the last item that committed, the rerun
# starting right after that checkpoint, and a third run doing nothing.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
db=ex_rust
dir="$ROOT/examples/rust-batch"
items=120
job="daily_settle:2026-11-30:shard-3"
work=$(mktemp -d /tmp/ex_rust.XXXXXX)
pid=
cleanup() {
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
  rm -rf "$work"
  psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" 2>/dev/null || true
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

t0=$(date +%s%N)
(cd "$dir" && cargo build --locked --quiet --target-dir "$dir/target$IDEM_OS_SUFFIX")
echo "cargo build (dev profile, no debug info; incremental): $(ms "$t0") ms"
bin="$dir/target$IDEM_OS_SUFFIX/debug/idem-example-batch"

psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
psql_idem -q -d $db -c "CREATE EXTENSION idem"
export PGHOST="$(client_host)" PGPORT="$(client_port)" PGUSER=postgres PGDATABASE=$db
q() { psql_idem -d $db -Atc "$1"; }
args=(--job "$job" --items $items --item-ms 15 --lease-secs 2)

# Run 1, killed once about a third of the items have committed.
t0=$(date +%s%N)
"$bin" "${args[@]}" > "$work/run1" 2>&1 &
pid=$!
settled=0
for _ in $(seq 1 300); do
  settled=$(q "SELECT count(*) FROM settlements" 2>/dev/null || echo 0)
  [ "$settled" -ge 40 ] && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.02
done
kill -9 $pid 2>/dev/null || fail "run 1 ended before it could be killed: $(cat "$work/run1")"
wait $pid 2>/dev/null || true
pid=
cat "$work/run1"
echo "run 1: killed (SIGKILL) after $(ms "$t0") ms"
# The dead client's backend may still be finishing the statement it was sent
# last (a COMMIT, say): wait until it is gone before reading.
for _ in $(seq 1 100); do
  [ "$(q "SELECT count(*) FROM pg_stat_activity WHERE datname = '$db' AND application_name = 'idem-example-batch'")" = 0 ] && break
  sleep 0.05
done
# The settlements and what the claim says (idem_leases, the operators' view
# of live leases), in one snapshot.
IFS='|' read -r count last checkpoint < <(q "SELECT (SELECT count(*) FROM settlements WHERE attempt = 1),
                                                   (SELECT max(item) FROM settlements WHERE attempt = 1),
                                                   (SELECT recovery_data->>'last_item' FROM idem_leases
                                                     WHERE key = '$job' AND biz_type = 'batch')")
echo "at the kill: $count items settled, the last one $last; checkpoint in the claim: $checkpoint"
[ "$count|$last" = "$checkpoint|$checkpoint" ] || fail "the checkpoint ($checkpoint) does not match the committed items ($count, last $last)"
[ "$checkpoint" -lt $items ] || fail "run 1 finished before the kill"

# Run 2: waits out the dead run's lease, takes over, resumes after the checkpoint.
t0=$(date +%s%N)
"$bin" "${args[@]}" | tee "$work/run2"
echo "run 2: $(ms "$t0") ms (including the wait for the lease to run out)"
grep -q "took the claim over (attempt 2): the last committed checkpoint is item $checkpoint, resuming at item $((checkpoint + 1))" "$work/run2" \
  || fail "run 2 did not resume from checkpoint $checkpoint"
[ "$(q "SELECT min(item) FROM settlements WHERE attempt = 2")" = $((checkpoint + 1)) ] \
  || fail "run 2's first item is $(q "SELECT min(item) FROM settlements WHERE attempt = 2"), not $((checkpoint + 1))"

# Run 3: the job is completed; nothing happens.
"$bin" "${args[@]}" | tee "$work/run3"
grep -q "already completed" "$work/run3" || fail "run 3 did not see the job completed"

# Every item exactly once.
stats=$(q "SELECT count(*) || '|' || count(DISTINCT item) || '|' || min(item) || '|' || max(item) FROM settlements")
[ "$stats" = "$items|$items|1|$items" ] || fail "settlements (rows|distinct|min|max): $stats, expected $items|$items|1|$items"
twice=$(q "SELECT count(*) FROM (SELECT item FROM settlements GROUP BY item HAVING count(*) > 1) t")
[ "$twice" = 0 ] || fail "$twice item(s) settled twice"
[ "$(q "SELECT state || ' ' || (result->>'items') FROM idem_lookup('$job', 'batch')")" = "completed $items" ] \
  || fail "the job's claim: $(q "SELECT state, result FROM idem_lookup('$job', 'batch')")"
echo "summary: $items items, run 1 killed after item $checkpoint, run 2 resumed at item $((checkpoint + 1))," \
     "$(q "SELECT count(*) FROM settlements WHERE attempt = 2") items in run 2; every item settled once; run 3 did nothing"
