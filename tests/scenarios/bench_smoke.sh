#!/usr/bin/env bash
# The benchmark runs end to end on tiny sizes (no timing is asserted: that is
# the benchmark's job, on a quiet machine). Proves bench/run.sh works from a
# fresh checkout: its own cluster, every variant, the CSV/JSON/SVG outputs.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
out="$ROOT/target/bench-smoke"
rm -rf "$out"
bash "$ROOT/bench/run.sh" --smoke --out "$out"
for f in results.csv results.json report.md tps.svg; do
  [ -s "$out/$f" ] || { echo "FAIL: bench/run.sh --smoke wrote no $f"; exit 1; }
done
for v in B0 B1 B1r B2 I1 I1c I1f I2 I3; do
  grep -q "^matrix,$v," "$out/results.csv" || { echo "FAIL: no measurement of $v"; exit 1; }
done
for s in latency wal bytes sustained scale partitions cleanup portable batch; do
  grep -q "^$s," "$out/results.csv" || { echo "FAIL: no measurement in section $s"; exit 1; }
done
grep -q "^## Targets" "$out/report.md" || { echo "FAIL: report.md has no targets table"; exit 1; }
echo ok
