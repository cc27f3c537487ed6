#!/usr/bin/env bash
# The portable edition after transaction-id wraparound, on a throw-away
# cluster of the pg_tle tree (tests/portable/tree.sh) aged on purpose: the
# counterpart of tests/scenarios/hardening.sh wraparound.
#
# SQL shows only a row's raw xmin, which a frozen row keeps; after the
# 32-bit xid counter wraps, a new transaction (or subtransaction) can be
# given that very number. Judged from the raw xmin, a frozen claim then read
# as this transaction's own (another worker's lease completed without its
# token, a duplicate answered in_progress, an expired claim never claimed
# anew), and a raw xmin that maps past the next xid made pg_xact_status
# fail ("transaction ID is in the future").
#
# Here: claims are made in one transaction T (a pending one, a leased one,
# one with a 1-second TTL, one with a 1-second lease) and in the next one, T+1 (a pending one and a
# 1-second one); every database is frozen, the cluster is stopped and
# pg_resetwal moves the xid counter one epoch on, to T itself (what ~4
# billion transactions would do). The next transaction is checked to have
# T's 32-bit id (else the test proves nothing and fails), and in it:
# duplicates read completed, idem_complete and idem_checkpoint of the
# leased claim without its token are refused with ID003, the lookup reads
# the lease in_progress, the expired claims are claimed anew (a business
# row written for each), also from a subtransaction whose xid is T+1; the
# rows this transaction writes are its own (the lease run out is taken
# over and completed without the token; a new claim reads in_progress to a
# duplicate and is completed); nothing else was written. Afterwards the lease holder still completes
# with its token. Runs on its own (bash tests/portable/wraparound.sh) and
# from tests/scenarios/editions.sh portable.
# The session under test also sets every setting the edition's first 0.4.0
# builds read to tell their own rows (idem.xact_claimed_since_us at 0:
# "every claim since 2000 is mine"; idem.xact_rewritten naming every stored
# version): they must change nothing, and no stored claim may differ after
# the round from before it.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/scenarios.sh"
source "$ROOT/tests/lib/cluster.sh"
port="${PORTABLE_WRAP_PORT:-5552}"
TLE_CONFIG=$(bash "$ROOT/tests/portable/tree.sh")
TLE_BIN=$("$TLE_CONFIG" --bindir)
dir="$(cluster_dir)/portable-wraparound"
work="$IDEM_TARGET/test-out/portable-wraparound"
stop() { pc_server_stop "$dir"; }
trap 'stop; rm -rf "$dir"' EXIT
stop
rm -rf "$dir" "$work"
mkdir -p "$dir" "$work"
chown postgres:postgres "$dir"
chmod 700 "$dir"
python3 "$ROOT/scripts/portable.py" --out "$work/dist" >/dev/null
chmod -R a+rX "$work"
# Nothing may take an xid behind the test's back between the reset and the
# transaction under test.
pc_initdb "$TLE_BIN" "$dir" "$port" "autovacuum = off"
start() { pc_server_start "$dir"; }
sql() { "$TLE_BIN/psql" -X -At -v ON_ERROR_STOP=1 -h "$dir" -p "$port" -U postgres -d wrap "$@"; }
start
"$TLE_BIN/psql" -X -q -h "$dir" -p "$port" -U postgres -d postgres -c "CREATE DATABASE wrap"
sql -q -f "$work/dist/idem_portable.sql" >/dev/null
sql -q -c "CREATE TABLE payments (key text PRIMARY KEY)"
read -r t token < <(sql -q -F ' ' <<'SQL'
BEGIN;
SELECT claimed FROM idem_claim('pending', 'wrap') \g /dev/null
SELECT claimed FROM idem_claim('expired', 'wrap', ttl => '1 second') \g /dev/null
SELECT result->>'lease_token' AS token FROM idem_claim('leased', 'wrap', lease => '1 hour') \gset
SELECT claimed FROM idem_claim('short_lease', 'wrap', lease => '1 second') \g /dev/null
SELECT xmin, :'token' FROM idem.claims WHERE biz_type = 'wrap' AND key = 'pending';
COMMIT;
SQL
)
t_next=$(sql -q <<'SQL'
BEGIN;
SELECT claimed FROM idem_claim('later', 'wrap') \g /dev/null
SELECT claimed FROM idem_claim('later_expired', 'wrap', ttl => '1 second') \g /dev/null
SELECT xmin FROM idem.claims WHERE biz_type = 'wrap' AND key = 'later';
COMMIT;
SQL
)
echo "claims made by transactions $t and $t_next"
expect "the second claims' transaction is the next one" "$t_next" "$((t + 1))"
# The 1-second claims must have expired before the round (a state waited
# for: nothing below depends on how long anything takes).
until [ "$(sql -c "SELECT bool_and(clock_timestamp() > expires_at) FROM idem.claims WHERE biz_type = 'wrap' AND key IN ('expired', 'later_expired')")" = t ] &&
      [ "$(sql -c "SELECT clock_timestamp() > idem.lease_until(result) FROM idem.claims WHERE biz_type = 'wrap' AND key = 'short_lease'")" = t ]; do
  sleep 0.2
