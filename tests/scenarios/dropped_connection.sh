#!/usr/bin/env bash
# A dropped connection rolls its claim back: a client that claimed a key and
# then vanished (its backend terminated mid-transaction) leaves nothing, and
# a retry that was waiting for it gets the claim. Each step waits for the
# state it needs (as the server reports it); the loops' bounds only stop a hang.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
retry_out="$IDEM_TARGET/test-out/dropped_connection.out"   # (per checkout and major, not /tmp: runs go side by side)
mkdir -p "$(dirname "$retry_out")"
db=idem_dropped
psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
psql_idem -q -d $db -c "CREATE EXTENSION idem"
# The first client claims and hangs inside its transaction.
psql_idem -d $db -c "BEGIN" -c "SELECT claimed FROM idem_claim('order-9', 'drop')" \
  -c "SELECT pg_sleep(60)" > /dev/null 2>&1 &
first=$!
for i in $(seq 1 1200); do
  state=$(psql_idem -d $db -Atc "SELECT state FROM idem_lookup('order-9', 'drop')")
  [ "$state" = in_progress ] && break
  sleep 0.1
done
[ "$state" = in_progress ] || { echo "FAIL: the first claim never showed up ($state)"; exit 1; }
# The retry waits for it...
PGAPPNAME=idem_dropped_retry psql_idem -d $db -Atc "SELECT claimed || '/' || state FROM idem_claim('order-9', 'drop')" > "$retry_out" 2>&1 &
retry=$!
for i in $(seq 1 1200); do
  waiting=$(psql_idem -d $db -Atc "SELECT count(*) FROM pg_stat_activity
                                   WHERE application_name = 'idem_dropped_retry' AND wait_event_type = 'Lock'")
  [ "$waiting" = 1 ] && break
  kill -0 $retry 2>/dev/null || { echo "FAIL: the retry did not wait"; cat "$retry_out"; exit 1; }
  sleep 0.1
done
[ "$waiting" = 1 ] || { echo "FAIL: the retry never waited for the first claim"; exit 1; }
# ... the first client's connection drops ...
psql_idem -d $db -Atc "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                        WHERE datname = '$db' AND query LIKE 'SELECT pg_sleep%'" >/dev/null
wait $retry
wait $first 2>/dev/null || true
# ... and the retry claims: the dropped claim left nothing.
echo "retry: $(cat "$retry_out")"
[ "$(cat "$retry_out")" = "true/new" ] || { echo "FAIL"; exit 1; }
echo ok
