#!/usr/bin/env bash
# Citus 13.2.2 for the Citus scenario (tests/scenarios/scaling.sh citus), built from
# the vendored source in ../shared/vendor/ (not in Debian's archive;
# AGPL-3.0, see the README there) and installed into the PostgreSQL of
# $PG_CONFIG: the private copy of Debian's 15 that tests/citus/tree.sh makes
# (PG_CONFIG=$(bash tests/citus/tree.sh)), never Debian's installed server
# (refused). Run on demand by the scenario, not by
# scripts/setup.sh: the demo does not need Citus. Once: skipped when the
# installed Citus carries the stamp of this very tarball and server.
# Cold build on 2 cores: 4.5-6.5 minutes (make -j2; measured 5m04 with the
# apt-get step, 5m31 and 6m22 without it under other load).
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"

if [ "$PG_DEBIAN" = 1 ]; then
  echo "citus: $PG_CONFIG is the system's PostgreSQL; Citus goes into a private copy of it:" >&2
  echo "citus:   PG_CONFIG=\$(bash tests/citus/tree.sh) bash tests/citus/install.sh" >&2
  exit 1
fi
VENDOR="$(cd "$ROOT/.." && pwd)/shared/vendor"
TARBALL="$VENDOR/citus-13.2.2-pg15.20.tar.gz"
CITUS_DIR=citus-13.2.2
PKGLIB="$("$PG_CONFIG" --pkglibdir)"
SHAREDIR="$("$PG_CONFIG" --sharedir)"
STAMP="$PKGLIB/citus.idem-vendor-stamp"

if [ ! -f "$TARBALL" ]; then
  echo "citus: $TARBALL is missing." >&2
  echo "citus: the Citus scenario needs the vendored Citus source in ../shared/vendor/ (relative to $ROOT);" >&2
  echo "citus: Citus is not in Debian's archive. Without it the Citus scenario fails." >&2
  exit 1
fi

want="$(sha256sum "$TARBALL" | cut -d' ' -f1) $("$PG_CONFIG" --version)"
if [ -f "$PKGLIB/citus.so" ] && [ -f "$SHAREDIR/extension/citus.control" ] &&
   [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
  exit 0
fi

DEPS=(build-essential autoconf flex bison libcurl4-openssl-dev liblz4-dev
      libzstd-dev libkrb5-dev libssl-dev libselinux1-dev libxslt1-dev libpam0g-dev libreadline-dev)
missing=()
for p in "${DEPS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing Citus build dependencies: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# (The headers are the tree's own: tests/citus/tree.sh unpacks the server
# and its -dev package of one version.)

say "building Citus 13.2.2 from $TARBALL into $PKGLIB (about 5 minutes on 2 cores, once)"
scratch="$(mktemp -d /tmp/idem-citus-build.XXXXXX)"
trap 'rm -rf "$scratch"' EXIT
tar -xzf "$TARBALL" -C "$scratch"
log="$scratch/build.log"
(
  cd "$scratch/$CITUS_DIR"
  ./configure PG_CONFIG="$PG_CONFIG" >"$log" 2>&1
  make -j2 >>"$log" 2>&1
  make install >>"$log" 2>&1
) || { echo "citus: the Citus build failed; last lines of its log:" >&2; tail -30 "$log" >&2; exit 1; }
echo "$want" > "$STAMP"
say "Citus installed: $PKGLIB/citus.so"
