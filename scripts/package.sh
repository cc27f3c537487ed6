#!/usr/bin/env bash
# Build the Debian package of idem for a Debian-packaged PostgreSQL:
#   bash scripts/package.sh                 Debian 12's PostgreSQL 15
#   bash tests/servers/in-trixie.sh bash scripts/package.sh   Debian 13's 17
#   → target/package/postgresql-NN-idem_<version>_amd64.deb
# Install it with: apt-get install ./target/package/postgresql-NN-idem_<version>_amd64.deb
#
# `cargo pgrx package` builds the release library and the install script into
# target/package/cargo-pgrx-pgNN/, under the paths pg_config reports; this adds the
# hand-written upgrade scripts (sql/idem--*.sql), the documentation and the
# package metadata, and runs dpkg-deb. The version is Cargo.toml's.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"
[ "$PG_DEBIAN" = 1 ] \
  || { echo "package.sh builds packages for Debian's own PostgreSQL packages only (PG_CONFIG=$PG_CONFIG is not one)" >&2; exit 1; }

# What the build needs, checked first: each missing piece named with the
# command that brings it (bash scripts/setup.sh brings them all), rather than
# a failure deep in cargo-pgrx's log.
need() { echo "package.sh needs $1: $2" >&2; echo "(bash scripts/setup.sh installs everything the build needs)" >&2; exit 1; }
command -v cargo >/dev/null || need "a Rust toolchain (1.89 or newer)" "https://rustup.rs"
grep -q " $PGRX_VERSION\$" <<<"$(cargo pgrx --version 2>/dev/null)" \
  || need "cargo-pgrx $PGRX_VERSION" "cargo install cargo-pgrx --version $PGRX_VERSION --locked"
[ -f "$("$PG_CONFIG" --includedir-server)/postgres.h" ] \
  || need "PostgreSQL $PG_MAJOR's server headers" "apt-get install postgresql-server-dev-$PG_MAJOR"
command -v clang >/dev/null || need "clang and libclang (pgrx's bindgen)" "apt-get install clang libclang-dev"
pgrx_config="${PGRX_HOME:-$HOME/.pgrx}/config.toml"
grep -qs "^pg$PG_MAJOR = " "$pgrx_config" \
  || need "cargo-pgrx pointed at PostgreSQL $PG_MAJOR ($pgrx_config names no pg$PG_MAJOR)" "cargo pgrx init --pg$PG_MAJOR $PG_CONFIG"

# (awk reading the file, not "| head -1": docs/development.md, Shell pipelines)
cargo_field() { awk -F'"' -v k="$1" '$1 == k " = " { print $2; exit }' Cargo.toml; }
version=$(cargo_field version)
description=$(cargo_field description)
license=$(cargo_field license)
arch=$(dpkg --print-architecture)
name=postgresql-$PG_MAJOR-idem
[ -n "$version" ] || { echo "no version in Cargo.toml" >&2; exit 1; }

pkglibdir=$("$PG_CONFIG" --pkglibdir)
extdir="$("$PG_CONFIG" --sharedir)/extension"

# A tree left by an earlier version would carry its idem--<old>.sql along.
built="$ROOT/target/package/cargo-pgrx-pg$PG_MAJOR"
rm -rf "$built"
say "cargo pgrx package for PostgreSQL $PG_MAJOR (release build, in $CARGO_TARGET_DIR)"
mkdir -p target/package
log="target/package/build-pg$PG_MAJOR.log"
if ! idem_build "$ROOT" cargo pgrx package --pg-config "$PG_CONFIG" "${PG_FEATURE_ARGS[@]}" --out-dir "$built" \
     > "$log" 2>&1; then
  # cargo's "error…" and cargo-pgrx's "Error:", else the log's end; the
  # message and the log's name whatever the grep finds (set -e, pipefail).
  { grep -E -A8 "^(error|Error:)" "$log" || tail -30 "$log"; } | sed -n 1,60p >&2 || true
  echo "cargo pgrx package failed (log: $log)" >&2
  exit 1
fi
for f in "$pkglibdir/idem.so" "$extdir/idem.control" "$extdir/idem--$version.sql"; do
  [ -f "$built$f" ] || { echo "cargo pgrx package did not produce $f" >&2; exit 1; }
done

stage="target/package/${name}_${version}_${arch}"
deb="target/package/${name}_${version}_${arch}.deb"
rm -rf "$stage" "$deb"
mkdir -p "$stage"
cp -a "$built/." "$stage/"

# Upgrade scripts (and any older version's install script) kept in sql/:
# ALTER EXTENSION idem UPDATE needs them beside the current install script.
# cargo pgrx copies the idem--A--B.sql ones itself; whatever it did not, we do.
for f in sql/idem--*.sql; do
  [ -e "$f" ] || continue
  target="$stage$extdir/$(basename "$f")"
  if [ -e "$target" ]; then
    cmp -s "$f" "$target" || { echo "$target differs from $f" >&2; exit 1; }
  else
    install -m 644 "$f" "$stage$extdir/"
  fi
done
# Debian's PostgreSQL modules are mode 644; cargo pgrx copies the .so as 755.
chmod 644 "$stage$pkglibdir/idem.so"

doc="$stage/usr/share/doc/$name"
mkdir -p "$doc"
install -m 644 README.md "$doc/"
for f in docs/*.md; do install -m 644 "$f" "$doc/"; done
cat > "$doc/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: idem
Source: the idem source tree (Cargo.toml version $version)

Files: *
License: $license
 On Debian systems the full text of the license is in
 /usr/share/common-licenses/$license.
EOF

# The library links only libc and libgcc_s; the glibc floor is the newest
# symbol version it uses.
glibc=$(objdump -T "$stage$pkglibdir/idem.so" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1 || true)
maintainer=$(git log --max-parents=0 -1 --format='%an <%ae>' 2>/dev/null || true)
maintainer=${maintainer:-idem maintainers <root@localhost>}
mkdir -p "$stage/DEBIAN"
cat > "$stage/DEBIAN/control" <<EOF
Package: $name
Version: $version
Architecture: $arch
Maintainer: $maintainer
Section: database
Priority: optional
Depends: postgresql-$PG_MAJOR, libc6 (>= ${glibc:-2.34}), libgcc-s1
Installed-Size: $(du -sk --exclude=DEBIAN "$stage" | cut -f1)
Description: $description
 idem is a PostgreSQL $PG_MAJOR extension: idempotency keys claimed in the same
 transaction as the business write, so that the dedup record and the write
 commit or roll back together, and a duplicate gets the first outcome back.
 After installing: CREATE EXTENSION idem; in each database (superuser), or
 ALTER EXTENSION idem UPDATE; where an older version is installed.
EOF
(cd "$stage" && find . -path ./DEBIAN -prune -o -type f -print | sed 's|^\./||' | sort | xargs md5sum) \
  > "$stage/DEBIAN/md5sums"

dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
rm -rf "$stage"
say "built $deb ($(du -k "$deb" | cut -f1) kB); install with: apt-get install ./$deb"
