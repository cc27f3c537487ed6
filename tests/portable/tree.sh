#!/usr/bin/env bash
# A private PostgreSQL with pg_tle (and pg_cron where it can be had) for the
# portable edition's scenario (tests/scenarios/portable.sh), of the major of
# $PG_CONFIG, at $IDEM_CACHE/pgNN-tle (default /var/cache/idem/pgNN-tle).
# pg_tle is built from ../shared/vendor into that private tree, never into
# the tree PG_CONFIG names: the native runs install idem there, and the
# portable edition must be tested on a server without the idem library.
#   Debian's packaged PostgreSQL (15 on the host, 17 in the Debian 13 root of
#     tests/servers/in-trixie.sh): the installed versions of its packages,
#     unpacked with dpkg-deb, plus Debian's postgresql-NN-cron.
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
  PKGS=("postgresql-$MAJOR" "postgresql-client-$MAJOR" "postgresql-server-dev-$MAJOR" libpq5 libpq-dev
        "postgresql-$MAJOR-cron")
  for p in "${PKGS[@]}"; do
    v=$(dpkg-query -W -f='${Version}' "$p" 2>/dev/null) && [ -n "$v" ] \
      || v=$(apt-cache policy "$p" 2>/dev/null | sed -n 's/^ *Candidate: *//p')
    [ -n "$v" ] && [ "$v" != "(none)" ] || die "$p is neither installed nor available here"
    want+=" $p=$v"
  done
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
ready() { [ -f "$STAMP" ] && [ "$(head -1 "$STAMP")" = "$want" ] && [ -x "$TLE_CONFIG" ]; }
if ready; then echo "$TLE_CONFIG"; exit 0; fi

take_lock "pg$MAJOR-tle"
if ready; then echo "$TLE_CONFIG"; exit 0; fi
host_packages flex libkrb5-dev build-essential
new="$PREFIX.new"
rm -rf "$new"
mkdir -p "$new"
cron="none"
if [ $DEBIAN = 1 ]; then
  log "unpacking Debian's PostgreSQL $MAJOR and pg_cron into $PREFIX and building pg_tle into it"
  debs="$IDEM_CACHE/build/pg$MAJOR-tle/debs"
  mkdir -p "$debs"
  for p in "${PKGS[@]}"; do
    v=$(sed -E "s/.* $p=([^ ]*).*/\1/" <<< "$want")
    ls "$debs/${p}_${v//:/%3a}_"*.deb >/dev/null 2>&1 && continue
    (cd "$debs" && apt-get download -qq "$p=$v" >/dev/null 2>&1) ||
      { apt-get update -qq && (cd "$debs" && apt-get download -qq "$p=$v" >/dev/null); } ||
      die "cannot download $p=$v"
  done
  for p in "${PKGS[@]}"; do
    v=$(sed -E "s/.* $p=([^ ]*).*/\1/" <<< "$want")
    dpkg-deb -x "$(ls "$debs/${p}_${v//:/%3a}_"*.deb | head -1)" "$new"
  done
  ln -s "usr/lib/postgresql/$MAJOR/bin" "$new/bin"
  new_config="$new/bin/pg_config"
  cron=$(sed -E "s/.* postgresql-$MAJOR-cron=([^ ]*).*/\1/" <<< "$want")
else
  log "copying $ORIG into $PREFIX (without idem) and building pg_tle into the copy"
  cp -a "$ORIG/." "$new/"
  new_config="$new/${rel#*/}"
  # The native runs installed idem into the original; this server must not have it.
  rm -f "$("$new_config" --pkglibdir)"/idem.so "$("$new_config" --sharedir)"/extension/idem.control \
        "$("$new_config" --sharedir)"/extension/idem--*.sql
  [ ! -f "$("$new_config" --pkglibdir)/pg_cron.so" ] || cron="the tree's own"
fi
"$new_config" --version >/dev/null || die "the private pg_config does not run"
src="$IDEM_CACHE/build/pg$MAJOR-tle/src"
rm -rf "$src"
mkdir -p "$src"
tar -xzf "$TLE_TARBALL" -C "$src"
tle_dir=$(ls -d "$src"/pg_tle-*/ | head -1)
# The private pg_config names paths inside the tree (PostgreSQL is
# relocatable), so make install writes there.
# FLEX named: the 16 wheel was configured without flex (its Makefile.global
# has FLEX empty), and pg_tle generates a scanner with it.
(cd "$tle_dir" && nice -n 10 make -s FLEX="$(command -v flex)" PG_CONFIG="$new_config" >"$src/build.log" 2>&1 &&
   make -s install FLEX="$(command -v flex)" PG_CONFIG="$new_config" >>"$src/build.log" 2>&1) || { tail -30 "$src/build.log" >&2; die "pg_tle did not build"; }
ls "$("$new_config" --pkglibdir)/pg_tle.so" >/dev/null || die "pg_tle.so is not where the private server looks"
printf '%s\npg_cron=%s\n' "$want" "$cron" > "$new/.idem-stamp"
# Swapped in whole (a server of the old tree keeps running on its open files).
rm -rf "$PREFIX.old"
[ ! -e "$PREFIX" ] || mv "$PREFIX" "$PREFIX.old"
mv "$new" "$PREFIX"
rm -rf "$PREFIX.old"
log "PostgreSQL $MAJOR with pg_tle (pg_cron: $cron): $PREFIX"
echo "$TLE_CONFIG"
