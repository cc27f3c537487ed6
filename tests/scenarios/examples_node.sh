#!/usr/bin/env bash
# examples/node-consumer against the shared cluster (node-postgres): an order
# event stream with duplicates, out-of-order events (SHIPPED before PAID,
# PAID before CREATED, a late PAID after SHIPPED) and a crash (SIGKILL)
# between the database commit and the offset commit, then a restart that gets
# the uncommitted events redelivered. Checks from the database: every order
# ends SHIPPED and every side effect (outbox row) exists exactly once.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
db=ex_node
dir="$ROOT/examples/node-consumer"
work=$(mktemp -d /tmp/ex_node.XXXXXX)
cleanup() {
  rm -rf "$work"
  psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" 2>/dev/null || true
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
[ -f "$dir/node_modules/pg/package.json" ] || fail "examples/node-consumer/node_modules missing: run bash scripts/setup.sh --tool examples"

psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
psql_idem -q -d $db -c "CREATE EXTENSION idem"
export PGHOST="$(client_host)" PGPORT="$(client_port)" PGUSER=postgres PGDATABASE=$db
q() { psql_idem -d $db -Atc "$1"; }
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
