# Shared by the portable edition's application-level checks
# (tests/portable/steps.sh pooler, privileges, environments): each runs on
# its own against a running PostgreSQL with pg_tle preloaded and no idem
# library (as tests/scenarios/editions.sh portable starts one), makes its own
# databases and roles (named with its prefix, dropped when it ends) and
# prints "ok: ..." / "FAIL: ..." lines (tests/lib/scenarios.sh).
#
#   bash tests/portable/steps.sh NAME [HOST [PORT]]
#
# HOST is the server's socket directory (default $PORTABLE_HOST), PORT its
# port (default $PORTABLE_PORT, else 5546). The edition is generated from
# this checkout into a scratch directory unless $PORTABLE_DIST names a
# directory holding scripts/portable.py's output. The server's superuser
# "postgres" only prepares what a managed service's operator would: roles,
# databases and pg_tle; idem itself is installed by roles that are not
# superusers.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/scenarios.sh"
PORTABLE_HOST="${1:-${PORTABLE_HOST:-}}"
PORTABLE_PORT="${2:-${PORTABLE_PORT:-5546}}"
[ -n "$PORTABLE_HOST" ] || { echo "usage: $0 SOCKET_DIR [PORT] (or PORTABLE_HOST, PORTABLE_PORT)" >&2; exit 2; }

# pp_psql ROLE DB ARGS...: psql as ROLE, stopping at the first error.
pp_psql() {
  local role=$1 db=$2
  shift 2
  "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$PORTABLE_HOST" -p "$PORTABLE_PORT" -U "$role" -d "$db" "$@"
}
# pp_sqlstate ROLE DB SQL: "ok", or the SQLSTATE of the first error.
pp_sqlstate() {
  local out
  out=$("$PG_BIN/psql" -X -At -h "$PORTABLE_HOST" -p "$PORTABLE_PORT" -U "$1" -d "$2" -v ON_ERROR_STOP=1 \
          -c "\\set VERBOSITY sqlstate" -c "$3" 2>&1) && { echo ok; return; }
  sed -n 's/^ERROR:  \([0-9A-Z]\{5\}\).*/\1/p' <<<"$out" | sed -n 1p | grep . || echo "??? $out"
}

# The edition's files (scripts/portable.py's output), readable by every
# role: psql reads them as root, but the scratch directory is shared with
# the postgres user's tools.
if [ -z "${PORTABLE_DIST:-}" ]; then
  PORTABLE_DIST=$(mktemp -d /tmp/idem-portable-dist.XXXXXX)
  python3 "$ROOT/scripts/portable.py" --out "$PORTABLE_DIST" >/dev/null
  chmod -R a+rX "$PORTABLE_DIST"
  pp_own_dist=1
fi
pp_cleanup_dist() { if [ -n "${pp_own_dist:-}" ]; then rm -rf "$PORTABLE_DIST"; fi; }

# pp_tle_install DB ADMIN: a database owned by ADMIN (a login role, not a
# superuser, member of pgtle_admin) with the edition registered through
# pg_tle and created by ADMIN: CREATE EXTENSION idem, as on a managed
# service. ADMIN owns the extension and so its SECURITY DEFINER functions.
pp_tle_install() {
  local db=$1 admin=$2
  pp_psql postgres postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db OWNER $admin"
  pp_psql postgres "$db" -c "SET client_min_messages = warning" -c "CREATE EXTENSION IF NOT EXISTS pg_tle" \
    -c "GRANT pgtle_admin TO $admin"
  pp_psql "$admin" "$db" -f "$PORTABLE_DIST/idem_pg_tle.sql" >/dev/null
  pp_psql "$admin" "$db" -c "CREATE EXTENSION idem"
}
# pp_plain_install DB OWNER: a database owned by OWNER (not a superuser)
# with the plain script run by OWNER (API in schema public).
pp_plain_install() {
  local db=$1 owner=$2
  pp_psql postgres postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db OWNER $owner"
  pp_psql "$owner" "$db" -f "$PORTABLE_DIST/idem_portable.sql" >/dev/null
}
# pp_roles ROLE...: login roles, not superusers (made anew).
pp_roles() {
  local r
  for r in "$@"; do pp_psql postgres postgres -c "SET client_min_messages = warning" -c "DROP ROLE IF EXISTS $r" -c "CREATE ROLE $r LOGIN NOSUPERUSER"; done
}
# pp_drop DBS ROLES: what a script made (databases first: roles own them).
pp_drop() {
  local dbs=$1 roles=$2 x
  for x in $dbs; do pp_psql postgres postgres -c "DROP DATABASE IF EXISTS $x WITH (FORCE)" >/dev/null 2>&1 || true; done
  for x in $roles; do
    pp_psql postgres postgres -c "DROP OWNED BY $x CASCADE" >/dev/null 2>&1 || true
    pp_psql postgres postgres -c "DROP ROLE IF EXISTS $x" >/dev/null 2>&1 || true
  done
}
