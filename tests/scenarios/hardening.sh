#!/usr/bin/env bash
# Hardening: session settings, encodings, catalog events, two-phase commit,
# hostile input, privileges and roles without them, the SQLSTATE table,
# dropped connections, random session sequences, both storage paths,
# transaction-id wraparound.
# One scenario per function: bash tests/scenarios/hardening.sh NAME (NAME: catalog_events, dropped_connection, encodings, environments, hostile_input, privileges, sessions_property, sqlstates, storage_sql, two_phase, wraparound);
# scripts/test.sh runs each as scenario/NAME (tests/lib/scenarios.sh).
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/scenarios.sh"

# Catalog events while sessions keep claiming (tests/stress/catalog_events.py):
# REINDEX [CONCURRENTLY], VACUUM FULL, CLUSTER, maintenance with a new width,
# DETACH/ATTACH by hand, ALTER EXTENSION UPDATE (from 0.2.0) and DROP +
# CREATE EXTENSION, each followed by every session claiming on; then every
# acknowledged claim replays and no key has two live claims. First, the
# updates from 0.2.0 and 0.3.0 (a new digest, the registry of TTL classes)
# with claims waiting on either side of their locks (--update-waits;
# storage_sql runs them on the SQL path).
old_versions() { # VERSION...: the old versions' install scripts, for ALTER EXTENSION UPDATE
  # (as tests/scenarios/packaging.sh upgrade does; only when they differ, as there)
  local v dest
  for v in "$@"; do
    dest="$("$PG_CONFIG" --sharedir)/extension/idem--$v.sql"
    cmp -s "$ROOT/tests/upgrade/idem--$v.sql" "$dest" || install -m 644 "$ROOT/tests/upgrade/idem--$v.sql" "$dest"
  done
}
scenario_catalog_events() {
bash "$ROOT/scripts/cluster.sh" start >/dev/null
db=idem_catalog_events
old_versions 0.2.0 0.3.0
psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
trap 'psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"' EXIT
"$IDEM_PY" "$ROOT/tests/stress/catalog_events.py" --dsn "host=$(cluster_dir) port=$IDEM_PORT user=postgres dbname=$db" \
  --update-waits 0.2.0 --update-waits 0.3.0 --old-version 0.2.0
}

# A dropped connection rolls its claim back: a client that claimed a key and
# then vanished (its backend terminated mid-transaction) leaves nothing, and
# a retry that was waiting for it gets the claim. Each step waits for the
# state it needs (as the server reports it); the loops' bounds only stop a hang.
scenario_dropped_connection() {
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
}

# Keys, business types, fingerprints, results and recovery points keep their
# exact bytes in every server encoding, on both storage paths: databases in
# UTF8, LATIN1, SQL_ASCII and EUC_JP, with non-ASCII keys sent by a UTF-8
# client. Claim, duplicate, lookup, finish, lease checkpoint and takeover,
# forget. (0.2.0: idem_forget('café') returned false in a LATIN1 database
# and the claim stayed; the SQL path refused every non-UTF8 database.)
scenario_encodings() {
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
}

