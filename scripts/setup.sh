#!/usr/bin/env bash
# Install what idem needs on Debian 12 (as root), then build and install the
# extension into the system PostgreSQL 15. Safe to run again: each step is
# skipped when already done.
#   bash scripts/setup.sh            what building and running idem needs (the demo's part)
#   bash scripts/setup.sh --tests    also the test suite's tools: TEST_TOOLS below
#   bash scripts/setup.sh --tool NAME...   only these tools (a tool_NAME below), nothing else
# Not installed here: a Rust toolchain (rustup, https://rustup.rs), Rust
# 1.89 or newer to build (idem's locked dependencies need it), 1.95 or newer
# for the tests (pgrx-tests' sysinfo); checked first.
# Another PostgreSQL: PG_CONFIG=/path/to/pg_config bash scripts/setup.sh
# (see lib.sh). A Debian-packaged one (/usr/lib/postgresql/NN/bin/pg_config)
# gets its packages from apt; for any other, the version-specific packages
# are skipped (the server and its headers come with it).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# The test suite's own tools (language drivers, toolchains, exporters), in
# this order, each idempotent: a tool_NAME function here. The core suite
# that runs on the other majors (scripts/test.sh, IDEM_SUITE=core) needs only Python and ps.
TEST_TOOLS=(python stress examples pgbouncer monitoring pgxn middleware_go middleware_node middleware_python java)
CORE_TOOLS=(python stress)
run_tool() { "tool_${1//-/_}"; }

