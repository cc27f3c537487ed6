#!/usr/bin/env bash
# PgBouncer (Debian 12's package, 1.18) for tests/scenarios/pgbouncer.sh,
# which runs its own PgBouncer on loopback in front of its own cluster. On a
# machine with systemd, the package also enables its own service on
# 127.0.0.1:6432; the scenario neither needs nor touches it.
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

if [ ! -x /usr/sbin/pgbouncer ]; then
  say "installing pgbouncer (Debian package, for the pooler scenario)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends pgbouncer >/dev/null
fi
