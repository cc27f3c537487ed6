#!/usr/bin/env bash
# PostgreSQL 18 for idem's scripts, on Debian 12 (as root), which has no
# PostgreSQL 18 package: built from the upstream tarball in Debian sid's
# source package postgresql-18 (only the source is fetched, with a
# throw-away apt list: the host's apt sources stay Debian 12, and nothing
# from sid is installed), with the contrib modules the suite and the bench
# use (CONTRIB below), pg_isolation_regress/isolationtester and pg_regress
# under pgxs, and pg_cron from sid's source package pg-cron when it builds.
#
#   PG_CONFIG=$(bash tests/servers/pg18.sh)      ensure it, print its pg_config
#   PG_CONFIG=$(bash tests/servers/pg18.sh) bash scripts/test.sh
#
# Installed under $IDEM_CACHE/pg18 (default /var/cache/idem/pg18), outside
# the clone, so that every checkout and worktree shares one build. The stamp
# $PREFIX/.idem-stamp records the recipe's hash and what was built; a re-run
# with the same recipe is a no-op, a changed recipe rebuilds (235 CPU s,
# 133 s on an idle 2-core machine; the contrib modules left out would add
# about 28 CPU s). A rebuild does not
# look for a newer 18.x in sid; to take one, delete the stamp. Progress
# goes to stderr, the pg_config path to stdout.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

PREFIX="$IDEM_CACHE/pg18"
CONFIGURE_FLAGS=(--without-icu --with-openssl)
# contrib modules built: amcheck (the stress and recovery checks), pgstattuple,
# pg_walinspect and pg_stat_statements (the bench)
CONTRIB=(amcheck pgstattuple pg_walinspect pg_stat_statements)
BUILD_DEPS=(build-essential libreadline-dev zlib1g-dev libssl-dev bison flex pkg-config perl
            ca-certificates debian-archive-keyring)

build_pg18() { # WORK STAGE -> writes STAGE$PREFIX
  local work=$1 stage=$2 jobs
  jobs=$(nproc)
  sid_source "$work" postgresql-18
  unpack_orig "$work" postgresql-18
  (
    cd "$work/src-postgresql-18"
    ./configure --prefix="$PREFIX" "${CONFIGURE_FLAGS[@]}" >"$work/configure.log" 2>&1 \
      || { tail -30 "$work/configure.log" >&2; exit 1; }
    # The server, its programs and pg_regress (make all), and of contrib
    # only what the suite and the bench load (the others, used by nothing
    # here, would add about 28 CPU s).
    make -j"$jobs" -s all >"$work/make.log" 2>&1 || { tail -40 "$work/make.log" >&2; exit 1; }
    local m
    for m in "${CONTRIB[@]}"; do
      make -j"$jobs" -s -C "contrib/$m" >>"$work/make.log" 2>&1 || { tail -40 "$work/make.log" >&2; exit 1; }
    done
    make -s install DESTDIR="$stage" >>"$work/make.log" 2>&1
    for m in "${CONTRIB[@]}"; do make -s -C "contrib/$m" install DESTDIR="$stage" >>"$work/make.log" 2>&1; done
    make -s -C src/test/isolation install DESTDIR="$stage" >>"$work/make.log" 2>&1
  )
  local pgxs_test="$stage$PREFIX/lib/postgresql/pgxs/src/test"
  for f in regress/pg_regress isolation/pg_isolation_regress isolation/isolationtester; do
    [ -x "$pgxs_test/$f" ] || die "the build did not install $pgxs_test/$f"
  done
  for m in "${CONTRIB[@]}"; do
    [ -f "$stage$PREFIX/share/postgresql/extension/$m.control" ] || die "contrib/$m was not installed"
  done
}

# pg_cron: nice to have (idem's cluster preloads it when present). Built
# against the staged tree; pg_config there reports the staged paths (it is
# relocatable), so `make install` lands in the stage. Prints the version
# built, or "none (reason)".
build_pg_cron() { # WORK STAGE
  local work=$1 stage=$2 pgc="$2$PREFIX/bin/pg_config" v
  if ! sid_source "$work" pg-cron >"$work/pg_cron.log" 2>&1; then echo "none (source download failed)"; return; fi
  v=$(ls "$work"/pg-cron_*.dsc | sed -E 's/.*pg-cron_(.*)\.dsc/\1/')
  unpack_orig "$work" pg-cron
  if (cd "$work/src-pg-cron" && make -j"$(nproc)" PG_CONFIG="$pgc" && make install PG_CONFIG="$pgc") \
       >>"$work/pg_cron.log" 2>&1 && [ -f "$stage$PREFIX/lib/postgresql/pg_cron.so" ]; then
    echo "$v"
  else
    tail -20 "$work/pg_cron.log" >&2
    echo "none (build of $v failed)"
  fi
}

RECIPE=$(recipe_hash unpack_orig build_pg18 build_pg_cron sid_source debian_source -- PREFIX CONFIGURE_FLAGS CONTRIB BUILD_DEPS)
make_pg18() { # WORK STAGE
  host_packages "${BUILD_DEPS[@]}"
  log "building PostgreSQL 18 from Debian sid's source into $PREFIX (about 4 minutes of CPU: 133 s on an idle 2-core machine; log in $1)"
  build_pg18 "$1" "$2"
  log "building pg_cron for it"
  build_pg_cron "$1" "$2" > "$1/pg_cron.version"
}
describe_pg18() { # WORK STAGE
  echo "postgresql=$("$2$PREFIX/bin/pg_config" --version | sed 's/^PostgreSQL //') (upstream tarball of sid's source package postgresql-18 $(ls "$1"/postgresql-18_*.dsc | sed -E 's/.*postgresql-18_(.*)\.dsc/\1/'))"
  echo "configure=${CONFIGURE_FLAGS[*]}"
  echo "pg_cron=$(cat "$1/pg_cron.version")"
}
host_packages_only "${1:-}" "${BUILD_DEPS[@]}"
cached_tree pg18 "$PREFIX" "$RECIPE" make_pg18 describe_pg18
echo "$PREFIX/bin/pg_config"
