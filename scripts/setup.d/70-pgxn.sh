#!/usr/bin/env bash
# For tests/scenarios/pgxn.sh: Debian's PGXN client (pgxnclient 1.3), which
# `pgxn install`s idem from a distribution zip with the Makefile.
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

if ! command -v pgxn >/dev/null; then
  say "installing pgxnclient (Debian package, for the PGXN test)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends pgxnclient >/dev/null
fi
