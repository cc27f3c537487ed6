# Shared by the project's scripts: where things are, and how to reach the
# private cluster. Source it; it defines functions and variables only.
#
# Which PostgreSQL: the one whose pg_config is $PG_CONFIG, by default Debian
# 12's PostgreSQL 15 (/usr/lib/postgresql/15/bin/pg_config). Others:
#   PG_CONFIG=$(bash tests/servers/pg18.sh) bash scripts/test.sh     18, built from source
#   PG_CONFIG=$(bash tests/servers/pg16.sh) bash scripts/test.sh     16.2, from PyPI's pgserver wheel
#   bash tests/servers/in-trixie.sh bash scripts/test.sh               17, in a Debian 13 root
# Each major version has its own cluster (.cluster/ and port 5499 for 15,
# .cluster-NN/ and port 54NN for the others), its own folder for test
# outputs (target/ for 15, target/pgNN/ for the others), its own cargo
# target folder (idem_build, below) and is built with --no-default-features
# --features pgNN when it is not 15.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PGRX_VERSION=0.18.1
PG_CONFIG="${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}"
if [ -x "$PG_CONFIG" ]; then
  PG_BIN="$("$PG_CONFIG" --bindir)"
  PG_MAJOR="$("$PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')"
  PGXS_TEST="$("$PG_CONFIG" --pkglibdir)/pgxs/src/test"
elif [[ "$PG_CONFIG" =~ ^/usr/lib/postgresql/([0-9]+)/bin/pg_config$ ]]; then
  # Debian's layout, before setup.sh has installed the package.
  PG_MAJOR="${BASH_REMATCH[1]}"
  PG_BIN="/usr/lib/postgresql/$PG_MAJOR/bin"
  PGXS_TEST="/usr/lib/postgresql/$PG_MAJOR/lib/pgxs/src/test"
else
  echo "PG_CONFIG=$PG_CONFIG: no such program" >&2
  exit 1
fi
[[ "$PG_MAJOR" =~ ^[0-9]+$ ]] || { echo "$PG_CONFIG: cannot tell the major version" >&2; exit 1; }
# Debian's packaged server (its packages can be installed with apt-get).
PG_DEBIAN=0
[ "$PG_CONFIG" != "/usr/lib/postgresql/$PG_MAJOR/bin/pg_config" ] || PG_DEBIAN=1

# What differs per major version. 15 keeps the names it always had.
if [ "$PG_MAJOR" = 15 ]; then
  PG_SUFFIX=""
  IDEM_PORT="${IDEM_PORT:-5499}"
  IDEM_TARGET="$ROOT/target"
  PG_FEATURE_ARGS=()
else
  PG_SUFFIX="-$PG_MAJOR"
  IDEM_PORT="${IDEM_PORT:-54$PG_MAJOR}"
  IDEM_TARGET="$ROOT/target/pg$PG_MAJOR"
  PG_FEATURE_ARGS=(--no-default-features --features "pg$PG_MAJOR")
fi

# Things built against the operating system's own libraries (a Python venv,
# the Rust example's build scripts) are kept apart per system, so that the
# Debian 13 root (tests/servers/in-trixie.sh) and the Debian 12 host can share
# one checkout: no suffix on Debian 12, "-debian13" in the root.
IDEM_OS_SUFFIX="$(. /etc/os-release && echo "-$ID$VERSION_ID")"
[ "$IDEM_OS_SUFFIX" != "-debian12" ] || IDEM_OS_SUFFIX=""

