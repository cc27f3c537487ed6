#!/usr/bin/env bash
# A private copy of Debian 12's installed PostgreSQL 15 (its programs,
# modules, share folder and server headers), for the #[pg_test] units:
# `cargo pgrx test` installs its test build of idem into the server it runs,
# and the suite's scenarios use the build installed into Debian's 15 at the
# same time (scripts/test.sh runs the units beside them). The same binaries
# as the installed server, pg_cron and PL/Proxy included; PostgreSQL finds
# its folders relative to its programs, so the copy's pg_config names the
# copy's folders (tests/scenarios/packaging.sh pgxn relies on the same).
#
#   PG_CONFIG=$(bash tests/servers/pg15-copy.sh)     ensure it, print its pg_config
#
# Cached under $IDEM_CACHE/pg15-copy at a fixed path (the units' build
# binds pgrx to the headers' path: a new path would rebuild pgrx), copied
# again when the installed packages' versions change (the stamp records
# them). Whatever `cargo pgrx test` installed there stays until the next
# copy. Progress goes to stderr, the pg_config path to stdout.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

PREFIX="$IDEM_CACHE/pg15-copy"
PG_CONFIG_15=/usr/lib/postgresql/15/bin/pg_config
# What the copy must match: the installed server, headers and modules.
PACKAGES=(postgresql-15 postgresql-server-dev-15 postgresql-15-cron postgresql-15-plproxy)

[ -x "$PG_CONFIG_15" ] || die "no $PG_CONFIG_15 (bash scripts/setup.sh installs Debian's PostgreSQL 15)"
versions=$(dpkg-query -W -f='${Package}=${Version}\n' "${PACKAGES[@]}" 2>/dev/null | sort | paste -sd' ')
copy_pg15() { copy_pg_install "$PG_CONFIG_15" "$1"; } # STAGE
RECIPE="$(recipe_hash copy_pg15 copy_pg_install -- PREFIX PG_CONFIG_15)-$(echo "$versions" | sha256sum | cut -c1-16)"
copied_config="$PREFIX$(readlink -f "$PG_CONFIG_15")"
if ! stamp_ok "$PREFIX/.idem-stamp" "$RECIPE" || [ ! -x "$copied_config" ]; then
  take_lock pg15-copy
  if ! stamp_ok "$PREFIX/.idem-stamp" "$RECIPE" || [ ! -x "$copied_config" ]; then
    log "copying Debian's PostgreSQL 15 into $PREFIX ($versions)"
    rm -rf "$PREFIX.new"
    mkdir -p "$PREFIX.new"
    copy_pg15 "$PREFIX.new"
    # (no idem in the copy until the units install theirs)
    rm -f "$PREFIX.new$("$PG_CONFIG_15" --pkglibdir)/idem.so" "$PREFIX.new$("$PG_CONFIG_15" --sharedir)"/extension/idem[.-]*
    printf 'recipe=%s\npostgresql=%s\npackages=%s\n' "$RECIPE" "$("$PG_CONFIG_15" --version)" "$versions" \
      > "$PREFIX.new/.idem-stamp"
    busy=$(processes_from "$PREFIX" | tr '\n' ' ')
    [ -z "$busy" ] || die "programs of $PREFIX still run (pids $busy: another checkout's units?); the new copy is left in $PREFIX.new"
    rm -rf "$PREFIX"
    mv "$PREFIX.new" "$PREFIX"
    chmod 755 "$IDEM_CACHE" "$PREFIX"
  fi
fi
libdir=$("$copied_config" --pkglibdir)
case "$libdir" in "$PREFIX"/*) ;; *) die "the copy's pg_config points outside it: $libdir" ;; esac
echo "$copied_config"
