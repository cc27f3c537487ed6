#!/usr/bin/env bash
# The Debian package and the PGXN metadata (the other tests use the build
# installed in the system PostgreSQL, which this one leaves alone):
#   - scripts/package.sh builds target/package/postgresql-15-idem_<v>_<arch>.deb;
#   - its control fields (name, Cargo.toml's version, Depends on postgresql-15
#     and on the Debian package of every shared library idem.so links to:
#     libc6 and libgcc-s1, the Rust runtime's unwinder);
#   - the .so, the control file and every SQL script (the generated install
#     script and each sql/idem--*.sql) sit at the paths pg_config reports;
#   - the packaged .so and SQL are byte-identical to the installed ones (both
#     come from this source tree: a difference means one of them is stale);
#   - apt-get install --simulate accepts it;
#   - installed for real with apt-get in a Debian 12 root that has only
#     Debian's PostgreSQL 15 (tests/servers/debian-root.sh bookworm): CREATE EXTENSION idem
#     from it, claims, the update path from 0.2.0, then apt-get remove
#     (tests/package/in_root.sh);
#   - META.json follows PGXN Meta spec 1.0.0 and carries Cargo.toml's version.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/assert.sh"
cd "$ROOT"
version=$(awk -F'"' '$1 == "version = " { print $2; exit }' Cargo.toml)
arch=$(dpkg --print-architecture)
deb="target/package/postgresql-15-idem_${version}_${arch}.deb"
pkglibdir=$("$PG_CONFIG" --pkglibdir)
extdir="$("$PG_CONFIG" --sharedir)/extension"
work=$(mktemp -d /tmp/doc_pkg.XXXXXX)
trap 'rm -rf "$work"' EXIT

say "build the package (version $version from Cargo.toml)"
bash scripts/package.sh
[ -f "$deb" ] || { echo "FAIL: $deb was not built"; exit 1; }
echo "$deb: $(stat -c %s "$deb") bytes"

