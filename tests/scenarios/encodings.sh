#!/usr/bin/env bash
# Keys, business types, fingerprints, results and recovery points keep their
# exact bytes in every server encoding, on both storage paths: databases in
# UTF8, LATIN1, SQL_ASCII and EUC_JP, with non-ASCII keys sent by a UTF-8
# client. Claim, duplicate, lookup, finish, lease checkpoint and takeover,
# forget. (0.2.0: idem_forget('café') returned false in a LATIN1 database
# and the claim stayed; the SQL path refused every non-UTF8 database.)
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
bash "$ROOT/scripts/cluster.sh" start >/dev/null
restore() {
  psql_idem -q -d postgres -c "LOAD 'idem'" -c "ALTER SYSTEM RESET idem.storage_access" -c "SELECT pg_reload_conf()" >/dev/null
}
trap restore EXIT
fails=0

run_checks() { # db key
  local db=$1 key=$2
  PGCLIENTENCODING=UTF8 psql_idem -X -At -d "$db" -v key="$key" 2>&1 <<'SQL'
\set ON_ERROR_STOP off
BEGIN;
SELECT 'claim=' || claimed || '/' || state FROM idem_claim(:'key', 'enc', fingerprint => :'key' || '-fp');
SELECT 'complete=' || (count(idem_complete(:'key', 'enc', jsonb_build_object('name', :'key'))) = 1) FROM (SELECT 1) x;
COMMIT;
SELECT 'duplicate=' || claimed || '/' || state || '/' || (result->>'name' = :'key') FROM idem_claim(:'key', 'enc', fingerprint => :'key' || '-fp');
SELECT 'lookup=' || state FROM idem_lookup(:'key', 'enc');
SELECT 'other-key=' || claimed FROM idem_claim(:'key' || 'x', 'enc');
\set VERBOSITY sqlstate
SELECT 'fingerprint=' || claimed FROM idem_claim(:'key', 'enc', fingerprint => :'key' || '-other');
\set VERBOSITY default
SELECT 'stored=' || count(*) FROM idem.claims WHERE biz_type = 'enc' AND key = :'key';
SELECT 'forget=' || idem_forget(:'key', 'enc');
SELECT 'after-forget=' || state FROM idem_lookup(:'key', 'enc');
SELECT 'claim-again=' || claimed FROM idem_claim(:'key', 'enc');
CREATE TEMP TABLE lease AS SELECT result->>'lease_token' AS t FROM idem_claim(:'key', 'enc.lease', lease => '1 second');
SELECT 'checkpoint=' || (count(idem_checkpoint(:'key', 'enc.lease', :'key' || '-point', jsonb_build_object('data', :'key'), t)) = 1) FROM lease;
SELECT pg_sleep(1.1);
SELECT 'takeover=' || claimed || '/' || (result->>'recovery_point' = :'key' || '-point') || '/' || (result->'recovery_data'->>'data' = :'key')
  FROM idem_claim(:'key', 'enc.lease', lease => '1 minute');
SELECT 'lease-view=' || (recovery_point = :'key' || '-point') FROM idem_leases WHERE key = :'key';
SQL
}

expected=$(cat <<'EOF2'
claim=true/new
complete=true
duplicate=false/completed/true
lookup=completed
other-key=true
ERROR:  ID001
stored=1
forget=true
after-forget=absent
claim-again=true
checkpoint=true
takeover=true/true/true
lease-view=true
EOF2
)

for path in direct sql; do
  psql_idem -q -d postgres -c "LOAD 'idem'" -c "ALTER SYSTEM SET idem.storage_access = '$path'" -c "SELECT pg_reload_conf()" >/dev/null
  for enc_key in "UTF8:café ☕ 日本" "LATIN1:café ñ" "SQL_ASCII:café ☕" "EUC_JP:日本語のキー"; do
    enc=${enc_key%%:*} key=${enc_key#*:}
    db="idem_enc_$(echo "$enc" | tr 'A-Z' 'a-z')"
    psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" \
      -c "CREATE DATABASE $db ENCODING '$enc' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
    psql_idem -q -d "$db" -c "CREATE EXTENSION idem"
    got=$(run_checks "$db" "$key" | grep -v '^$' | grep -v '^SELECT\|^CREATE\|^BEGIN\|^COMMIT' | sed 's/^psql:[^ ]* //')
    if [ "$(echo "$got" | grep -v '^pg_sleep\|^$')" = "$expected" ]; then
      echo "ok: $path path, $enc database, key '$key'"
    else
      echo "FAIL: $path path, $enc database, key '$key':"
      diff <(echo "$expected") <(echo "$got") | sed 's/^/    /'
      fails=$((fails + 1))
    fi
    psql_idem -q -d postgres -c "DROP DATABASE $db WITH (FORCE)"
  done
done
echo "encodings failed: $fails"
[ "$fails" = 0 ]
