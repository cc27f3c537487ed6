#!/usr/bin/env bash
# How long the README's test command takes on this machine with nothing
# cached: a fresh clone of this checkout beside it (so that ../shared/ is
# reached as from the project), and empty caches for everything the
# project's scripts cache or build:
#   IDEM_CACHE    the PostgreSQL 18 and 15.18 trees, 16.2, the copy of 15
#                 for the units, the Debian 12 and 13 roots, the Citus and
#                 pg_tle trees (tests/servers/, tests/citus/, tests/portable/),
#                 and idem's cargo target folders (cargo-target/)
#   CARGO_HOME    the rustup proxies only: no cargo-pgrx, no crates fetched
#   PGRX_HOME     no `cargo pgrx init` yet
#   target/       new with the clone (the tests' outputs)
# What it cannot make cold: Debian packages this host already has (the
# scripts install what is missing with apt; bench/first_run.sh measures
# the demo's share of that on a new Debian 12 root).
#   bash bench/cold_test.sh        writes bench/out/cold_test/
# Takes as long as a cold run does; deletes the clone and the caches at the
# end (KEEP=1 keeps them; the cache can then replace /var/cache/idem).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/tests/servers/common.sh"
OUT="$ROOT/bench/out/cold_test"
work="/var/cache/idem-cold.$$"
clone="$(dirname "$ROOT")/idem-cold-test.$$"
mkdir -p "$OUT" "$work/pgrx"
cleanup() {
  if [ "${KEEP:-0}" = 1 ]; then echo "kept: $clone and $work"; return; fi
  (cd "$clone" 2>/dev/null && bash scripts/cluster.sh stop >/dev/null 2>&1) || true
  rm -rf --one-file-system "$clone" "$work"
}
trap cleanup EXIT
git clone -q "$ROOT" "$clone"
empty_cargo_home "$work/cargo"
echo "clone $clone at $(git -C "$clone" rev-parse --short HEAD); caches in $work; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
# (the host's own CARGO_HOME/bin, with its cargo-pgrx, off the PATH)
cold_path="$work/cargo/bin:$(echo "$PATH" | tr ':' '\n' | grep -vxF "${CARGO_HOME:-$HOME/.cargo}/bin" | paste -sd:)"
start=$(date +%s)
status=0
(cd "$clone" && env IDEM_CACHE="$work/cache" CARGO_HOME="$work/cargo" PGRX_HOME="$work/pgrx" \
   PATH="$cold_path" bash .ci/run) > "$OUT/test.log" 2>&1 || status=$?
end=$(date +%s)
{ echo "commit: $(git -C "$clone" rev-parse --short HEAD)"
  echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.1f GB", $2/1048576}' /proc/meminfo)"
  echo "cold test command: $((end - start)) s, exit status $status"
  grep -E '^[0-9]+ passed, [0-9]+ failed$' "$OUT/test.log" | tail -1
  grep -E '^failed: ' "$OUT/test.log" || true
  grep -E '^pg1[5-8]: ' "$OUT/test.log" | sed 's/\x1b\[[0-9;]*m//g' || true; } | tee "$OUT/summary.txt"
