#!/usr/bin/env bash
# A private PostgreSQL with pg_tle (and pg_cron where it can be had) for the
# portable edition's scenario (tests/scenarios/editions.sh portable), of the major of
# $PG_CONFIG, at $IDEM_CACHE/pgNN-tle (default /var/cache/idem/pgNN-tle).
# pg_tle is built from ../shared/vendor into that private tree, never into
# the tree PG_CONFIG names: the native runs install idem there, and the
# portable edition must be tested on a server without the idem library.
#   Debian's packaged PostgreSQL (15 on the host, 17 in the Debian 13 root of
#     tests/servers/in-trixie.sh): the installed versions of its packages,
#     unpacked with dpkg-deb; Debian's postgresql-NN-cron is unpacked into
#     the tree afterwards, in place, with a stamp of its own: adding files
#     only, it never swaps the tree under a server running from it, and a
#     tree built without pg_cron (by an older version of this script) keeps
#     its stamp and is not rebuilt.
#   A tree of tests/servers/ (18: pg18.sh, 16: pg16.sh): a copy (cp -a) of that
#     tree, without idem's files, plus the tree's own pg_cron if it has one.
#     pg_cron for these two cannot be had here: no pg-cron source package
#     downloads from the archive mirror, sid's postgresql-18-cron binary needs
#     glibc 2.38 (Debian 12 has 2.36), and no Debian suite has 16 any more.
# Prints the private tree's pg_config. Built once: a stamp names what went in.
#   PG_CONFIG=$(bash tests/portable/tree.sh)
source "$(dirname "${BASH_SOURCE[0]}")/../servers/common.sh"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TLE_TARBALL="$ROOT/../shared/vendor/pg_tle-1.5.3-2f4b7b3.tar.gz"
PG_CONFIG="${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}"
MAJOR=$("$PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
[[ "$MAJOR" =~ ^[0-9]+$ ]] || die "$PG_CONFIG: cannot tell the major version"
PREFIX="$IDEM_CACHE/pg$MAJOR-tle"
STAMP="$PREFIX/.idem-stamp"

[ -f "$TLE_TARBALL" ] || die "pg_tle's source is missing: $TLE_TARBALL (see ../shared/vendor/README.md)"
want="tle=$(basename "$TLE_TARBALL")"
if [ "$PG_CONFIG" = "/usr/lib/postgresql/$MAJOR/bin/pg_config" ]; then
  DEBIAN=1
  PKGS=("postgresql-$MAJOR" "postgresql-client-$MAJOR" "postgresql-server-dev-$MAJOR" libpq5 libpq-dev)
  CRON_PKG="postgresql-$MAJOR-cron"
  # The installed version, else apt's candidate (the cron package need not
  # be installed).
  version_of() {
    local v
    v=$(dpkg-query -W -f='${Version}' "$1" 2>/dev/null) && [ -n "$v" ] \
      || v=$(apt-cache policy "$1" 2>/dev/null | sed -n 's/^ *Candidate: *//p')
    [ -n "$v" ] && [ "$v" != "(none)" ] || die "$1 is neither installed nor available here"
    echo "$v"
  }
  for p in "${PKGS[@]}"; do
    want+=" $p=$(version_of "$p")"
  done
  CRON_WANT="$CRON_PKG=$(version_of "$CRON_PKG")"
  TLE_CONFIG="$PREFIX/bin/pg_config"
else
  DEBIAN=0
  # The tree of tests/servers/: the folder right under $IDEM_CACHE that holds
  # pg_config (pg18/ for 18, pg16/ for 16, whose programs find libpq beside
  # the tree). Its stamp says which build it is.
  rel=${PG_CONFIG#"$IDEM_CACHE"/}
  [ "$rel" != "$PG_CONFIG" ] || die "$PG_CONFIG is neither Debian's nor a tree of tests/servers/ under $IDEM_CACHE"
  ORIG="$IDEM_CACHE/${rel%%/*}"
  [ -f "$ORIG/.idem-stamp" ] || die "$ORIG has no stamp: build it with tests/servers/"
  want+=" copy=$ORIG stamp=$(sha256sum < "$ORIG/.idem-stamp" | cut -c1-16)"
  TLE_CONFIG="$PREFIX/${rel#*/}"
fi
debs="$IDEM_CACHE/build/pg$MAJOR-tle/debs"
CRON_STAMP="$PREFIX/.idem-cron-stamp"
ready() { [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$TLE_CONFIG" ]; }
cron_ready() { [ $DEBIAN = 0 ] || { [ -f "$CRON_STAMP" ] && [ "$(cat "$CRON_STAMP")" = "$CRON_WANT" ]; }; }
# add_cron: Debian's pg_cron unpacked into the finished tree, in place.
add_cron() {
  log "unpacking Debian's pg_cron ($CRON_WANT) into $PREFIX"
  dpkg-deb -x "$(download_deb "$debs" "$CRON_WANT")" "$PREFIX"
  [ -f "$("$TLE_CONFIG" --pkglibdir)/pg_cron.so" ] || die "pg_cron.so is not where the private server looks"
  echo "$CRON_WANT" > "$CRON_STAMP"
}
if ready && cron_ready; then echo "$TLE_CONFIG"; exit 0; fi

take_lock "pg$MAJOR-tle"
if ready; then
  cron_ready || add_cron
  echo "$TLE_CONFIG"; exit 0
fi
host_packages flex libkrb5-dev build-essential
new="$PREFIX.new"
rm -rf "$new"
mkdir -p "$new"
if [ $DEBIAN = 1 ]; then
  log "unpacking Debian's PostgreSQL $MAJOR into $PREFIX and building pg_tle into it"
  for p in "${PKGS[@]}"; do
    dpkg-deb -x "$(download_deb "$debs" "$p=$(sed -E "s/.* $p=([^ ]*).*/\1/" <<< "$want")")" "$new"
  done
  ln -s "usr/lib/postgresql/$MAJOR/bin" "$new/bin"
  new_config="$new/bin/pg_config"
else
  log "copying $ORIG into $PREFIX (without idem) and building pg_tle into the copy"
  cp -a "$ORIG/." "$new/"
  new_config="$new/${rel#*/}"
  # The native runs installed idem into the original; this server must not have it.
  rm -f "$("$new_config" --pkglibdir)"/idem.so "$("$new_config" --sharedir)"/extension/idem.control \
        "$("$new_config" --sharedir)"/extension/idem--*.sql
fi
"$new_config" --version >/dev/null || die "the private pg_config does not run"
src="$IDEM_CACHE/build/pg$MAJOR-tle/src"
rm -rf "$src"
mkdir -p "$src"
tar -xzf "$TLE_TARBALL" -C "$src"
tle_dir=$(ls -d "$src"/pg_tle-*/ | sed -n 1p)
# The private pg_config names paths inside the tree (PostgreSQL is
# relocatable), so make install writes there.
# FLEX named: the 16 wheel was configured without flex (its Makefile.global
# has FLEX empty), and pg_tle generates a scanner with it.
(cd "$tle_dir" && nice -n 10 make -s FLEX="$(command -v flex)" PG_CONFIG="$new_config" >"$src/build.log" 2>&1 &&
   make -s install FLEX="$(command -v flex)" PG_CONFIG="$new_config" >>"$src/build.log" 2>&1) || { tail -30 "$src/build.log" >&2; die "pg_tle did not build"; }
ls "$("$new_config" --pkglibdir)/pg_tle.so" >/dev/null || die "pg_tle.so is not where the private server looks"
echo "$want" > "$new/.idem-stamp"
# Swapped in whole (a server of the old tree keeps running on its open files).
rm -rf "$PREFIX.old"
[ ! -e "$PREFIX" ] || mv "$PREFIX" "$PREFIX.old"
mv "$new" "$PREFIX"
rm -rf "$PREFIX.old"
log "PostgreSQL $MAJOR with pg_tle: $PREFIX"
cron_ready || add_cron
echo "$TLE_CONFIG"
