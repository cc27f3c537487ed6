# Shared by tests/servers/*.sh (source it): the cache folder outside the clone,
# a lock so that two runs never build the same thing at once, and the stamp
# that makes a re-run a no-op. A stamp records the recipe's hash: the hash of
# the build functions' code as bash prints it back (`declare -f` drops the
# comments, so editing a comment does not rebuild; changing a step does),
# plus the variables the recipe names (package lists, configure flags).
set -euo pipefail

IDEM_CACHE="${IDEM_CACHE:-/var/cache/idem}"

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# recipe_hash FUNCTION... -- VARIABLE...
recipe_hash() {
  local fns=() vars=() seen=0 a
  for a in "$@"; do
    if [ "$a" = -- ]; then seen=1
    elif [ $seen = 0 ]; then fns+=("$a")
    else vars+=("$a"); fi
  done
  { declare -f "${fns[@]}"; for a in "${vars[@]}"; do declare -p "$a" | sed 's/^declare -[a-zA-Z-]* //'; done; } \
    | sha256sum | cut -c1-16
}

# stamp_ok STAMPFILE RECIPE: the thing was built by this recipe.
stamp_ok() { [ -f "$1" ] && grep -qx "recipe=$2" "$1"; }

# take_lock NAME: hold $IDEM_CACHE/NAME.lock until the script exits.
take_lock() {
  mkdir -p "$IDEM_CACHE"
  chmod 755 "$IDEM_CACHE"
  exec 9>"$IDEM_CACHE/$1.lock"
  if ! flock -n 9; then
    log "waiting for another run holding $IDEM_CACHE/$1.lock"
    flock 9
  fi
}

# host_packages_only ARG PKG...: with ARG --host-packages, install the
# host packages a script needs and exit (scripts/test.sh does that in the
# foreground before it runs the script in the background: apt lets one
# dpkg run at a time); otherwise return.
host_packages_only() {
  [ "${1:-}" = --host-packages ] || return 0
  shift
  host_packages "$@"
  exit 0
}

