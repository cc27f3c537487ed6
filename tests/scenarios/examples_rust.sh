#!/usr/bin/env bash
# examples/rust-batch against the shared cluster (tokio-postgres): a batch
# job that claims its run with a lease and checkpoints every item in the
# item's own transaction. The test kills it (SIGKILL) mid-batch, runs it
# again and checks from the database: every item settled exactly once, the
# checkpoint at the kill equal to the last item that committed, the rerun
# starting right after that checkpoint, and a third run doing nothing. The
# kill point is announced by the program itself (--hang-at-item: it stops
# inside an item's transaction before COMMIT and says so), so the outcome
# is known exactly and no verdict depends on timing.
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

# Run 1, killed (SIGKILL) at a point the program announces: in item 40's
# transaction, its settlement and checkpoint written, not committed. Nothing
# here depends on timing: the test waits for the line, then kills.
hang=40
t0=$(date +%s%N)
"$bin" "${args[@]}" --hang-at-item $hang > "$work/run1" 2>&1 &
pid=$!
for _ in $(seq 1 6000); do     # (a safety limit of 10 minutes, for a program that hangs elsewhere)
  grep -q "^item $hang: written, not committed; hanging until killed" "$work/run1" && break
  kill -0 $pid 2>/dev/null || fail "run 1 ended before item $hang: $(cat "$work/run1")"
  sleep 0.1
done
grep -q "^item $hang: written, not committed" "$work/run1" || fail "run 1 never reached item $hang: $(cat "$work/run1")"
kill -9 $pid
wait $pid 2>/dev/null || true
pid=
cat "$work/run1"
echo "run 1: killed (SIGKILL) in item $hang's transaction after $(ms "$t0") ms"
# The dead client's backend rolls item $hang back when it sees the
# connection closed: wait until it is gone before reading.
for _ in $(seq 1 600); do
  [ "$(q "SELECT count(*) FROM pg_stat_activity WHERE datname = '$db' AND application_name = 'idem-example-batch'")" = 0 ] && break
  sleep 0.1
done
[ "$(q "SELECT count(*) FROM pg_stat_activity WHERE datname = '$db' AND application_name = 'idem-example-batch'")" = 0 ] \
  || fail "the killed client's backend is still there after 60 s"
# The settlements and what the claim says (idem_leases, the operators' view
# of live leases), in one snapshot.
IFS='|' read -r count last checkpoint < <(q "SELECT (SELECT count(*) FROM settlements WHERE attempt = 1),
                                                   (SELECT max(item) FROM settlements WHERE attempt = 1),
                                                   (SELECT recovery_data->>'last_item' FROM idem_leases
                                                     WHERE key = '$job' AND biz_type = 'batch')")
echo "at the kill: $count items settled, the last one $last; checkpoint in the claim: $checkpoint"
[ "$count|$last|$checkpoint" = "$((hang - 1))|$((hang - 1))|$((hang - 1))" ] \
  || fail "expected items 1..$((hang - 1)) settled and checkpoint $((hang - 1)) (item $hang rolled back with its checkpoint), got $count items, last $last, checkpoint $checkpoint"

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
