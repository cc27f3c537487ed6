#!/usr/bin/env bash
# The crash and failover tests (tests/lib/cluster.sh) find a postmaster's
# children with ps, which minimal Debian images lack. (amcheck and
# pg_basebackup come with postgresql-15; psycopg with 10-python.sh.)
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

if ! dpkg-query -W -f='${Status}' procps 2>/dev/null | grep -q "install ok installed"; then
  say "installing procps (ps, for the crash and failover tests)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq procps >/dev/null
fi
