#!/usr/bin/env bash
# pg_upgrade from PostgreSQL 15 to 18 (tests/servers/pg18.sh, with this build
# of idem installed by a core run of scripts/test.sh), with live claims, a
# running lease, a state machine and its guard, a one-time token and a
# business type setting in the old cluster. After the upgrade every claim
# replays its stored outcome, the lease is finished with its token, the
# guard and the token still hold, maintenance runs and new claims work.
#   PG18_CONFIG=/path/to/18/bin/pg_config bash tests/versions/pg_upgrade.sh
#
# The old side is PostgreSQL 15 built from the upstream source
# (tests/servers/pg15-upstream.sh: the Debian 15.20 of this machine kind
# stamps every column with an attribute option 18 rejects, so pg_upgrade
# from it fails for any database), with idem copied from the build
# installed into Debian's 15.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/cluster.sh"
: "${PG18_CONFIG:?PG18_CONFIG must point at the pg_config of PostgreSQL 18}"
OLD_CONFIG="$(bash "$ROOT/tests/servers/pg15-upstream.sh")"
OLD_BIN="$("$OLD_CONFIG" --bindir)"
NEW_BIN="$("$PG18_CONFIG" --bindir)"
# idem into the old tree: Debian's 15 has this build installed (lib.sh's
# default PG_CONFIG).
install -m 644 "$("$PG_CONFIG" --pkglibdir)/idem.so" "$("$OLD_CONFIG" --pkglibdir)/"
install -m 644 "$("$PG_CONFIG" --sharedir)"/extension/idem* "$("$OLD_CONFIG" --sharedir)/extension/"
[ -f "$("$PG18_CONFIG" --pkglibdir)/idem.so" ] || { echo "idem is not installed into PostgreSQL 18 (run the core suite on 18 first)"; exit 1; }
work="$(cluster_dir)/pg_upgrade"
old="$work/old" new="$work/new"
oport=5521 nport=5522
stop_all() { pc_server_stop "$old"; pc_server_stop "$new"; }
trap stop_all EXIT
stop_all
pc_fresh "$work"; pc_fresh "$old"; pc_fresh "$new"
sql_old() { "$OLD_BIN/psql" -X -At -v ON_ERROR_STOP=1 -h "$old" -p $oport -U postgres -d app "$@"; }
sql_new() { "$NEW_BIN/psql" -X -At -v ON_ERROR_STOP=1 -h "$new" -p $nport -U postgres -d app "$@"; }

pc_initdb "$OLD_BIN" "$old" $oport
pc_server_start "$old"
"$OLD_BIN/psql" -X -q -h "$old" -p $oport -U postgres -d postgres -c "CREATE DATABASE app"
sql_old -q >/dev/null <<'SQL'
CREATE EXTENSION idem;
SELECT idem_configure('pay', '3 days');
SELECT idem_maintain();
BEGIN; SELECT idem_claim('done', 'pay'); SELECT idem_complete('done', 'pay', '{"charged": 42}'); COMMIT;
BEGIN; SELECT idem_claim('refused', 'pay'); SELECT idem_fail('refused', 'pay', '{"reason": "card declined"}'); COMMIT;
BEGIN; SELECT idem_claim('far', 'pay', ttl => '400 days'); SELECT idem_complete('far', 'pay', '{"far": true}'); COMMIT;
SELECT idem_define_machine('order', '{"CREATED": ["PAID"], "PAID": ["SHIPPED"]}');
CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL);
SELECT idem_guard('orders', 'status', 'order');
INSERT INTO orders VALUES (1, 'CREATED');
UPDATE orders SET status = 'PAID' WHERE id = 1;
CREATE TABLE tok AS SELECT idem_issue_token('form') AS t;
CREATE TABLE lease_tok AS SELECT result->>'lease_token' AS t FROM idem_claim('job-1', 'batch', lease => '1 hour');
SQL
lease_token=$(sql_old -c "SELECT t FROM lease_tok")
[[ "$lease_token" =~ ^[0-9a-f]{32}$ ]] || { echo "FAIL: no lease token from the old cluster: $lease_token"; exit 1; }
sql_old -c "SELECT idem_checkpoint('job-1', 'batch', 'item', '{\"last_item\": 7}', '$lease_token')" >/dev/null
before=$(sql_old -c "SELECT count(*) FROM idem.claims")
pc_ctl "$old" -m fast -w stop >/dev/null