# Where cargo builds idem: one target folder per major and system under
# $IDEM_CACHE/cargo-target (IDEM_CACHE is /var/cache/idem unless set, where
# tests/servers/ keeps its trees), shared by every checkout on the machine,
# so that a new clone compiles idem itself (scripts/package.sh on 15: 14 s)
# and not its dependencies again (163 s, two minutes of CPU). A
# CARGO_TARGET_DIR set by the caller wins, unless this file chose it in a
# parent script (IDEM_CHOSEN_TARGET) for another major: scripts/test.sh runs
# the other majors' suites. A user who cannot write the cache builds in
# target/ as cargo would.
IDEM_CACHE="${IDEM_CACHE:-/var/cache/idem}"
if [ -z "${CARGO_TARGET_DIR:-}" ] || [ "$CARGO_TARGET_DIR" = "${IDEM_CHOSEN_TARGET:-}" ]; then
  CARGO_TARGET_DIR="$IDEM_CACHE/cargo-target/pg$PG_MAJOR$IDEM_OS_SUFFIX"
  mkdir -p "$CARGO_TARGET_DIR" 2>/dev/null && [ -w "$CARGO_TARGET_DIR" ] || CARGO_TARGET_DIR="$IDEM_TARGET"
  export IDEM_CHOSEN_TARGET="$CARGO_TARGET_DIR"
  # (a major's first build starts from 15's: idem_seed_target)
  IDEM_SEED_FROM=
  [ "$PG_MAJOR" = 15 ] || IDEM_SEED_FROM="$IDEM_CACHE/cargo-target/pg15$IDEM_OS_SUFFIX"
fi
export CARGO_TARGET_DIR

# idem_build SOURCE COMMAND...: run a command that builds idem from the
# source folder SOURCE and uses what it built (cargo pgrx install, package,
# test; make) holding the target folder's lock, so that another checkout's
# build cannot replace the library between the two. First, when the last
# build there came from another checkout, idem's own artifacts are removed
# (its dependencies stay): cargo judges them fresh by file times, and an
# older checkout's sources would look fresh against a newer one's build.
idem_build() {
  local source=$1
  shift
  mkdir -p "$CARGO_TARGET_DIR"
  (
    flock 8
    idem_seed_target
    local stamp="$CARGO_TARGET_DIR/.idem-built-from"
    if [ "$(cat "$stamp" 2>/dev/null)" != "$source" ]; then
      (cd "$ROOT" && cargo clean --quiet -p idem && cargo clean --quiet --release -p idem) 2>/dev/null || true
      echo "$source" > "$stamp"
    fi
    "$@"
  ) 8> "$CARGO_TARGET_DIR/.idem-build.lock"
}

# A target folder with no release build yet starts from a copy of the
# release build in $IDEM_SEED_FROM, when that folder has one (copied under
# its lock, so never half-written): cargo then compiles only what differs
# instead of every crate. Another major compiles pgrx-pg-sys, pgrx and idem
# with its own feature (measured on 16: 36 CPU s, against 133 from an empty
# folder); the PGXN scenario's build, pgrx-pg-sys again for its copy's
# pg_config, then pgrx and idem. Only the first build of a folder: the
# folders stay apart, because cargo writes idem's library to one path for
# every feature set, and one folder for all majors would compile idem
# again each time the major changes. (No cycle of locks: the folders
# seeded from are never seeded themselves.)
idem_seed_target() {
  local from=${IDEM_SEED_FROM:-} to=$CARGO_TARGET_DIR
  [ -n "$from" ] && [ "$from" != "$to" ] && [ ! -d "$to/release" ] && [ -d "$from/release" ] || return 0
  (
    flock 9
    rm -rf "$to/release.seeding"
    cp -a "$from/release" "$to/release.seeding"
    # (the stamp says which checkout built idem's own artifacts there)
    cp -a "$from/.rustc_info.json" "$from/.idem-built-from" "$to/" 2>/dev/null || true
    mv "$to/release.seeding" "$to/release"
  ) 9> "$from/.idem-build.lock"
}

