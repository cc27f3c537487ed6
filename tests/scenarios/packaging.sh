#!/usr/bin/env bash
# Packaging and upgrades: the Debian package in a Debian 12 root, the PGXN
# distribution, ALTER EXTENSION UPDATE from every shipped version.
# One scenario per function: bash tests/scenarios/packaging.sh NAME (NAME: package, pgxn, upgrade);
# scripts/test.sh runs each as scenario/NAME (tests/lib/scenarios.sh).
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/scenarios.sh"

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
scenario_package() {
source "$ROOT/tests/lib/scenarios.sh"
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
  owner=$(dpkg -S "*/$(gcc -print-multiarch)/$lib" 2>/dev/null | sed -n 1p | cut -d: -f1)
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
}

# `pgxn install` of idem, as PGXN users run it, with the Makefile: a
# distribution zip made from the tracked files (what `git archive` puts in a
# PGXN release), installed by Debian's pgxnclient into a private copy of the
# PostgreSQL the suite uses (its server, headers and share folder copied to
# a scratch folder; PostgreSQL finds its paths relative to its binaries), so
# that the installed server is never touched. Then a cluster of that copy
# (port ${IDEM_PGXN_PORT:-5474}) runs CREATE EXTENSION idem and claims.
# Builds a release build in a fresh source folder, in a cargo target folder
# of its own ($IDEM_CACHE/cargo-target/pgNN-pgxn: the dependencies are
# reused from the last run, or at first from the suite's folder, idem
# itself is compiled from the zip's sources each time, see idem_build and
# idem_seed_target in scripts/lib.sh; the suite's own folder is left to
# the checkout's builds).
scenario_pgxn() {
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
IDEM_SEED_FROM=${IDEM_CHOSEN_TARGET:-}
(cd "$scratch" && idem_build "$scratch" pgxn install --pg_config "$pg_config" "./idem-$version.zip") > "$scratch/pgxn.log" 2>&1 \
  || { tail -40 "$scratch/pgxn.log"; fail "pgxn install failed"; }
grep -m10 -E "^(INFO|WARNING|ERROR)" "$scratch/pgxn.log"
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
}