# The pg_regress and isolation schedules again, in session environments a
# user may have: DateStyle, TimeZone (named and POSIX), abbreviation sets,
# IntervalStyle, default_transaction_isolation and a search_path with
# look-alike objects, on both storage paths. Expected output is the same
# files as the plain run: nothing idem stores or answers may depend on the
# session (tests print timestamps and intervals in fixed forms).
#
# pg_regress pins PGTZ, PGDATESTYLE and IntervalStyle for every psql it
# starts; a launcher script drops those and sets the environment below
# instead (PGOPTIONS), for every session of every test.
#
# The full product of the settings would take hours; each value appears in
# at least one environment (a covering subset), and the environments that
# broke 0.2.0 (Asia/Kolkata with Postgres style, the Australia abbreviation
# set) are among them:
#
#   name     DateStyle      TimeZone          abbreviations  IntervalStyle     isolation (*)    path    strings (**)
#   kolkata  Postgres, MDY  Asia/Kolkata      Default        sql_standard      read committed   direct  on
#   sydney   SQL, DMY       Australia/Sydney  Australia      iso_8601          repeatable read  direct  on
#   chatham  German         Pacific/Chatham   Default        postgres          serializable     direct  off
#   posix    ISO, DMY       IST-1 (POSIX)     Australia      postgres_verbose  read committed   sql     off
#
# (*) default_transaction_isolation, for the pg_regress schedule (see below).
# (**) standard_conforming_strings: SQL and PL/pgSQL bodies are parsed
# under the caller's setting, so with it off a plain literal's backslashes
# are escapes (idem_unguard, and the Citus uninstall trigger's patterns,
# once read '\x00' and '\s' so).
#
# Every environment also has search_path = public, idem_lookalike: a schema
# with tables and functions named like idem's own (claims, biz_types,
# key_hash, ...), which idem's SQL must never reach.
scenario_environments() {
source "$ROOT/tests/lib/suite.sh"
source "$ROOT/tests/lib/cluster.sh"
out="$IDEM_TARGET/test-out/environments"
rm -rf "$out"; mkdir -p "$out"

fails=0
passed=0
# (**) above, before anything runs: a body the matrix does not reach could
# still hold a plain literal with a backslash. None may (both editions'
# SQL; tests/lib/plain_literals.py says how it reads them).
if found=$(python3 "$ROOT/tests/lib/plain_literals.py"); then
  echo "ok: no plain '...' literal with a backslash in sql/*.sql, portable/*.sql"
else
  echo "FAIL: plain '...' literals with a backslash (write E'...' or avoid the backslash):"; echo "$found"
  fails=$((fails + 1))
fi

environments=(
  "kolkata|Postgres, MDY|Asia/Kolkata|Default|sql_standard|read committed|direct|on"
  "sydney|SQL, DMY|Australia/Sydney|Australia|iso_8601|repeatable read|direct|on"
  "chatham|German|Pacific/Chatham|Default|postgres|serializable|direct|off"
  "posix|ISO, DMY|IST-1|Australia|postgres_verbose|read committed|sql|off"
)
# PGOPTIONS: backslash-escaped spaces inside a value.
esc() { printf '%s' "$1" | sed 's/ /\\ /g'; }
# Each environment on a cluster of its own (a copy of this PostgreSQL's
# initdb, set as the suite's cluster is for the schedules: prepared
# transactions, its shared buffers; the storage path in its
# postgresql.conf), all four at once:
# the schedules wait much of their time (sleeps past TTLs and leases, lock
# waits), and the environments share nothing. Each writes its lines to
# $out/NAME.out, and a file per failed or passed suite, read below.
environment() { # name datestyle tz abbrevs intervalstyle isolation path strings
  local name=$1 datestyle=$2 tz=$3 abbrevs=$4 intervalstyle=$5 isolation=$6 path=$7 strings=$8 suite suites kind tool input schedule db ok bad
  trap pc_stop EXIT
  pc_init "$(cluster_dir)/env-$name" "$(major_port 5580)" "max_prepared_transactions = 10" "shared_buffers = 128MB" \
    "$([ "$path" = sql ] && echo "idem.storage_access = sql" || echo "# idem.storage_access: direct, the default")"
  pc_start
  launcher() { # file isolation
    cat > "$1" <<SH
#!/bin/sh
unset PGTZ PGDATESTYLE
export PGOPTIONS="-c DateStyle=$(esc "$datestyle") -c TimeZone=$(esc "$tz") -c timezone_abbreviations=$abbrevs -c IntervalStyle=$intervalstyle -c default_transaction_isolation=$(esc "$2") -c standard_conforming_strings=$strings -c search_path=public,idem_lookalike"
exec "\$@"
SH
    chmod 755 "$1"
  }
  # The default isolation level varies for the pg_regress schedule (one
  # session; a test that needs READ COMMITTED says so, as idem_maintain
  # does). The isolation specs set the level each session needs
  # (claim_read_committed, claim_repeatable_read and claim_serializable
  # cover all three), so they run with the default one.
  launcher "$out/launcher-$name-regress.sh" "$isolation"
  launcher "$out/launcher-$name-isolation.sh" "read committed"
  if [ "$path" = sql ]; then
    suites=("regress|regress|$ROOT/tests/pg_regress|$ROOT/tests/sql_access/regress_schedule"
            "isolation|isolation|$ROOT/tests/isolation|$ROOT/tests/sql_access/isolation_schedule")
  else
    suites=("regress|regress|$ROOT/tests/pg_regress|$ROOT/tests/pg_regress/schedule"
            "isolation|isolation|$ROOT/tests/isolation|$ROOT/tests/isolation/schedule")
  fi
  for suite in "${suites[@]}"; do
    IFS='|' read -r kind tool input schedule <<<"$suite"
    db="idem_env_${name}_$kind"
    pc_psql -q -d postgres -c "CREATE DATABASE $db"
    pc_psql -q -d "$db" <<'SQL'
SET client_min_messages = warning;
CREATE EXTENSION idem;
CREATE SCHEMA idem_lookalike;
CREATE TABLE idem_lookalike.claims (LIKE idem.claims);
CREATE TABLE idem_lookalike.biz_types (biz_type text, ttl interval, owner regrole);
INSERT INTO idem_lookalike.biz_types VALUES ('basic', '1 second', NULL);
CREATE FUNCTION idem_lookalike.key_hash(text, text) RETURNS bigint LANGUAGE sql AS 'SELECT 0::bigint';
CREATE FUNCTION idem_lookalike.check_name(text, text) RETURNS void LANGUAGE sql AS 'SELECT';
GRANT USAGE ON SCHEMA idem_lookalike TO PUBLIC;
SQL
    regress_run "$tool" "$PC_DIR" "$PC_PORT" "$db" "$input" "$out/$name-$kind" "$out/$name-$kind.log" \
      --schedule="$schedule" --launcher="$out/launcher-$name-$kind.sh" || true
    regress_results "$out/$name-$kind.log" > "$out/$name-$kind.results"
    ok=$(grep -c ' ok$' "$out/$name-$kind.results" || true)
    bad=$( (grep -v ' ok$' "$out/$name-$kind.results" || true) | cut -d' ' -f1 | tr '\n' ' ')
    echo "$ok" > "$out/$name-$kind.passed"
    if [ -n "$bad" ] || [ "$ok" = 0 ]; then
      echo "FAIL: $name ($datestyle; $tz; $abbrevs; $intervalstyle; $isolation; $path path; strings $strings) $kind: ${bad:-nothing ran}"
      [ -f "$out/$name-$kind/regression.diffs" ] && head -60 "$out/$name-$kind/regression.diffs"
      touch "$out/$name-$kind.failed"
    else
      echo "ok: $name ($datestyle; $tz; $abbrevs; $intervalstyle; $isolation; $path path; strings $strings) $kind: $ok tests"
    fi
    # (dropped at once: autovacuum would otherwise work through its tables meanwhile)
    pc_psql -q -d postgres -c "DROP DATABASE $db WITH (FORCE)"
  done
  # The Citus uninstall trigger's reading of DROP EXTENSION (it runs in the
  # dropping session, under its settings), without Citus: its patterns
  # alone, with standard_conforming_strings on and off (once, here).
  if [ "$name" = kolkata ]; then
    pc_psql -q -d postgres -c "CREATE DATABASE idem_env_strings"
    pc_psql -q -d idem_env_strings -c "SET client_min_messages = warning" -c "CREATE EXTENSION idem"
    for strings in on off; do
      got=$(PGOPTIONS="-c standard_conforming_strings=$strings -c escape_string_warning=off" pc_psql -At -d idem_env_strings -c \
        "SELECT idem.drops_idem('DROP EXTENSION idem CASCADE') AND idem.drops_idem('drop  extension if exists pg_x, idem') AND NOT idem.drops_idem('DROP EXTENSION idem_other')")
      if [ "$got" = t ]; then echo "ok: standard_conforming_strings=$strings: DROP EXTENSION idem is recognized"
      else echo "FAIL: standard_conforming_strings=$strings: DROP EXTENSION idem recognized: '$got', want t"; touch "$out/$name-strings-$strings.failed"; fi
    done
  fi
  pc_stop
  rm -rf "$PC_DIR"
}
pids=()
for env in "${environments[@]}"; do
  IFS='|' read -r name datestyle tz abbrevs intervalstyle isolation path strings <<<"$env"
  (environment "$name" "$datestyle" "$tz" "$abbrevs" "$intervalstyle" "$isolation" "$path" "$strings") > "$out/$name.out" 2>&1 &
  pids+=($!)
done
i=0
for env in "${environments[@]}"; do
  name=${env%%|*}
  wait "${pids[$i]}" || { echo "FAIL: environment $name stopped half-way (its output below)"; fails=$((fails + 1)); }
  i=$((i + 1))
  cat "$out/$name.out"
  for kind in regress isolation; do
    [ -f "$out/$name-$kind.passed" ] || { echo "FAIL: $name $kind: did not run"; fails=$((fails + 1)); continue; }
    passed=$((passed + $(cat "$out/$name-$kind.passed")))
  done
done
fails=$((fails + $(find "$out" -maxdepth 1 -name '*.failed' | wc -l)))
echo "environments: $passed test runs passed, $fails suites failed"
[ "$fails" = 0 ]
}