done

# Every row frozen, then the counter moved one epoch on, to T.
"$TLE_BIN/vacuumdb" -h "$dir" -p "$port" -U postgres --all --freeze -q
sql -c "CHECKPOINT" >/dev/null
pc_ctl "$dir" -m fast -w stop >/dev/null
as_postgres "$TLE_BIN/pg_resetwal" -e 1 -x "$t" -D "$dir/data" >/dev/null
start

# The transaction whose id is T again. Every check runs in a savepoint
# rolled back after it, so that an error ends only its own check; the
# first write in a savepoint gives it the next xid: T+1, the second
# claims' raw xmin, then T+2, ...
stored="SELECT md5(string_agg(key || ' ' || state::text || ' ' || coalesce(result::text, '') || ' ' || expires_at, ',' ORDER BY key))
        FROM idem.claims WHERE biz_type = 'wrap'"
stored_before=$(sql -c "$stored")
out=$(sql <<'SQL' 2>&1
\set ON_ERROR_STOP 0
\set VERBOSITY sqlstate
SELECT set_config('idem.xact_claimed_since_us', '0', false) IS NOT NULL AS forged \g /dev/null
SELECT set_config('idem.xact_rewritten', string_agg(tableoid::oid || ':' || ctid, ' '), false) IS NOT NULL AS forged
  FROM idem.claims \g /dev/null
BEGIN;
SELECT 'xid=' || (txid_current() % 4294967296);
SAVEPOINT s;
SELECT 'duplicate=' || state FROM idem_claim('pending', 'wrap');
ROLLBACK TO s;
SELECT 'lookup=' || state FROM idem_lookup('leased', 'wrap');
ROLLBACK TO s;
SELECT 'expired_before=' || bool_and(expires_at < statement_timestamp()) FROM idem.claims WHERE biz_type = 'wrap' AND key IN ('expired', 'later_expired');
WITH c AS (SELECT claimed FROM idem_claim('later_expired', 'wrap')),
     w AS (INSERT INTO payments SELECT 'later_expired' FROM c WHERE claimed)
SELECT 'later_expired_claimed=' || claimed FROM c;
SELECT 'subxact_xid=' || xmin FROM idem.claims WHERE biz_type = 'wrap' AND key = 'later_expired' AND expires_at > statement_timestamp();
SELECT 'later_duplicate=' || state FROM idem_claim('later', 'wrap');
SELECT 'later_lookup=' || state FROM idem_lookup('later', 'wrap');
ROLLBACK TO s;
WITH c AS (SELECT claimed FROM idem_claim('expired', 'wrap')),
     w AS (INSERT INTO payments SELECT 'expired' FROM c WHERE claimed)
SELECT 'expired_claimed=' || claimed FROM c;
SELECT 'payments=' || count(*) FROM payments;
ROLLBACK TO s;
SELECT 'complete_without_token=done' FROM idem_complete('leased', 'wrap', '{"forged": true}');
ROLLBACK TO s;
SELECT 'checkpoint_without_token=done' FROM idem_checkpoint('leased', 'wrap', 'forged');
ROLLBACK TO s;
SELECT 'fail_without_token=done' FROM idem_fail('leased', 'wrap', '{"forged": true}');
ROLLBACK TO s;
SELECT 'takeover=' || claimed FROM idem_claim('short_lease', 'wrap');
SELECT 'takeover_completed=done' FROM idem_complete('short_lease', 'wrap', '{"by": "taker"}');
SELECT 'takeover_after=' || state FROM idem_lookup('short_lease', 'wrap');
ROLLBACK TO s;
SELECT 'fresh=' || claimed FROM idem_claim('fresh', 'wrap');
SELECT 'fresh_duplicate=' || state FROM idem_claim('fresh', 'wrap');
SELECT 'fresh_completed=done' FROM idem_complete('fresh', 'wrap', '{}');
ROLLBACK TO s;
SELECT 'rows=' || count(*) || ',' || count(*) FILTER (WHERE state = 'l') || ',' || count(*) FILTER (WHERE state = 'p') FROM idem.claims WHERE biz_type = 'wrap';
SELECT 'payments_after=' || count(*) FROM payments;
COMMIT;
SQL
)
echo "$out" | sed 's/^/    /'
echo "$out" > "$work/round.log"
expect "the transaction under test has the claims' 32-bit xid" "$(echo "$out" | grep '^xid=')" "xid=$t"
expect "a duplicate of the committed claim" "$(echo "$out" | grep '^duplicate=')" "duplicate=completed"
expect "the lease as others see it" "$(echo "$out" | grep '^lookup=')" "lookup=in_progress"
expect "the 1-second claims have expired (a precondition)" "$(echo "$out" | grep '^expired_before=')" "expired_before=true"
expect "an expired claim whose raw xmin lies past the next xid is claimed anew" \
  "$(echo "$out" | grep '^later_expired_claimed=')" "later_expired_claimed=true"
