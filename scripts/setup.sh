#!/usr/bin/env bash
# Install what idem needs on Debian 12 (as root), then build and install the
# extension into the system PostgreSQL 15. Safe to run again: each step is
# skipped when already done.
#   bash scripts/setup.sh            what building and running idem needs (the demo's part)
#   bash scripts/setup.sh --tests    also the test suite's tools: scripts/setup.d/*.sh
# Not installed here: a Rust toolchain (rustup, https://rustup.rs), Rust
# 1.89 or newer to build (idem's locked dependencies need it), 1.95 or newer
# for the tests (pgrx-tests' sysinfo); checked first.
# Another PostgreSQL: PG_CONFIG=/path/to/pg_config bash scripts/setup.sh
# (see lib.sh). A Debian-packaged one (/usr/lib/postgresql/NN/bin/pg_config)
# gets its packages from apt; for any other, the version-specific packages
# are skipped (the server and its headers come with it).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

tests=0
[ "${1:-}" = --tests ] && tests=1
RUST_MIN=1.89
RUST_MIN_TESTS=1.95

# step NAME: announce a step; its time is printed when the next one starts
# (and by step_end).
step_started= step_name=
step_end() {
  [ -z "$step_started" ] || printf '    (%s: %d s)\n' "$step_name" $(( $(date +%s) - step_started ))
  step_started=
}
step() { step_end; step_name=$1; step_started=$(date +%s); say "$1"; }

# The one prerequisite: cargo and rustc, new enough.
need=$RUST_MIN
[ $tests = 1 ] && need=$RUST_MIN_TESTS
if ! command -v cargo >/dev/null || ! command -v rustc >/dev/null; then
  cat >&2 <<MSG
idem needs a Rust toolchain ($need or newer), which this script does not install.
Install it with rustup (https://rustup.rs), as the user that runs this script:
  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
  . "\$HOME/.cargo/env"
MSG
  exit 1
fi
have=$(rustc --version | awk '{print $2}')
if [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
  echo "rustc $have is older than $need, which idem's build needs$([ $tests = 1 ] && echo ' with its tests'): rustup update stable" >&2
  exit 1
fi

# What building and running idem needs (the server, its headers, bindgen's
# libclang, a C compiler, sudo for the scripts), and pg_cron, which the
# demo schedules maintenance with (Debian's PostgreSQL only).
PACKAGES=(libclang-dev clang sudo build-essential pkg-config)
[ "$PG_DEBIAN" = 1 ] && PACKAGES=("postgresql-$PG_MAJOR" "postgresql-server-dev-$PG_MAJOR" "postgresql-$PG_MAJOR-cron" "${PACKAGES[@]}")
# The test suite's: PL/Proxy (Debian's PostgreSQL only), TAP tests'
# IPC::Run, Python for drivers and property tests.
TEST_PACKAGES=(libipc-run-perl python3-venv python3-pip)
[ "$PG_DEBIAN" = 1 ] && TEST_PACKAGES=("postgresql-$PG_MAJOR-plproxy" "${TEST_PACKAGES[@]}")
[ $tests = 1 ] && PACKAGES+=("${TEST_PACKAGES[@]}")

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

# cargo-pgrx builds while apt installs (it needs only the Rust toolchain and
# a linker): the two overlap. Built with cargo's dev profile, no debug info:
# half the compile time of a release build, and it only drives builds.
pgrx_log="${TMPDIR:-/tmp}/idem-cargo-pgrx-install.$$.log"
pgrx_pid=
if ! cargo pgrx --version 2>/dev/null | grep -q "$PGRX_VERSION"; then
  if command -v cc >/dev/null; then
    step "building cargo-pgrx $PGRX_VERSION in the background (once; about 3 minutes of CPU on 2 cores, log: $pgrx_log)"
    CARGO_PROFILE_DEV_DEBUG=0 cargo install cargo-pgrx --version "$PGRX_VERSION" --locked --debug > "$pgrx_log" 2>&1 &
    pgrx_pid=$!
  else
    pgrx_pid=later   # no C linker yet: after build-essential is installed
  fi
fi
if [ ${#missing[@]} -gt 0 ]; then
  step "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ "$pgrx_pid" = later ]; then
  step "building cargo-pgrx $PGRX_VERSION (once; about 3 minutes of CPU on 2 cores)"
  CARGO_PROFILE_DEV_DEBUG=0 cargo install cargo-pgrx --version "$PGRX_VERSION" --locked --debug
elif [ -n "$pgrx_pid" ]; then
  step "waiting for cargo-pgrx $PGRX_VERSION to finish building"
  if ! wait "$pgrx_pid"; then
    tail -30 "$pgrx_log" >&2
    echo "cargo install cargo-pgrx failed (log: $pgrx_log)" >&2
    exit 1
  fi
  rm -f "$pgrx_log"
fi
idem_locate_cluster

# `cargo pgrx init` rewrites config.toml with just the versions it is given:
# pass every version already configured (whose pg_config still exists) too.
# Under a lock: scripts/test.sh runs the other majors' set-ups side by side.
pgrx_config="${PGRX_HOME:-$HOME/.pgrx}/config.toml"
mkdir -p "$(dirname "$pgrx_config")"
exec {pgrx_lock}> "$pgrx_config.lock"
flock "$pgrx_lock"
if ! grep -qsxF "pg$PG_MAJOR = \"$PG_CONFIG\"" "$pgrx_config"; then
  init_args=()
  while IFS= read -r line; do
    if [[ "$line" =~ ^pg([0-9]+)\ =\ \"(.*)\"$ ]] && [ "${BASH_REMATCH[1]}" != "$PG_MAJOR" ]; then
      if [ -x "${BASH_REMATCH[2]}" ]; then init_args+=("--pg${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}")
      else echo "dropping pg${BASH_REMATCH[1]} from $pgrx_config: ${BASH_REMATCH[2]} is gone" >&2; fi
    fi
  done < <(cat "$pgrx_config" 2>/dev/null || true)
  step "pointing pgrx at PostgreSQL $PG_MAJOR ($PG_CONFIG)"
  cargo pgrx init "${init_args[@]}" "--pg$PG_MAJOR" "$PG_CONFIG" >/dev/null
fi
exec {pgrx_lock}>&-

# The test suite's own tools (language drivers, toolchains, exporters):
# scripts/setup.d/*.sh, in name order, each idempotent. The core suite that
# runs on the other majors (scripts/test.sh, IDEM_SUITE=core) needs only
# Python and ps.
if [ $tests = 1 ]; then
  step "the test suite's tools (scripts/setup.d)"
  for s in "$ROOT"/scripts/setup.d/*.sh; do
    [ -e "$s" ] || continue
    if [ "${IDEM_SUITE:-full}" = core ] && [[ ! "$(basename "$s")" =~ ^(10-python|20-stress) ]]; then continue; fi
    bash "$s"
  done
fi

step "building and installing the extension (release build)"
cd "$ROOT"
idem_build "$ROOT" cargo pgrx install --release --pg-config "$PG_CONFIG" "${PG_FEATURE_ARGS[@]}" 2>&1 | grep -E "^error|^warning|Finished installing" || true
test -f "$($PG_CONFIG --pkglibdir)/idem.so" || { echo "idem.so was not installed" >&2; exit 1; }
step_end
