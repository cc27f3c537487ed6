#!/usr/bin/env bash
# For tests/scenarios/prometheus.sh, dashboard.sh and sql_exporter.sh: Debian's
# prometheus-postgres-exporter (0.11.1), curl to scrape it, PyYAML to read
# the queries file. The package enables its own service on a machine with
# systemd (on :9187, for a local PostgreSQL); the scenario neither needs nor
# touches it: it runs its own exporter on a loopback port.
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

missing=()
for p in prometheus-postgres-exporter curl python3-yaml; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing Debian packages for the monitoring tests: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
