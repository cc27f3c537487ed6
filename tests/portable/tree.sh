#!/usr/bin/env bash
# A private PostgreSQL 15 with pg_tle for the portable edition's scenario
# (tests/scenarios/portable.sh): Debian 12's own postgresql-15 packages (the
# versions installed on the host) unpacked with dpkg-deb under
# $IDEM_CACHE/pg15-tle (default /var/cache/idem/pg15-tle), and pg_tle built
# from ../shared/vendor into that tree, never into the system's
# /usr/lib/postgresql/15. The native idem is never installed here. Prints
# its pg_config. Once: a stamp names the packages and the pg_tle tarball.
#   PG_CONFIG=$(bash tests/portable/tree.sh)
source "$(dirname "${BASH_SOURCE[0]}")/../../tests/servers/common.sh"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TLE_TARBALL="$ROOT/../shared/vendor/pg_tle-1.5.3-2f4b7b3.tar.gz"
PREFIX="$IDEM_CACHE/pg15-tle"
STAMP="$PREFIX/.idem-stamp"
PKGS=(postgresql-15 postgresql-client-15 postgresql-server-dev-15 libpq5 libpq-dev)

[ -f "$TLE_TARBALL" ] || die "pg_tle's source is missing: $TLE_TARBALL (see ../shared/vendor/README.md)"
want="tle=$(basename "$TLE_TARBALL")"
for p in "${PKGS[@]}"; do
  v=$(dpkg-query -W -f='${Version}' "$p" 2>/dev/null) || die "$p is not installed on the host (bash scripts/setup.sh installs it)"
  want+=" $p=$v"
done
ready() { [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$PREFIX/bin/pg_config" ]; }
if ready; then echo "$PREFIX/bin/pg_config"; exit 0; fi

take_lock pg15-tle
if ready; then echo "$PREFIX/bin/pg_config"; exit 0; fi
host_packages flex libkrb5-dev build-essential
log "unpacking Debian's PostgreSQL 15 into $PREFIX and building pg_tle into it"
debs="$IDEM_CACHE/build/pg15-tle/debs"
mkdir -p "$debs"
for p in "${PKGS[@]}"; do
  v=$(dpkg-query -W -f='${Version}' "$p")
  ls "$debs/${p}_${v//:/%3a}_"*.deb >/dev/null 2>&1 && continue
  (cd "$debs" && apt-get download -qq "$p=$v" >/dev/null 2>&1) ||
    { apt-get update -qq && (cd "$debs" && apt-get download -qq "$p=$v" >/dev/null); } ||
    die "cannot download $p=$v"
done
new="$PREFIX.new"
rm -rf "$new"
mkdir -p "$new"
for p in "${PKGS[@]}"; do
  v=$(dpkg-query -W -f='${Version}' "$p")
  dpkg-deb -x "$(ls "$debs/${p}_${v//:/%3a}_"*.deb | head -1)" "$new"
done
ln -s usr/lib/postgresql/15/bin "$new/bin"
"$new/bin/pg_config" --version >/dev/null || die "the unpacked pg_config does not run"
src="$IDEM_CACHE/build/pg15-tle/src"
rm -rf "$src"
mkdir -p "$src"
tar -xzf "$TLE_TARBALL" -C "$src"
tle_dir=$(ls -d "$src"/pg_tle-*/ | head -1)
# The unpacked pg_config names paths inside the tree (PostgreSQL is
# relocatable), so make install writes there.
(cd "$tle_dir" && nice -n 10 make -s PG_CONFIG="$new/bin/pg_config" >/dev/null &&
   make -s install PG_CONFIG="$new/bin/pg_config" >/dev/null) || die "pg_tle did not build"
ls "$new"/usr/lib/postgresql/15/lib/pg_tle.so >/dev/null || die "pg_tle.so is not where the private server looks"
echo "$want" > "$new/.idem-stamp"
rm -rf "$PREFIX"
mv "$new" "$PREFIX"
log "PostgreSQL 15 with pg_tle: $PREFIX"
echo "$PREFIX/bin/pg_config"
