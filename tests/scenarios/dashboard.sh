#!/usr/bin/env bash
# The Grafana dashboard (monitoring/idem-dashboard.json) uses only metrics
# and labels that the postgres_exporter queries file
# (monitoring/idem-queries.yaml) exports (tests/monitoring/check_dashboard.py),
# and the checker does catch a dashboard that does not. The live check,
# against a real exporter's scrape: tests/scenarios/prometheus.sh.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
check="$ROOT/tests/monitoring/check_dashboard.py"
queries="$ROOT/monitoring/idem-queries.yaml"
dashboard="$ROOT/monitoring/idem-dashboard.json"
work=$(mktemp -d /tmp/idem-dashboard.XXXXXX)
trap 'rm -rf "$work"' EXIT

python3 "$check" "$queries" "$dashboard"

# The checker itself: a misspelt metric, and a label its query lacks.
sed 's/idem_claims_total/idem_claim_total/' "$dashboard" > "$work/bad-metric.json"
sed 's/sum by (biz_type) (rate(idem_waits_total/sum by (key) (rate(idem_waits_total/' "$dashboard" > "$work/bad-label.json"
for bad in bad-metric bad-label; do
  if python3 "$check" "$queries" "$work/$bad.json" > "$work/$bad.out" 2>&1; then
    echo "FAIL: the checker accepted $bad.json"; exit 1
  fi
  echo "the checker refuses $bad.json: $(grep -m1 FAIL "$work/$bad.out")"
done
