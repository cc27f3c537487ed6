#!/usr/bin/env bash
# ALTER EXTENSION idem UPDATE from every shipped version to the current one.
# For each old version V with a frozen install script tests/upgrade/idem--V.sql:
#   1. install V in a new database and use it (with the new library, as a
#      server does between installing a build and ALTER EXTENSION UPDATE):
#      claims in range partitions and in the default one, completed and
#      failed, a lease, a business type setting, a machine and a guarded
#      table, a token;
#   2. ALTER EXTENSION idem UPDATE (walks sql/idem--A--B.sql to the current);
#   3. every claim replays its stored outcome, the lease is finished with its
#      token, guards and tokens still hold, new claims work, idem.claims and
#      every partition the old version made have REPLICA IDENTITY FULL;
#   4. the upgraded schema equals a fresh install's, object by object
#      (tests/upgrade/schema.sql), so an upgrade script that forgets a change
#      fails here.
# First: the unreleased update scripts are what their templates give
# (scripts/updates.py).
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
python3 "$ROOT/scripts/updates.py" --check
current=$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -1)
extdir="$("$PG_CONFIG" --sharedir)/extension"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0

fresh() { psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $1 WITH (FORCE)" -c "CREATE DATABASE $1"; }

fresh idem_upgrade_fresh
psql_idem -q -d postgres -c "DROP ROLE IF EXISTS upgrade_member, upgrade_owner, upgrade_stranger" \
  -c "CREATE ROLE upgrade_owner NOLOGIN" -c "CREATE ROLE upgrade_member NOLOGIN IN ROLE upgrade_owner" -c "CREATE ROLE upgrade_stranger NOLOGIN"
trap 'rm -rf "$work"; psql_idem -q -d postgres -c "DROP ROLE IF EXISTS upgrade_member, upgrade_owner, upgrade_stranger" >/dev/null 2>&1' EXIT
psql_idem -q -d idem_upgrade_fresh -c "CREATE EXTENSION idem"
psql_idem -At -d idem_upgrade_fresh -f "$ROOT/tests/upgrade/schema.sql" > "$work/fresh.txt"
echo "fresh $current install: $(grep -c '^[a-z]' "$work/fresh.txt") description lines"

for frozen in "$ROOT"/tests/upgrade/idem--*.sql; do
  old=$(basename "$frozen" .sql); old=${old#idem--}
  # The old version's install script is not shipped with the new build: put
  # it beside the current one so that CREATE EXTENSION ... VERSION finds it.
  # (Only when it differs: scenarios running beside this one copy that
  # folder, and would copy a file being rewritten.)
  cmp -s "$frozen" "$extdir/idem--$old.sql" || install -m 644 "$frozen" "$extdir/idem--$old.sql"
  path=$(psql_idem -At -d idem_upgrade_fresh -c \
    "SELECT path FROM pg_extension_update_paths('idem') WHERE source = '$old' AND target = '$current'")
  if [ -z "$path" ]; then echo "FAIL: no update path from $old to $current (missing sql/idem--$old--…sql)"; fails=$((fails + 1)); continue; fi
  echo "update path $old → $current: $path"

  db=idem_upgrade_from_${old//./_}
  fresh "$db"
  psql_idem -q -d "$db" > /dev/null <<SQL
CREATE EXTENSION idem VERSION '$old';
SELECT idem_configure('pay', '3 days');
SELECT idem_maintain();
BEGIN; SELECT idem_claim('done', 'pay'); SELECT idem_complete('done', 'pay', '{"charged": 42}'); COMMIT;
BEGIN; SELECT idem_claim('refused', 'pay'); SELECT idem_fail('refused', 'pay', '{"reason": "card declined"}'); COMMIT;
BEGIN; SELECT idem_claim('far', 'pay', ttl => '400 days'); SELECT idem_complete('far', 'pay', '{"far": true}'); COMMIT;
SELECT idem_claim('open', 'pay');
CREATE TABLE lease_token AS SELECT result->>'lease_token' AS t FROM idem_claim('leased', 'pay', lease => '1 hour');
SELECT idem_define_machine('order', '{"CREATED": ["PAID"], "PAID": ["SHIPPED"]}');
CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL);
SELECT idem_guard('orders', 'status', 'order');
INSERT INTO orders VALUES (1, 'CREATED');
UPDATE orders SET status = 'PAID' WHERE id = 1;
CREATE TABLE tok AS SELECT idem_issue_token('form') AS t;
SQL
  # Versions with owner roles (0.3.0: stored as a regrole) reserve a type.
  has_owner=$(psql_idem -At -d "$db" -c "SELECT count(*) FROM pg_proc WHERE proname = 'idem_set_owner'")
  if [ "$has_owner" = 1 ]; then
    psql_idem -q -d "$db" -c "SELECT idem_configure('owned', '5 hours')" -c "SELECT idem_set_owner('owned', 'upgrade_owner')" >/dev/null
  fi
  # An operator's grant of idem_configure(biz_type, ttl), and a hardened
  # idem_checkpoint (PUBLIC revoked, one role granted).
  psql_idem -q -d "$db" -c "GRANT EXECUTE ON FUNCTION idem_configure(text, interval) TO upgrade_stranger" \
    -c "REVOKE EXECUTE ON FUNCTION idem_checkpoint(text, text, text, jsonb, text) FROM PUBLIC" \
    -c "GRANT EXECUTE ON FUNCTION idem_checkpoint(text, text, text, jsonb, text) TO upgrade_member"
  psql_idem -q -d "$db" -c "ALTER EXTENSION idem UPDATE"
  out=$(psql_idem -At -d "$db" <<'SQL'
SELECT 'version=' || extversion FROM pg_extension WHERE extname = 'idem';
SELECT 'done=' || claimed || '/' || state || '/' || result::text FROM idem_claim('done', 'pay');
SELECT 'refused=' || claimed || '/' || state || '/' || result::text FROM idem_claim('refused', 'pay');
SELECT 'far=' || claimed || '/' || state || '/' || result::text FROM idem_claim('far', 'pay');
SELECT 'open=' || claimed || '/' || state FROM idem_claim('open', 'pay');
SELECT 'new=' || claimed || '/' || state FROM idem_claim('new-after-upgrade', 'pay');
SELECT 'leased=' || claimed || '/' || state FROM idem_claim('leased', 'pay');
SELECT 'lease-completed=' || (count(idem_complete('leased', 'pay', '{"by": "owner"}', t)) = 1) FROM lease_token;
SELECT 'leased-after=' || state || '/' || result::text FROM idem_lookup('leased', 'pay');
SELECT 'ttl=' || ttl FROM idem.biz_types WHERE biz_type = 'pay';
SELECT 'token=' || idem_consume_token(t, 'form') FROM tok;
SELECT 'token-again=' || idem_consume_token(t, 'form') FROM tok;
SELECT 'replica-identity=' || string_agg(DISTINCT relreplident::text, ',') FROM pg_class
 WHERE oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'idem.claims'::regclass) OR oid = 'idem.claims'::regclass;
SELECT 'maintain=' || (idem_maintain() IS NOT NULL);
SQL
  )
  # A guarded transition that already happened must still be refused.
  guard=$(psql_idem -At -d "$db" -c "UPDATE orders SET status = 'CREATED' WHERE id = 1" 2>&1 || true)
  echo "$out" | sed 's/^/  /'
  echo "  re-transition PAID → CREATED: $guard" | head -1
  for want in "version=$current" 'done=false/completed/{"charged": 42}' 'refused=false/failed/{"reason": "card declined"}' \
              'far=false/completed/{"far": true}' 'open=false/completed' 'new=true/new' 'ttl=3 days' \
              'leased=false/in_progress' 'lease-completed=true' 'leased-after=completed/{"by": "owner"}' \
              'token=true' 'token-again=false' 'maintain=true' 'replica-identity=f'; do
    grep -qxF "$want" <<<"$out" || { echo "FAIL: after the upgrade from $old, expected '$want'"; fails=$((fails + 1)); }
  done
  grep -q "ERROR" <<<"$guard" || { echo "FAIL: guard did not refuse a repeated transition after the upgrade"; fails=$((fails + 1)); }
  if [ "$has_owner" = 1 ]; then
    owned=$(psql_idem -At -d "$db" -c "SELECT owner || '/' || ttl FROM idem.biz_types WHERE biz_type = 'owned'")
    stranger=$(psql_idem -At -d "$db" -c "SET ROLE upgrade_stranger" -c "SELECT idem_claim('o', 'owned')" 2>&1 | grep -o 'permission denied for biz_type "owned"' || true)
    member=$(psql_idem -At -d "$db" -c "SET ROLE upgrade_member" -c "SELECT claimed FROM idem_claim('o', 'owned')" 2>&1 | tail -1)
    echo "  owner kept: $owned; stranger: $stranger; member claims: $member"
    [ "$owned" = "upgrade_owner/05:00:00" ] || { echo "FAIL: the type's owner and TTL after the upgrade: $owned"; fails=$((fails + 1)); }
    [ -n "$stranger" ] || { echo "FAIL: a non-member used the reserved type after the upgrade"; fails=$((fails + 1)); }
    [ "$member" = t ] || { echo "FAIL: the owner's member could not claim after the upgrade: $member"; fails=$((fails + 1)); }
  fi

  # 0.4.0's idem_configure(biz_type, ttl, on_failure) is granted to the
  # roles granted the two-argument form; under the retry policy the claim
  # idem_fail refused before the update is claimed anew.
  retried=$(psql_idem -At -d "$db" -c "SET ROLE upgrade_stranger" -c "SELECT idem_configure('pay', '3 days', 'retry')" \
              -c "RESET ROLE" -c "SELECT claimed || '/' || (result->>'attempt') || '/' || (result->'previous_error')::text FROM idem_claim('refused', 'pay')" 2>&1 | tail -1)
  echo "  granted on_failure, refused claim retried: $retried"
  [ "$retried" = 'true/2/{"reason": "card declined"}' ] || { echo "FAIL: configure with on_failure by a role granted idem_configure before the upgrade, then a retry: $retried"; fails=$((fails + 1)); }
  # The new idem_checkpoint form has the old one's privileges.
  merge_acl=$(psql_idem -At -d "$db" -c "SELECT has_function_privilege('public', 'idem_checkpoint(text, text, text, jsonb, text, boolean)', 'EXECUTE')
                                                || '/' || has_function_privilege('upgrade_member', 'idem_checkpoint(text, text, text, jsonb, text, boolean)', 'EXECUTE')")
  echo "  idem_checkpoint with merge, PUBLIC/granted role: $merge_acl"
  [ "$merge_acl" = false/true ] || { echo "FAIL: idem_checkpoint with merge after a hardened idem_checkpoint: $merge_acl"; fails=$((fails + 1)); }
  psql_idem -q -d "$db" -c "REVOKE EXECUTE ON FUNCTION idem_configure(text, interval), idem_configure(text, interval, text), idem_configure(text, interval, text, text) FROM upgrade_stranger" \
    -c "REVOKE EXECUTE ON FUNCTION idem_checkpoint(text, text, text, jsonb, text), idem_checkpoint(text, text, text, jsonb, text, boolean) FROM upgrade_member" \
    -c "UPDATE pg_proc SET proacl = NULL WHERE proname = 'idem_checkpoint'"  # the default ACL again, as a fresh install has it (no GRANT restores NULL)
  psql_idem -At -d "$db" -f "$ROOT/tests/upgrade/schema.sql" > "$work/upgraded-$old.txt"
  if diff -u "$work/fresh.txt" "$work/upgraded-$old.txt" > "$work/diff-$old.txt"; then
    echo "schema after $old → $current equals a fresh $current install"
  else
    echo "FAIL: schema after $old → $current differs from a fresh install:"; cat "$work/diff-$old.txt"
    fails=$((fails + 1))
  fi
  psql_idem -q -d postgres -c "DROP DATABASE $db WITH (FORCE)"
done
psql_idem -q -d postgres -c "DROP DATABASE idem_upgrade_fresh WITH (FORCE)"
echo "upgrade checks failed: $fails"
[ "$fails" = 0 ]
