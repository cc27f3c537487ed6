#!/usr/bin/env bash
# The README's two commands timed with nothing cached:
#   bash bench/cold.sh demo    the demo, on a new Debian 12 root (below, cold_demo)
#   bash bench/cold.sh tests   the test suite, from a fresh clone (below, cold_tests)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/tests/servers/common.sh"

# demo: the README's demo on a new Debian 12 root (debootstrap minbase +
# ca-certificates, run through tests/servers/in-trixie.sh) with only what the
# README asks for, a Rust toolchain (the host's rustup toolchains behind a
# fresh CARGO_HOME) and a fresh target folder; `bash scripts/demo.sh` cold,
# then warm, timed. Writes bench/out/first_run/; needs deb.debian.org and
# crates.io; deletes its root and caches at the end (KEEP=1 keeps them).
cold_demo() {
OUT="$ROOT/bench/out/first_run"
work="$IDEM_CACHE/first-run.$$"
# The demo in the root makes its cluster in the checkout's .cluster/ (owned
# by the root's postgres user): the host's own must not be there.
[ ! -e "$ROOT/.cluster" ] || die "$ROOT/.cluster exists (the host's cluster: bash scripts/cluster.sh stop, then move it away); the demo in the root would use it"
mkdir -p "$OUT" "$work"
cleanup() {
  [ "${KEEP:-0}" = 1 ] && { echo "kept: $work and $ROOT/.cluster"; return; }
  rm -rf "$ROOT/.cluster"
  # (nothing is mounted there: in-trixie.sh mounts in a private namespace)
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT
host_packages debootstrap debian-archive-keyring

t0=$(date +%s)
log "debootstrap bookworm (minbase) into $work/root"
unshare --mount --propagation private -- debootstrap --variant=minbase --include=ca-certificates \
  bookworm "$work/root" http://deb.debian.org/debian > "$OUT/debootstrap.log" 2>&1
printf '#!/bin/sh\nexit 101\n' > "$work/root/usr/sbin/policy-rc.d"; chmod 755 "$work/root/usr/sbin/policy-rc.d"
cat > "$work/root/etc/apt/sources.list" <<SOURCES
deb http://deb.debian.org/debian bookworm main
deb http://deb.debian.org/debian bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
SOURCES
cp /etc/hosts "$work/root/etc/hosts"
echo "root made in $(( $(date +%s) - t0 )) s (not part of the measurement)"

# A CARGO_HOME with the rustup proxies only (cargo, rustc, ...), on the
# host's toolchains (RUSTUP_HOME).
mkdir -p "$work/cargo/bin" "$work/root/tmp/idem-target"
empty_cargo_home "$work/cargo"

run() { # NAME: the demo in the root, timed
  local name=$1 start end
  log "demo, $name run (log: $OUT/demo-$name.log)"
  start=$(date +%s)
  /usr/bin/time -f "%e s wall, %U s user, %S s system CPU" -o "$OUT/demo-$name.time" \
    env CARGO_HOME="$work/cargo" CARGO_TARGET_DIR=/tmp/idem-target IDEM_PORT="${IDEM_FIRST_RUN_PORT:-5479}" \
        IDEM_TRIXIE_ROOT="$work/root" IDEM_TRIXIE_PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config \
        IDEM_TRIXIE_ENV="CARGO_TARGET_DIR" DEBIAN_FRONTEND=noninteractive \
        bash "$ROOT/tests/servers/in-trixie.sh" bash scripts/demo.sh > "$OUT/demo-$name.log" 2>&1 \
    || { tail -30 "$OUT/demo-$name.log"; die "the $name demo run failed"; }
  end=$(date +%s)
  echo "$name: $(cat "$OUT/demo-$name.time")"
  grep -E "^\s+\(|demo finished" "$OUT/demo-$name.log" | sed 's/\x1b\[[0-9;]*m//g' | sed 's/^/    /'
}
run cold
run warm
# Stop the demo's cluster (it runs in the root, from the checkout's .cluster/).
IDEM_TRIXIE_ROOT="$work/root" IDEM_TRIXIE_PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config IDEM_PORT="${IDEM_FIRST_RUN_PORT:-5479}" \
  bash "$ROOT/tests/servers/in-trixie.sh" bash scripts/cluster.sh stop >/dev/null 2>&1 || true
{ echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.1f GB", $2/1048576}' /proc/meminfo), load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "cold: $(cat "$OUT/demo-cold.time")"; echo "warm: $(cat "$OUT/demo-warm.time")"; } | tee "$OUT/summary.txt"
}

# tests: the README's test command in a fresh clone beside this checkout (so
# that ../shared/ is reached as from the project) with empty IDEM_CACHE (the
# servers, roots, Citus and pg_tle trees, cargo targets), CARGO_HOME (rustup
# proxies only) and PGRX_HOME; Debian packages the host has stay installed.
# Writes bench/out/cold_test/; deletes the clone and caches (KEEP=1 keeps them).
cold_tests() {
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
# (each step's wall and CPU seconds, kept with the report: the clone goes)
cp "$clone/target/test-out/times.tsv" "$OUT/times.tsv" 2>/dev/null || true
{ echo "commit: $(git -C "$clone" rev-parse --short HEAD)"
  echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.1f GB", $2/1048576}' /proc/meminfo)"
  echo "cold test command: $((end - start)) s, exit status $status"
  grep -E '^[0-9]+ passed, [0-9]+ failed$' "$OUT/test.log" | tail -1
  grep -E '^failed: ' "$OUT/test.log" || true
  grep -E '^pg1[5-8]: ' "$OUT/test.log" | sed 's/\x1b\[[0-9;]*m//g' || true; } | tee "$OUT/summary.txt"
}

case "${1:-}" in
demo) cold_demo ;;
tests) cold_tests ;;
*) echo "usage: bash bench/cold.sh demo|tests" >&2; exit 2 ;;
esac