# 18's initdb turns data checksums on by default; the old cluster has none.
PC_INITDB_OPTS=--no-data-checksums pc_initdb "$NEW_BIN" "$new" $nport
echo "pg_upgrade $("$OLD_BIN/postgres" --version | awk '{print $3}') → $("$NEW_BIN/postgres" --version | awk '{print $3}')"
# (pg_upgrade writes its logs into the current directory: the work folder,
# which the postgres user owns; as_postgres would start it in /.)
(cd "$work" && sudo -u postgres "$NEW_BIN/pg_upgrade" -b "$OLD_BIN" -B "$NEW_BIN" -d "$old/data" -D "$new/data" \
   -o "-c unix_socket_directories=$work" -O "-c unix_socket_directories=$work" -p $oport -P $nport) > "$work/pg_upgrade.out" 2>&1 \
  || { echo "FAIL: pg_upgrade"; tail -30 "$work/pg_upgrade.out"; exit 1; }
pc_server_start "$new"

fails=0
check() { # label want got
  if [ "$2" = "$3" ]; then echo "ok: $1"; else echo "FAIL: $1: want '$2', got '$3'"; fails=$((fails + 1)); fi
}
check "server is 18" 18 "$(sql_new -c "SELECT current_setting('server_version_num')::int / 10000")"
check "claims carried over" "$before" "$(sql_new -c "SELECT count(*) FROM idem.claims")"
check "completed claim replays" 'false|completed|{"charged": 42}' "$(sql_new -c "SELECT claimed || '|' || state || '|' || result FROM idem_claim('done', 'pay')")"
check "failed claim replays" 'false|failed|{"reason": "card declined"}' "$(sql_new -c "SELECT claimed || '|' || state || '|' || result FROM idem_claim('refused', 'pay')")"
check "far claim (default partition) replays" 'false|completed|{"far": true}' "$(sql_new -c "SELECT claimed || '|' || state || '|' || result FROM idem_claim('far', 'pay')")"
check "running lease still in progress" 'false|in_progress' "$(sql_new -c "SELECT claimed || '|' || state FROM idem_claim('job-1', 'batch')")"
check "recovery point kept" '{"last_item": 7}' "$(sql_new -c "SELECT recovery_data FROM idem_leases WHERE key = 'job-1'")"
sql_new -c "SELECT idem_complete('job-1', 'batch', '{\"done\": true}', '$lease_token')" >/dev/null
check "lease finished with its token" 'completed|{"done": true}' "$(sql_new -c "SELECT state || '|' || result FROM idem_lookup('job-1', 'batch')")"
check "business type TTL kept" 't' "$(sql_new -c "SELECT extract(epoch FROM expires_at - first_claimed_at) = 3 * 86400 FROM idem_claim('new-after', 'pay')")"
check "guard still refuses" 'ID002' "$(sql_new -c "DO \$\$ BEGIN UPDATE orders SET status = 'CREATED' WHERE id = 1; EXCEPTION WHEN OTHERS THEN RAISE NOTICE '%', SQLSTATE; END \$\$" 2>&1 | sed -n 's/^NOTICE:  //p')"
check "token spent once" 'true|false' "$(sql_new -c "SELECT idem_consume_token(t, 'form') || '|' || idem_consume_token(t, 'form') FROM tok")"
check "maintenance runs" 't' "$(sql_new -c "SELECT idem_maintain() ? 'partitions_created'")"
check "digest unchanged" -1710364826077851957 "$(sql_new -c "SELECT idem.key_hash('payment', 'req-42')")"
echo "pg_upgrade checks failed: $fails"
[ "$fails" = 0 ]
