#!/usr/bin/env bash
# Moving a database between the native and the portable edition
# (docs/portable.md, "Moving between editions"), each way, with the
# documented export and import scripts run as they stand in the doc:
#   1. pg_tle (portable) -> native       (from a managed service home)
#   2. native -> pg_tle                  (and back)
#   3. plain script (portable) -> native
#   4. native -> plain script
# The source database of each move holds one of everything: completed
# claims with results and fingerprints (in a range partition and in the
# default one), a committed claim without result, a failure, a running
# lease with a recovery point, an expired claim, TTLs and an owner per
# type, a state machine and a guarded table, spent and unspent tokens, and
# business rows written with the claims. After the move, the target must
# hold the same claims (same digest, expiry, state, result, row for row)
# and answer alike: a duplicate gets the first outcome and the business row
# matches it, a different fingerprint is refused (ID001), the lease holder
# finishes with the token it got before the move, a stranger is refused
# (ID003), the expired claim is claimed anew, the owned type refuses
# others (42501), guards and tokens work. And the import refuses a target
# that has idem state already (55000).
#
# Clusters (both private, run as postgres from $IDEM_TARGET/portable_move):
# the pg_tle tree of tests/portable/tree.sh on port 5549 (no idem library),
# and the system's PostgreSQL 15 binaries with the native idem installed
# there on port 5550 (only its binaries and installed files are used; the
# suite's cluster is not touched). PostgreSQL 15 only: the pg_tle tree is
# Debian 12's PostgreSQL 15, and a move between majors is pg_dump's
# business, not this test's.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/cluster.sh"
source "$ROOT/tests/lib/assert.sh"
if [ "$PG_MAJOR" != 15 ]; then
  echo "skipped: moving between editions is tested on PostgreSQL 15 (this run is $PG_MAJOR)"
  exit 0
fi
TLE_PORT=5549
NAT_PORT=5550
TLE_CONFIG=$(bash "$ROOT/tests/portable/tree.sh")
TLE_BIN=$("$TLE_CONFIG" --bindir)
[ -e "$PG_BIN/../lib/idem.so" ] || [ -e "$("$PG_CONFIG" --pkglibdir)/idem.so" ] ||
  { echo "the native idem is not installed in $PG_BIN's PostgreSQL (bash scripts/setup.sh)"; exit 1; }
base="$IDEM_TARGET/portable_move"
# (under /tmp when the postgres user cannot reach the checkout, as
# scripts/lib.sh does for the suite's cluster)
mkdir -p "$IDEM_TARGET"
sudo -u postgres test -x "$IDEM_TARGET" 2>/dev/null || base="/tmp/idem-portable_move-$(echo "$ROOT" | md5sum | cut -c1-8)"
out="$base/out"
tle_dir="$base/tle"
nat_dir="$base/native"

stop_all() {
  pc_server_stop "$tle_dir"
  pc_server_stop "$nat_dir"
}
[ -n "${IDEM_MOVE_KEEP:-}" ] || trap stop_all EXIT  # IDEM_MOVE_KEEP=1: leave the clusters running to look at them
stop_all
rm -rf "$base"
mkdir -p "$tle_dir" "$nat_dir" "$out"
chown postgres:postgres "$tle_dir" "$nat_dir"
chmod 755 "$base" "$tle_dir" "$nat_dir"
python3 "$ROOT/scripts/portable.py" --out "$out/dist"
chmod -R a+rX "$out"

start_cluster() { # bindir dir port preload
  pc_initdb "$1" "$2" "$3" \
    "max_connections = 40" \
    "shared_preload_libraries = '$4'"
  pc_server_start "$2"
}
start_cluster "$TLE_BIN" "$tle_dir" $TLE_PORT pg_tle
start_cluster "$PG_BIN" "$nat_dir" $NAT_PORT idem

