#!/usr/bin/env bash
# PostgreSQL 15 from the upstream tarball in Debian 12's own source package
# postgresql-15 (15.18 in bookworm's main archive), server and client
# programs only: the old side of tests/versions/majors.sh pg_upgrade.
#
# Why not Debian's installed 15: the PostgreSQL 15.20 package on this kind
# of machine stamps every column of every table with an attribute option,
# pg_attver, that PostgreSQL 18 does not know; pg_upgrade to 18 then fails
# restoring the first table of any database ("unrecognized parameter
# pg_attver"), whatever is in it. A 15 built from the upstream source has
# no such option.
#
#   PG_CONFIG=$(bash tests/servers/pg15-upstream.sh)
#
# Cached under $IDEM_CACHE/pg15-upstream like pg18.sh's tree (stamp,
# lock, swapped in whole). idem is not built for it: tests/versions/
# majors.sh pg_upgrade copies the build installed into Debian's 15 (same major:
# the module's magic block checks the major version, and extensions built
# against one minor release load into another).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

PREFIX="$IDEM_CACHE/pg15-upstream"
CONFIGURE_FLAGS=(--without-icu --without-readline --with-openssl)
BUILD_DEPS=(build-essential zlib1g-dev libssl-dev bison flex pkg-config perl ca-certificates
            debian-archive-keyring)

build_pg15_upstream() { # WORK STAGE -> writes STAGE$PREFIX
  local work=$1 stage=$2
  debian_source "$work" bookworm postgresql-15
  unpack_orig "$work" postgresql-15
  (
    cd "$work/src-postgresql-15"
    ./configure --prefix="$PREFIX" "${CONFIGURE_FLAGS[@]}" >"$work/configure.log" 2>&1 \
      || { tail -30 "$work/configure.log" >&2; exit 1; }
    make -j"$(nproc)" -s >"$work/make.log" 2>&1 || { tail -40 "$work/make.log" >&2; exit 1; }
    make -s install DESTDIR="$stage" >>"$work/make.log" 2>&1
  )
  [ -x "$stage$PREFIX/bin/pg_upgrade" ] || die "the build did not install pg_upgrade"
}

RECIPE=$(recipe_hash unpack_orig build_pg15_upstream debian_source -- PREFIX CONFIGURE_FLAGS BUILD_DEPS)
make_pg15_upstream() { # WORK STAGE
  host_packages "${BUILD_DEPS[@]}"
  log "building PostgreSQL 15 from Debian 12's source package into $PREFIX (log in $1)"
  build_pg15_upstream "$1" "$2"
}
describe_pg15_upstream() { # WORK STAGE
  echo "postgresql=$("$2$PREFIX/bin/pg_config" --version | sed 's/^PostgreSQL //') (upstream tarball of bookworm's source package $(ls "$1"/postgresql-15_*.dsc | sed -E 's/.*postgresql-15_(.*)\.dsc/\1/'))"
  echo "configure=${CONFIGURE_FLAGS[*]}"
}
host_packages_only "${1:-}" "${BUILD_DEPS[@]}"
cached_tree pg15-upstream "$PREFIX" "$RECIPE" make_pg15_upstream describe_pg15_upstream
echo "$PREFIX/bin/pg_config"
