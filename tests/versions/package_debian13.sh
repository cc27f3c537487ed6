#!/usr/bin/env bash
# The Debian 13 package for PostgreSQL 17, built and installed for real in
# the trixie root (tests/servers/debian-root.sh trixie), which is Debian 13 with Debian's
# postgresql-17 installed, like a fresh server:
#   bash tests/servers/in-trixie.sh bash tests/versions/package_debian13.sh
#   - scripts/package.sh builds target/package/postgresql-17-idem_<v>_<arch>.deb;
#   - its control fields name postgresql-17 and Cargo.toml's version;
#   - apt-get installs it (dependencies resolved by apt, not forced);
#   - every file it owns is where PostgreSQL 17's pg_config says;
#   - a new cluster of Debian's 17 runs CREATE EXTENSION idem from the
#     package, claims a key, gets the first outcome back on the second
#     claim, and refuses a read-only write with 25006;
#   - apt-get purge removes every file the package installed.
# Runs inside the root only (it installs packages there; the root is a
# cache this project owns, never the host). The core suite run before it
# installed the same build with cargo pgrx; the purge at the end removes
# it, and the next core run installs it again.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/cluster.sh"
die() { echo "FAIL: $*"; exit 1; }
[ "${IDEM_IN_TRIXIE:-}" = 1 ] || die "run this inside the trixie root: bash tests/servers/in-trixie.sh bash $0"
[ "$PG_MAJOR" = 17 ] || die "expected Debian 13's PostgreSQL 17, PG_CONFIG=$PG_CONFIG is $PG_MAJOR"
cd "$ROOT"
version=$(awk -F'"' '$1 == "version = " { print $2; exit }' Cargo.toml)
arch=$(dpkg --print-architecture)
deb="target/package/postgresql-17-idem_${version}_${arch}.deb"
fails=0
check() { # label want got
  if [ "$2" = "$3" ]; then echo "ok: $1"; else echo "FAIL: $1: want '$2', got '$3'"; fails=$((fails + 1)); fi
}

echo "Debian $(cat /etc/debian_version), $("$PG_CONFIG" --version)"
bash scripts/package.sh >/dev/null
[ -f "$deb" ] || die "$deb was not built"
check "package name" postgresql-17-idem "$(dpkg-deb --field "$deb" Package)"
check "package version" "$version" "$(dpkg-deb --field "$deb" Version)"
[[ ", $(dpkg-deb --field "$deb" Depends)," =~ ,\ postgresql-17[,\ ] ]] && echo "ok: depends on postgresql-17" \
  || { echo "FAIL: Depends lacks postgresql-17: $(dpkg-deb --field "$deb" Depends)"; fails=$((fails + 1)); }

cleanup() {
  [ -z "${work:-}" ] || { pc_server_stop "$work"; rm -rf "$work"; }
}
trap cleanup EXIT
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "./$deb" >/dev/null
check "installed" "install ok installed" "$(dpkg-query -W -f '${Status}' postgresql-17-idem)"
pkglibdir=$("$PG_CONFIG" --pkglibdir) extdir="$("$PG_CONFIG" --sharedir)/extension"
misplaced=$(dpkg -L postgresql-17-idem | while read -r f; do
  [ -f "$f" ] || continue
  case "$f" in "$pkglibdir"/*|"$extdir"/*|/usr/share/doc/postgresql-17-idem/*) ;; *) echo "$f" ;; esac
done)
check "every file under pg_config's directories or the doc folder" "" "$misplaced"
check "library owned by the package" postgresql-17-idem "$(dpkg -S "$pkglibdir/idem.so" | cut -d: -f1)"

work=$(mktemp -d /tmp/idem-deb13.XXXXXX); chown postgres:postgres "$work"
pc_initdb /usr/lib/postgresql/17/bin "$work" 5577
pc_server_start "$work"
q() { /usr/lib/postgresql/17/bin/psql -X -At -v ON_ERROR_STOP=1 -h "$work" -p 5577 -U postgres -d postgres "$@"; }
check "CREATE EXTENSION from the package" "$version" "$(q -c "CREATE EXTENSION idem" -c "SELECT extversion FROM pg_extension WHERE extname = 'idem'" | tail -1)"
q -c "BEGIN" -c "SELECT idem_claim('deb13', 'pay')" -c "SELECT idem_complete('deb13', 'pay', '{\"ok\": 1}')" -c "COMMIT" >/dev/null
check "second claim replays the first outcome" 'false|completed|{"ok": 1}' "$(q -c "SELECT claimed || '|' || state || '|' || result FROM idem_claim('deb13', 'pay')")"
check "read-only transaction refused with 25006" 25006 "$(q -c "SET default_transaction_read_only = on" \
  -c "DO \$\$ BEGIN PERFORM idem_claim('ro', 'pay'); EXCEPTION WHEN OTHERS THEN RAISE NOTICE '%', SQLSTATE; END \$\$" 2>&1 | sed -n 's/^NOTICE:  //p')"
pc_ctl "$work" -m fast -w stop >/dev/null

owned=$(dpkg -L postgresql-17-idem | while read -r f; do if [ -f "$f" ]; then echo "$f"; fi; done)
DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq postgresql-17-idem >/dev/null
left=$(for f in $owned; do if [ -e "$f" ]; then echo "$f"; fi; done)
check "purge removes every file the package installed" "" "$left"
echo "package checks failed: $fails"
[ "$fails" = 0 ]
