#!/usr/bin/env bash
# Session settings against the portable edition, as
# tests/scenarios/hardening.sh environments runs the native one: the round trip
# (claim, complete, fail, lookup, leases and checkpoints, forget, TTLs from
# arguments, configured types and idem.default_ttl, tokens, transitions and
# guards) and every view, tests/portable/environments.sql, first under the
# server's defaults and then in each environment below, each in a new
# database where the edition is installed through pg_tle by a role that is
# not a superuser; every output must equal the default run's. The views are
# also compared within each run: read under the environment's settings,
# then under the defaults, in one transaction.
#
#   name      DateStyle      TimeZone            abbreviations IntervalStyle     isolation (*)    other settings
#   kolkata   Postgres, MDY  Asia/Kolkata        Default       sql_standard      read committed   lc_time C
#   sydney    SQL, DMY       Australia/Sydney    Australia     iso_8601          repeatable read  bytea_output escape, extra_float_digits -15
#   chatham   German, DMY    Pacific/Chatham     Default       postgres          serializable     standard_conforming_strings off, transform_null_equals on
#   posix     ISO, DMY       IST-1 (POSIX)       Australia     postgres_verbose  read committed   plpgsql.extra_errors all, lc_numeric POSIX, extra_float_digits 3
#   kiritimati ISO, YMD      Pacific/Kiritimati  Default       iso_8601          read committed   plpgsql.extra_warnings all, lc_monetary C
#
# (*) default_transaction_isolation. The round trip writes in READ
# COMMITTED transactions; a claim, its duplicate and its completion in a
# transaction of the session's default level are checked too (every level
# is supported). Every environment also has
# search_path = public, idem_lookalike: a schema with tables and functions
# named like the edition's own, which its SQL must never reach.
#
#   bash tests/portable/environments.sh [SOCKET_DIR [PORT]]     (tests/portable/lib.sh)
#
# PORTABLE_BREAK=interval_text runs the negative control: idem.interval_text
# loses its pinned IntervalStyle, so idem_health's texts follow the
# session's; the run must then fail.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
P=portable_env
ADMIN=${P}_admin
environments=(
  "default|||||||"
  "kolkata|Postgres, MDY|Asia/Kolkata|Default|sql_standard|read committed|-c lc_time=C"
  "sydney|SQL, DMY|Australia/Sydney|Australia|iso_8601|repeatable read|-c bytea_output=escape -c extra_float_digits=-15"
  "chatham|German, DMY|Pacific/Chatham|Default|postgres|serializable|-c standard_conforming_strings=off -c transform_null_equals=on"
  "posix|ISO, DMY|IST-1|Australia|postgres_verbose|read committed|-c plpgsql.extra_errors=all -c lc_numeric=POSIX -c extra_float_digits=3"
  "kiritimati|ISO, YMD|Pacific/Kiritimati|Default|iso_8601|read committed|-c plpgsql.extra_warnings=all -c client_min_messages=error -c lc_monetary=C"
)
DBS=$(for e in "${environments[@]}"; do printf '%s_%s ' $P "${e%%|*}"; done)
out=$(mktemp -d /tmp/idem-portable-env.XXXXXX)
trap 'pp_drop "$DBS" "$ADMIN"; rm -rf "$out"; pp_cleanup_dist' EXIT
pp_drop "$DBS" "$ADMIN"
pp_roles "$ADMIN"
esc() { printf '%s' "$1" | sed 's/ /\\ /g'; }

for env in "${environments[@]}"; do
  IFS='|' read -r name datestyle tz abbrevs intervalstyle isolation other <<<"$env"
  db=${P}_$name
  pp_tle_install "$db" "$ADMIN"
  pp_psql "$ADMIN" "$db" >/dev/null <<'SQL'
