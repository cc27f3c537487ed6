#!/usr/bin/env bash
# pg_dump / pg_restore of a database that uses idem keeps everything idem
# promises to keep, in both dump formats (custom + pg_restore, and plain SQL
# + psql), restored into fresh databases:
#   - live claims: completed (in a range partition and in the default one),
#     failed, and a running lease with its recovery point; a retry is still
#     a duplicate and gets the stored result back, a different fingerprint
#     is still refused (ID001), the lease still runs and its token still
#     finishes it;
#   - configuration: business type TTLs (and new claims use them), state
#     machines, unspent and spent one-time tokens, EXECUTE grants on admin
#     functions;
#   - guards: the trigger is restored, an illegal UPDATE is refused (ID002),
#     a repeated transition reads "already";
#   - the restored database works: new claims, idem_maintain;
#   - restored where a type's owner role does not exist (dropped after the
#     dump, as on another server): every other type's settings are
#     restored (0.3.0 stored the owner as a regrole, so the whole
#     idem.biz_types COPY failed and every TTL was lost), and the type
#     itself stays closed to all but superusers, naming its role.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
pfx=${IDEM_DUMP_DB_PREFIX:-idem_dump}
src=${pfx}_src; dst_c=${pfx}_custom; dst_p=${pfx}_plain; dst_n=${pfx}_norole
role=${pfx}_ops; owner=${pfx}_owner; user=${pfx}_user
tmp=""
pgdsn=(-h "$(cluster_dir)" -p "$IDEM_PORT" -U postgres)

cleanup() {
  for db in $src $dst_c $dst_p $dst_n; do psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true; done
  psql_idem -q -d postgres -c "DROP ROLE IF EXISTS $role, $owner, $user" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
cleanup
tmp=$(mktemp -d)
for db in $src $dst_c $dst_p $dst_n; do psql_idem -q -d postgres -c "CREATE DATABASE $db"; done
psql_idem -q -d postgres -c "CREATE ROLE $role NOLOGIN" -c "CREATE ROLE $owner NOLOGIN" -c "CREATE ROLE $user NOLOGIN IN ROLE $owner"

# The source database: one of everything.
lease_token=$(psql_idem -q -d $src -At <<SQL | tail -1
CREATE EXTENSION idem;
SELECT idem_configure('pay', '2 days');
SELECT idem_configure('short', '1 hour');
SELECT idem_configure('owned', '3 hours');
SELECT idem_set_owner('owned', '$owner');
SELECT idem_define_machine('order', '{"CREATED":["PAID","CANCELLED"],"PAID":["SHIPPED"]}');
SELECT idem_maintain();
GRANT EXECUTE ON FUNCTION idem_forget(text, text) TO $role;
-- completed, in a range partition
BEGIN; SELECT idem_claim('in-range', 'pay', fingerprint => 'fp-1'); SELECT idem_complete('in-range', 'pay', '{"charge_id": 7, "amount": 12.50}'); COMMIT;
-- committed without a result (reads completed, result NULL)
SELECT idem_claim('bare', 'pay');
-- beyond the premade partitions: lives in the default partition
BEGIN; SELECT idem_claim('far', 'pay', ttl => '300 days'); SELECT idem_complete('far', 'pay', '{"ok": 1}'); COMMIT;
-- a deterministic failure
BEGIN; SELECT idem_claim('declined', 'pay'); SELECT idem_fail('declined', 'pay', '{"error": "insufficient_funds"}'); COMMIT;
-- tokens: one spent, one not
CREATE TABLE tok (name text PRIMARY KEY, token text);
INSERT INTO tok VALUES ('unspent', idem_issue_token('form', '1 hour')), ('spent', idem_issue_token('form', '1 hour'));
SELECT idem_consume_token(token, 'form') FROM tok WHERE name = 'spent';
-- a guarded table, one row moved by a guarded transition
CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL);
INSERT INTO orders VALUES (1, 'CREATED'), (2, 'CREATED');
SELECT idem_guard('orders', 'status', 'order');
SELECT idem_transition('orders', 'id', '1', 'status', 'PAID', 'order');
-- a running lease with a recovery point (its token is printed last)
CREATE TEMP TABLE l AS SELECT result->>'lease_token' AS t FROM idem_claim('job-1', 'batch', lease => '10 minutes');
SELECT idem_checkpoint('job-1', 'batch', 'item', '{"last_item": 42}', (SELECT t FROM l));
SELECT t FROM l;
SQL
)
[[ "$lease_token" =~ ^[0-9a-f]{32,}$ ]] || { echo "no lease token from the source database: $lease_token"; exit 1; }
before=$(psql_idem -d $src -At -c "SELECT count(*) FROM idem.claims")

