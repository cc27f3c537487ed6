#!/usr/bin/env bash
# PostgreSQL 18 for idem's scripts, on Debian 12 (as root), which has no
# PostgreSQL 18 package: built from the upstream tarball in Debian sid's
# source package postgresql-18 (only the source is fetched, with a
# throw-away apt list: the host's apt sources stay Debian 12, and nothing
# from sid is installed), with contrib (amcheck, pgstattuple, pg_walinspect
# are used by the tests), pg_isolation_regress/isolationtester and pg_regress
# under pgxs, and pg_cron from sid's source package pg-cron when it builds.
#
#   PG_CONFIG=$(bash scripts/pg/pg18.sh)      ensure it, print its pg_config
#   PG_CONFIG=$(bash scripts/pg/pg18.sh) bash scripts/test.sh
#
# Installed under $IDEM_CACHE/pg18 (default /var/cache/idem/pg18), outside
# the clone, so that every checkout and worktree shares one build. The stamp
# $PREFIX/.idem-stamp records the recipe's hash and what was built; a re-run
# with the same recipe is a no-op, a changed recipe rebuilds (9.5 min of
# CPU, 10-13 min measured on a busy 2-core machine). A rebuild does not
# look for a newer 18.x in sid; to take one, delete the stamp. Progress
# goes to stderr, the pg_config path to stdout.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

PREFIX="$IDEM_CACHE/pg18"
CONFIGURE_FLAGS=(--without-icu --with-openssl)
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
    make -j"$jobs" -s world-bin >"$work/make.log" 2>&1 || { tail -40 "$work/make.log" >&2; exit 1; }
    make -s install DESTDIR="$stage" >>"$work/make.log" 2>&1
    make -s -C contrib install DESTDIR="$stage" >>"$work/make.log" 2>&1
    make -s -C src/test/isolation install DESTDIR="$stage" >>"$work/make.log" 2>&1
  )
  local pgxs_test="$stage$PREFIX/lib/postgresql/pgxs/src/test"
  for f in regress/pg_regress isolation/pg_isolation_regress isolation/isolationtester; do
    [ -x "$pgxs_test/$f" ] || die "the build did not install $pgxs_test/$f"
  done
  [ -f "$stage$PREFIX/share/postgresql/extension/amcheck.control" ] || die "contrib/amcheck was not installed"
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

RECIPE=$(recipe_hash unpack_orig build_pg18 build_pg_cron sid_source debian_source -- PREFIX CONFIGURE_FLAGS BUILD_DEPS)
STAMP="$PREFIX/.idem-stamp"

if ! stamp_ok "$STAMP" "$RECIPE" || ! "$PREFIX/bin/pg_config" --version >/dev/null 2>&1; then
  take_lock pg18
  if ! stamp_ok "$STAMP" "$RECIPE"; then
    started=$(date +%s)
    host_packages "${BUILD_DEPS[@]}"
    work="$IDEM_CACHE/build/pg18"
    stage="$work/stage"
    rm -rf "$work"
    mkdir -p "$work"
    log "building PostgreSQL 18 from Debian sid's source into $PREFIX (about 9.5 min of CPU: 10-13 min measured on a busy 2-core machine; log in $work)"
    build_pg18 "$work" "$stage"
    pg_version=$(ls "$work"/postgresql-18_*.dsc | sed -E 's/.*postgresql-18_(.*)\.dsc/\1/')
    log "building pg_cron for it"
    cron_version=$(build_pg_cron "$work" "$stage")
    cat > "$stage$PREFIX/.idem-stamp" <<STAMP
recipe=$RECIPE
postgresql=$("$stage$PREFIX/bin/pg_config" --version | sed 's/^PostgreSQL //') (upstream tarball of sid's source package postgresql-18 $pg_version)
configure=${CONFIGURE_FLAGS[*]}
pg_cron=$cron_version
built=$(date -u +%FT%TZ) in $(( $(date +%s) - started )) s by scripts/pg/pg18.sh
STAMP
    # Swap the new tree in whole, so that a failed build leaves the old one.
    rm -rf "$PREFIX.old"
    [ ! -e "$PREFIX" ] || mv "$PREFIX" "$PREFIX.old"
    mv "$stage$PREFIX" "$PREFIX"
    rm -rf "$PREFIX.old" "$work"
    chmod 755 "$IDEM_CACHE"
    log "PostgreSQL 18 ready: $(grep -E '^(postgresql|pg_cron)=' "$STAMP" | tr '\n' ' ')"
  fi
fi
echo "$PREFIX/bin/pg_config"