say "dpkg-deb --info"
dpkg-deb --info "$deb" | tee "$work/info"
field() { dpkg-deb --field "$deb" "$1"; }
[ "$(field Package)" = postgresql-15-idem ] || fail "Package is '$(field Package)'"
[ "$(field Version)" = "$version" ] || fail "Version is '$(field Version)', Cargo.toml says $version"
[ "$(field Architecture)" = "$arch" ] || fail "Architecture is '$(field Architecture)'"
[[ ", $(field Depends)," =~ ,\ postgresql-15[,\ ] ]] || fail "Depends lacks postgresql-15: $(field Depends)"
# Every library the packaged idem.so links to comes from a package it depends
# on (the dynamic loader itself comes with libc6).
dpkg-deb -x "$deb" "$work/unpacked"
needed=$(readelf -d "$work/unpacked$pkglibdir/idem.so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
[ -n "$needed" ] || fail "readelf found no NEEDED library in the packaged idem.so"
for lib in $needed; do
  owner=$(dpkg -S "*/$(gcc -print-multiarch)/$lib" 2>/dev/null | head -1 | cut -d: -f1)
  if [ -z "$owner" ]; then fail "no installed Debian package provides $lib, which idem.so links to"; continue; fi
  if [[ ", $(field Depends)," =~ ,\ $owner[,\ ] ]]; then echo "idem.so needs $lib: $owner is in Depends"
  else fail "idem.so needs $lib from $owner, which Depends lacks: $(field Depends)"; fi
done

say "dpkg-deb --contents"
dpkg-deb --contents "$deb" | tee "$work/contents"
expected=("$pkglibdir/idem.so" "$extdir/idem.control" "$extdir/idem--$version.sql")
for f in sql/idem--*.sql; do [ -e "$f" ] && expected+=("$extdir/$(basename "$f")"); done
for f in "${expected[@]}"; do
  grep -q " \.$f\$" "$work/contents" && echo "present: $f" || fail "$f is not in the package"
done
# Nothing outside PostgreSQL's directories and the package's doc directory.
stray=$(awk '{print $6}' "$work/contents" | grep -v '/$' \
  | grep -v -e "^\.$pkglibdir/" -e "^\.$extdir/" -e '^\./usr/share/doc/postgresql-15-idem/' || true)
[ -z "$stray" ] || fail "files outside pg_config's directories: $stray"

say "packaged files against the installed build"
dpkg-deb --extract "$deb" "$work/root"
grep -q "^default_version = '$version'\$" "$work/root$extdir/idem.control" \
  || fail "the packaged control file's default_version is not '$version'"
same=0
while read -r f; do
  if [ ! -e "$f" ]; then fail "$f is in the package but not installed in the system PostgreSQL"
  elif cmp -s "$work/root$f" "$f"; then same=$((same + 1)); echo "identical: $f"
  else fail "$f differs from the installed one ($(stat -c %s "$work/root$f") vs $(stat -c %s "$f") bytes): rebuild and reinstall, or rebuild the package"
  fi
done < <(cd "$work/root" && find ".$pkglibdir" ".$extdir" -type f | sed 's|^\.||' | sort)
for f in sql/idem--*.sql; do
  [ -e "$f" ] || continue
  cmp -s "$f" "$work/root$extdir/$(basename "$f")" || fail "packaged $(basename "$f") differs from $f"
done
# Installed idem scripts the package does not carry (old versions' install
# scripts put there by tests) are not an error, but worth seeing.
for f in "$extdir"/idem--*.sql; do
  [ -e "$work/root$f" ] || echo "note: installed but not packaged: $f"
done

say "apt-get install --simulate"
if apt-get install --simulate "./$deb" > "$work/apt" 2>&1; then
  grep -E "^(Inst|Conf) postgresql-15-idem" "$work/apt" || { cat "$work/apt"; fail "apt-get --simulate did not plan to install the package"; }
else
  cat "$work/apt"; fail "apt-get install --simulate refused the package"
fi

say "installed for real: apt-get install into a Debian 12 root with PostgreSQL 15 (tests/servers/debian-root.sh bookworm)"
# The host's PostgreSQL is not touched: a debootstrapped Debian 12 with only
# Debian's postgresql-15, cached under /var/cache/idem (built once, minutes).
bookworm=$(bash tests/servers/debian-root.sh bookworm)
if IDEM_TRIXIE_ROOT="$bookworm" IDEM_TRIXIE_PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config \
   IDEM_TRIXIE_ENV="IDEM_PKG_DEB IDEM_PKG_PORT" IDEM_PKG_DEB="$ROOT/$deb" IDEM_PKG_PORT="${IDEM_PKG_PORT:-5475}" \
   bash tests/servers/in-trixie.sh bash tests/package/in_root.sh > "$work/in_root.log" 2>&1; then
  cat "$work/in_root.log"
else
  cat "$work/in_root.log"; fail "installing the package in the Debian 12 root failed"
fi

say "META.json (PGXN Meta spec 1.0.0)"
ls LICENSE* COPYING* >/dev/null 2>&1 || echo "note: no LICENSE file in the tree; Cargo.toml and META.json name the license only"
python3 - "$version" "$(awk -F'"' '$1 == "license = " { print $2; exit }' Cargo.toml)" <<'PY' || fails=$((fails + 1))
import json, os, re, sys
version, cargo_license = sys.argv[1], sys.argv[2]
m = json.load(open("META.json"))
bad = []
for k in ("name", "abstract", "version", "maintainer", "license", "provides", "meta-spec"):
    if k not in m:
        bad.append(f"required key {k} missing")
if m.get("meta-spec", {}).get("version") != "1.0.0":
    bad.append("meta-spec.version is not 1.0.0")
if m.get("version") != version:
    bad.append(f"version {m.get('version')} != Cargo.toml's {version}")
if not re.fullmatch(r"\d+\.\d+\.\d+", str(m.get("version", ""))):
    bad.append("version is not a semantic version")
p = m.get("provides", {}).get("idem", {})
if p.get("version") != version:
    bad.append(f"provides.idem.version {p.get('version')} != {version}")
for k in ("file", "docfile"):
    if not p.get(k) or not os.path.exists(p[k]):
        bad.append(f"provides.idem.{k} {p.get(k)!r} is not a file in the tree")
# PGXN's names for the SPDX identifiers used here.
spdx = {"Apache-2.0": "apache_2_0", "MIT": "mit", "PostgreSQL": "postgresql", "BSD-3-Clause": "bsd"}
if cargo_license and m.get("license") != spdx.get(cargo_license, cargo_license):
    bad.append(f"license {m.get('license')!r} does not match Cargo.toml's {cargo_license}")
pg = m.get("prereqs", {}).get("runtime", {}).get("requires", {}).get("PostgreSQL", "")
if not pg.startswith(">= 15"):
    bad.append(f"prereqs.runtime.requires.PostgreSQL is {pg!r}")
for b in bad:
    print("FAIL: META.json: " + b)
print(f"META.json: version {m.get('version')}, license {m.get('license')}, PostgreSQL {pg!r}"
      + ("" if bad else ", ok"))
sys.exit(1 if bad else 0)
PY

echo
echo "package $deb: $(wc -l < "$work/contents") entries, $same files identical to the installed build; $fails failures"
[ "$fails" = 0 ]