# ALTER EXTENSION idem UPDATE from every shipped version to the current one.
# For each old version V with a frozen install script tests/upgrade/idem--V.sql:
#   1. install V in a new database and use it (with the new library, as a
#      server does between installing a build and ALTER EXTENSION UPDATE):
#      tests/upgrade/seed.sql (claims in range partitions and in the default
#      one, completed and failed, a lease, a business type setting, a
#      machine and a guarded table, a token);
#   2. ALTER EXTENSION idem UPDATE (walks sql/idem--A--B.sql to the current);
#   3. every claim replays its stored outcome, the lease is finished with its
#      token, guards and tokens still hold, new claims work, idem.claims and
#      every partition the old version made have REPLICA IDENTITY FULL;
#   4. the upgraded schema equals a fresh install's, object by object
#      (tests/upgrade/schema.sql), so an upgrade script that forgets a change
#      fails here.
# First: the unreleased update scripts are what their templates give
# (scripts/updates.py).
scenario_upgrade() {
python3 "$ROOT/scripts/updates.py" --check
current=$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml" | sed -n 1p)
extdir="$("$PG_CONFIG" --sharedir)/extension"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0

fresh() { psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $1 WITH (FORCE)" -c "CREATE DATABASE $1"; }

fresh idem_upgrade_fresh
psql_idem -q -d postgres -c "DROP ROLE IF EXISTS upgrade_member, upgrade_owner, upgrade_stranger" \
  -c "CREATE ROLE upgrade_owner NOLOGIN" -c "CREATE ROLE upgrade_member NOLOGIN IN ROLE upgrade_owner" -c "CREATE ROLE upgrade_stranger NOLOGIN"
trap 'rm -rf "$work"; psql_idem -q -d postgres -c "DROP ROLE IF EXISTS upgrade_member, upgrade_owner, upgrade_stranger" >/dev/null 2>&1' EXIT
psql_idem -q -d idem_upgrade_fresh -c "CREATE EXTENSION idem"
psql_idem -At -d idem_upgrade_fresh -f "$ROOT/tests/upgrade/schema.sql" > "$work/fresh.txt"
echo "fresh $current install: $(grep -c '^[a-z]' "$work/fresh.txt") description lines"

for frozen in "$ROOT"/tests/upgrade/idem--*.sql; do
  old=$(basename "$frozen" .sql); old=${old#idem--}
  # The old version's install script is not shipped with the new build: put
  # it beside the current one so that CREATE EXTENSION ... VERSION finds it.
  # (Only when it differs: scenarios running beside this one copy that
  # folder, and would copy a file being rewritten.)
  cmp -s "$frozen" "$extdir/idem--$old.sql" || install -m 644 "$frozen" "$extdir/idem--$old.sql"
  path=$(psql_idem -At -d idem_upgrade_fresh -c \
    "SELECT path FROM pg_extension_update_paths('idem') WHERE source = '$old' AND target = '$current'")
  if [ -z "$path" ]; then echo "FAIL: no update path from $old to $current (missing sql/idem--$old--…sql)"; fails=$((fails + 1)); continue; fi
  echo "update path $old → $current: $path"

  db=idem_upgrade_from_${old//./_}
  fresh "$db"
  psql_idem -q -d "$db" -c "CREATE EXTENSION idem VERSION '$old'" -f "$ROOT/tests/upgrade/seed.sql" > /dev/null
  # Versions with owner roles (0.3.0: stored as a regrole) reserve a type.
  has_owner=$(psql_idem -At -d "$db" -c "SELECT count(*) FROM pg_proc WHERE proname = 'idem_set_owner'")
  if [ "$has_owner" = 1 ]; then
    psql_idem -q -d "$db" -c "SELECT idem_configure('owned', '5 hours')" -c "SELECT idem_set_owner('owned', 'upgrade_owner')" >/dev/null
  fi
  # An operator's grant of idem_configure(biz_type, ttl), and a hardened
  # idem_checkpoint (PUBLIC revoked, one role granted).
  psql_idem -q -d "$db" -c "GRANT EXECUTE ON FUNCTION idem_configure(text, interval) TO upgrade_stranger" \
    -c "REVOKE EXECUTE ON FUNCTION idem_checkpoint(text, text, text, jsonb, text) FROM PUBLIC" \
    -c "GRANT EXECUTE ON FUNCTION idem_checkpoint(text, text, text, jsonb, text) TO upgrade_member"
  psql_idem -q -d "$db" -c "ALTER EXTENSION idem UPDATE"
  out=$(psql_idem -At -d "$db" <<'SQL'
SELECT 'version=' || extversion FROM pg_extension WHERE extname = 'idem';
SELECT 'done=' || claimed || '/' || state || '/' || result::text FROM idem_claim('done', 'pay');
SELECT 'refused=' || claimed || '/' || state || '/' || result::text FROM idem_claim('refused', 'pay');
SELECT 'far=' || claimed || '/' || state || '/' || result::text FROM idem_claim('far', 'pay');
SELECT 'open=' || claimed || '/' || state FROM idem_claim('open', 'pay');
SELECT 'new=' || claimed || '/' || state FROM idem_claim('new-after-upgrade', 'pay');
SELECT 'leased=' || claimed || '/' || state FROM idem_claim('leased', 'pay');
SELECT 'lease-completed=' || (count(idem_complete('leased', 'pay', '{"by": "owner"}', t)) = 1) FROM lease_token;
SELECT 'leased-after=' || state || '/' || result::text FROM idem_lookup('leased', 'pay');
SELECT 'ttl=' || ttl FROM idem.biz_types WHERE biz_type = 'pay';
SELECT 'token=' || idem_consume_token(t, 'form') FROM tok;
SELECT 'token-again=' || idem_consume_token(t, 'form') FROM tok;
SELECT 'replica-identity=' || string_agg(DISTINCT relreplident::text, ',') FROM pg_class
 WHERE oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'idem.claims'::regclass) OR oid = 'idem.claims'::regclass;
SELECT 'maintain=' || (idem_maintain() IS NOT NULL);
SQL
  )
  # A guarded transition that already happened must still be refused.
  guard=$(psql_idem -At -d "$db" -c "UPDATE orders SET status = 'CREATED' WHERE id = 1" 2>&1 || true)
  echo "$out" | sed 's/^/  /'
  # (its first line; not "echo | head -1", which ended this scenario
  # without a word once on 16 and once on 17: docs/development.md, Shell
  # pipelines)
  echo "  re-transition PAID → CREATED: ${guard%%$'\n'*}"
  for want in "version=$current" 'done=false/completed/{"charged": 42}' 'refused=false/failed/{"reason": "card declined"}' \
              'far=false/completed/{"far": true}' 'open=false/completed' 'new=true/new' 'ttl=3 days' \
              'leased=false/in_progress' 'lease-completed=true' 'leased-after=completed/{"by": "owner"}' \
              'token=true' 'token-again=false' 'maintain=true' 'replica-identity=f'; do
    grep -qxF "$want" <<<"$out" || { echo "FAIL: after the upgrade from $old, expected '$want'"; fails=$((fails + 1)); }
  done
  grep -q "ERROR" <<<"$guard" || { echo "FAIL: guard did not refuse a repeated transition after the upgrade"; fails=$((fails + 1)); }
  if [ "$has_owner" = 1 ]; then
    owned=$(psql_idem -At -d "$db" -c "SELECT owner || '/' || ttl FROM idem.biz_types WHERE biz_type = 'owned'")
    stranger=$(psql_idem -At -d "$db" -c "SET ROLE upgrade_stranger" -c "SELECT idem_claim('o', 'owned')" 2>&1 | grep -o 'permission denied for biz_type "owned"' || true)
    member=$( { psql_idem -At -d "$db" -c "SET ROLE upgrade_member" -c "SELECT claimed FROM idem_claim('o', 'owned')" 2>&1 || true; } | tail -1)
    echo "  owner kept: $owned; stranger: $stranger; member claims: $member"
    [ "$owned" = "upgrade_owner/05:00:00" ] || { echo "FAIL: the type's owner and TTL after the upgrade: $owned"; fails=$((fails + 1)); }
    [ -n "$stranger" ] || { echo "FAIL: a non-member used the reserved type after the upgrade"; fails=$((fails + 1)); }
    [ "$member" = t ] || { echo "FAIL: the owner's member could not claim after the upgrade: $member"; fails=$((fails + 1)); }
  fi

  # 0.4.0's idem_configure(biz_type, ttl, on_failure) is granted to the
  # roles granted the two-argument form; under the retry policy the claim
  # idem_fail refused before the update is claimed anew.
  # (|| true in these captures: a psql error must reach the check's FAIL
  # line, not end the scenario under set -e without a word)
  retried=$( { psql_idem -At -d "$db" -c "SET ROLE upgrade_stranger" -c "SELECT idem_configure('pay', '3 days', 'retry')" \
              -c "RESET ROLE" -c "SELECT claimed || '/' || (result->>'attempt') || '/' || (result->'previous_error')::text FROM idem_claim('refused', 'pay')" 2>&1 || true; } | tail -1)
  echo "  granted on_failure, refused claim retried: $retried"
  [ "$retried" = 'true/2/{"reason": "card declined"}' ] || { echo "FAIL: configure with on_failure by a role granted idem_configure before the upgrade, then a retry: $retried"; fails=$((fails + 1)); }
  # The new idem_checkpoint form has the old one's privileges.
  merge_acl=$(psql_idem -At -d "$db" -c "SELECT has_function_privilege('public', 'idem_checkpoint(text, text, text, jsonb, text, boolean)', 'EXECUTE')
                                                || '/' || has_function_privilege('upgrade_member', 'idem_checkpoint(text, text, text, jsonb, text, boolean)', 'EXECUTE')" 2>&1 || true)
  echo "  idem_checkpoint with merge, PUBLIC/granted role: $merge_acl"
  [ "$merge_acl" = false/true ] || { echo "FAIL: idem_checkpoint with merge after a hardened idem_checkpoint: $merge_acl"; fails=$((fails + 1)); }
  psql_idem -q -d "$db" -c "REVOKE EXECUTE ON FUNCTION idem_configure(text, interval), idem_configure(text, interval, text), idem_configure(text, interval, text, text) FROM upgrade_stranger" \
    -c "REVOKE EXECUTE ON FUNCTION idem_checkpoint(text, text, text, jsonb, text), idem_checkpoint(text, text, text, jsonb, text, boolean) FROM upgrade_member" \
    -c "UPDATE pg_proc SET proacl = NULL WHERE proname = 'idem_checkpoint'"  # the default ACL again, as a fresh install has it (no GRANT restores NULL)
  psql_idem -At -d "$db" -f "$ROOT/tests/upgrade/schema.sql" > "$work/upgraded-$old.txt"
  if diff -u "$work/fresh.txt" "$work/upgraded-$old.txt" > "$work/diff-$old.txt"; then
    echo "schema after $old → $current equals a fresh $current install"
  else
    echo "FAIL: schema after $old → $current differs from a fresh install:"; cat "$work/diff-$old.txt"
    fails=$((fails + 1))
  fi
  psql_idem -q -d postgres -c "DROP DATABASE $db WITH (FORCE)"
done
psql_idem -q -d postgres -c "DROP DATABASE idem_upgrade_fresh WITH (FORCE)"
echo "upgrade checks failed: $fails"
[ "$fails" = 0 ]
}

scenario_main "$@"