# Where each edition lives: a connection (cluster and role) per kind.
#   tle:    the pg_tle tree, as tle_admin (not a superuser, pgtle_admin,
#           owner of the database: as on a managed service)
#   plain:  the pg_tle tree, as plain_owner (the database's owner)
#   native: the system binaries' cluster, as postgres
conn() { # kind db -> psql arguments
  case $1 in
    tle) echo "$TLE_BIN/psql -X -q -v ON_ERROR_STOP=1 -h $tle_dir -p $TLE_PORT -U tle_admin -d $2" ;;
    plain) echo "$TLE_BIN/psql -X -q -v ON_ERROR_STOP=1 -h $tle_dir -p $TLE_PORT -U plain_owner -d $2" ;;
    native) echo "$PG_BIN/psql -X -q -v ON_ERROR_STOP=1 -h $nat_dir -p $NAT_PORT -U postgres -d $2" ;;
  esac
}
as_owner() { local kind=$1 db=$2; shift 2; $(conn "$kind" "$db") "$@"; }
# The superuser of the kind's cluster (SET ROLE for the owner checks).
as_super() { local kind=$1 db=$2; shift 2
  if [ "$kind" = native ]; then $(conn native "$db") "$@"
  else "$TLE_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$tle_dir" -p $TLE_PORT -U postgres -d "$db" "$@"; fi
}
roles="CREATE ROLE pay_owner NOLOGIN; CREATE ROLE pay_user NOLOGIN IN ROLE pay_owner; CREATE ROLE outsider NOLOGIN;"
as_super native postgres -c "$roles"
as_super tle postgres -c "$roles" -c "CREATE ROLE tle_admin LOGIN NOSUPERUSER" -c "CREATE ROLE plain_owner LOGIN NOSUPERUSER"

install_edition() { # kind db
  case $1 in
    native)
      as_super native postgres -c "CREATE DATABASE $2"
      as_owner native "$2" -c "CREATE EXTENSION idem" ;;
    tle)
      as_super tle postgres -c "CREATE DATABASE $2 OWNER tle_admin"
      as_super tle "$2" -c "SET client_min_messages = warning" -c "CREATE EXTENSION pg_tle" -c "GRANT pgtle_admin TO tle_admin"
      as_owner tle "$2" -f "$out/dist/idem_pg_tle.sql" >/dev/null
      as_owner tle "$2" -c "CREATE EXTENSION idem" ;;
    plain)
      as_super plain postgres -c "CREATE DATABASE $2 OWNER plain_owner"
      as_owner plain "$2" -f "$out/dist/idem_portable.sql" >/dev/null ;;
  esac
}

# The source's state; prints the running lease's token.
populate() { # kind db
  as_owner "$1" "$2" -At <<'SQL' | tail -1
SELECT idem_configure('pay', '2 days');
SELECT idem_configure('short', '1 hour');
SELECT idem_configure('owned', '3 hours');
SELECT idem_set_owner('owned', 'pay_owner');
SELECT idem_define_machine('order', '{"CREATED":["PAID","CANCELLED"],"PAID":["SHIPPED"]}');
SELECT idem_maintain();
CREATE TABLE payments (key text PRIMARY KEY, charge_id int NOT NULL, amount numeric NOT NULL);
-- completed, in a range partition, with its business row
BEGIN;
SELECT idem_claim('in-range', 'pay', fingerprint => 'fp-1');
INSERT INTO payments VALUES ('in-range', 7, 12.50);
SELECT idem_complete('in-range', 'pay', '{"charge_id": 7, "amount": 12.50}');
COMMIT;
-- committed without a result
SELECT idem_claim('bare', 'pay');
-- beyond the premade partitions: in the default partition
BEGIN; SELECT idem_claim('far', 'pay', ttl => '300 days'); SELECT idem_complete('far', 'pay', '{"ok": 1}'); COMMIT;
-- a deterministic failure
BEGIN; SELECT idem_claim('declined', 'pay'); SELECT idem_fail('declined', 'pay', '{"error": "insufficient_funds"}'); COMMIT;
-- a claim that expires before the move (the script waits for it below)
BEGIN; SELECT idem_claim('gone', 'pay', ttl => '1 second'); SELECT idem_complete('gone', 'pay', '{"old": true}'); COMMIT;
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
CREATE TEMP TABLE l AS SELECT result->>'lease_token' AS t FROM idem_claim('job-1', 'batch', lease => '30 minutes');
SELECT idem_checkpoint('job-1', 'batch', 'item', '{"last_item": 42}', (SELECT t FROM l));
SELECT t FROM l;
SQL
}
# Waits (a state, not a time) until the short claim has expired.
wait_expired() { # kind db
  local i
  for i in $(seq 1 300); do
    [ "$(as_owner "$1" "$2" -Atc "SELECT expires_at < now() FROM idem.claims WHERE key = 'gone'")" = t ] && return 0
    sleep 0.1
  done
  fail "the claim 'gone' never expired"
}

# The two documented scripts, taken from docs/portable.md.
doc_block() { # marker
  sed -n "/^<!-- move: $1 -->\$/,/^<!-- end -->\$/p" "$ROOT/docs/portable.md" | sed '1,2d; $d' | sed '$d'
}
doc_block export > "$out/idem_export.sql"
doc_block import > "$out/idem_import.sql"
expect "the export script is in the doc" "$(grep -c '^\\copy' "$out/idem_export.sql")" 5
expect "the import script is in the doc" "$(grep -c '^\\copy' "$out/idem_import.sql")" 5

