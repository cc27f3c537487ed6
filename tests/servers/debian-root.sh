#!/usr/bin/env bash
# A Debian root for tests/servers/in-trixie.sh to run commands in:
#   bash tests/servers/debian-root.sh trixie [--host-packages]
#       Debian 13 with Debian's PostgreSQL 17 and what building idem with
#       pgrx and running its tests needs (clang, libclang, a C toolchain,
#       sudo, IPC::Run, Python with venv, procps, git, pg_cron, PL/Proxy):
#       Debian 12 has no PostgreSQL 17 package, and trixie's packages must
#       not be installed on the host; a debootstrapped root keeps them apart.
#   bash tests/servers/debian-root.sh bookworm [--host-packages]
#       Debian 12 with Debian's PostgreSQL 15 and nothing else: a server as
#       idem's Debian package meets it, for tests/scenarios/packaging.sh package to
#       install the package into for real (apt-get install ./….deb, CREATE
#       EXTENSION, apt-get remove) without touching the host's PostgreSQL.
#       Commands run in it with in-trixie.sh, pointed at it:
#         IDEM_TRIXIE_ROOT=$(bash tests/servers/debian-root.sh bookworm) \
#           IDEM_TRIXIE_PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config bash tests/servers/in-trixie.sh CMD...
# Each ensures its root (in $IDEM_CACHE/SUITE) and prints its path;
# --host-packages installs only what the host needs to make it.
#
# Made with debootstrap (minbase) from deb.debian.org into $IDEM_CACHE/SUITE
# (default /var/cache/idem/SUITE), outside the clone. Then, inside it: a
# policy-rc.d so that no package starts a service, no "main" cluster created
# by postgresql-common, a postgres user with the host's uid/gid (the test
# clusters under the checkout are then owned alike on both sides), and
# PACKAGES from SUITE's own sources (SUITE, SUITE-updates, SUITE-security).
# The stamp ROOT/.idem-stamp records the recipe's hash and the versions
# installed; a re-run with the same recipe is a no-op, a changed recipe
# rebuilds (minutes) into ROOT.new and swaps it in whole. It refuses to
# replace a root that processes still run in (a test cluster: stop it first).
# Progress goes to stderr.

MIRROR=http://deb.debian.org/debian
HOST_PACKAGES=(debootstrap debian-archive-keyring)
PG_UID=$(id -u postgres 2>/dev/null || echo 0)
PG_GID=$(id -g postgres 2>/dev/null || echo 0)
IN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/in-trixie.sh"

# PIDs of processes whose root directory is DIR.
processes_in() {
  local p
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/root" 2>/dev/null)" = "$1" ] && echo "${p#/proc/}"
  done
  return 0
}

# Delete a tree under $IDEM_CACHE that nothing is mounted under.
remove_tree() {
  case "$1" in "$IDEM_CACHE"/?*) ;; *) die "refusing to delete $1" ;; esac
  [ -e "$1" ] || return 0
  if grep -q "^$1/" <<<"$(findmnt -rn -o TARGET)"; then die "something is mounted under $1; not deleting it"; fi
  rm -rf --one-file-system "$1"
}

