#!/usr/bin/env bash
# `pgxn install` of idem, as PGXN users run it, with the Makefile: a
# distribution zip made from the tracked files (what `git archive` puts in a
# PGXN release), installed by Debian's pgxnclient into a private copy of the
# PostgreSQL the suite uses (its server, headers and share folder copied to
# a scratch folder; PostgreSQL finds its paths relative to its binaries), so
# that the installed server is never touched. Then a cluster of that copy
# (port ${IDEM_PGXN_PORT:-5474}) runs CREATE EXTENSION idem and claims.
# Builds a release build in a fresh source folder, in a cargo target folder
# of its own ($IDEM_CACHE/cargo-target/pgNN-pgxn: the dependencies are
# reused from the last run, idem itself is compiled from the zip's sources
# each time, see idem_build in scripts/lib.sh; the suite's own folder is
# left to the checkout's builds).
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/cluster.sh"
source "$ROOT/tests/servers/common.sh"   # (copy_pg_install)
command -v pgxn >/dev/null || { echo "FAIL: no pgxn (bash scripts/setup.sh --tests installs pgxnclient)"; exit 1; }
version=$(awk -F'"' '$1 == "version = " { print $2; exit }' "$ROOT/Cargo.toml")
scratch=$(mktemp -d /tmp/idem-pgxn.XXXXXX)
chmod 755 "$scratch"
cleanup() { pc_stop; rm -rf "$scratch"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

say "a private copy of PostgreSQL $PG_MAJOR under $scratch"
copy_pg_install "$PG_CONFIG" "$scratch"
pg_config="$scratch$(readlink -f "$PG_CONFIG")"
libdir=$("$pg_config" --pkglibdir)
extdir="$("$pg_config" --sharedir)/extension"
case "$libdir" in "$scratch"/*) ;; *) fail "the copy's pg_config points outside it: $libdir" ;; esac
# (whatever idem the copied tree had is removed: the install must bring it)
rm -f "$libdir/idem.so" "$extdir"/idem.control "$extdir"/idem--*.sql
# pgxnclient asks whether it may write pg_config --libdir (Debian's is
# /usr/lib/<triplet>, not copied: make it in the copy, empty).
mkdir -p "$("$pg_config" --libdir)"
echo "pg_config: $pg_config (pkglibdir $libdir)"

say "the distribution: idem-$version.zip, from git ls-files"
(cd "$ROOT" && git ls-files -z) | python3 -c '
import sys, zipfile, os
root, out, prefix = sys.argv[1], sys.argv[2], sys.argv[3]
names = [n for n in sys.stdin.buffer.read().decode().split("\0") if n]
with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
    for n in names:
        p = os.path.join(root, n)
        if os.path.isfile(p):
            z.write(p, prefix + "/" + n)
print(f"{len(names)} files")
' "$ROOT" "$scratch/idem-$version.zip" "idem-$version"
unzip -l "$scratch/idem-$version.zip" | grep -E " idem-$version/(Makefile|META.json|idem.control)$" || fail "the zip lacks the Makefile, META.json or idem.control"

say "pgxn install (make, then make install)"
t0=$(date +%s)
export CARGO_TARGET_DIR="$IDEM_CACHE/cargo-target/pg$PG_MAJOR$IDEM_OS_SUFFIX-pgxn"
(cd "$scratch" && idem_build "$scratch" pgxn install --pg_config "$pg_config" "./idem-$version.zip") > "$scratch/pgxn.log" 2>&1 \
  || { tail -40 "$scratch/pgxn.log"; fail "pgxn install failed"; }
grep -E "^(INFO|WARNING|ERROR)" "$scratch/pgxn.log" | head -10
echo "pgxn install: $(( $(date +%s) - t0 )) s"
for f in "$libdir/idem.so" "$extdir/idem.control" "$extdir/idem--$version.sql" "$extdir"/idem--*--"$version".sql; do
  [ -f "$f" ] && echo "installed: ${f#$scratch}" || fail "$f was not installed"
done

say "CREATE EXTENSION idem from it"
PG_BIN=$("$pg_config" --bindir)
pc_init "$(cluster_dir)/pgxn" "${IDEM_PGXN_PORT:-5474}"
pc_start
out=$(pc_psql -d postgres -At <<'SQL'
CREATE EXTENSION idem;
SELECT 'version=' || extversion FROM pg_extension WHERE extname = 'idem';
SELECT 'claim=' || claimed || '/' || state FROM idem_claim('pgxn-1', 'pgxn');
SELECT 'again=' || claimed || '/' || state FROM idem_claim('pgxn-1', 'pgxn');
SQL
)
echo "$out"
grep -qx "version=$version" <<<"$out" || fail "CREATE EXTENSION did not install version $version"
grep -qx "claim=true/new" <<<"$out" && grep -qx "again=false/completed" <<<"$out" || fail "claims did not work"
echo "ok: idem $version installed by pgxn into the copy and created there"
