#!/usr/bin/env bash
# The example programs in examples/ against the shared cluster, each checked
# from the database (below, one function per example):
#   bash tests/scenarios/examples.sh            every example, each in a process of its own;
#                                               one line "ok: NAME" or "FAIL: NAME" each
#   bash tests/scenarios/examples.sh NAME       one of them (java, node, python, rust)
# Their toolchains and drivers: bash scripts/setup.sh --tool examples (and the
# Python venv, scripts/setup.sh --tool python).
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"

# Shared by the examples: each works in a fresh database $db with idem.
fail() { echo "FAIL: $*"; exit 1; }
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
q() { psql_idem -d $db -Atc "$1"; }
new_db() {
  psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
  psql_idem -q -d $db -c "CREATE EXTENSION idem"
}
drop_db() { psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" 2>/dev/null || true; }

# examples/java-payment against the shared cluster (JDBC, Debian's pgjdbc):
# a payment call whose answer to COMMIT is lost on the network, retried with
# the request key made before the retry loop. Checks from the database: the
# card was charged once, the retry got the stored result of the committed
# charge; and the labelled anti-pattern (a key per attempt) charged twice.
example_java() {
db=ex_java
work=$(mktemp -d /tmp/ex_java.XXXXXX)
cleanup() {
  rm -rf "$work"
  drop_db
}
trap cleanup EXIT
JDBC=/usr/share/java/postgresql.jar
[ -f "$JDBC" ] || fail "$JDBC missing: run bash scripts/setup.sh --tool examples"

new_db

t0=$(date +%s%N)
javac -d "$work/classes" "$ROOT/examples/java-payment/PaymentRetry.java"
echo "javac: $(ms "$t0") ms"
export PGHOST="$(client_host)" PGPORT="$(client_port)" PGUSER=postgres PGDATABASE=$db
t0=$(date +%s%N)
java -cp "$work/classes:$JDBC" PaymentRetry | tee "$work/log"
echo "program run: $(ms "$t0") ms"

# The right way: one charge, and the client's answer is that charge's stored result.
[ "$(q "SELECT count(*) FROM card_charges WHERE order_no LIKE 'ORD-%-A'")" = 1 ] \
  || fail "order A charged $(q "SELECT count(*) FROM card_charges WHERE order_no LIKE 'ORD-%-A'") times, not once"
key=$(q "SELECT request_key FROM card_charges WHERE order_no LIKE 'ORD-%-A'")
answer=$(sed -n "s/^client's answer for ORD-.*-A: //p" "$work/log")
[ -n "$answer" ] || fail "no answer for order A in the program's output"
check=$(q "SELECT r.state || ' ' || (r.result = '$answer'::jsonb) || ' ' || ((r.result->>'charge_id')::bigint = c.id)
             FROM idem_lookup('$key', 'card-charge') r, card_charges c WHERE c.order_no LIKE 'ORD-%-A'")
[ "$check" = "completed true true" ] || fail "order A: stored claim vs client's answer vs charge row: $check"
grep -q "^attempt 1: no answer to COMMIT" "$work/log" || fail "the first attempt's answer was not lost"
grep -q "^attempt 2: replayed" "$work/log" || fail "the second attempt did not replay"
# The anti-pattern: the lost answer plus a new key per attempt = a second charge.
[ "$(q "SELECT count(DISTINCT request_key) || '/' || count(*) FROM card_charges WHERE order_no LIKE 'ORD-%-B'")" = 2/2 ] \
  || fail "order B (key inside the loop) was expected to be charged twice under two keys"
echo "summary: order A (key before the loop): answer to COMMIT lost, retry replayed, charged 1 time;" \
     "order B (ANTI-PATTERN, key inside the loop): charged $(q "SELECT count(*) FROM card_charges WHERE order_no LIKE 'ORD-%-B'") times"
}

# examples/node-consumer against the shared cluster (node-postgres): an order
# event stream with duplicates, out-of-order events (SHIPPED before PAID,
# PAID before CREATED, a late PAID after SHIPPED) and a crash (SIGKILL)
# between the database commit and the offset commit, then a restart that gets
# the uncommitted events redelivered. Checks from the database: every order
# ends SHIPPED and every side effect (outbox row) exists exactly once.
example_node() {
db=ex_node
dir="$ROOT/examples/node-consumer"
work=$(mktemp -d /tmp/ex_node.XXXXXX)
cleanup() {
  rm -rf "$work"
  drop_db
}
trap cleanup EXIT
[ -f "$dir/node_modules/pg/package.json" ] || fail "examples/node-consumer/node_modules missing: run bash scripts/setup.sh --tool examples"

new_db
export PGHOST="$(client_host)" PGPORT="$(client_port)" PGUSER=postgres PGDATABASE=$db
events=$(grep -c . "$dir/events.jsonl")

# Run 1 dies right after offset 8's transaction committed.
t0=$(date +%s%N)
set +e
node "$dir/consumer.js" --topic "$dir/events.jsonl" --offsets "$work/offsets.json" --crash-after 8 | tee "$work/run1"
rc=${PIPESTATUS[0]}
set -e
echo "run 1: exit $rc after $(ms "$t0") ms, committed offset $(cat "$work/offsets.json")"
[ "$rc" = 137 ] || fail "run 1 was to be killed by SIGKILL (exit 137), exited $rc"
# Offset 7 (order 1003 PAID, early) is parked, so the committed offset stays
# at 7 although offset 8 (order 1003 CREATED) committed in the database.
[ "$(cat "$work/offsets.json")" = '{"committed":7}' ] || fail "committed offset after the crash: $(cat "$work/offsets.json")"
[ "$(q "SELECT status FROM orders WHERE id = '1003'")" = CREATED ] || fail "offset 8 had not committed before the crash"
before=$(q "SELECT count(*) FROM outbox")

# Run 2: offsets 7 and 8 are delivered again, then the rest of the log.
t0=$(date +%s%N)
node "$dir/consumer.js" --topic "$dir/events.jsonl" --offsets "$work/offsets.json" | tee "$work/run2"
echo "run 2: $(ms "$t0") ms, committed offset $(cat "$work/offsets.json")"
[ "$(cat "$work/offsets.json")" = "{\"committed\":$events}" ] || fail "run 2 did not consume the whole log"
grep -q "^offset 8 ev-07 order 1003 CREATED: already" "$work/run2" || fail "the redelivered offset 8 was not dropped as a duplicate"

# The database: final states, and each side effect exactly once.
[ "$(q "SELECT string_agg(id || '=' || status, ' ' ORDER BY id) FROM orders")" = "1001=SHIPPED 1002=SHIPPED 1003=SHIPPED" ] \
  || fail "final states: $(q "SELECT string_agg(id || '=' || status, ' ' ORDER BY id) FROM orders")"
dups=$(q "SELECT count(*) FROM (SELECT order_id, effect FROM outbox GROUP BY 1, 2 HAVING count(*) > 1) d")
[ "$dups" = 0 ] || fail "$dups side effect(s) happened more than once: $(q "SELECT order_id, effect, count(*) FROM outbox GROUP BY 1, 2 HAVING count(*) > 1")"
[ "$(q "SELECT count(*) FROM outbox")" = 9 ] || fail "expected 9 side effects (3 orders x 3 states), got $(q "SELECT count(*) FROM outbox")"
# The parked SHIPPED of 1002 was applied once, after its PAID.
[ "$(q "SELECT string_agg(effect, ',' ORDER BY id) FROM outbox WHERE order_id = '1002'")" = reserve_stock,send_receipt,notify_customer ] \
  || fail "order 1002's side effects out of order"
verdicts=$(cat "$work/run1" "$work/run2" | sed -n 's/^offset [0-9]* [^:]*: \([a-z]*\).*/\1/p' | sort | uniq -c | tr -s ' ' | paste -sd, -)
echo "summary: $events events, 2 runs (one killed), deliveries by verdict:$verdicts; side effects: $before before the crash, $(q "SELECT count(*) FROM outbox") in all, none twice; orders: $(q "SELECT string_agg(id || ' ' || status, ', ' ORDER BY id) FROM orders")"
}

# examples/python-http against the shared cluster: a real HTTP server and real
# HTTP requests with Idempotency-Key headers (psycopg 3). The program checks
# the HTTP answers; this test then checks the database: every payment charged
# exactly once, the stored response equal to the one sent and replayed, the
# declined card stored as a failure with no payment row, keys scoped per client.
example_python() {
db=ex_python
report=$(mktemp /tmp/ex_python.XXXXXX.json)
cleanup() {
  rm -f "$report"
  drop_db
}
trap cleanup EXIT
new_db

export PGHOST="$(client_host)" PGPORT="$(client_port)" PGUSER=postgres PGDATABASE=$db
t0=$(date +%s%N)
# The program imports idem_http (clients/python) from the source tree.
(cd "$ROOT/examples/python-http" && PYTHONPATH="$ROOT/clients/python/src" "$IDEM_PY" demo.py --report "$report")
echo "program run: $(( ($(date +%s%N) - t0) / 1000000 )) ms"

# The database's side, compared with what the client saw.
"$IDEM_PY" - "$report" <<'PY'
import json, sys
import psycopg

rep = json.load(open(sys.argv[1]))
k1, k2, k3 = rep["keys"]["k1"], rep["keys"]["k2"], rep["keys"]["k3"]
by_label = {e["label"].split(" ")[0] + " " + e["label"].split(" ")[1]: e for e in rep["exchanges"]}
failures = []
def check(cond, msg):
    print(("ok    " if cond else "FAIL  ") + msg)
    if not cond:
        failures.append(msg)

with psycopg.connect() as db:
    def payments(client, key):
        return db.execute("SELECT count(*), coalesce(sum(amount), 0)::text FROM payments WHERE client = %s AND idem_key = %s",
                          (client, key)).fetchone()
    def stored(client, key):
        return db.execute("SELECT state, result FROM idem_lookup(%s, 'payment-api')", (f"{client}/{key}",)).fetchone()

    n, total = payments("shop-1", k1)
    check(n == 1 and total == "42.00", f"key 1 (request, retry, reuse with 43.00): {n} payment(s), {total} charged")
    state, result = stored("shop-1", k1)
    check(state == "completed" and result["status"] == 201, f"key 1 stored as {state}, status {result and result['status']}")
    check(result["body"] == by_label["request 1"]["body"] == by_label["request 2"]["body"],
          "key 1: stored body == body sent to request 1 == body replayed to request 2")
    check(by_label["request 3"]["status"] == 422, f"key 1 reused for 43.00: {by_label['request 3']['status']}")

    n, total = payments("shop-1", k2)
    check(n == 1 and total == "19.90", f"key 2 (request, concurrent retry, late retry): {n} payment(s), {total} charged")
    state, result = stored("shop-1", k2)
    check(by_label["request 5"]["status"] == 409 and by_label["request 5"]["retry_after"] == "1",
          "key 2: the retry during the first request got 409 with Retry-After")
    check(result["body"] == by_label["request 4"]["body"] == by_label["request 6"]["body"],
          "key 2: stored body == body sent to request 4 == body replayed to request 6")

    n, _ = payments("shop-1", k3)
    state, result = stored("shop-1", k3)
    check(n == 0 and state == "failed" and result["status"] == 402,
          f"key 3 (declined card): {n} payment(s), stored as {state}, status {result['status']}")
    check(by_label["request 8"]["status"] == 402 and by_label["request 8"]["replayed"], "key 3: the retry replayed 402")

    n, total = payments("shop-2", k1)
    check(n == 1 and total == "42.00", f"shop-2 with shop-1's key: its own payment ({n}, {total})")

    (all_rows,) = db.execute("SELECT count(*) FROM payments").fetchone()
    bad = [e["status"] for e in rep["exchanges"] if e["label"].split(" ")[1] in ("10", "11", "12")]
    check(all_rows == 3 and bad == [400, 400, 400],
          f"payments in all: {all_rows} for 12 requests; missing/malformed keys: {bad}")

print(f"summary: 12 HTTP requests, 3 payments, {len(failures)} failed check(s)")
sys.exit(1 if failures else 0)
PY
}

# examples/rust-batch against the shared cluster (tokio-postgres): a batch
# job that claims its run with a lease and checkpoints every item in the
# item's own transaction. The test kills it (SIGKILL) mid-batch, runs it
# again and checks from the database: every item settled exactly once, the
# checkpoint at the kill equal to the last item that committed, the rerun
# starting right after that checkpoint, and a third run doing nothing. The
# kill point is announced by the program itself (--hang-at-item: it stops
# inside an item's transaction before COMMIT and says so), so the outcome
# is known exactly and no verdict depends on timing.
example_rust() {
db=ex_rust
dir="$ROOT/examples/rust-batch"
items=120
job="daily_settle:2026-11-30:shard-3"
work=$(mktemp -d /tmp/ex_rust.XXXXXX)
pid=
cleanup() {
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
  rm -rf "$work"
  drop_db
}
trap cleanup EXIT

t0=$(date +%s%N)
(cd "$dir" && cargo build --locked --quiet --target-dir "$dir/target$IDEM_OS_SUFFIX")
echo "cargo build (dev profile, no debug info; incremental): $(ms "$t0") ms"
bin="$dir/target$IDEM_OS_SUFFIX/debug/idem-example-batch"

new_db
export PGHOST="$(client_host)" PGPORT="$(client_port)" PGUSER=postgres PGDATABASE=$db
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
}


if [ $# -gt 0 ]; then
  "example_$1"
  exit
fi
failed=0
for name in java node python rust; do
  say "example: $name"
  if bash "${BASH_SOURCE[0]}" "$name"; then echo "ok: $name"; else echo "FAIL: $name"; failed=$((failed + 1)); fi
done
echo "examples failed: $failed"
[ "$failed" = 0 ]