# Every live claim as the digest finds it, with all it holds. (The
# expired one is left out: the import's maintenance run may remove it, as
# any maintenance run would on the source; a claim below checks that it
# stays expired.)
claims_sql="SELECT biz_type, key, idem.key_hash(biz_type, key), ttl_class, expires_at, claimed_at, state, fingerprint, result
            FROM idem.claims WHERE expires_at > now() ORDER BY biz_type, key, expires_at"
# The registry's row for the expired claim's class is left out too: the
# import's maintenance removes it once its until has passed (none of the
# others comes within 10 minutes of that during the test).
config_sql="SELECT 'type', biz_type, ttl::text, owner::text, created_at::text FROM idem.biz_types
            UNION ALL SELECT 'machine', name, transitions::text, reachable::text, updated_at::text FROM idem.machines
            UNION ALL SELECT 'token', encode(token_sha256, 'hex'), biz_type, spent_at::text, expires_at::text FROM idem.tokens
            UNION ALL SELECT 'class', biz_type, ttl_class::text, until::text, NULL FROM idem.type_classes
                       WHERE until > now() + interval '10 minutes'
            ORDER BY 1, 2, 3, 4"
business_sql="SELECT 'payment', key, charge_id::text || ' ' || amount::text FROM payments
              UNION ALL SELECT 'order', id::text, status FROM orders ORDER BY 1, 2"

check() { # kind db what want sql  (one line; an error shows its SQLSTATE)
  local got
  got=$(as_super "$1" "$2" -At -c '\set VERBOSITY sqlstate' -c "$5" 2>&1 | tail -1 | sed 's/^ERROR:  //' || true)
  expect "[$1 $2] $3" "$got" "$4"
}

