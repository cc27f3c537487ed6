#!/usr/bin/env bash
# Install what idem needs on Debian 12 (as root), then build and install the
# extension into the system PostgreSQL 15. Safe to run again: each step is
# skipped when already done.
#   bash scripts/setup.sh            what building and running idem needs (the demo's part)
#   bash scripts/setup.sh --tests    also the test suite's tools: TEST_TOOLS below
#   bash scripts/setup.sh --tool NAME...   only these tools (a tool_NAME below, or a
#                                    file of scripts/setup.d/), nothing else
# Not installed here: a Rust toolchain (rustup, https://rustup.rs), Rust
# 1.89 or newer to build (idem's locked dependencies need it), 1.95 or newer
# for the tests (pgrx-tests' sysinfo); checked first.
# Another PostgreSQL: PG_CONFIG=/path/to/pg_config bash scripts/setup.sh
# (see lib.sh). A Debian-packaged one (/usr/lib/postgresql/NN/bin/pg_config)
# gets its packages from apt; for any other, the version-specific packages
# are skipped (the server and its headers come with it).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# The test suite's own tools (language drivers, toolchains, exporters), in
# this order, each idempotent: a tool_NAME function here, or a file of
# scripts/setup.d/. The core suite that runs on the other majors
# (scripts/test.sh, IDEM_SUITE=core) needs only Python and ps.
TEST_TOOLS=(10-python.sh stress examples 50-pgbouncer.sh monitoring pgxn 80-middleware-go.sh middleware_node
            80-middleware-python.sh 85-java.sh)
CORE_TOOLS=(10-python.sh stress)
run_tool() { case "$1" in *.sh) bash "$ROOT/scripts/setup.d/$1" ;; *) "tool_${1//-/_}" ;; esac; }

# The crash and failover tests (tests/lib/cluster.sh) find a postmaster's
# children with ps, which minimal Debian images lack. (amcheck and
# pg_basebackup come with postgresql-15; psycopg with 10-python.sh.)
tool_stress() (
  if ! dpkg-query -W -f='${Status}' procps 2>/dev/null | grep -q "install ok installed"; then
    say "installing procps (ps, for the crash and failover tests)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq procps >/dev/null
  fi
)
# Toolchains and drivers for the example programs in examples/ (run by
# tests/scenarios/examples_*.sh): Node.js with npm and the `pg` package,
# a JDK with Debian's PostgreSQL JDBC driver, the Rust example (built with
# its pinned crates).
# Python's psycopg comes with the venv (10-python.sh). Each step is skipped
# when already done.
tool_examples() (
  apt_missing=()
  # A machine may have Node.js and npm from elsewhere (NodeSource ships both in
  # one package); only what is missing comes from Debian (Node.js 18).
  command -v node >/dev/null || apt_missing+=(nodejs)
  command -v npm >/dev/null || apt_missing+=(npm)
  command -v javac >/dev/null || apt_missing+=(default-jdk-headless)
  [ -f /usr/share/java/postgresql.jar ] || apt_missing+=(libpostgresql-jdbc-java)
  if [ ${#apt_missing[@]} -gt 0 ]; then
    say "installing Debian packages for the examples: ${apt_missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${apt_missing[@]}" >/dev/null
  fi

  # npm writes node_modules/.package-lock.json on every install: newer than the
  # committed lock means the installed tree is the locked one.
  node_dir="$ROOT/examples/node-consumer"
  if [ ! "$node_dir/node_modules/.package-lock.json" -nt "$node_dir/package-lock.json" ]; then
    say "installing the Node example's packages (npm ci)"
    (cd "$node_dir" && npm ci --no-audit --no-fund --loglevel=error)
  fi

  # The Rust example, built here with the crates its Cargo.lock pins: a cold
  # build takes 20 s on an idle 2-core machine and over a minute on a busy
  # one, too much for its test's time. A no-op when up to date (the test
  # builds again, incrementally, to pick up any change); errors still print.
  rust_dir="$ROOT/examples/rust-batch"
  # (target$IDEM_OS_SUFFIX: build scripts linked against another system's glibc
  # must not be reused; see lib.sh)
  (cd "$rust_dir" && cargo build --locked --quiet --target-dir "$rust_dir/target$IDEM_OS_SUFFIX")
)
# For tests/scenarios/prometheus.sh, dashboard.sh and sql_exporter.sh: Debian's
# prometheus-postgres-exporter (0.11.1), curl to scrape it, PyYAML to read
# the queries file. The package enables its own service on a machine with
# systemd (on :9187, for a local PostgreSQL); the scenario neither needs nor
# touches it: it runs its own exporter on a loopback port.
tool_monitoring() (
  missing=()
  for p in prometheus-postgres-exporter curl python3-yaml; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing Debian packages for the monitoring tests: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
)
# For tests/scenarios/pgxn.sh: Debian's PGXN client (pgxnclient 1.3), which
# `pgxn install`s idem from a distribution zip with the Makefile, and unzip,
# which the test lists the zip with (not on a minimal Debian 12).
tool_pgxn() (
  missing=()
  command -v pgxn >/dev/null || missing+=(pgxnclient)
  command -v unzip >/dev/null || missing+=(unzip)
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]} (Debian packages, for the PGXN test)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
)
# For tests/scenarios/middleware_node.sh: the npm packages a user's project
# installs next to idem-pg (express, fastify, pg, and typescript with the
# types for the .d.ts check; clients/node/test/package.json), fetched once
# into npm's cache, so that the scenario's `npm install --prefer-offline`
# in a fresh folder needs no network. Node.js and npm come from
# tool_examples, PgBouncer from setup.d/50-pgbouncer.sh. Skipped when the cache
# already holds what that package.json asks for.
tool_middleware_node() (
  spec="$ROOT/clients/node/test/package.json"
  stamp_dir=/var/cache/idem/middleware-node
  stamp="$stamp_dir/$(sha256sum "$spec" | cut -c1-16)"
  if [ ! -f "$stamp" ]; then
    say "filling npm's cache for the Node middleware test (express, fastify, pg, typescript)"
    scratch=$(mktemp -d /tmp/middleware-node-setup.XXXXXX)
    cp "$spec" "$scratch/package.json"
    (cd "$scratch" && npm install --no-audit --no-fund --loglevel=error >/dev/null)
    rm -rf "$scratch"
    mkdir -p "$stamp_dir"
    touch "$stamp"
  fi
)

if [ "${1:-}" = --tool ]; then
  shift
  for t in "$@"; do run_tool "$t"; done
  exit 0
fi

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

if [ $tests = 1 ]; then
  step "the test suite's tools"
  tools=("${TEST_TOOLS[@]}")
  [ "${IDEM_SUITE:-full}" != core ] || tools=("${CORE_TOOLS[@]}")
  for t in "${tools[@]}"; do run_tool "$t"; done
  # (a file of scripts/setup.d/ not listed above runs too, last)
  for f in "$ROOT"/scripts/setup.d/*.sh; do
    [ -e "$f" ] && [ "${IDEM_SUITE:-full}" != core ] || continue
    printf '%s\n' "${TEST_TOOLS[@]}" | grep -qx "$(basename "$f")" || bash "$f"
  done
fi

step "building and installing the extension (release build)"
cd "$ROOT"
idem_build "$ROOT" cargo pgrx install --release --pg-config "$PG_CONFIG" "${PG_FEATURE_ARGS[@]}" 2>&1 | grep -E "^error|^warning|Finished installing" || true
test -f "$($PG_CONFIG --pkglibdir)/idem.so" || { echo "idem.so was not installed" >&2; exit 1; }
step_end