"$PG_BIN/pg_dump" "${pgdsn[@]}" -Fc -f "$tmp/idem.dump" $src
"$PG_BIN/pg_restore" "${pgdsn[@]}" --exit-on-error -d $dst_c "$tmp/idem.dump"
"$PG_BIN/pg_dump" "${pgdsn[@]}" -Fp -f "$tmp/idem.sql" $src
psql_idem -q -d $dst_p -v ON_ERROR_STOP=1 -f "$tmp/idem.sql" >/dev/null
echo "dumped $before claims: custom format $(stat -c %s "$tmp/idem.dump") bytes, plain $(stat -c %s "$tmp/idem.sql") bytes"

fail=0; pass=0
check() {  # check DB NAME EXPECTED SQL  (SQL prints one line; errors print their SQLSTATE)
  local db=$1 name=$2 want=$3 sql=$4 got
  got=$("$PG_BIN/psql" -X -At "${pgdsn[@]}" -d "$db" -v ON_ERROR_STOP=1 -c '\set VERBOSITY sqlstate' -c "$sql" 2>&1 | tail -1 | sed 's/^ERROR:  //' || true)
  if [ "$got" = "$want" ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "  FAIL [$db] $name: got '$got', expected '$want'"; fi
}

verify() {
  local db=$1
  echo "verifying $db"
  check $db "claims restored"           "$before" "SELECT count(*) FROM idem.claims"
  check $db "duplicate replays result"  'false|completed|{"amount": 12.50, "charge_id": 7}' \
        "SELECT claimed || '|' || state || '|' || result::text FROM idem_claim('in-range', 'pay', fingerprint => 'fp-1')"
  check $db "fingerprint still checked" "ID001" "SELECT claimed FROM idem_claim('in-range', 'pay', fingerprint => 'fp-2')"
  check $db "bare claim is completed"   'false|completed|' "SELECT claimed || '|' || state || '|' || coalesce(result::text, '') FROM idem_claim('bare', 'pay')"
  check $db "default-partition claim"   'false|completed|{"ok": 1}' "SELECT claimed || '|' || state || '|' || result::text FROM idem_claim('far', 'pay')"
  check $db "failure replays"           'false|failed|{"error": "insufficient_funds"}' "SELECT claimed || '|' || state || '|' || result::text FROM idem_claim('declined', 'pay')"
  check $db "expiry kept"               "t" "SELECT (SELECT expires_at FROM idem_lookup('far', 'pay')) > now() + interval '299 days'"
  check $db "lease still running"       'false|in_progress' "SELECT claimed || '|' || state FROM idem_claim('job-1', 'batch', lease => '1 minute')"
  check $db "lease refuses a stranger"  "ID003" "SELECT idem_checkpoint('job-1', 'batch', 'x')"
  check $db "recovery point kept"       '{"last_item": 42}' "SELECT (result->'recovery_data')::text FROM idem.claims WHERE key = 'job-1'"
  check $db "lease token finishes it"   "" "SELECT idem_complete('job-1', 'batch', '{\"done\": true}', '$lease_token')"
  check $db "then it replays"           'false|completed|{"done": true}' "SELECT claimed || '|' || state || '|' || result::text FROM idem_claim('job-1', 'batch')"
  check $db "biz_type ttl kept"         "2 days" "SELECT ttl FROM idem.biz_types WHERE biz_type = 'pay'"
  check $db "new claim uses the ttl"    "01:00:00" "SELECT expires_at - first_claimed_at FROM idem_claim('new-short', 'short')"
  check $db "machine kept"              '{"PAID": ["SHIPPED"], "CREATED": ["PAID", "CANCELLED"]}' "SELECT idem_machine('order')->'transitions'"
  check $db "unspent token spends once" "true,false" "SELECT idem_consume_token(token, 'form') || ',' || idem_consume_token(token, 'form') FROM tok WHERE name = 'unspent'"
  check $db "spent token stays spent"   "f" "SELECT idem_consume_token(token, 'form') FROM tok WHERE name = 'spent'"
  check $db "guard trigger restored"    "1" "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'orders'::regclass AND tgname = 'idem_guard_status'"
  check $db "guard refuses illegal"     "ID002" "UPDATE orders SET status = 'CREATED' WHERE id = 1"
  check $db "guard refuses premature"   "ID002" "UPDATE orders SET status = 'SHIPPED' WHERE id = 2"
  check $db "repeat transition: already" "already" "SELECT idem_transition('orders', 'id', '1', 'status', 'PAID', 'order')"
  check $db "stale transition"          "stale" "SELECT idem_transition('orders', 'id', '1', 'status', 'CREATED', 'order')"
  check $db "illegal transition"        "ID002" "SELECT idem_transition('orders', 'id', '1', 'status', 'CANCELLED', 'order')"
  check $db "legal transition applies"  "applied" "SELECT idem_transition('orders', 'id', '2', 'status', 'PAID', 'order')"
  check $db "admin grant kept"          "true|false" "SELECT has_function_privilege('$role', 'idem_forget(text,text)', 'EXECUTE') || '|' || has_function_privilege('public', 'idem_forget(text,text)', 'EXECUTE')"
  check $db "new key claims"            "t" "SELECT claimed FROM idem_claim('fresh', 'pay')"
  check $db "maintenance runs"          "t" "SELECT (idem_maintain() ? 'partitions_created')"
  check $db "claims survive maintenance" 'false|completed' "SELECT claimed || '|' || state FROM idem_claim('far', 'pay')"
}
verify $dst_c
verify $dst_p
check $dst_c "owner role kept"         "$owner" "SELECT owner FROM idem.biz_types WHERE biz_type = 'owned'"
check $dst_c "owner's member claims"   "t" "SET ROLE $user; SELECT claimed FROM idem_claim('o-1', 'owned')"

# Restored where the owner role does not exist.
psql_idem -q -d postgres -c "DROP ROLE $user, $owner"
echo "verifying $dst_n (restored without role $owner)"
"$PG_BIN/pg_restore" "${pgdsn[@]}" --exit-on-error -d $dst_n "$tmp/idem.dump" && pass=$((pass + 1)) ||
  { fail=$((fail + 1)); echo "  FAIL [$dst_n] pg_restore failed without the owner role"; }
check $dst_n "other types' TTLs kept"   "2 days|01:00:00" "SELECT string_agg(ttl::text, '|' ORDER BY biz_type) FROM idem.biz_types WHERE biz_type IN ('pay', 'short')"
check $dst_n "the type's TTL kept"      "03:00:00" "SELECT ttl FROM idem.biz_types WHERE biz_type = 'owned'"
check $dst_n "claims restored"          "$before" "SELECT count(*) FROM idem.claims"
check $dst_n "type closed"             "42501" "SET ROLE $role; SELECT claimed FROM idem_claim('o-2', 'owned')"
msg=$("$PG_BIN/psql" -X -At "${pgdsn[@]}" -d $dst_n -c "SET ROLE $role" -c "SELECT claimed FROM idem_claim('o-2', 'owned')" 2>&1 | grep '^ERROR' || true)
if [ "$msg" = "ERROR:  idem: permission denied for biz_type \"owned\": it is reserved for role \"$owner\", which does not exist on this server" ]; then
  pass=$((pass + 1))
else fail=$((fail + 1)); echo "  FAIL [$dst_n] the refusal names the missing role: $msg"; fi
check $dst_n "a superuser opens it"     "t" "SELECT idem_set_owner('owned', NULL); SET ROLE $role; SELECT claimed FROM idem_claim('o-2', 'owned')"
echo "dump/restore: $pass passed, $fail failed"
[ $fail -eq 0 ]
