#!/usr/bin/env bash
# Run a command as root inside the Debian 13 (trixie) root made by
# tests/servers/debian-root.sh trixie, where Debian's PostgreSQL 17 is installed:
#   bash tests/servers/in-trixie.sh bash scripts/test.sh          (PG_CONFIG is 17's there)
#   bash tests/servers/in-trixie.sh                                (a shell)
# Why: Debian 12 has no PostgreSQL 17 package, and trixie's binaries must not
# be installed on the host; a chroot runs them on the host's kernel.
#
# Inside: /proc, /sys, /dev (with /dev/pts and /dev/shm), this checkout at
# the same absolute path (and, for a git worktree, its main repository),
# ../shared beside it (read-only: the vendored sources), idem's cargo
# target folders ($IDEM_CACHE/cargo-target, see scripts/lib.sh), and
# the host's Rust toolchain ($CARGO_HOME, $RUSTUP_HOME, at the same paths;
# cargo-pgrx built on Debian 12 runs on trixie's newer glibc). HOME is the
# root's own /root (its ~/.pgrx/config.toml names PostgreSQL 17), PATH has
# cargo, PG_CONFIG=/usr/lib/postgresql/17/bin/pg_config unless the command
# sets another, IDEM_IN_TRIXIE=1. The command starts in the current folder
# when that is inside the checkout, else at the checkout's top.
#
# Every mount is made in a private mount namespace (unshare): the host's
# mount table never changes, so the host's /proc and /dev can never be
# unmounted or covered, and nothing is mounted under the cached root as the
# host sees it (deleting it cannot reach through a bind mount). On exit a
# trap unmounts everything, even on failure; if a daemon the command started
# (a PostgreSQL server started with pg_ctl) still runs in the namespace, the
# mounts are left to it and the kernel drops them when it exits. Safe to run
# again and again, and in parallel; run inside the root it just runs the
# command.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PROJECT="$(cd "$HERE/../.." && pwd)"

mounted=()
mount_at() { # how target: mount and remember, for the trap
  local how=$1 target=$2; shift 2
  case "$target" in "$ROOTFS"/?*) ;; *) echo "refusing to mount at $target" >&2; exit 1 ;; esac
  mkdir -p "$target"
  case "$how" in
    bind) mount --bind "$1" "$target" ;;
    *) mount -t "$how" "$how" "$target" ;;
  esac
  mounted+=("$target")
}

