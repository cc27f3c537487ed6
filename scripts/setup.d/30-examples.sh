#!/usr/bin/env bash
# Toolchains and drivers for the example programs in examples/ (run by
# tests/scenarios/examples_*.sh): Node.js with npm and the `pg` package,
# a JDK with Debian's PostgreSQL JDBC driver, the Rust example (built with
# its pinned crates).
# Python's psycopg comes with the venv (10-python.sh). Each step is skipped
# when already done.
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

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