# The crash and failover tests (tests/lib/cluster.sh) find a postmaster's
# children with ps, which minimal Debian images lack. (amcheck and
# pg_basebackup come with postgresql-15; psycopg with tool_python.)
tool_stress() (
  apt_install "ps, for the crash and failover tests" procps
)
# Toolchains and drivers for the example programs in examples/ (run by
# tests/scenarios/examples_*.sh): Node.js with npm and the `pg` package,
# a JDK with Debian's PostgreSQL JDBC driver, the Rust example (built with
# its pinned crates).
# Python's psycopg comes with the venv (tool_python). Each step is skipped
# when already done.
tool_examples() (
  apt_missing=()
  # A machine may have Node.js and npm from elsewhere (NodeSource ships both in
  # one package); only what is missing comes from Debian (Node.js 18).
  command -v node >/dev/null || apt_missing+=(nodejs)
  command -v npm >/dev/null || apt_missing+=(npm)
  command -v javac >/dev/null || apt_missing+=(default-jdk-headless)
  [ -f /usr/share/java/postgresql.jar ] || apt_missing+=(libpostgresql-jdbc-java)
  [ ${#apt_missing[@]} = 0 ] || apt_install "for the examples" "${apt_missing[@]}"

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
  # must not be reused; see lib.sh. It is a link to a folder of the machine's
  # cache, as idem's own cargo targets are: a new clone compiles the example
  # alone, not its pinned crates again, 48 CPU s.)
  target="$rust_dir/target$IDEM_OS_SUFFIX" cache="$IDEM_CACHE/cargo-target/rust-batch$IDEM_OS_SUFFIX"
  if [ ! -e "$target" ] && mkdir -p "$cache" 2>/dev/null && [ -w "$cache" ]; then ln -s "$cache" "$target"; fi
  (cd "$rust_dir" && cargo build --locked --quiet --target-dir "$target")
)
# For tests/scenarios/monitoring.sh (prometheus, dashboard, sql_exporter): Debian's
# prometheus-postgres-exporter (0.11.1), curl to scrape it, PyYAML to read
# the queries file. The package enables its own service on a machine with
# systemd (on :9187, for a local PostgreSQL); the scenario neither needs nor
# touches it: it runs its own exporter on a loopback port.
tool_monitoring() (
  apt_install "for the monitoring tests" prometheus-postgres-exporter curl python3-yaml
)
# For tests/scenarios/packaging.sh pgxn: Debian's PGXN client (pgxnclient 1.3), which
# `pgxn install`s idem from a distribution zip with the Makefile, and unzip,
# which the test lists the zip with (not on a minimal Debian 12).
tool_pgxn() (
  missing=()
  command -v pgxn >/dev/null || missing+=(pgxnclient)
  command -v unzip >/dev/null || missing+=(unzip)
  [ ${#missing[@]} = 0 ] || apt_install "for the PGXN test" "${missing[@]}"
)
# For tests/scenarios/clients.sh middleware_node: the npm packages a user's project
# installs next to idem-pg (express, fastify, pg, and typescript with the
# types for the .d.ts check; clients/node/test/package.json), fetched once
# into npm's cache, so that the scenario's `npm install --prefer-offline`
# in a fresh folder needs no network. Node.js and npm come from
# tool_examples, PgBouncer from tool_pgbouncer. Skipped when the cache
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

# A Python venv with the client driver (psycopg 3 from PyPI) and the
# property-testing library, for the stress driver, fuzz tests and examples.
tool_python() (
  PY_PACKAGES=("psycopg[binary]==3.2.*" "hypothesis==6.*")
  if [ ! -x "$IDEM_PY" ]; then
    say "creating the Python venv in $IDEM_VENV"
    python3 -m venv "$IDEM_VENV"
  fi
  if ! "$IDEM_PY" -c "import psycopg, hypothesis" 2>/dev/null; then
    say "installing Python packages: ${PY_PACKAGES[*]}"
    "$IDEM_PY" -m pip install -q --disable-pip-version-check "${PY_PACKAGES[@]}"
  fi
)
# PgBouncer (Debian 12's package, 1.18) for tests/scenarios/clients.sh pgbouncer,
# which runs its own PgBouncer on loopback in front of its own cluster. On a
# machine with systemd, the package also enables its own service on
# 127.0.0.1:6432; the scenario neither needs nor touches it.
tool_pgbouncer() (
  [ -x /usr/sbin/pgbouncer ] || apt_install "for the pooler scenario" pgbouncer
)
# What tests/scenarios/clients.sh middleware_go needs: a Go toolchain (GO_MIN or
# newer, tests/lib/middleware.sh) and the modules of the Go client (clients/go:
# pgx) and of its test servers (clients/go/test: chi, echo, gin), downloaded
# from the Go module proxy once into /var/cache/idem/go/mod, so that the
# scenario builds offline (GOPROXY=off). A machine without a new enough Go
# gets Debian's (1.19), which only fetches the toolchain module that the go
# command itself would take from the proxy; that one is used from then on.
# Skipped when the cache already holds what both go.sum files name.
tool_middleware_go() (
  source "$ROOT/tests/lib/middleware.sh"

  go_env online
  if ! go_new_enough; then
    if ! command -v go >/dev/null; then
      apt_install "Debian's Go, to fetch a newer toolchain with" golang-go
    fi
    say "fetching the Go toolchain module golang.org/toolchain@$GO_TOOLCHAIN from the Go module proxy"
    mkdir -p "$GO_CACHE_DIR"
    dir=$(cd /tmp && GOFLAGS=-mod=mod GO111MODULE=on go mod download -json "golang.org/toolchain@$GO_TOOLCHAIN" |
          sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [ -n "$dir" ] && [ -f "$dir/bin/go" ] || { echo "the toolchain module did not unpack" >&2; exit 1; }
    # (the module cache is read-only and keeps no execute bits; the go
    # command sets them the same way when it switches toolchains)
    chmod -R u+w "$dir" && chmod +x "$dir"/bin/* "$dir"/pkg/tool/*/*
    echo "$dir" > "$GO_CACHE_DIR/goroot"
    go_env online
    go_new_enough || { echo "the toolchain in $dir is not Go $GO_MIN or newer" >&2; exit 1; }
  fi

  # (go.mod too: a module newly required can have its hashes in go.sum already)
  stamp="$GO_CACHE_DIR/.complete-$(cat "$ROOT"/clients/go/go.{mod,sum} "$ROOT"/clients/go/test/go.{mod,sum} | sha256sum | cut -c1-16)"
  if [ ! -f "$stamp" ]; then
    say "downloading the Go client's modules (pgx, chi, echo, gin) into $GO_CACHE_DIR/mod"
    (cd "$ROOT/clients/go" && go mod download)
    (cd "$ROOT/clients/go/test" && go mod download)
    touch "$stamp"
  fi
)
# What tests/scenarios/clients.sh middleware_python needs: the wheels of the web
# frameworks the idem-http package integrates with (FastAPI, Starlette,
# uvicorn, Django, SQLAlchemy), of its client (httpx), of psycopg 3 and of
# the build backend (setuptools), downloaded from PyPI once into a local
# wheelhouse. The scenario then builds idem-http's wheel and installs it,
# with these, into a fresh venv of its own, offline (pip --no-index
# --find-links), exactly as a user's `pip install` would.
# Skipped when the wheelhouse already holds every requirement.
tool_middleware_python() (
  MW_WHEELHOUSE="$ROOT/.venv-wheels$IDEM_OS_SUFFIX/middleware-python"
  MW_REQUIREMENTS=("psycopg[binary]==3.2.*" "psycopg-pool==3.2.*" "fastapi==0.115.*" "starlette" "uvicorn==0.32.*"
                   "Django==5.1.*" "SQLAlchemy==2.0.*" "httpx==0.27.*"
                   "setuptools>=69" "wheel" "build==1.2.*" "mypy==1.13.*")
  stamp="$MW_WHEELHOUSE/.complete-$(printf '%s\n' "${MW_REQUIREMENTS[@]}" | md5sum | cut -c1-12)"
  if [ ! -f "$stamp" ]; then
    say "downloading the middleware scenario's wheels into $MW_WHEELHOUSE"
    mkdir -p "$MW_WHEELHOUSE"
    # (the project venv's pip: tool_python made it; Debian's python3 may have none)
    "$IDEM_PY" -m pip download -q --disable-pip-version-check --only-binary=:all: \
      -d "$MW_WHEELHOUSE" "${MW_REQUIREMENTS[@]}"
    touch "$stamp"
  fi
)
# For tests/scenarios/clients.sh java_spring: Maven, and every artifact the build
# of clients/java needs under Spring Boot 3.5 and 4.0 (Spring Boot,
# Hibernate, pgJDBC, JUnit, Maven's
# plugins and Surefire's JUnit provider, spring-kafka) fetched from Maven
# Central into $IDEM_MAVEN_REPO (lib.sh), so that the scenario builds
# offline; and the jars of the Kafka broker the scenario runs (kafka_2.13,
# KRaft) copied into $IDEM_KAFKA_LIBS. The JDK
# comes from tool_examples. Skipped when that repository already served
# these pom files.
tool_java() (
  command -v mvn >/dev/null || apt_install "Maven" maven

  src="$ROOT/clients/java"
  stamp="$IDEM_MAVEN_REPO/.idem-stamps/$(cat "$src"/pom.xml "$src"/*/pom.xml | sha256sum | cut -c1-16)"
  if [ ! -f "$stamp" ]; then
    say "filling Maven's repository for clients/java ($IDEM_MAVEN_REPO)"
    scratch=$(mktemp -d /tmp/java-setup.XXXXXX)
    tar -C "$src" --exclude=target -cf - . | tar -C "$scratch" -xf -
    # The whole build with the starter's database-free test (that resolves
    # Surefire's provider); the application test needs a database and is
    # left out here (no test of that name matches in its module).
    # Both Spring Boot lines the scenario builds (JAVA_BOOT_VERSIONS there).
    for boot in 3.5.7 4.0.7; do
      if ! (cd "$scratch" && mvn_idem -q clean verify -Dspring-boot.version=$boot -Dtest=OutsideTransactionTest \
              -Dsurefire.failIfNoSpecifiedTests=false) > "$scratch.log" 2>&1; then
        tail -40 "$scratch.log"; rm -rf "$scratch" "$scratch.log"; exit 1
      fi
    done
    rm -rf "$scratch" "$scratch.log"
    mkdir -p "$(dirname "$stamp")"
    touch "$stamp"
  fi

  if [ ! -f "$IDEM_KAFKA_LIBS/.complete" ]; then
    say "fetching the Kafka broker's jars ($IDEM_KAFKA_LIBS)"
    rm -rf "$IDEM_KAFKA_LIBS"
    mvn_idem -q -f "$src/it/kafka-broker/pom.xml" dependency:copy-dependencies -DoutputDirectory="$IDEM_KAFKA_LIBS" \
      || { rm -rf "$IDEM_KAFKA_LIBS"; exit 1; }
    touch "$IDEM_KAFKA_LIBS/.complete"
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
if [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | sed -n 1p)" != "$need" ]; then
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
  grep -q "install ok installed" <<<"$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" || missing+=("$p")
done

# cargo-pgrx builds while apt installs (it needs only the Rust toolchain and
# a linker): the two overlap. Built with cargo's dev profile, no debug info:
# half the compile time of a release build, and it only drives builds.
pgrx_log="${TMPDIR:-/tmp}/idem-cargo-pgrx-install.$$.log"
pgrx_pid=
if ! grep -q "$PGRX_VERSION" <<<"$(cargo pgrx --version 2>/dev/null)"; then
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
  apt_install "" "${missing[@]}"
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
fi

step "building and installing the extension (release build)"
cd "$ROOT"
idem_build "$ROOT" cargo pgrx install --release --pg-config "$PG_CONFIG" "${PG_FEATURE_ARGS[@]}" 2>&1 | grep -E "^error|^warning|Finished installing" || true
test -f "$($PG_CONFIG --pkglibdir)/idem.so" || { echo "idem.so was not installed" >&2; exit 1; }
step_end