move() { # from-kind to-kind label
  local from=$1 to=$2 src="src_$3" dst="dst_$3" work="$out/$3" token
  echo "== $from -> $to"
  install_edition "$from" "$src"
  token=$(populate "$from" "$src")
  [[ "$token" =~ ^[0-9a-f]{32,}$ ]] || { fail "$from: no lease token from the source: $token"; return; }
  wait_expired "$from" "$src"
  install_edition "$to" "$dst"
  mkdir -p "$work" && chmod 777 "$work"
  # The application's own tables (the guard trigger comes with orders).
  "$PG_BIN/pg_dump" --no-owner --no-privileges -t public.payments -t public.orders -t public.tok \
    $(as_super_dsn "$from") "$src" > "$work/app.sql"
  as_owner "$to" "$dst" -f "$work/app.sql" >/dev/null
  (cd "$work" && as_owner "$from" "$src" -f "$out/idem_export.sql")
  (cd "$work" && as_owner "$to" "$dst" -f "$out/idem_import.sql" >/dev/null)

  expect "[$3] the same claims, row for row (digest, class, expiry, state, result)" \
    "$(as_super "$to" "$dst" -At -c "$claims_sql" | md5sum)" "$(as_super "$from" "$src" -At -c "$claims_sql" | md5sum)"
  # (the comparison sees a claim that did not move: one deleted and
  # rolled back on the target compares unequal)
  [ "$(as_super "$to" "$dst" -At -c "BEGIN" -c "DELETE FROM idem.claims WHERE key = 'declined'" -c "$claims_sql" -c "ROLLBACK" | md5sum)" \
      != "$(as_super "$from" "$src" -At -c "$claims_sql" | md5sum)" ] &&
    echo "ok: [$3] the comparison sees a missing claim" || fail "[$3] the comparison does not see a missing claim"
  expect "[$3] claims compared" "$(as_super "$to" "$dst" -At -c "SELECT count(*) FROM idem.claims WHERE expires_at > now()")" 5
  expect "[$3] the same types, owners, machines, tokens, classes" \
    "$(as_super "$to" "$dst" -At -c "$config_sql" | md5sum)" "$(as_super "$from" "$src" -At -c "$config_sql" | md5sum)"
  expect "[$3] the same business rows" \
    "$(as_super "$to" "$dst" -At -c "$business_sql" | tr '\n' ';')" "order|1|PAID;order|2|CREATED;payment|in-range|7 12.50;"
  check "$to" "$dst" "maintenance moved the claims out of the default partition" "0" \
    "SELECT count(*) FROM idem.claims_default"
  check "$to" "$dst" "duplicate gets the first outcome, as the business row says" 'false|completed|true' \
    "SELECT r.claimed || '|' || r.state || '|' || ((r.result->>'charge_id')::int = p.charge_id AND (r.result->>'amount')::numeric = p.amount)
     FROM idem_claim('in-range', 'pay', fingerprint => 'fp-1') r, payments p WHERE p.key = 'in-range'"
  check "$to" "$dst" "a different fingerprint is refused" "ID001" "SELECT claimed FROM idem_claim('in-range', 'pay', fingerprint => 'fp-2')"
  check "$to" "$dst" "bare claim reads completed" 'false|completed|' "SELECT claimed || '|' || state || '|' || coalesce(result::text, '') FROM idem_claim('bare', 'pay')"
  check "$to" "$dst" "default-partition claim replays" 'false|completed|{"ok": 1}' "SELECT claimed || '|' || state || '|' || result::text FROM idem_claim('far', 'pay')"
  check "$to" "$dst" "failure replays" 'false|failed|{"error": "insufficient_funds"}' "SELECT claimed || '|' || state || '|' || result::text FROM idem_claim('declined', 'pay')"
  check "$to" "$dst" "the expired claim stays expired: claimed anew" 'true|new' "SELECT claimed || '|' || state FROM idem_claim('gone', 'pay')"
  check "$to" "$dst" "lease still running for others" 'false|in_progress' "SELECT claimed || '|' || state FROM idem_claim('job-1', 'batch', lease => '1 minute')"
  check "$to" "$dst" "lease refuses a stranger" "ID003" "SELECT idem_checkpoint('job-1', 'batch', 'x')"
  check "$to" "$dst" "lease refuses a wrong token" "ID003" "SELECT idem_complete('job-1', 'batch', '{}', repeat('0', 64))"
  check "$to" "$dst" "the pre-move lease token finishes it" "" "SELECT idem_complete('job-1', 'batch', '{\"done\": true}', '$token')"
  check "$to" "$dst" "then a duplicate gets that outcome" 'false|completed|{"done": true}' "SELECT claimed || '|' || state || '|' || result::text FROM idem_claim('job-1', 'batch')"
  check "$to" "$dst" "the type's TTL applies to new claims" "01:00:00" "SELECT expires_at - first_claimed_at FROM idem_claim('new-short', 'short')"
  check "$to" "$dst" "the owned type refuses others" "42501" "SET ROLE outsider; SELECT claimed FROM idem_claim('o-1', 'owned')"
  check "$to" "$dst" "the owner's member claims" "t" "SET ROLE pay_user; SELECT claimed FROM idem_claim('o-1', 'owned')"
  check "$to" "$dst" "unspent token spends once" "true,false" "SELECT idem_consume_token(token, 'form') || ',' || idem_consume_token(token, 'form') FROM tok WHERE name = 'unspent'"
  check "$to" "$dst" "spent token stays spent" "f" "SELECT idem_consume_token(token, 'form') FROM tok WHERE name = 'spent'"
  check "$to" "$dst" "guard refuses an illegal update" "ID002" "UPDATE orders SET status = 'CREATED' WHERE id = 1"
  check "$to" "$dst" "repeated transition: already" "already" "SELECT idem_transition('orders', 'id', '1', 'status', 'PAID', 'order')"
  check "$to" "$dst" "legal transition applies" "applied" "SELECT idem_transition('orders', 'id', '2', 'status', 'PAID', 'order')"
  check "$to" "$dst" "a new key claims" "t" "SELECT claimed FROM idem_claim('fresh', 'pay')"
  check "$to" "$dst" "and its duplicate reads completed" 'false|completed' "SELECT claimed || '|' || state FROM idem_claim('fresh', 'pay')"
  check "$to" "$dst" "maintenance runs" "t" "SELECT (idem_maintain() ? 'partitions_created')"
  # A second import would mix two databases' claims.
  expect "[$3] the import refuses a target with idem state (55000)" \
    "$(cd "$work" && as_owner "$to" "$dst" -v VERBOSITY=sqlstate -c '\set VERBOSITY sqlstate' -f "$out/idem_import.sql" 2>&1 | grep -o '55000' | head -1)" 55000
}
as_super_dsn() { # kind -> pg_dump connection options (the superuser)
  if [ "$1" = native ]; then echo "-h $nat_dir -p $NAT_PORT -U postgres"; else echo "-h $tle_dir -p $TLE_PORT -U postgres"; fi
}

move tle native tle_to_native
move native tle native_to_tle
move plain native plain_to_native
move native plain native_to_plain

finish portable_move
