#!/usr/bin/env bash
# A Debian 12 (bookworm) root with Debian's PostgreSQL 15 and nothing else:
# a server as idem's Debian package meets it, for tests/scenarios/package.sh
# to install the package into for real (apt-get install ./….deb, CREATE
# EXTENSION, apt-get remove) without touching the host's PostgreSQL.
# Commands run in it with tests/servers/in-trixie.sh, pointed at it:
#   IDEM_TRIXIE_ROOT=$(bash tests/servers/bookworm.sh) \
#     IDEM_TRIXIE_PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config bash tests/servers/in-trixie.sh CMD...
#
#   bash tests/servers/bookworm.sh       ensure it (in $IDEM_CACHE/bookworm), print its path
#
# How it is made and cached: tests/servers/debian-root.sh.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
source "$(dirname "${BASH_SOURCE[0]}")/debian-root.sh"

SUITE=bookworm
PG_MAJOR=15
PACKAGES=(postgresql-15)
STAMP_PACKAGES=(postgresql-15)
ensure_debian_root "$@"
