#!/usr/bin/env bash
# examples/java-payment against the shared cluster (JDBC, Debian's pgjdbc):
# a payment call whose answer to COMMIT is lost on the network, retried with
# the request key made before the retry loop. Checks from the database: the
# card was charged once, the retry got the stored result of the committed
# charge; and the labelled anti-pattern (a key per attempt) charged twice.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
db=ex_java
work=$(mktemp -d /tmp/ex_java.XXXXXX)
cleanup() {
  rm -rf "$work"
  psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" 2>/dev/null || true
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
JDBC=/usr/share/java/postgresql.jar
[ -f "$JDBC" ] || fail "$JDBC missing: run bash scripts/setup.sh --tool examples"

psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
psql_idem -q -d $db -c "CREATE EXTENSION idem"

t0=$(date +%s%N)
javac -d "$work/classes" "$ROOT/examples/java-payment/PaymentRetry.java"
echo "javac: $(ms "$t0") ms"
export PGHOST="$(client_host)" PGPORT="$(client_port)" PGUSER=postgres PGDATABASE=$db
t0=$(date +%s%N)
java -cp "$work/classes:$JDBC" PaymentRetry | tee "$work/log"
echo "program run: $(ms "$t0") ms"

q() { psql_idem -d $db -Atc "$1"; }
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