expect "that claim's subtransaction has the second claims' 32-bit xid" \
  "$(echo "$out" | grep '^subxact_xid=')" "subxact_xid=$t_next"
expect "a duplicate of a claim whose raw xmin is this subtransaction's" \
  "$(echo "$out" | grep '^later_duplicate=')" "later_duplicate=completed"
expect "its lookup" "$(echo "$out" | grep '^later_lookup=')" "later_lookup=completed"
expect "an expired claim whose raw xmin is this transaction's is claimed anew" \
  "$(echo "$out" | grep '^expired_claimed=')" "expired_claimed=true"
expect "one business row per expired claim claimed anew" "$(echo "$out" | grep '^payments=')" "payments=1"
expect "idem_complete, idem_checkpoint and idem_fail without the lease token refused (ID003)" \
  "$(echo "$out" | grep -c '^ERROR:  ID003')" "3"
expect "nothing finished without the token" "$(echo "$out" | grep -c '_without_token=done')" "0"
expect "no other error" "$(echo "$out" | grep '^ERROR' | grep -v '^ERROR:  ID003' || true)" ""
expect "a lease run out is taken over" "$(echo "$out" | grep '^takeover=')" "takeover=true"
expect "the transaction that took it over completes it without the token (its own row)" \
  "$(echo "$out" | grep -c '^takeover_completed=done')" "1"
expect "completed" "$(echo "$out" | grep '^takeover_after=')" "takeover_after=completed"
expect "a new claim" "$(echo "$out" | grep '^fresh=')" "fresh=true"
expect "its duplicate in the claiming transaction" "$(echo "$out" | grep '^fresh_duplicate=')" "fresh_duplicate=in_progress"
expect "the claiming transaction completes it" "$(echo "$out" | grep -c '^fresh_completed=done')" "1"
expect "the six claims still there, the leases unchanged, four pending" "$(echo "$out" | grep '^rows=')" "rows=6,2,4"
expect "no business row kept" "$(echo "$out" | grep '^payments_after=')" "payments_after=0"

expect "no stored claim changed in the round" "$(sql -c "$stored")" "$stored_before"

# After the wrap, the lease's holder still finishes it with its token, and
# new claims work.
sql -q -c "SELECT idem_complete('leased', 'wrap', '{\"done\": true}', lease_token => '$token')"
expect "the lease holder completes with its token" "$(sql -c "SELECT state FROM idem_lookup('leased', 'wrap')")" "completed"
expect "a new claim after the wrap" "$(sql -c "SELECT claimed FROM idem_claim('after', 'wrap')")" "t"
finish "portable wraparound"
