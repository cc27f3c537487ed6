#!/usr/bin/env bash
# Transaction-id wraparound, on a throw-away cluster aged on purpose.
#
# A row keeps its raw xmin when VACUUM freezes it; after the 32-bit xid
# counter wraps, a new transaction can be given that very number. 0.3.0
# judged "claimed by this transaction" from the raw xmin, so that
# transaction treated frozen claims as its own: it completed another
# worker's lease without the lease token, and a duplicate of a committed
# claim read in_progress.
#
# Here: claims are made (a pending one, a leased one, one with a 1-second
# TTL) in one transaction T,
# every database is frozen, the cluster is stopped and pg_resetwal moves the
# xid counter one epoch on, to T itself (exactly what ~4 billion
# transactions would do). The next transaction is checked to have T's
# 32-bit id (else the test proves nothing and fails), and in it: the
# duplicate claim reads completed, idem_complete of the leased claim without
# its token is refused with ID003, the lookup reads the lease in_progress,
# the expired claim is claimed anew (not read as a claim in progress), and
# nothing else was written. Then the same again on the SQL storage path
# (idem.storage_access = sql, the counter moved on one more epoch).
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/assert.sh"
dir="$(cluster_dir)/wraparound"
port=$(major_port 5515)
pgsh="$ROOT/tests/lib/cluster.sh"
trap 'bash "$pgsh" destroy "$dir"' EXIT
sql() { "$PG_BIN/psql" -X -At -v ON_ERROR_STOP=1 -h "$dir" -p "$port" -U postgres -d wrap "$@"; }

bash "$pgsh" init "$dir" "$port"
# Nothing may take an xid behind the test's back between the reset and the
# transaction under test.
echo "autovacuum = off" >> "$dir/data/postgresql.conf"
bash "$pgsh" start "$dir"
"$PG_BIN/psql" -X -q -h "$dir" -p "$port" -U postgres -d postgres -c "CREATE DATABASE wrap"
sql -q -c "CREATE EXTENSION idem"
read -r t token < <(sql -q -F ' ' <<'SQL'
BEGIN;
SELECT claimed FROM idem_claim('pending', 'wrap') \g /dev/null
SELECT claimed FROM idem_claim('expired', 'wrap', ttl => '1 second') \g /dev/null
CREATE TEMP TABLE lease AS SELECT result->>'lease_token' AS token FROM idem_claim('leased', 'wrap', lease => '1 hour');
SELECT xmin, (SELECT token FROM lease) FROM idem.claims WHERE biz_type = 'wrap' AND key = 'pending';
COMMIT;
SQL
)
echo "claims made by transaction $t"
# The 1-second claim must have expired before the rounds (a state waited
# for: nothing below depends on how long anything takes).
until [ "$(sql -c "SELECT clock_timestamp() > expires_at FROM idem.claims WHERE biz_type = 'wrap' AND key = 'expired'")" = t ]; do
  sleep 0.2
done

# Move the counter to T, one epoch on, with every row frozen first.
wrap_to() { # EPOCH
  # (After a reset, VACUUM warns that it corrects relfrozenxid values the
  # reset made look new: expected here.)
  "$PG_BIN/vacuumdb" -h "$dir" -p "$port" -U postgres --all --freeze -q 2>&1 | grep -v "overwrote invalid relfrozenxid" || true
  sql -c "CHECKPOINT"
  bash "$pgsh" ctl "$dir" -m fast -w stop >/dev/null
  as_postgres "$PG_BIN/pg_resetwal" -e "$1" -x "$t" -D "$dir/data" >/dev/null
  bash "$pgsh" start "$dir"
}

# The transaction whose id is T again, on one storage path.
round() { # label
  local label=$1 out
  out=$(sql <<'SQL' 2>&1
\set ON_ERROR_STOP 0
\set VERBOSITY sqlstate
BEGIN;
SELECT 'xid=' || (txid_current() % 4294967296);
SELECT 'duplicate=' || state FROM idem_claim('pending', 'wrap');
SELECT 'lookup=' || state FROM idem_lookup('leased', 'wrap');
SAVEPOINT s;
SELECT 'expired_before=' || (expires_at < statement_timestamp()) FROM idem.claims WHERE biz_type = 'wrap' AND key = 'expired';
SELECT 'expired_claimed=' || claimed FROM idem_claim('expired', 'wrap');
ROLLBACK TO s;
SELECT 'complete_without_token=done' FROM idem_complete('leased', 'wrap', '{"forged": true}');
ROLLBACK TO s;
SELECT 'checkpoint_without_token=done' FROM idem_checkpoint('leased', 'wrap', 'forged');
ROLLBACK TO s;
SELECT 'rows=' || count(*) || ',' || count(*) FILTER (WHERE state = 'l') FROM idem.claims WHERE biz_type = 'wrap';
COMMIT;
SQL
)
  echo "$out" | sed 's/^/    /'
  expect "$label: the transaction under test has the claims' 32-bit xid" "$(echo "$out" | grep '^xid=')" "xid=$t"
  expect "$label: a duplicate of the committed claim" "$(echo "$out" | grep '^duplicate=')" "duplicate=completed"
  expect "$label: the 1-second claim has expired (a precondition)" "$(echo "$out" | grep '^expired_before=')" "expired_before=true"
  expect "$label: an expired claim is claimed anew" "$(echo "$out" | grep '^expired_claimed=')" "expired_claimed=true"
  expect "$label: the lease as others see it" "$(echo "$out" | grep '^lookup=')" "lookup=in_progress"
  expect "$label: idem_complete and idem_checkpoint without the lease token refused (ID003)" "$(echo "$out" | grep -c '^ERROR:  ID003')" "2"
  expect "$label: nothing completed without the token" "$(echo "$out" | grep -c 'complete_without_token=done')" "0"
  expect "$label: nothing checkpointed without the token" "$(echo "$out" | grep -c 'checkpoint_without_token=done')" "0"
  expect "$label: the three claims still there, the lease unchanged" "$(echo "$out" | grep '^rows=')" "rows=3,1"
}

wrap_to 1
round direct
echo "idem.storage_access = sql" >> "$dir/data/postgresql.conf"
wrap_to 2
expect "the SQL storage path is in use" "$(sql -c 'SELECT idem_storage_path()')" "sql"
round sql

# After the wraps, the lease's holder still finishes it with its token, and
# new claims work.
sql -q -c "SELECT idem_complete('leased', 'wrap', '{\"done\": true}', lease_token => '$token')"
expect "the lease holder completes with its token" "$(sql -c "SELECT state FROM idem_lookup('leased', 'wrap')")" "completed"
expect "a new claim after the wrap" "$(sql -c "SELECT claimed FROM idem_claim('after', 'wrap')")" "t"
finish "wraparound"