# Hostile input: property/fuzz tests over every idem function's arguments
# (tests/fuzz/hostile.py, hypothesis, derandomized), against the shared
# cluster, in a database of its own. Fails on any SQLSTATE README.md does
# not document, any storage change by an erroring call, any broken
# property, and any PANIC / crash / "terminated by signal" the server wrote
# to its log while the test ran.
scenario_hostile_input() {
db=hostile_fuzz
log="$(cluster_dir)/server.log"   # scripts/cluster.sh starts the server with -l this file
[ -f "$log" ] || { echo "server log $log not found" >&2; exit 1; }
[ -x "$IDEM_PY" ] || { echo "no venv python at $IDEM_PY (scripts/setup.sh --tool python)" >&2; exit 1; }

cleanup() { psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true; }
trap cleanup EXIT
cleanup
psql_idem -q -d postgres -c "CREATE DATABASE $db"
psql_idem -q -d $db -c "CREATE EXTENSION idem" -c "SELECT idem_maintain()" >/dev/null

log_from=$(stat -c %s "$log")
set +e
"$IDEM_PY" "$ROOT/tests/fuzz/hostile.py" --dsn "host=$(cluster_dir) port=$IDEM_PORT user=postgres dbname=$db"
rc=$?
set -e

# The server's log lines written during the run (by any session: a crash in
# this test shows as the postmaster's report of a terminated backend).
new_log=$(tail -c +"$((log_from + 1))" "$log")
bad=$(grep -E 'PANIC|terminated by signal|server process .* (was terminated|exited with exit code)|database system is in recovery mode|TRAP:' <<<"$new_log" || true)
echo "server log: $(wc -l <<<"$new_log") lines written during the run, $(grep -c . <<<"$bad" || true) crash lines"
if [ -n "$bad" ]; then
  echo "CRASH LINES IN THE SERVER LOG:"; head -20 <<<"$bad"
  rc=1
fi
psql_idem -q -d postgres -c "SELECT 1" >/dev/null || { echo "server not answering after the run"; rc=1; }
exit $rc
}

# Property test (tests/fuzz/sessions.py, hypothesis, derandomized): random
# sequences of claims, finishes, forgets and lookups through three sessions
# with random DateStyle / TimeZone / abbreviations / IntervalStyle and
# isolation levels, interleaved with catalog events (REINDEX CONCURRENTLY,
# VACUUM FULL, maintenance with a new width, DROP + CREATE EXTENSION); after
# every step no key has two live claims and every lookup equals the model.
# Both storage paths (the SQL path under READ COMMITTED only).
scenario_sessions_property() {
bash "$ROOT/scripts/cluster.sh" start >/dev/null
db=idem_sessions_property
dist=""
restore() {
  psql_idem -q -d postgres -c "LOAD 'idem'" -c "ALTER SYSTEM RESET idem.storage_access" -c "SELECT pg_reload_conf()" >/dev/null || true
  psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "DROP DATABASE IF EXISTS ${db}_portable WITH (FORCE)" || true
  rm -rf "${dist:-}"
}
trap restore EXIT
psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
dsn="host=$(cluster_dir) port=$IDEM_PORT user=postgres dbname=$db"
"$IDEM_PY" "$ROOT/tests/fuzz/sessions.py" --dsn "$dsn" --path direct --examples "${SESSIONS_EXAMPLES:-100}" --steps 40
psql_idem -q -d postgres -c "LOAD 'idem'" -c "ALTER SYSTEM SET idem.storage_access = 'sql'" -c "SELECT pg_reload_conf()" >/dev/null
"$IDEM_PY" "$ROOT/tests/fuzz/sessions.py" --dsn "$dsn" --path sql --examples "${SESSIONS_EXAMPLES:-60}" --steps 40
# The portable edition against the same model, in a database of its own
# (the plain script, generated from this checkout): the protocol written a
# second time in PL/pgSQL (docs/design.md §14).
psql_idem -q -d postgres -c "LOAD 'idem'" -c "ALTER SYSTEM RESET idem.storage_access" -c "SELECT pg_reload_conf()" >/dev/null
dist=$(mktemp -d /tmp/idem-sessions-portable.XXXXXX)
python3 "$ROOT/scripts/portable.py" --out "$dist" >/dev/null
psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS ${db}_portable WITH (FORCE)" -c "CREATE DATABASE ${db}_portable"
"$IDEM_PY" "$ROOT/tests/fuzz/sessions.py" --dsn "${dsn}_portable" --path portable --portable-dist "$dist" \
  --examples "${SESSIONS_EXAMPLES:-40}" --steps 40
}

# The README's SQLSTATE table against the code: every SQLSTATE idem raises
# itself (src/errors.rs, and ERRCODE in sql/*.sql) has a row, and every row
# is either raised by idem or is one of the PostgreSQL errors the table
# explains (waits, casts, privileges), listed below with the reason. A code
# added to the code without a README row, or a row left behind, fails here.
scenario_sqlstates() {
python3 - "$ROOT" <<'PY'
import glob, re, sys
root = sys.argv[1]
readme = open(f"{root}/README.md", encoding="utf-8").read()
table = readme[readme.index("### SQLSTATEs"):]
table = table[:table.index("\n\n", table.index("| SQLSTATE |"))]
documented = set()
for line in table.splitlines():
    if line.startswith("| `"):
        documented.update(re.findall(r"`([0-9A-Z]{5})`", line.split("|")[1]))
raised = {}
errors_rs = open(f"{root}/src/errors.rs", encoding="utf-8").read()
for code in re.findall(r'=> b"([0-9A-Z]{5})"', errors_rs):
    raised.setdefault(code, set()).add("src/errors.rs")
for path in glob.glob(f"{root}/sql/*.sql"):
    if re.search(r"idem--[0-9.]+--", path):
        continue  # upgrade scripts restate what the install scripts raise
    for code in re.findall(r"ERRCODE\s*=\s*'([0-9A-Z]{5})'", open(path, encoding="utf-8").read()):
        raised.setdefault(code, set()).add(path[len(root) + 1:])
# Raised by PostgreSQL inside idem's calls, and documented on purpose.
by_postgres = {
    "40P01": "deadlock detector, waiting for another claimer",
    "55P03": "lock_timeout while waiting for another claimer",
    "57014": "statement_timeout while waiting for another claimer",
    "53200": "the lock table, SQL path",
    "22P02": "idem_transition's cast of id / to_state",
    "22003": "idem_transition's cast of id / to_state",
    "42501": "privilege checks on idem's functions and schema",
}
missing = sorted(set(raised) - documented)
stale = sorted(documented - set(raised) - set(by_postgres))
for code in missing:
    print(f"FAIL: {code} is raised by {', '.join(sorted(raised[code]))} but has no row in the README's SQLSTATE table")
for code in stale:
    print(f"FAIL: the README's SQLSTATE table lists {code}, which nothing raises")
print(f"README rows: {len(documented)} SQLSTATEs; raised by idem: {len(raised)}; by PostgreSQL, documented: {len(by_postgres)}")
sys.exit(1 if missing or stale else 0)
PY
}

