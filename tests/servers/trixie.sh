#!/usr/bin/env bash
# A Debian 13 (trixie) root with Debian's PostgreSQL 17 and what building
# idem with pgrx and running its tests needs (clang, libclang, a C
# toolchain, sudo, IPC::Run, Python with venv, procps, git, pg_cron,
# PL/Proxy), for tests/servers/in-trixie.sh to run commands in. Why: Debian 12
# has no PostgreSQL 17 package, and trixie's packages must not be installed
# on the host; a debootstrapped root keeps them apart.
#
#   bash tests/servers/trixie.sh       ensure it (in $IDEM_CACHE/trixie), print its path
#
# How it is made and cached: tests/servers/debian-root.sh.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
source "$(dirname "${BASH_SOURCE[0]}")/debian-root.sh"

SUITE=trixie
PG_MAJOR=17
PACKAGES=(postgresql-17 postgresql-server-dev-17 postgresql-17-cron postgresql-17-plproxy
          libclang-dev clang build-essential pkg-config sudo libipc-run-perl
          python3 python3-venv python3-pip procps git ca-certificates less)
STAMP_PACKAGES=(postgresql-17 postgresql-17-cron clang)
ensure_debian_root "$@"