# host_packages PKG...: install from the host's own apt sources (Debian 12)
# whatever is missing (apt_install of scripts/lib.sh, in a subshell: the
# servers' scripts do not take that file's variables).
host_packages() {
  (source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"; apt_install "for tests/servers/" "$@")
}

# download_deb DIR PACKAGE=VERSION: the host's apt sources' file of that
# package into DIR (once; apt's lists updated, through apt_locked, when they
# do not know it), printing its path.
download_deb() {
  local dir=$1 p=${2%%=*} v=${2#*=}
  mkdir -p "$dir"
  if ! ls "$dir/${p}_${v//:/%3a}_"*.deb >/dev/null 2>&1; then
    (cd "$dir" && apt-get download -qq "$p=$v" >/dev/null 2>&1) ||
      { (source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"; apt_locked update -qq) &&
        (cd "$dir" && apt-get download -qq "$p=$v" >/dev/null); } ||
      die "cannot download $p=$v"
  fi
  ls "$dir/${p}_${v//:/%3a}_"*.deb | sed -n 1p
}

# debian_source DIR SUITE PACKAGE...: download Debian SUITE's source
# packages into DIR with a throw-away apt list under DIR/.apt; the host's apt
# sources, lists and caches are left as they are. apt checks every file
# against the signed index, so the downloads are verified.
sid_source() { debian_source "$1" sid "${@:2}"; }
debian_source() {
  local dir=$1 suite=$2; shift 2
  local apt="$dir/.apt"
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial"
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main" \
    > "$apt/sources.list"
  local o=(-o Dir::Etc::SourceList="$apt/sources.list" -o Dir::Etc::SourceParts=-
           -o Dir::State::Lists="$apt/lists" -o Dir::Cache="$apt/cache"
           -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=
           -o APT::Sandbox::User=root)
  apt-get "${o[@]}" update -qq
  (cd "$dir" && apt-get "${o[@]}" source --download-only -qq "$@")
}

# Unpack the upstream tarball (NAME_VERSION.orig.tar.*) of a downloaded
# source package into DIR/src-NAME; Debian's own patches (socket directory
# under /var/run, packaging paths) are not applied.
unpack_orig() { # DIR NAME
  local tarball
  tarball=$(ls "$1/$2"_*.orig.tar.* | sed -n 1p)
  mkdir -p "$1/src-$2"
  tar -xf "$tarball" -C "$1/src-$2" --strip-components=1
}

# empty_cargo_home DIR: a CARGO_HOME at DIR with only the host's rustup
# proxies (cargo, rustc, ...) on the host's toolchains (RUSTUP_HOME): no
# installed tools such as cargo-pgrx, no crates fetched. For measuring a
# first run (bench/cold.sh demo, bench/cold.sh tests).
empty_cargo_home() {
  local b
  mkdir -p "$1/bin"
  for b in "${CARGO_HOME:-$HOME/.cargo}"/bin/*; do
    case "$(basename "$b")" in cargo|rustc|rustup|rustdoc|rust-gdb|rust-lldb|rustfmt|cargo-fmt|clippy-driver|cargo-clippy) cp -a "$b" "$1/bin/" ;; esac
  done
  [ -x "$1/bin/cargo" ] || die "no rustup proxies in ${CARGO_HOME:-$HOME/.cargo}/bin"
}

# processes_from DIR: the pids of programs running from DIR (a test
# cluster's server): a new tree is not swapped in under them.
processes_from() {
  local p
  for p in /proc/[0-9]*; do
    case "$(readlink "$p/exe" 2>/dev/null)" in "$1"/*) echo "${p#/proc/}" ;; esac
  done
  return 0
}

# copy_pg_install PG_CONFIG DEST: the folders of an installed PostgreSQL
# that PG_CONFIG names (programs, modules, share folder, server headers),
# copied under DEST at their own paths. PostgreSQL finds its folders
# relative to its programs, so the copy's pg_config names the copy's.
copy_pg_install() {
  local pg_config=$1 dest=$2 d
  for d in "$("$pg_config" --bindir)/.." "$("$pg_config" --sharedir)" \
           "$("$pg_config" --includedir-server)" "$("$pg_config" --pkglibdir)"; do
    d=$(readlink -f "$d")
    [ -e "$dest$d" ] && continue
    mkdir -p "$dest$(dirname "$d")"
    cp -a "$d" "$dest$(dirname "$d")/"
  done
}

# cached_tree NAME PREFIX RECIPE MAKE DESCRIBE: a PostgreSQL tree at PREFIX
# built by the recipe RECIPE, or built now: under the lock NAME, in
# $IDEM_CACHE/build/NAME, by `MAKE WORK STAGE` (which installs into
# STAGE/PREFIX), stamped with the recipe, the lines `DESCRIBE WORK STAGE`
# prints and the time it took, then swapped in whole, so that a failed
# build leaves the old tree where it was.
cached_tree() {
  local name=$1 prefix=$2 recipe=$3 make=$4 describe=$5 started work stage
  if stamp_ok "$prefix/.idem-stamp" "$recipe" && "$prefix/bin/pg_config" --version >/dev/null 2>&1; then return 0; fi
  take_lock "$name"
  if stamp_ok "$prefix/.idem-stamp" "$recipe"; then return 0; fi
  started=$(date +%s)
  work="$IDEM_CACHE/build/$name"
  stage="$work/stage"
  rm -rf "$work"
  mkdir -p "$work"
  "$make" "$work" "$stage"
  {
    echo "recipe=$recipe"
    "$describe" "$work" "$stage"
    echo "built=$(date -u +%FT%TZ) in $(( $(date +%s) - started )) s by tests/servers/$name.sh"
  } > "$stage$prefix/.idem-stamp"
  rm -rf "$prefix.old"
  [ ! -e "$prefix" ] || mv "$prefix" "$prefix.old"
  mv "$stage$prefix" "$prefix"
  rm -rf "$prefix.old" "$work"
  chmod 755 "$IDEM_CACHE"
  log "$name ready: $(grep -E '^(postgresql|pg_cron)=' "$prefix/.idem-stamp" | tr '\n' ' ')"
}
