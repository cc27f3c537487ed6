#!/usr/bin/env bash
# For tests/scenarios/pgxn.sh: Debian's PGXN client (pgxnclient 1.3), which
# `pgxn install`s idem from a distribution zip with the Makefile, and unzip,
# which the test lists the zip with (not on a minimal Debian 12).
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

missing=()
command -v pgxn >/dev/null || missing+=(pgxnclient)
command -v unzip >/dev/null || missing+=(unzip)
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]} (Debian packages, for the PGXN test)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
