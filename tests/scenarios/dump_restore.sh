#!/usr/bin/env bash
# pg_dump / pg_restore keep live claims (in range partitions and in the
# default partition), business type settings, machines and tokens: after a
# restore into a new database, a retry is still a duplicate.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
src=idem_dump_src; dst=idem_dump_dst
for db in $src $dst; do psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"; done
psql_idem -q -d $src <<'SQL'
CREATE EXTENSION idem;
SELECT idem_configure('pay', '2 days');
SELECT idem_define_machine('order', '{"CREATED":["PAID"]}');
SELECT idem_maintain();
-- one claim in a range partition, one beyond the horizon in the default one
SELECT idem_claim('in-range', 'pay');
BEGIN; SELECT idem_claim('far', 'pay', ttl => '300 days'); SELECT idem_complete('far', 'pay', '{"ok":1}'); COMMIT;
SQL
dump=$(mktemp -d)/idem.dump
"$PG_BIN/pg_dump" -h "$(cluster_dir)" -p "$IDEM_PORT" -U postgres -Fc -f "$dump" $src
"$PG_BIN/pg_restore" -h "$(cluster_dir)" -p "$IDEM_PORT" -U postgres -d $dst "$dump"
out=$(psql_idem -d $dst -At <<'SQL'
SELECT 'in-range=' || claimed || '/' || state FROM idem_claim('in-range', 'pay');
SELECT 'far=' || claimed || '/' || state || '/' || result::text FROM idem_claim('far', 'pay');
SELECT 'ttl=' || ttl FROM idem.biz_types WHERE biz_type = 'pay';
SELECT 'machine=' || (idem_machine('order') IS NOT NULL);
SELECT 'new=' || claimed FROM idem_claim('fresh', 'pay');
SQL
)
echo "$out"
grep -qx 'in-range=false/completed' <<<"$out" && grep -qx 'far=false/completed/{"ok": 1}' <<<"$out" \
  && grep -qx 'ttl=2 days' <<<"$out" && grep -qx 'machine=true' <<<"$out" && grep -qx 'new=true' <<<"$out"
