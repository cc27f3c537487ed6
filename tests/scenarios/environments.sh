#!/usr/bin/env bash
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
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/regress.sh"
bash "$ROOT/scripts/cluster.sh" start >/dev/null
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
restore() {
  psql_idem -q -d postgres -c "LOAD 'idem'" -c "ALTER SYSTEM RESET idem.storage_access" -c "SELECT pg_reload_conf()" >/dev/null
}
trap restore EXIT

environments=(
  "kolkata|Postgres, MDY|Asia/Kolkata|Default|sql_standard|read committed|direct|on"
  "sydney|SQL, DMY|Australia/Sydney|Australia|iso_8601|repeatable read|direct|on"
  "chatham|German|Pacific/Chatham|Default|postgres|serializable|direct|off"
  "posix|ISO, DMY|IST-1|Australia|postgres_verbose|read committed|sql|off"
)

for env in "${environments[@]}"; do
  IFS='|' read -r name datestyle tz abbrevs intervalstyle isolation path strings <<<"$env"
  if [ "$path" = sql ]; then set_path="ALTER SYSTEM SET idem.storage_access = 'sql'"; else set_path="ALTER SYSTEM RESET idem.storage_access"; fi
  psql_idem -q -d postgres -c "LOAD 'idem'" -c "$set_path" -c "SELECT pg_reload_conf()" >/dev/null
  # PGOPTIONS: backslash-escaped spaces inside a value.
  esc() { printf '%s' "$1" | sed 's/ /\\ /g'; }
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
    psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
    psql_idem -q -d "$db" <<'SQL'
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
    regress_run "$tool" "$(cluster_dir)" "$IDEM_PORT" "$db" "$input" "$out/$name-$kind" "$out/$name-$kind.log" \
      --schedule="$schedule" --launcher="$out/launcher-$name-$kind.sh" || true
    regress_results "$out/$name-$kind.log" > "$out/$name-$kind.results"
    ok=$(grep -c ' ok$' "$out/$name-$kind.results" || true)
    bad=$( (grep -v ' ok$' "$out/$name-$kind.results" || true) | cut -d' ' -f1 | tr '\n' ' ')
    passed=$((passed + ok))
    if [ -n "$bad" ] || [ "$ok" = 0 ]; then
      echo "FAIL: $name ($datestyle; $tz; $abbrevs; $intervalstyle; $isolation; $path path; strings $strings) $kind: ${bad:-nothing ran}"
      [ -f "$out/$name-$kind/regression.diffs" ] && head -60 "$out/$name-$kind/regression.diffs"
      fails=$((fails + 1))
    else
      echo "ok: $name ($datestyle; $tz; $abbrevs; $intervalstyle; $isolation; $path path; strings $strings) $kind: $ok tests"
    fi
    psql_idem -q -d postgres -c "DROP DATABASE $db WITH (FORCE)"
  done
done
# The Citus uninstall trigger's reading of DROP EXTENSION (it runs in the
# dropping session, under its settings), without Citus: its patterns alone.
psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS idem_env_strings WITH (FORCE)" -c "CREATE DATABASE idem_env_strings"
psql_idem -q -d idem_env_strings -c "SET client_min_messages = warning" -c "CREATE EXTENSION idem"
for strings in on off; do
  got=$(PGOPTIONS="-c standard_conforming_strings=$strings -c escape_string_warning=off" psql_idem -At -d idem_env_strings -c \
    "SELECT idem.drops_idem('DROP EXTENSION idem CASCADE') AND idem.drops_idem('drop  extension if exists pg_x, idem') AND NOT idem.drops_idem('DROP EXTENSION idem_other')")
  if [ "$got" = t ]; then echo "ok: standard_conforming_strings=$strings: DROP EXTENSION idem is recognized"
  else echo "FAIL: standard_conforming_strings=$strings: DROP EXTENSION idem recognized: '$got', want t"; fails=$((fails + 1)); fi
done
psql_idem -q -d postgres -c "DROP DATABASE idem_env_strings WITH (FORCE)"
echo "environments: $passed test runs passed, $fails suites failed"
[ "$fails" = 0 ]
