#!/usr/bin/env bash
# PostgreSQL 16 headers and a pg_config, for `cargo check` (and builds) of
# idem with the pg16 feature on a machine that has no PostgreSQL 16:
#   PGRX_PG_CONFIG_PATH=$(bash scripts/pg/pg16-headers.sh) \
#     CARGO_TARGET_DIR=target/pg16 cargo check --no-default-features --features pg16
# Why: pgrx-pg-sys runs bindgen on the server headers of the version its
# feature names, at every build (the bindings shipped in its crate are not
# used), so it needs a pg_config for 16; pgrx reads it from
# PGRX_PG_CONFIG_PATH (or ~/.pgrx/config.toml). Neither Debian 12 nor any
# suite of deb.debian.org has PostgreSQL 16 any more; PyPI's pgserver 0.1.4
# wheel ships a relocatable PostgreSQL 16.2 install with its headers, so
# that is what is unpacked here. Only for compiling: it is an old 16.x, and
# this project does not test against it.
#
# Unpacked into $IDEM_CACHE/pg16 (default /var/cache/idem/pg16); the stamp
# makes a re-run a no-op. Progress to stderr, the pg_config path to stdout.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

PREFIX="$IDEM_CACHE/pg16"
WHEEL=pgserver==0.1.4

fetch_pg16() { # WORK STAGE
  local work=$1 stage=$2
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
    --platform manylinux2014_x86_64 -d "$work" "$WHEEL" >&2
  (cd "$work" && python3 -m zipfile -e pgserver-*.whl unpacked)
  mv "$work/unpacked/pgserver/pginstall" "$stage"
  chmod -R a+rX "$stage"
  chmod 755 "$stage"/bin/*
  [ -f "$stage/include/postgresql/server/access/heapam.h" ] || die "no server headers in $WHEEL"
  "$stage/bin/pg_config" --version | grep -q '^PostgreSQL 16\.' || die "$WHEEL is not PostgreSQL 16"
}

RECIPE=$(recipe_hash fetch_pg16 -- PREFIX WHEEL)
STAMP="$PREFIX/.idem-stamp"
if ! stamp_ok "$STAMP" "$RECIPE"; then
  take_lock pg16
  if ! stamp_ok "$STAMP" "$RECIPE"; then
    host_packages python3-pip
    work="$IDEM_CACHE/build/pg16"
    rm -rf "$work" "$PREFIX.new"
    mkdir -p "$work"
    log "unpacking PostgreSQL 16 headers from PyPI's $WHEEL into $PREFIX"
    fetch_pg16 "$work" "$PREFIX.new"
    printf 'recipe=%s\npostgresql=%s (from PyPI %s)\n' "$RECIPE" \
      "$("$PREFIX.new/bin/pg_config" --version | sed 's/^PostgreSQL //')" "$WHEEL" > "$PREFIX.new/.idem-stamp"
    rm -rf "$PREFIX"
    mv "$PREFIX.new" "$PREFIX"
    rm -rf "$work"
  fi
fi
echo "$PREFIX/bin/pg_config"