# The cluster lives under the project folder, unless the postgres user cannot
# reach that folder (a checkout under /root, say): then under /tmp.
cluster_dir_now() {
  if sudo -u postgres test -x "$ROOT" 2>/dev/null; then
    echo "$ROOT/.cluster$PG_SUFFIX"
  else
    echo "/tmp/idem-cluster$PG_SUFFIX-$(echo "$ROOT" | md5sum | cut -c1-8)"
  fi
}
# Asked once per script, not per psql call: sudo can take seconds (it looks
# up the host name). Before setup.sh has installed sudo and PostgreSQL (on a
# fresh machine) there is no answer yet: a script that runs setup.sh first
# calls idem_locate_cluster after it.
idem_locate_cluster() { IDEM_CLUSTER_DIR=$(cluster_dir_now); }
IDEM_CLUSTER_DIR=
if command -v sudo >/dev/null && id postgres >/dev/null 2>&1; then idem_locate_cluster; fi
cluster_dir() {
  if [ -n "$IDEM_CLUSTER_DIR" ]; then echo "$IDEM_CLUSTER_DIR"; else cluster_dir_now; fi
}

# A scenario's own TCP port: BASE on 15, BASE + 100 per major above it
# (5516 → 5616 on 16): scripts/test.sh runs the other majors' suites side
# by side, and a private server that listens on 127.0.0.1 (tests/lib/cluster.sh)
# needs a port of its own there.
major_port() { echo $(( $1 + 100 * (PG_MAJOR - 15) )); }

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

# The Debian packages of PACKAGE... that are missing, installed from the
# machine's apt sources, saying why (WHY: "for the PGXN test"; "": the
# caller says what it installs). The suite's steps run side by side (the
# servers' builds beside the tests, each installing what it needs on a
# fresh machine), and apt and dpkg let one caller in at a time: every apt
# command of the suite goes through apt_locked, which queues on one lock,
# and apt waits for any other caller (an unattended upgrade) rather than
# failing.
apt_install() { # why package...
  local why=$1 missing=() p
  shift
  for p in "$@"; do
    grep -q "install ok installed" <<<"$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" || missing+=("$p")
  done
  [ ${#missing[@]} = 0 ] && return 0
  [ -z "$why" ] || printf '\033[1m==> %s\033[0m\n' "installing Debian packages ($why): ${missing[*]}" >&2
  apt_locked update -qq && apt_locked install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
apt_locked() { # apt-get argument...
  (flock 9 && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 "$@") 9> /var/cache/apt/idem-install.lock
}

as_postgres() { (cd / && sudo -u postgres "$@"); }

# IDEM_HOST (a socket directory) and IDEM_PORT point the scripts at another
# cluster; IDEM_CLIENT_HOST / IDEM_CLIENT_PORT point the programs under test
# (the examples) at a pooler in front of it (tests/scenarios/clients.sh pgbouncer).
psql_idem() {
  "$PG_BIN/psql" -X -v ON_ERROR_STOP=1 -h "${IDEM_HOST:-$(cluster_dir)}" -p "$IDEM_PORT" -U postgres "$@"
}
client_host() { echo "${IDEM_CLIENT_HOST:-${IDEM_HOST:-$(cluster_dir)}}"; }
client_port() { echo "${IDEM_CLIENT_PORT:-$IDEM_PORT}"; }

# Python for the project's drivers and examples: a venv under the project
# (Debian 12's system Python refuses pip installs), made by setup.sh --tool python.
IDEM_VENV="$ROOT/.venv$IDEM_OS_SUFFIX"
IDEM_PY="$IDEM_VENV/bin/python"

# Maven for clients/java: its own repository cache, filled by
# scripts/setup.sh --tool java; tests run offline from it.
IDEM_MAVEN_REPO="${IDEM_MAVEN_REPO:-/var/cache/idem/m2}"
mvn_idem() { mvn -B -Dmaven.repo.local="$IDEM_MAVEN_REPO" "$@"; }
# The Kafka broker's jars (clients/java/it/kafka-broker/pom.xml's version), for java_spring.sh.
IDEM_KAFKA_LIBS="${IDEM_KAFKA_LIBS:-/var/cache/idem/kafka/$(sed -n 's#^  <version>\(.*\)</version>#\1#p' "$ROOT/clients/java/it/kafka-broker/pom.xml" 2>/dev/null)}"