build_root() { # DIR
  local dir=$1
  log "debootstrap $SUITE (minbase) into $dir"
  # In a private mount namespace: debootstrap mounts /proc and /sys in the
  # target itself; those mounts then never reach the host's mount table.
  unshare --mount --propagation private -- \
    debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$dir" "$MIRROR" \
    >"$dir.log" 2>&1 || { tail -30 "$dir.log" >&2; die "debootstrap failed (log: $dir.log)"; }
  # (The comment written into the root still names the scripts' old folder:
  # the recipe's hash covers this line, and a new text would rebuild every
  # cached root for nothing.)
  printf '#!/bin/sh\n# scripts/pg/%s.sh: no service starts in this root\nexit 101\n' "$SUITE" > "$dir/usr/sbin/policy-rc.d"
  chmod 755 "$dir/usr/sbin/policy-rc.d"
  mkdir -p "$dir/etc/postgresql-common/createcluster.d"
  echo "create_main_cluster = false" > "$dir/etc/postgresql-common/createcluster.d/idem.conf"
  cat > "$dir/etc/apt/sources.list" <<SOURCES
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb ${MIRROR%/debian}/debian-security $SUITE-security main
SOURCES
  cp /etc/hosts "$dir/etc/hosts"
  echo "idem-$SUITE" > "$dir/etc/hostname"
  if [ "$PG_UID" != 0 ]; then
    chroot "$dir" groupadd --system -g "$PG_GID" postgres
    chroot "$dir" useradd --system -u "$PG_UID" -g postgres -d /var/lib/postgresql -s /bin/bash \
      -c "PostgreSQL administrator" postgres
  fi
  log "installing ${#PACKAGES[@]} packages from $SUITE inside it"
  IDEM_TRIXIE_ROOT="$dir" IDEM_TRIXIE_ENV= DEBIAN_FRONTEND=noninteractive bash "$IN_ROOT" /bin/sh -c '
    set -e
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null
    apt-get clean
    rm -rf /var/lib/apt/lists/*' sh "${PACKAGES[@]}" >>"$dir.log" 2>&1 \
    || { tail -30 "$dir.log" >&2; die "package installation failed (log: $dir.log)"; }
  [ -x "$dir/usr/lib/postgresql/$PG_MAJOR/bin/pg_config" ] || die "no pg_config for $PG_MAJOR in $dir"
  rm -f "$dir.log"
}

ensure_debian_root() { # [--host-packages]
  host_packages_only "${1:-}" "${HOST_PACKAGES[@]}"
  local rootfs="$IDEM_CACHE/$SUITE" recipe stamp new busy started p
  recipe=$(recipe_hash processes_in remove_tree build_root -- SUITE PG_MAJOR MIRROR PACKAGES PG_UID PG_GID)
  stamp="$rootfs/.idem-stamp"
  if ! stamp_ok "$stamp" "$recipe"; then
    take_lock "$SUITE"
    if ! stamp_ok "$stamp" "$recipe"; then
      started=$(date +%s)
      host_packages "${HOST_PACKAGES[@]}"
      new="$rootfs.new"
      # (a complete new root left by a run that could not swap it in is reused)
      if ! stamp_ok "$new/.idem-stamp" "$recipe"; then
        remove_tree "$new"
        build_root "$new"
        {
          echo "recipe=$recipe"
          echo "postgresql=$(chroot "$new" "/usr/lib/postgresql/$PG_MAJOR/bin/pg_config" --version | sed 's/^PostgreSQL //')"
          for p in "${STAMP_PACKAGES[@]}" libc6; do echo "$p=$(chroot "$new" dpkg-query -W -f='${Version}' "$p")"; done
          echo "packages=${PACKAGES[*]}"
          echo "built=$(date -u +%FT%TZ) in $(( $(date +%s) - started )) s by tests/servers/$SUITE.sh"
        } > "$new/.idem-stamp"
      fi
      if [ -e "$rootfs" ]; then
        busy=$(processes_in "$(readlink -f "$rootfs")" | tr '\n' ' ')
        [ -z "$busy" ] || die "processes run in $rootfs (pids $busy; a test cluster? stop it with: IDEM_TRIXIE_ROOT=$rootfs bash tests/servers/in-trixie.sh bash scripts/cluster.sh stop); the new root is kept in $new"
        remove_tree "$rootfs.old"
        mv "$rootfs" "$rootfs.old"
      fi
      mv "$new" "$rootfs"
      remove_tree "$rootfs.old"
      log "$SUITE root ready: $(grep -E '^(postgresql|libc6)=' "$stamp" | tr '\n' ' ')"
    fi
  fi
  echo "$rootfs"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
  SUITE=${1:-}
  case "$SUITE" in
  bookworm)
    PG_MAJOR=15
    PACKAGES=(postgresql-15)
    STAMP_PACKAGES=(postgresql-15) ;;
  trixie)
    PG_MAJOR=17
    PACKAGES=(postgresql-17 postgresql-server-dev-17 postgresql-17-cron postgresql-17-plproxy
              libclang-dev clang build-essential pkg-config sudo libipc-run-perl
              python3 python3-venv python3-pip procps git ca-certificates less)
    STAMP_PACKAGES=(postgresql-17 postgresql-17-cron clang) ;;
  *) echo "usage: bash $0 bookworm|trixie [--host-packages]" >&2; exit 2 ;;
  esac
  shift
  ensure_debian_root "$@"
fi