CREATE SCHEMA idem_lookalike;
CREATE TABLE idem_lookalike.claims (LIKE idem.claims);
CREATE TABLE idem_lookalike.biz_types (biz_type text, ttl interval, owner regrole);
INSERT INTO idem_lookalike.biz_types VALUES ('env.pay', '1 second', NULL);
CREATE TABLE idem_lookalike.type_classes (biz_type text, class int);
CREATE FUNCTION idem_lookalike.key_hash(text, text) RETURNS bigint LANGUAGE sql AS 'SELECT 0::bigint';
CREATE FUNCTION idem_lookalike.ttl_class(interval) RETURNS int LANGUAGE sql AS 'SELECT 0';
CREATE FUNCTION idem_lookalike.check_name(text, text) RETURNS void LANGUAGE sql AS 'SELECT';
CREATE FUNCTION idem_lookalike.interval_text(interval) RETURNS text LANGUAGE sql AS 'SELECT ''lookalike''';
GRANT USAGE ON SCHEMA idem_lookalike TO PUBLIC;
SQL
  if [ -n "${PORTABLE_BREAK:-}" ] && [ "$name" != default ]; then
    [ "$PORTABLE_BREAK" = interval_text ] || { echo "PORTABLE_BREAK=$PORTABLE_BREAK: unknown" >&2; exit 2; }
    pp_psql "$ADMIN" "$db" -c "ALTER FUNCTION idem.interval_text(interval) RESET IntervalStyle" >/dev/null
  fi
  opts=
  if [ "$name" != default ]; then
    opts="-c DateStyle=$(esc "$datestyle") -c TimeZone=$(esc "$tz") -c timezone_abbreviations=$abbrevs"
    opts+=" -c IntervalStyle=$intervalstyle -c default_transaction_isolation=$(esc "$isolation")"
    opts+=" -c search_path=public,idem_lookalike $other"
  fi
  PGOPTIONS="$opts" pp_psql "$ADMIN" "$db" -At -F ' | ' -f "$ROOT/tests/portable/environments.sql" > "$out/$name.out" 2>&1 ||
    fail "$name: environments.sql stopped: $(tail -3 "$out/$name.out")"
  # The settings took effect (the server took them from PGOPTIONS).
  got=$(PGOPTIONS="$opts" pp_psql "$ADMIN" "$db" -At -c "SELECT current_setting('DateStyle') || ' / ' || current_setting('TimeZone') || ' / ' || current_setting('IntervalStyle') || ' / ' || current_setting('transaction_isolation')")
  if [ "$name" = default ]; then
    echo "default: the server's settings: $got"
    grep -q . "$out/default.out" || fail "default: no output"
    continue
  fi
  expect "$name: the session's settings" "$got" "$datestyle / $tz / $intervalstyle / $isolation"
  expect "$name ($datestyle; $tz; $abbrevs; $intervalstyle; $isolation;$(echo " $other" | sed 's/ -c /; /g; s/^; //')): every answer equals the default run's" \
    "$(diff "$out/default.out" "$out/$name.out" | head -20)" ""
  # A claim, its duplicate and its completion in a transaction of the
  # session's default level.
  expect "$name: a claim under default_transaction_isolation = $isolation" \
    "$(PGOPTIONS="$opts" pp_psql "$ADMIN" "$db" -At -c "BEGIN" -c "SELECT (SELECT claimed FROM idem_claim('iso-$name', 'env.iso'))
         || ' ' || (SELECT state FROM idem_claim('iso-$name', 'env.iso')) || ' ' || current_setting('transaction_isolation')" \
       -c "SELECT idem_complete('iso-$name', 'env.iso', '{}')" -c "COMMIT" \
       -c "SELECT state FROM idem_lookup('iso-$name', 'env.iso')" 2>&1 | grep -v '^\(BEGIN\|COMMIT\|\)$' | tr '\n' ' ')" \
    "true in_progress $isolation completed "
done
echo "the default run's output ($(wc -l < "$out/default.out") lines):"
sed 's/^/  /' "$out/default.out"
finish "portable environments"
