#!/usr/bin/env bash
# A Debian 12 (bookworm) root with Debian's PostgreSQL 15 and nothing else:
# a server as idem's Debian package meets it, for tests/scenarios/package.sh
# to install the package into for real (apt-get install ./….deb, CREATE
# EXTENSION, apt-get remove) without touching the host's PostgreSQL.
# Commands run in it with scripts/pg/in-trixie.sh, pointed at it:
#   IDEM_TRIXIE_ROOT=$(bash scripts/pg/bookworm.sh) \
#     IDEM_TRIXIE_PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config bash scripts/pg/in-trixie.sh CMD...
#
#   bash scripts/pg/bookworm.sh       ensure it, print its path
#
# Made with debootstrap (minbase) from deb.debian.org into $IDEM_CACHE/bookworm
# (default /var/cache/idem/bookworm), outside the clone. Then, inside it:
# a policy-rc.d so that no package starts a service, no "main" cluster
# created by postgresql-common, a postgres user with the host's uid/gid (the
# test clusters under the checkout are then owned alike on both sides), and
# the packages below from bookworm's own sources (bookworm, bookworm-updates,
# bookworm-security). The stamp $ROOT/.idem-stamp records the recipe's hash and
# the versions installed; a re-run with the same recipe is a no-op, a
# changed recipe rebuilds (several minutes). It refuses to replace a root
# that processes still run in (a test cluster: stop it first).
# Progress goes to stderr, the root's path to stdout.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

ROOTFS="$IDEM_CACHE/bookworm"
SUITE=bookworm
MIRROR=http://deb.debian.org/debian
PACKAGES=(postgresql-15)
HOST_PACKAGES=(debootstrap debian-archive-keyring)
PG_UID=$(id -u postgres 2>/dev/null || echo 0)
PG_GID=$(id -g postgres 2>/dev/null || echo 0)

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
  if findmnt -rn -o TARGET | grep -q "^$1/"; then die "something is mounted under $1; not deleting it"; fi
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
  printf '#!/bin/sh\n# scripts/pg/bookworm.sh: no service starts in this root\nexit 101\n' > "$dir/usr/sbin/policy-rc.d"
  chmod 755 "$dir/usr/sbin/policy-rc.d"
  mkdir -p "$dir/etc/postgresql-common/createcluster.d"
  echo "create_main_cluster = false" > "$dir/etc/postgresql-common/createcluster.d/idem.conf"
  cat > "$dir/etc/apt/sources.list" <<SOURCES
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb ${MIRROR%/debian}/debian-security $SUITE-security main
SOURCES
  cp /etc/hosts "$dir/etc/hosts"
  echo "idem-bookworm" > "$dir/etc/hostname"
  if [ "$PG_UID" != 0 ]; then
    chroot "$dir" groupadd --system -g "$PG_GID" postgres
    chroot "$dir" useradd --system -u "$PG_UID" -g postgres -d /var/lib/postgresql -s /bin/bash \
      -c "PostgreSQL administrator" postgres
  fi
  log "installing ${#PACKAGES[@]} packages from $SUITE inside it"
  IDEM_TRIXIE_ROOT="$dir" IDEM_TRIXIE_ENV= DEBIAN_FRONTEND=noninteractive bash "$HERE/in-trixie.sh" /bin/sh -c '
    set -e
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null
    apt-get clean
    rm -rf /var/lib/apt/lists/*' sh "${PACKAGES[@]}" >>"$dir.log" 2>&1 \
    || { tail -30 "$dir.log" >&2; die "package installation failed (log: $dir.log)"; }
  [ -x "$dir/usr/lib/postgresql/15/bin/pg_config" ] || die "no pg_config for 15 in $dir"
  rm -f "$dir.log"
}

RECIPE=$(recipe_hash processes_in remove_tree build_root -- SUITE MIRROR PACKAGES PG_UID PG_GID)
STAMP="$ROOTFS/.idem-stamp"

if ! stamp_ok "$STAMP" "$RECIPE"; then
  take_lock bookworm
  if ! stamp_ok "$STAMP" "$RECIPE"; then
    started=$(date +%s)
    host_packages "${HOST_PACKAGES[@]}"
    new="$ROOTFS.new"
    # (a complete new root left by a run that could not swap it in is reused)
    if ! stamp_ok "$new/.idem-stamp" "$RECIPE"; then
      remove_tree "$new"
      build_root "$new"
      v() { chroot "$new" dpkg-query -W -f='${Version}' "$1"; }
      cat > "$new/.idem-stamp" <<STAMP
recipe=$RECIPE
postgresql=$(chroot "$new" /usr/lib/postgresql/15/bin/pg_config --version | sed 's/^PostgreSQL //') (postgresql-15 $(v postgresql-15))
libc6=$(v libc6)
packages=${PACKAGES[*]}
built=$(date -u +%FT%TZ) in $(( $(date +%s) - started )) s by scripts/pg/bookworm.sh
STAMP
    fi
    if [ -e "$ROOTFS" ]; then
      busy=$(processes_in "$(readlink -f "$ROOTFS")" | tr '\n' ' ')
      [ -z "$busy" ] || die "processes run in $ROOTFS (pids $busy; a test cluster?); the new root is kept in $new"
      remove_tree "$ROOTFS.old"
      mv "$ROOTFS" "$ROOTFS.old"
    fi
    mv "$new" "$ROOTFS"
    remove_tree "$ROOTFS.old"
    log "bookworm root ready: $(grep -E '^(postgresql|libc6)=' "$STAMP" | tr '\n' ' ')"
  fi
fi
echo "$ROOTFS"