# idem.storage_access = sql: the claim path that reaches idem.claims through
# SQL on the logical table (src/storage/sql.rs; a Citus-distributed
# idem.claims never takes it: storage/citus.rs reaches the shard directly), run
# against its own small cluster configured with it. The pg_regress and
# isolation tests listed in tests/sql_access/*schedule run unchanged against
# their usual expected output (tests/pg_regress, tests/isolation), so both
# paths must answer alike; tests/sql_access/ adds what differs (REPEATABLE
# READ is refused with 0A000; the key lock is held to the end). Then the
# updates with claims waiting on them (catalog_events' first part).
scenario_storage_sql() {
source "$ROOT/tests/lib/cluster.sh"
PORT=5541
out="$IDEM_TARGET/test-out/sql_access"
trap pc_stop EXIT
rm -rf "$out"
mkdir -p "$out"
pc_init "$(cluster_dir)/sqlpath" "$PORT" \
  "max_prepared_transactions = 10" \
  "idem.storage_access = sql"
pc_start
dir=$PC_DIR
psql_sql() { pc_psql -q "$@"; }

fails=0
source "$ROOT/tests/lib/suite.sh"
run() { # name kind db schedule inputdir [psql setup]
  local name=$1 kind=$2 db=$3 schedule=$4 input=$5
  shift 5
  psql_sql -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
  [ $# -gt 0 ] && psql_sql -d "$db" "$@"
  if ! regress_run "$kind" "$dir" "$PORT" "$db" "$input" "$out/$name" "$out/$name.log" --schedule="$schedule"; then
    fails=$((fails + 1))
    regress_diffs "$out/$name" 150
  fi
  regress_results "$out/$name.log" | grep . || cat "$out/$name.log"
}
run regress regress idem_regress "$ROOT/tests/sql_access/regress_schedule" "$ROOT/tests/pg_regress"
run isolation isolation idem_isolation "$ROOT/tests/sql_access/isolation_schedule" \
  "$ROOT/tests/isolation" -c "CREATE EXTENSION idem"
run sql_only isolation idem_isolation "$ROOT/tests/sql_access/schedule" \
  "$ROOT/tests/sql_access" -c "CREATE EXTENSION idem"
# The updates from 0.2.0 and 0.3.0 with claims waiting on either side of
# their locks (tests/stress/catalog_events.py --update-waits; catalog_events
# runs them on the direct path).
old_versions 0.2.0 0.3.0
psql_sql -d postgres -c "DROP DATABASE IF EXISTS idem_update_waits WITH (FORCE)" -c "CREATE DATABASE idem_update_waits"
"$IDEM_PY" "$ROOT/tests/stress/catalog_events.py" --dsn "host=$dir port=$PORT user=postgres dbname=idem_update_waits" \
  --update-waits 0.2.0 --update-waits 0.3.0 --no-events || fails=$((fails + 1))
# Databases in other encodings: tests/scenarios/hardening.sh encodings, on both paths.
echo "storage_access=sql suites failed: $fails"
[ "$fails" = 0 ]
}

# A claim in a prepared transaction (two-phase commit, as transaction
# managers and Citus use it) blocks a waiting duplicate until COMMIT
# PREPARED or ROLLBACK PREPARED, issued from another session, decides it;
# the duplicate then gets the outcome, or claims. The isolation spec
# claim_two_phase covers the non-waiting answers (isolationtester cannot
# see a wait for a prepared transaction); this one waits, and sees the
# wait in pg_stat_activity. Both storage paths.
scenario_two_phase() {
bash "$ROOT/scripts/cluster.sh" start >/dev/null
db=idem_two_phase
psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
psql_idem -q -d "$db" -c "CREATE EXTENSION idem"
cleanup() {
  psql_idem -q -d "$db" -c "ROLLBACK PREPARED 'idem_tp'" >/dev/null 2>&1 || true
  psql_idem -q -d postgres -c "LOAD 'idem'" -c "ALTER SYSTEM RESET idem.storage_access" -c "SELECT pg_reload_conf()" >/dev/null
}
trap cleanup EXIT
fails=0

# waiter KEY: a duplicate claim in the background, tagged by application_name.
waiter() {
  PGAPPNAME=idem_tp_waiter psql_idem -At -d "$db" -c "SELECT claimed || '|' || state || '|' || coalesce(result::text, '') FROM idem_claim('$1', 'tp')" > "$out" 2>&1 &
  wpid=$!
}
# Until the waiter reports waiting for a lock (a state the server reports;
# the loop's bound only stops a hang).
wait_blocked() {
  for _ in $(seq 1 300); do
    ev=$(psql_idem -At -d "$db" -c "SELECT wait_event_type || '/' || wait_event FROM pg_stat_activity WHERE application_name = 'idem_tp_waiter' AND state = 'active'")
    case "$ev" in Lock/*) echo "$ev"; return 0 ;; esac
    sleep 0.05
  done
  echo "never blocked"; return 1
}
out=$(mktemp)

for path in direct sql; do
  psql_idem -q -d postgres -c "LOAD 'idem'" -c "ALTER SYSTEM SET idem.storage_access = '$path'" -c "SELECT pg_reload_conf()" >/dev/null
  for decision in COMMIT ROLLBACK; do
    key="k-$path-$decision"
    psql_idem -q -d "$db" >/dev/null <<SQL
BEGIN;
SELECT idem_claim('$key', 'tp');
SELECT idem_complete('$key', 'tp', '{"by": "prepared"}');
PREPARE TRANSACTION 'idem_tp';
SQL
    waiter "$key"
    ev=$(wait_blocked)
    psql_idem -q -d "$db" -c "$decision PREPARED 'idem_tp'"
    wait "$wpid"
    got=$(cat "$out")
    want='false|completed|{"by": "prepared"}'; [ "$decision" = ROLLBACK ] && want='true|new|'
    if [ "$got" = "$want" ] && [[ "$ev" == Lock/* ]]; then
      echo "ok: $path path: the duplicate waited ($ev) for the prepared claim; after $decision PREPARED: $got"
    else
      echo "FAIL: $path path, $decision PREPARED: waited: $ev; duplicate got '$got', want '$want'"
      fails=$((fails + 1))
    fi
  done
done
rm -f "$out"
echo "two-phase checks failed: $fails"
[ "$fails" = 0 ]
}

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
scenario_wraparound() {
source "$ROOT/tests/lib/scenarios.sh"
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
}

# Privileges, as an operator would set them up, with real login roles:
#  A. the default install (CREATE EXTENSION idem in public): every SECURITY
#     DEFINER function pins search_path; the admin functions (idem_forget,
#     idem_configure, idem_maintain, idem_define_machine) are not executable
#     by PUBLIC, and a role without grants cannot use them to block claims or
#     loosen another role's guard;
#  B. the hardened install (extension in its own schema, EXECUTE revoked
#     from PUBLIC, an idem_user role granted what applications need, an
#     idem_admin role for operators): a member of idem_user can claim,
#     complete, fail, look up, lease and checkpoint, spend tokens, transition
#     and guard its own tables, and cannot touch storage or call the admin
#     functions; a member of idem_admin can;
#  C. malicious objects on the caller's search_path (tables named like
#     idem's, temp tables shadowing catalogs, functions and operators named
#     like those idem uses, placed before pg_catalog) are never used by idem.
# Roles are cluster-wide, so they carry this test's prefix.
scenario_privileges() {
dba=hostile_priv_default; dbb=hostile_priv_hard
R_USER=hostile_idem_user; R_ADMIN=hostile_idem_admin
APP=hostile_app; OTHER=hostile_other; OPS=hostile_ops; CLERK=hostile_clerk

cleanup() {
  for db in $dba $dbb; do psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true; done
  for r in $APP $OTHER $OPS $CLERK $R_USER $R_ADMIN; do psql_idem -q -d postgres -c "DROP ROLE IF EXISTS $r" >/dev/null 2>&1 || true; done
}
trap cleanup EXIT
cleanup

pass=0; fail=0; failures=()
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); failures+=("$1"); echo "  FAIL: $1"; }

# as ROLE DB SQL -> prints "ok" or the SQLSTATE of the first error
as() {
  local role=$1 db=$2 sql=$3 out
  out=$("$PG_BIN/psql" -X -At -h "$(cluster_dir)" -p "$IDEM_PORT" -U "$role" -d "$db" \
          -v ON_ERROR_STOP=1 -v VERBOSITY=sqlstate -c "\\set VERBOSITY sqlstate" -c "$sql" 2>&1) && { echo ok; return; }
  sed -n 's/^ERROR:  \([0-9A-Z]\{5\}\).*/\1/p' <<<"$out" | sed -n 1p | grep . || echo "??? $out"
}
# expect WHAT ROLE DB SQL: WHAT is ok or a SQLSTATE
expect() {
  local want=$1 role=$2 db=$3 sql=$4 got
  got=$(as "$role" "$db" "$sql")
  if [ "$got" = "$want" ]; then ok; else bad "as $role: $sql -> $got (expected $want)"; fi
}

for r in $R_USER $R_ADMIN; do psql_idem -q -d postgres -c "CREATE ROLE $r NOLOGIN"; done
for r in $APP $OTHER $OPS $CLERK; do psql_idem -q -d postgres -c "CREATE ROLE $r LOGIN"; done
for db in $dba $dbb; do psql_idem -q -d postgres -c "CREATE DATABASE $db"; done

# ------------------------------------------------------------------ A
say "A. default install"
psql_idem -q -d $dba -c "CREATE EXTENSION idem" -c "SELECT idem_maintain()" >/dev/null
psql_idem -q -d $dba -c "GRANT CREATE ON SCHEMA public TO $APP"

echo "  functions of the extension (pg_depend): security definer, proconfig, PUBLIC execute"
psql_idem -d $dba -c "
  SELECT p.oid::regprocedure AS function, p.prosecdef AS definer, p.proconfig,
         has_function_privilege('public', p.oid, 'EXECUTE') AS public_exec
    FROM pg_proc p JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
    JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idem' ORDER BY p.prosecdef DESC, 1::text" | sed 's/^/    /'
# Every SECURITY DEFINER function sets search_path to pg_catalog (and
# pg_temp, last) and nothing else.
unpinned=$(psql_idem -d $dba -At -c "
  SELECT string_agg(p.oid::regprocedure::text, ', ')
    FROM pg_proc p JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
    JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idem'
   WHERE p.prosecdef
     AND NOT coalesce((SELECT bool_or(c ~ '^search_path=(\"?pg_catalog\"?)(, *\"?pg_temp\"?)?$') FROM unnest(p.proconfig) c), false)")
ndef=$(psql_idem -d $dba -At -c "
  SELECT count(*) FROM pg_proc p JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
    JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idem' WHERE p.prosecdef")
[ -z "$unpinned" ] && ok || bad "SECURITY DEFINER functions without a pinned search_path: $unpinned"
echo "  $ndef SECURITY DEFINER functions; without search_path = pg_catalog[, pg_temp]: ${unpinned:-none}"

for f in "idem_forget(text,text)" "idem_configure(text,interval)" "idem_maintain()" "idem_define_machine(text,jsonb)"; do
  v=$(psql_idem -d $dba -At -c "SELECT has_function_privilege('public', '$f', 'EXECUTE')")
  [ "$v" = f ] && ok || bad "admin function $f is executable by PUBLIC"
done
expect 42501 $OTHER $dba "SELECT idem_forget('k', 'pay')"
expect 42501 $OTHER $dba "SELECT idem_configure('pay', '1 hour')"
expect 42501 $OTHER $dba "SELECT idem_maintain()"
expect 42501 $OTHER $dba "SELECT idem_define_machine('hostile.any', '{\"A\":[\"B\"]}')"

# What PUBLIC's EXECUTE on idem_maintain allows: a role with no grant at all
# takes idem.claims' ACCESS EXCLUSIVE lock (it needs only some work to do,
# which raising its own idem.default_ttl provides) and holds it as long as
# its transaction stays open; every claim in the database waits meanwhile.
(PGAPPNAME=idem_priv_holder as $OTHER $dba "BEGIN; SET LOCAL idem.default_ttl = '400 days'; SELECT idem_maintain(); SELECT pg_sleep(3); COMMIT" >/tmp/hostile_priv_hold.$$ 2>&1) &
holder=$!
# The claim below runs once the holder is either gone (refused) or sleeping
# inside its transaction (holding whatever idem_maintain took).
for _ in $(seq 1 1200); do
  kill -0 $holder 2>/dev/null || break
  [ "$(psql_idem -d $dba -Atc "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'idem_priv_holder' AND query LIKE '%pg_sleep%'")" = 1 ] && break
  sleep 0.1
done
got=$(as $APP $dba "SET lock_timeout = '500ms'; SELECT idem_claim('blocked?', 'hostile.pay')")
wait $holder || true
held=$(cat /tmp/hostile_priv_hold.$$); rm -f /tmp/hostile_priv_hold.$$
echo "  a role without grants ran idem_maintain in an open transaction: '$held'; a claim meanwhile: $got"
[ "$got" = ok ] && ok || bad "a role without grants blocked claims through idem_maintain (claim got $got while it held its transaction open)"
parts=$(psql_idem -d $dba -At -c "SELECT count(*) FROM idem_partitions")
echo "  partitions of idem.claims now: $parts"

# What PUBLIC's EXECUTE on idem_define_machine allows: APP guards its table
# with machine hostile.order; OTHER, which has no right on APP's table,
# redefines the machine, and the guard lets an illegal update through.
expect ok postgres $dba "SELECT idem_define_machine('hostile.order', '{\"CREATED\":[\"PAID\"],\"PAID\":[\"SHIPPED\"]}')"
expect ok $APP $dba "CREATE TABLE app_orders (id int PRIMARY KEY, status text); INSERT INTO app_orders VALUES (1, 'SHIPPED');
                     SELECT idem_guard('app_orders', 'status', 'hostile.order')"
expect ID002 $APP $dba "UPDATE app_orders SET status = 'CREATED' WHERE id = 1"
as $OTHER $dba "SELECT idem_define_machine('hostile.order', '{\"SHIPPED\":[\"CREATED\"]}')" >/dev/null
expect ID002 $APP $dba "UPDATE app_orders SET status = 'CREATED' WHERE id = 1"

# ------------------------------------------------------------------ B
say "B. hardened install: schema idemapi, EXECUTE revoked from PUBLIC, roles $R_USER and $R_ADMIN"
# The grant SQL the README should show (role names prefixed here).
psql_idem -q -d $dbb >/dev/null <<SQL
CREATE SCHEMA idemapi;
CREATE EXTENSION idem SCHEMA idemapi;
SELECT idemapi.idem_maintain();
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA idemapi FROM PUBLIC;

GRANT USAGE ON SCHEMA idemapi TO $R_USER;
GRANT EXECUTE ON FUNCTION
    idemapi.idem_claim(text, text, interval, text, boolean, interval),
    idemapi.idem_complete(text, text, jsonb, text),
    idemapi.idem_fail(text, text, jsonb, text),
    idemapi.idem_checkpoint(text, text, text, jsonb, text),
    idemapi.idem_checkpoint(text, text, text, jsonb, text, boolean),
    idemapi.idem_lookup(text, text),
    idemapi.idem_issue_token(text, interval),
    idemapi.idem_consume_token(text, text),
    idemapi.idem_machine(text, text),
    idemapi.idem_classify_transition(text, text, text),
    idemapi.idem_transition(regclass, name, text, name, text, text, name, bigint),
    idemapi.idem_guard(regclass, name, text),
    idemapi.idem_unguard(regclass, name),
    idemapi.idem_guard_trigger()
  TO $R_USER;

GRANT $R_USER TO $R_ADMIN;
GRANT EXECUTE ON FUNCTION
    idemapi.idem_forget(text, text),
    idemapi.idem_configure(text, interval),
    idemapi.idem_configure(text, interval, text),
    idemapi.idem_configure(text, interval, text, text),
    idemapi.idem_define_machine(text, jsonb),
    idemapi.idem_maintain(),
    idemapi.idem_schedule_maintenance(text)
  TO $R_ADMIN;
GRANT SELECT ON idemapi.idem_stats, idemapi.idem_partitions TO $R_ADMIN;

GRANT $R_USER TO $APP;
GRANT $R_ADMIN TO $OPS;
ALTER DATABASE $dbb SET search_path = "\$user", public, idemapi;
GRANT CREATE ON SCHEMA public TO $APP;
SQL
expect ok $OPS $dbb "SELECT idem_define_machine('hostile.order', '{\"CREATED\":[\"PAID\",\"CANCELLED\"],\"PAID\":[\"SHIPPED\"]}')"

echo "  $APP (member of $R_USER): the application's calls"
expect ok $APP $dbb "BEGIN; SELECT idem_claim('p1', 'hostile.pay'); SELECT idem_complete('p1', 'hostile.pay', '{\"ok\":1}'); COMMIT"
expect ok $APP $dbb "SELECT 1/count(*) FROM idem_claim('p1', 'hostile.pay') WHERE NOT claimed AND state = 'completed' AND result = '{\"ok\":1}'"
expect ok $APP $dbb "BEGIN; SELECT idem_claim('p2', 'hostile.pay', ttl => '1 hour', fingerprint => 'f'); SELECT idem_fail('p2', 'hostile.pay', '{\"e\":1}'); COMMIT"
expect ok $APP $dbb "SELECT 1/count(*) FROM idem_lookup('p2', 'hostile.pay') WHERE state = 'failed'"
expect ID001 $APP $dbb "SELECT idem_claim('p2', 'hostile.pay', fingerprint => 'g')"
expect ok $APP $dbb "SELECT idem_claim('l1', 'hostile.job', lease => '1 minute');
                     SELECT idem_checkpoint('l1', 'hostile.job', 'step1', '{\"n\":1}');
                     SELECT idem_complete('l1', 'hostile.job')"
expect ok $APP $dbb "SELECT 1/count(*) FROM idem_consume_token(idem_issue_token('hostile.form'), 'hostile.form') t WHERE t"
expect ok $APP $dbb "CREATE TABLE orders (id int PRIMARY KEY, status text); INSERT INTO orders VALUES (1, 'CREATED'), (2, 'CREATED');
                     SELECT 1/count(*) FROM idem_transition('orders', 'id', '1', 'status', 'PAID', 'hostile.order') r WHERE r = 'applied'"
expect ok $APP $dbb "SELECT 1/count(*) FROM idem_transition('orders', 'id', '1', 'status', 'PAID', 'hostile.order') r WHERE r = 'already'"
expect ok $APP $dbb "SELECT 1/count(*) FROM idem_classify_transition('hostile.order', 'PAID', 'CREATED') r WHERE r = 'stale'"
expect ok $APP $dbb "SELECT idem_guard('orders', 'status', 'hostile.order')"
expect ID002 $APP $dbb "UPDATE orders SET status = 'CREATED' WHERE id = 1"
expect ok $APP $dbb "UPDATE orders SET status = 'SHIPPED' WHERE id = 1"
expect ID002 $APP $dbb "UPDATE orders SET status = 'SHIPPED' WHERE id = 2"

echo "  $APP: storage and admin functions refused"
for t in idem.claims idem.claims_default idem.biz_types idem.tokens idem.machines idem.maintenance_runs; do
  expect 42501 $APP $dbb "SELECT count(*) FROM $t"
  expect 42501 $APP $dbb "DELETE FROM $t"
done
expect 42501 $APP $dbb "INSERT INTO idem.claims (expires_at, claimed_at, state, biz_type, key) VALUES (now() + interval '1 hour', now(), 'c', 'hostile.pay', 'forged')"
expect 42501 $APP $dbb "UPDATE idem.machines SET transitions = '{\"SHIPPED\":[\"CREATED\"]}'"
expect 42501 $APP $dbb "SELECT idem.key_hash('hostile.pay', 'p1')"
expect 42501 $APP $dbb "SELECT idem.random_token()"
expect 42501 $APP $dbb "CREATE TABLE idem.forged (x int)"
expect 42501 $APP $dbb "SELECT idem_forget('p1', 'hostile.pay')"
expect 42501 $APP $dbb "SELECT idem_configure('hostile.pay', '1 hour')"
expect 42501 $APP $dbb "SELECT idem_maintain()"
expect 42501 $APP $dbb "SELECT idem_define_machine('hostile.order', '{\"SHIPPED\":[\"CREATED\"]}')"
expect 42501 $APP $dbb "SELECT idem_schedule_maintenance()"
expect 42501 $APP $dbb "SELECT * FROM idem_stats"
expect 42501 $APP $dbb "SELECT * FROM idem_partitions"
echo "  $OTHER (no grants): nothing"
expect 42883 $OTHER $dbb "SELECT idem_claim('o1', 'hostile.pay')"   # no USAGE on idemapi: not even found
expect 42501 $OTHER $dbb "SELECT idemapi.idem_lookup('p1', 'hostile.pay')"
echo "  $OPS (member of $R_ADMIN): the operator's calls"
expect ok $OPS $dbb "SELECT idem_configure('hostile.pay', '2 days')"
expect ok $OPS $dbb "SELECT 1/count(*) FROM idem_forget('p1', 'hostile.pay') f WHERE f"
expect ok $OPS $dbb "SELECT idem_maintain()"
expect ok $OPS $dbb "SELECT count(*) FROM idem_stats; SELECT count(*) FROM idem_partitions"
expect ok $OPS $dbb "BEGIN; SELECT 1/count(*) FROM idem_claim('p1', 'hostile.pay') WHERE claimed; ROLLBACK"
expect 55000 $OPS $dbb "SELECT idem_schedule_maintenance()"   # pg_cron is not in this database
expect 42501 $OPS $dbb "SELECT count(*) FROM idem.claims"     # even operators go through the API

# A role that may update a guarded table but holds no idem grant: the guard
# fails closed (the trigger's check needs EXECUTE and schema USAGE).
expect ok $APP $dbb "GRANT SELECT, UPDATE ON orders TO $CLERK"
got=$(as $CLERK $dbb "UPDATE orders SET status = 'PAID' WHERE id = 2")
echo "  $CLERK (UPDATE on a guarded table, no idem grant): a legal UPDATE gets $got"
[ "$got" = 42501 ] && ok || bad "clerk's update through the guard: $got (expected 42501: the guard fails closed)"
psql_idem -q -d $dbb -c "GRANT $R_USER TO $CLERK"
expect ok $CLERK $dbb "UPDATE orders SET status = 'PAID' WHERE id = 2"
expect ID002 $CLERK $dbb "UPDATE orders SET status = 'CREATED' WHERE id = 2"

# ------------------------------------------------------------------ C
say "C. malicious objects on the caller's search_path"
# APP owns schema evil: tables named like idem's storage, functions and
# operators named like those idem's code uses, each recording its call. It
# puts evil (and its temp schema, for relations) before pg_catalog.
psql_idem -q -d $dbb -c "CREATE SCHEMA evil AUTHORIZATION $APP"
"$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$(cluster_dir)" -p "$IDEM_PORT" -U $APP -d $dbb <<'SQL'
CREATE TABLE evil.calls (what text, ran_as name, at timestamptz DEFAULT clock_timestamp());
GRANT ALL ON SCHEMA evil TO PUBLIC;
GRANT INSERT, SELECT ON evil.calls TO PUBLIC;
CREATE TABLE evil.claims (LIKE orders);  CREATE TABLE evil.machines (name text, transitions jsonb, reachable jsonb);
CREATE TABLE evil.tokens (x int);  CREATE TABLE evil.biz_types (biz_type text, ttl interval);
CREATE TABLE evil.pg_attribute (x int); CREATE TABLE evil.pg_trigger (x int); CREATE TABLE evil.pg_index (x int);
INSERT INTO evil.machines VALUES ('hostile.order', '{"SHIPPED":["CREATED"]}', '{"SHIPPED":["CREATED"],"CREATED":[]}');
CREATE FUNCTION evil.log(w text) RETURNS void LANGUAGE sql AS $$ INSERT INTO evil.calls (what, ran_as) VALUES (w, current_user) $$;
CREATE FUNCTION evil.idem_machine(name text, state text DEFAULT NULL) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN PERFORM evil.log('idem_machine'); RETURN '{"transitions":{"SHIPPED":["CREATED"]},"reachable":{"SHIPPED":["CREATED"],"CREATED":[]}}'; END $$;
CREATE FUNCTION evil.idem_classify_transition(m text, f text, t text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM evil.log('idem_classify_transition'); RETURN 'allowed'; END $$;
CREATE FUNCTION evil.check_name(w text, v text) RETURNS void LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.log('check_name'); END $$;
CREATE FUNCTION evil.random_token() RETURNS text LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.log('random_token'); RETURN 'predictable'; END $$;
CREATE FUNCTION evil.sha256(bytea) RETURNS bytea LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.log('sha256'); RETURN '\x00'; END $$;
CREATE FUNCTION evil.convert_to(text, name) RETURNS bytea LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.log('convert_to'); RETURN '\x00'; END $$;
CREATE FUNCTION evil.clock_timestamp() RETURNS timestamptz LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.log('clock_timestamp'); RETURN '2000-01-01'; END $$;
CREATE FUNCTION evil.format_type(oid, integer) RETURNS text LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.log('format_type'); RETURN 'text'; END $$;
CREATE FUNCTION evil.jsonb_typeof(jsonb) RETURNS text LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.log('jsonb_typeof'); RETURN 'object'; END $$;
CREATE FUNCTION evil.texteq(a text, b text) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.log('= (text,text)'); RETURN a OPERATOR(pg_catalog.=) b; END $$;
CREATE FUNCTION evil.textne(a text, b text) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.log('<> (text,text)'); RETURN a OPERATOR(pg_catalog.<>) b; END $$;
CREATE FUNCTION evil.byteaeq(a bytea, b bytea) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.log('= (bytea,bytea)'); RETURN true; END $$;
CREATE FUNCTION evil.jsonb_exists(a jsonb, b text) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.log('? (jsonb,text)'); RETURN true; END $$;
CREATE FUNCTION evil.tsgt(a timestamptz, b timestamptz) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.log('> (timestamptz)'); RETURN true; END $$;
CREATE FUNCTION evil.ivlt(a interval, b interval) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.log('< (interval)'); RETURN false; END $$;
CREATE OPERATOR evil.=  (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.texteq);
CREATE OPERATOR evil.<> (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.textne);
CREATE OPERATOR evil.=  (LEFTARG = bytea, RIGHTARG = bytea, FUNCTION = evil.byteaeq);
CREATE OPERATOR evil.?  (LEFTARG = jsonb, RIGHTARG = text, FUNCTION = evil.jsonb_exists);
CREATE OPERATOR evil.>  (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil.tsgt);
CREATE OPERATOR evil.<  (LEFTARG = interval, RIGHTARG = interval, FUNCTION = evil.ivlt);
CREATE TABLE evil_orders (id int PRIMARY KEY, status text);
INSERT INTO evil_orders VALUES (1, 'SHIPPED'), (2, 'CREATED');
SQL
# Each line: expected outcome, role, SQL run with evil first on the path
# (and temp tables shadowing idem's and the catalogs' names).
EVIL_PATH="SET search_path = evil, pg_catalog, public, idemapi;
  CREATE TEMP TABLE IF NOT EXISTS claims (x int); CREATE TEMP TABLE IF NOT EXISTS machines (x int);
  CREATE TEMP TABLE IF NOT EXISTS pg_attribute (x int); CREATE TEMP TABLE IF NOT EXISTS pg_trigger (x int);"
evil() { expect "$1" "$2" $dbb "$EVIL_PATH $3"; }
evil ok    $APP "BEGIN; SELECT idem_claim('e1', 'hostile.evil'); SELECT idem_complete('e1', 'hostile.evil', '{\"v\":1}'); COMMIT"
evil ok    $APP "SELECT 1/count(*) FROM idemapi.idem_claim('e1', 'hostile.evil') WHERE NOT claimed AND state OPERATOR(pg_catalog.=) 'completed'"
evil ok    $APP "SELECT idem_claim('e2', 'hostile.evil', lease => '1 minute'); SELECT idem_checkpoint('e2', 'hostile.evil', 'p'); SELECT idem_fail('e2', 'hostile.evil', '{}')"
evil ok    $APP "SELECT 1/count(*) FROM idem_lookup('e2', 'hostile.evil') WHERE state OPERATOR(pg_catalog.=) 'failed'"
evil ok    $APP "SELECT 1/count(*) FROM idem_consume_token(idem_issue_token('hostile.evil'), 'hostile.evil') t WHERE t"
evil ok    $APP "SELECT 1/(1 OPERATOR(pg_catalog.-) count(*)) FROM idem_consume_token('predictable', 'hostile.evil') t WHERE t"
evil ok    $APP "SELECT 1/count(*) FROM idem_transition('evil_orders', 'id', '1', 'status', 'CREATED', 'hostile.order') r WHERE r OPERATOR(pg_catalog.=) 'stale'"
evil ID002 $APP "SELECT idem_transition('evil_orders', 'id', '1', 'status', 'CANCELLED', 'hostile.order')"
evil ok    $APP "SELECT 1/count(*) FROM idem_transition('evil_orders', 'id', '2', 'status', 'PAID', 'hostile.order') r WHERE r OPERATOR(pg_catalog.=) 'applied'"
evil ok    $APP "SELECT idem_guard('evil_orders', 'status', 'hostile.order')"
evil ID002 $APP "UPDATE evil_orders SET status = 'CREATED' WHERE id = 1"
evil 22023 $APP "SELECT idemapi.idem_classify_transition('hostile.nosuch', 'A', 'B')"
evil ok    $APP "SELECT 1/count(*) FROM idemapi.idem_classify_transition('hostile.order', 'SHIPPED', 'CREATED') r WHERE r OPERATOR(pg_catalog.=) 'stale'"
evil ok    $OPS "SELECT idem_define_machine('hostile.evil', '{\"A\":[\"B\"]}')"
evil ok    $OPS "SELECT idem_maintain()"
evil ok    $OPS "SELECT idem_configure('hostile.evil', '1 hour')"
evil ok    $OPS "SELECT idem_forget('e1', 'hostile.evil')"
calls=$(psql_idem -d $dbb -At -c "SELECT coalesce(string_agg(DISTINCT what || ' as ' || ran_as, '; '), '') FROM evil.calls")
rows=$(psql_idem -d $dbb -At -c "SELECT (SELECT count(*) FROM evil.claims) + (SELECT count(*) FROM evil.tokens) + (SELECT count(*) FROM evil.biz_types) + (SELECT count(*) FROM evil.machines) - 1")
echo "  shadowing objects called: ${calls:-none}; rows written to evil tables: $rows"
[ -z "$calls" ] && ok || bad "idem called objects from the caller's search_path: $calls"
[ "$rows" = 0 ] && ok || bad "idem wrote $rows rows into the caller's look-alike tables"

echo
echo "privileges: $pass passed, $fail failed"
if [ $fail -gt 0 ]; then printf '  - %s\n' "${failures[@]}"; exit 1; fi
}

scenario_main "$@"
