#!/usr/bin/env bash
# A private PostgreSQL 15 for the Citus scenario: Debian 12's own
# postgresql-15 packages (the very versions installed on the host, so that
# the idem library built for the host's server loads here too), unpacked
# with dpkg-deb under $IDEM_CACHE/pg15-citus (default
# /var/cache/idem/pg15-citus) instead of installed. Citus
# (tests/citus/install.sh) and idem go into this tree, never into the
# system's /usr/lib/postgresql/15. PostgreSQL finds its files relative to
# its programs, so the unpacked tree works where it lies. Prints its
# pg_config. Once: a stamp names the packages it was made from.
#   PG_CONFIG=$(bash tests/citus/tree.sh)
source "$(dirname "${BASH_SOURCE[0]}")/../../tests/servers/common.sh"

PREFIX="$IDEM_CACHE/pg15-citus"
STAMP="$PREFIX/.idem-stamp"
PKGS=(postgresql-15 postgresql-client-15 postgresql-server-dev-15 libpq5 libpq-dev postgresql-15-cron)

# The host's versions of the packages (its server must be installed: the
# suite's setup installs it).
want=""
for p in "${PKGS[@]}"; do
  v=$(dpkg-query -W -f='${Version}' "$p" 2>/dev/null) || die "$p is not installed on the host (bash scripts/setup.sh installs it)"
  want+="$p=$v "
done
want="${want% }"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$PREFIX/bin/pg_config" ]; then
  echo "$PREFIX/bin/pg_config"
  exit 0
fi

take_lock pg15-citus
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$PREFIX/bin/pg_config" ]; then
  echo "$PREFIX/bin/pg_config"
  exit 0
fi
log "unpacking Debian's PostgreSQL 15 into $PREFIX (${want})"
debs="$IDEM_CACHE/build/pg15-citus/debs"
mkdir -p "$debs"
for p in "${PKGS[@]}"; do
  v=$(dpkg-query -W -f='${Version}' "$p")
  ls "$debs/${p}_${v//:/%3a}_"*.deb >/dev/null 2>&1 && continue
  (cd "$debs" && apt-get download -qq "$p=$v" >/dev/null 2>&1) ||
    { apt-get update -qq && (cd "$debs" && apt-get download -qq "$p=$v" >/dev/null); } ||
    die "cannot download $p=$v"
done
# A tree made from other versions is replaced whole (a Citus built into it
# goes with it, and tests/citus/install.sh builds it again).
new="$PREFIX.new"
rm -rf "$new"
mkdir -p "$new"
for p in "${PKGS[@]}"; do
  v=$(dpkg-query -W -f='${Version}' "$p")
  dpkg-deb -x "$(ls "$debs/${p}_${v//:/%3a}_"*.deb | head -1)" "$new"
done
ln -s usr/lib/postgresql/15/bin "$new/bin"
"$new/bin/pg_config" --version >/dev/null || die "the unpacked pg_config does not run"
echo "$want" > "$new/.idem-stamp"
rm -rf "$PREFIX"
mv "$new" "$PREFIX"
log "PostgreSQL 15 unpacked: $PREFIX"
echo "$PREFIX/bin/pg_config"