# Processes other than this script in this namespace, into OTHERS. Runs in
# the current shell: the /proc glob is expanded before any helper process of
# ours exists, and those helpers (children of $$) are skipped anyway.
OTHERS=()
others_in_namespace() {
  local ns pid stat
  OTHERS=()
  ns=$(readlink /proc/$$/ns/mnt)
  for pid in /proc/[0-9]*; do
    pid=${pid#/proc/}
    [ "$pid" = $$ ] && continue
    [ "$(readlink "/proc/$pid/ns/mnt" 2>/dev/null)" = "$ns" ] || continue
    read -r stat < "/proc/$pid/stat" 2>/dev/null || continue
    stat=${stat##*) }                         # after "pid (comm) ": state ppid ...
    stat=${stat#* }
    [ "${stat%% *}" = $$ ] && continue
    OTHERS+=("$pid")
  done
}

unmount_all() {
  local rc=$? i
  trap - EXIT INT TERM HUP
  others_in_namespace
  if [ ${#OTHERS[@]} -gt 0 ]; then
    echo "in-trixie: processes still run in the root (pids ${OTHERS[*]}); the mounts stay with them (private namespace, gone when they exit)" >&2
  else
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
      umount "${mounted[$i]}" 2>/dev/null || umount -l "${mounted[$i]}" || true
    done
  fi
  exit "$rc"
}

if [ "${1:-}" = --in-namespace ]; then
  # Second stage, run by unshare in the new mount namespace.
  ROOTFS=$2; shift 2
  [ "$(readlink -f /proc/$$/ns/mnt)" != "$(readlink -f /proc/1/ns/mnt)" ] \
    || { echo "in-trixie: not in a private mount namespace, refusing to mount" >&2; exit 1; }
  trap unmount_all EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'exit 129' HUP
  mount --make-rprivate /
  mount_at proc "$ROOTFS/proc"
  mount_at bind "$ROOTFS/sys" /sys
  mount_at bind "$ROOTFS/dev" /dev
  mount_at bind "$ROOTFS/dev/pts" /dev/pts
  mountpoint -q /dev/shm && mount_at bind "$ROOTFS/dev/shm" /dev/shm
  cargo_home="${CARGO_HOME:-$HOME/.cargo}"
  rustup_home="${RUSTUP_HOME:-$HOME/.rustup}"
  for d in "$cargo_home" "$rustup_home"; do
    [ -d "$d" ] && mount_at bind "$ROOTFS$d" "$d"
  done
  mount_at bind "$ROOTFS$PROJECT" "$PROJECT"
  # A git worktree's .git points into the main repository: make it reachable.
  common=$(git -C "$PROJECT" rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)
  if [ -n "$common" ] && [ -d "$common" ]; then
    case "$common/" in "$PROJECT"/*) ;; *) mount_at bind "$ROOTFS$common" "$common" ;; esac
  fi
  # The vendored sources beside the checkout (../shared/vendor: pg_tle for
  # tests/portable/tree.sh), read-only.
  shared=$(readlink -f "$PROJECT/../shared" 2>/dev/null || true)
  if [ -n "$shared" ] && [ -d "$shared" ]; then
    mount_at bind "$ROOTFS$shared" "$shared"
    mount -o remount,bind,ro "$ROOTFS$shared"
  fi
  # idem's cargo target folders (scripts/lib.sh, idem_build), at the same
  # path: the root's builds (pgNN-debian13) are kept with the host's.
  targets="${IDEM_CACHE:-/var/cache/idem}/cargo-target"
  mkdir -p "$targets"
  mount_at bind "$ROOTFS$targets" "$targets"
  cp -L /etc/resolv.conf "$ROOTFS/etc/resolv.conf" 2>/dev/null || true
  # The host's local certificate authorities (a TLS-inspecting proxy's,
  # say) are trusted inside too, so that pip, npm and cargo reach their
  # registries as they do on the host.
  cas=/usr/local/share/ca-certificates
  if [ -d "$cas" ] && ! diff -rq "$cas" "$ROOTFS$cas" >/dev/null 2>&1; then
    rm -rf "$ROOTFS$cas"
    cp -a "$cas" "$ROOTFS$cas"
    chroot "$ROOTFS" /usr/sbin/update-ca-certificates >/dev/null 2>&1 \
      || echo "in-trixie: update-ca-certificates failed in the root" >&2
  fi
  case "$PWD/" in "$PROJECT"/*) dir=$PWD ;; *) dir=$PROJECT ;; esac
  envs=(HOME=/root TERM="${TERM:-dumb}" LANG=C.UTF-8 IDEM_IN_TRIXIE=1
        PATH="$cargo_home/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        CARGO_HOME="$cargo_home" RUSTUP_HOME="$rustup_home"
        PG_CONFIG="${IDEM_TRIXIE_PG_CONFIG:-/usr/lib/postgresql/17/bin/pg_config}")
  # Passed through: these, and any named in IDEM_TRIXIE_ENV; one whose value
  # is an absolute path only when that path exists inside the root.
  for v in IDEM_PORT IDEM_CACHE RUST_BACKTRACE CARGO_TERM_COLOR DEBIAN_FRONTEND \
           http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY \
           SSL_CERT_FILE SSL_CERT_DIR CURL_CA_BUNDLE REQUESTS_CA_BUNDLE PIP_CERT \
           NODE_EXTRA_CA_CERTS GIT_SSL_CAINFO CARGO_HTTP_CAINFO PIP_DEFAULT_TIMEOUT \
           ${IDEM_TRIXIE_ENV:-}; do
    [ -n "${!v+x}" ] || continue
    case "${!v}" in /*) [ -e "$ROOTFS${!v}" ] || continue ;; esac
    envs+=("$v=${!v}")
  done
  # The command runs in the background of this shell so that a SIGTERM or
  # SIGHUP sent to this script reaches it at once (bash would only run the
  # trap after a foreground child ended); it keeps the terminal's stdin and
  # process group, and SIGINT/SIGQUIT at their defaults (a background child
  # of a script ignores them otherwise): ^C on a terminal reaches it directly.
  env --default-signal=INT,QUIT chroot "$ROOTFS" /usr/bin/env -i "${envs[@]}" \
    /bin/bash -c 'cd "$1" && shift && exec "$@"' in-trixie "$dir" "$@" <&0 &
  child=$!
  trap 'kill -TERM "$child" 2>/dev/null' TERM
  trap 'kill -HUP "$child" 2>/dev/null' HUP
  trap ':' INT
  set +e
  while wait "$child"; rc=$?; kill -0 "$child" 2>/dev/null; do :; done
  wait "$child" 2>/dev/null; rc=$?
  set -e
  exit $rc
fi

[ $# -gt 0 ] || set -- /bin/bash -l
if [ "${IDEM_IN_TRIXIE:-}" = 1 ]; then
  exec "$@"   # already inside
fi
[ "$(id -u)" = 0 ] || { echo "in-trixie: run as root" >&2; exit 1; }
if [ -n "${IDEM_TRIXIE_ROOT:-}" ]; then
  root=$IDEM_TRIXIE_ROOT      # (debian-root.sh, while it builds the root)
else
  root=$(bash "$HERE/debian-root.sh" trixie)
fi
root=$(readlink -f "$root")
[ "$root" != / ] && [ -f "$root/etc/debian_version" ] || { echo "in-trixie: $root is not a Debian root" >&2; exit 1; }
exec unshare --mount --propagation private -- /bin/bash "$HERE/in-trixie.sh" --in-namespace "$root" "$@"
