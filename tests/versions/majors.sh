#!/usr/bin/env bash
# What runs only across PostgreSQL majors and packages, beside the core
# suites (scripts/test.sh calls each after the suite of the major it needs):
#   PG18_CONFIG=/path/to/18/bin/pg_config bash tests/versions/majors.sh pg_upgrade
#   bash tests/servers/in-trixie.sh bash tests/versions/majors.sh package_debian13
# Each is one function below; the checks are tests/lib/scenarios.sh's.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/cluster.sh"
source "$ROOT/tests/lib/scenarios.sh"
die() { echo "FAIL: $*"; exit 1; }

# The Debian 13 package for PostgreSQL 17, built and installed for real in
# the trixie root (tests/servers/debian-root.sh trixie), which is Debian 13 with Debian's
# postgresql-17 installed, like a fresh server:
#   bash tests/servers/in-trixie.sh bash tests/versions/majors.sh package_debian13
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
scenario_package_debian13() {
[ "${IDEM_IN_TRIXIE:-}" = 1 ] || die "run this inside the trixie root: bash tests/servers/in-trixie.sh bash $0 package_debian13"
[ "$PG_MAJOR" = 17 ] || die "expected Debian 13's PostgreSQL 17, PG_CONFIG=$PG_CONFIG is $PG_MAJOR"
cd "$ROOT"
version=$(awk -F'"' '$1 == "version = " { print $2; exit }' Cargo.toml)
arch=$(dpkg --print-architecture)
deb="target/package/postgresql-17-idem_${version}_${arch}.deb"

echo "Debian $(cat /etc/debian_version), $("$PG_CONFIG" --version)"
bash scripts/package.sh >/dev/null
[ -f "$deb" ] || die "$deb was not built"
expect "package name" "$(dpkg-deb --field "$deb" Package)" postgresql-17-idem
expect "package version" "$(dpkg-deb --field "$deb" Version)" "$version"
[[ ", $(dpkg-deb --field "$deb" Depends)," =~ ,\ postgresql-17[,\ ] ]] && echo "ok: depends on postgresql-17" \
  || fail "Depends lacks postgresql-17: $(dpkg-deb --field "$deb" Depends)"

cleanup() {
  [ -z "${work:-}" ] || { pc_server_stop "$work"; rm -rf "$work"; }
}
trap cleanup EXIT
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "./$deb" >/dev/null
expect "installed" "$(dpkg-query -W -f '${Status}' postgresql-17-idem)" "install ok installed"
pkglibdir=$("$PG_CONFIG" --pkglibdir) extdir="$("$PG_CONFIG" --sharedir)/extension"
misplaced=$(dpkg -L postgresql-17-idem | while read -r f; do
  [ -f "$f" ] || continue
  case "$f" in "$pkglibdir"/*|"$extdir"/*|/usr/share/doc/postgresql-17-idem/*) ;; *) echo "$f" ;; esac
done)
expect "every file under pg_config's directories or the doc folder" "$misplaced" ""
expect "library owned by the package" "$(dpkg -S "$pkglibdir/idem.so" | cut -d: -f1)" postgresql-17-idem

work=$(mktemp -d /tmp/idem-deb13.XXXXXX); chown postgres:postgres "$work"
pc_initdb /usr/lib/postgresql/17/bin "$work" 5577
pc_server_start "$work"
q() { /usr/lib/postgresql/17/bin/psql -X -At -v ON_ERROR_STOP=1 -h "$work" -p 5577 -U postgres -d postgres "$@"; }
expect "CREATE EXTENSION from the package" "$(q -c "CREATE EXTENSION idem" -c "SELECT extversion FROM pg_extension WHERE extname = 'idem'" | tail -1)" "$version"
q -c "BEGIN" -c "SELECT idem_claim('deb13', 'pay')" -c "SELECT idem_complete('deb13', 'pay', '{\"ok\": 1}')" -c "COMMIT" >/dev/null
expect "second claim replays the first outcome" "$(q -c "SELECT claimed || '|' || state || '|' || result FROM idem_claim('deb13', 'pay')")" 'false|completed|{"ok": 1}'
expect "read-only transaction refused with 25006" "$(q -c "SET default_transaction_read_only = on" \
  -c "DO \$\$ BEGIN PERFORM idem_claim('ro', 'pay'); EXCEPTION WHEN OTHERS THEN RAISE NOTICE '%', SQLSTATE; END \$\$" 2>&1 | sed -n 's/^NOTICE:  //p')" 25006
pc_ctl "$work" -m fast -w stop >/dev/null

owned=$(dpkg -L postgresql-17-idem | while read -r f; do if [ -f "$f" ]; then echo "$f"; fi; done)
DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq postgresql-17-idem >/dev/null
left=$(for f in $owned; do if [ -e "$f" ]; then echo "$f"; fi; done)
expect "purge removes every file the package installed" "$left" ""
finish package
}

# pg_upgrade from PostgreSQL 15 to 18 (tests/servers/pg18.sh, with this build
# of idem installed by a core run of scripts/test.sh), with live claims, a
# running lease, a state machine and its guard, a one-time token and a
# business type setting in the old cluster. After the upgrade every claim
# replays its stored outcome, the lease is finished with its token, the
# guard and the token still hold, maintenance runs and new claims work.
#   PG18_CONFIG=/path/to/18/bin/pg_config bash tests/versions/majors.sh pg_upgrade
#
# The old side is PostgreSQL 15 built from the upstream source
# (tests/servers/pg15-upstream.sh: the Debian 15.20 of this machine kind
# stamps every column with an attribute option 18 rejects, so pg_upgrade
# from it fails for any database), with idem copied from the build
# installed into Debian's 15.
scenario_pg_upgrade() {
: "${PG18_CONFIG:?PG18_CONFIG must point at the pg_config of PostgreSQL 18}"
OLD_CONFIG="$(bash "$ROOT/tests/servers/pg15-upstream.sh")"
OLD_BIN="$("$OLD_CONFIG" --bindir)"
NEW_BIN="$("$PG18_CONFIG" --bindir)"
# idem into the old tree: Debian's 15 has this build installed (lib.sh's
# default PG_CONFIG).
install -m 644 "$("$PG_CONFIG" --pkglibdir)/idem.so" "$("$OLD_CONFIG" --pkglibdir)/"
install -m 644 "$("$PG_CONFIG" --sharedir)"/extension/idem* "$("$OLD_CONFIG" --sharedir)/extension/"
[ -f "$("$PG18_CONFIG" --pkglibdir)/idem.so" ] || { echo "idem is not installed into PostgreSQL 18 (run the core suite on 18 first)"; exit 1; }
work="$(cluster_dir)/pg_upgrade"
old="$work/old" new="$work/new"
oport=5521 nport=5522
stop_all() { pc_server_stop "$old"; pc_server_stop "$new"; }
trap stop_all EXIT
stop_all
pc_fresh "$work"; pc_fresh "$old"; pc_fresh "$new"
sql_old() { "$OLD_BIN/psql" -X -At -v ON_ERROR_STOP=1 -h "$old" -p $oport -U postgres -d app "$@"; }
sql_new() { "$NEW_BIN/psql" -X -At -v ON_ERROR_STOP=1 -h "$new" -p $nport -U postgres -d app "$@"; }

pc_initdb "$OLD_BIN" "$old" $oport
pc_server_start "$old"
"$OLD_BIN/psql" -X -q -h "$old" -p $oport -U postgres -d postgres -c "CREATE DATABASE app"
sql_old -q -c "CREATE EXTENSION idem" -f "$ROOT/tests/upgrade/seed.sql" >/dev/null
lease_token=$(sql_old -c "SELECT t FROM lease_token")
[[ "$lease_token" =~ ^[0-9a-f]{32}$ ]] || { echo "FAIL: no lease token from the old cluster: $lease_token"; exit 1; }
sql_old -c "SELECT idem_checkpoint('leased', 'pay', 'item', '{\"last_item\": 7}', '$lease_token')" >/dev/null
before=$(sql_old -c "SELECT count(*) FROM idem.claims")
pc_ctl "$old" -m fast -w stop >/dev/null

# 18's initdb turns data checksums on by default; the old cluster has none.
PC_INITDB_OPTS=--no-data-checksums pc_initdb "$NEW_BIN" "$new" $nport
echo "pg_upgrade $("$OLD_BIN/postgres" --version | awk '{print $3}') → $("$NEW_BIN/postgres" --version | awk '{print $3}')"
# (pg_upgrade writes its logs into the current directory: the work folder,
# which the postgres user owns; as_postgres would start it in /.)
(cd "$work" && sudo -u postgres "$NEW_BIN/pg_upgrade" -b "$OLD_BIN" -B "$NEW_BIN" -d "$old/data" -D "$new/data" \
   -o "-c unix_socket_directories=$work" -O "-c unix_socket_directories=$work" -p $oport -P $nport) > "$work/pg_upgrade.out" 2>&1 \
  || { echo "FAIL: pg_upgrade"; tail -30 "$work/pg_upgrade.out"; exit 1; }
pc_server_start "$new"

expect "server is 18" "$(sql_new -c "SELECT current_setting('server_version_num')::int / 10000")" 18
expect "claims carried over" "$(sql_new -c "SELECT count(*) FROM idem.claims")" "$before"
expect "completed claim replays" "$(sql_new -c "SELECT claimed || '|' || state || '|' || result FROM idem_claim('done', 'pay')")" 'false|completed|{"charged": 42}'
expect "failed claim replays" "$(sql_new -c "SELECT claimed || '|' || state || '|' || result FROM idem_claim('refused', 'pay')")" 'false|failed|{"reason": "card declined"}'
expect "far claim (default partition) replays" "$(sql_new -c "SELECT claimed || '|' || state || '|' || result FROM idem_claim('far', 'pay')")" 'false|completed|{"far": true}'
expect "claim committed unfinished reads completed" "$(sql_new -c "SELECT claimed || '|' || state FROM idem_claim('open', 'pay')")" 'false|completed'
expect "running lease still in progress" "$(sql_new -c "SELECT claimed || '|' || state FROM idem_claim('leased', 'pay')")" 'false|in_progress'
expect "recovery point kept" "$(sql_new -c "SELECT recovery_data FROM idem_leases WHERE key = 'leased'")" '{"last_item": 7}'
sql_new -c "SELECT idem_complete('leased', 'pay', '{\"done\": true}', '$lease_token')" >/dev/null
expect "lease finished with its token" "$(sql_new -c "SELECT state || '|' || result FROM idem_lookup('leased', 'pay')")" 'completed|{"done": true}'
expect "business type TTL kept" "$(sql_new -c "SELECT extract(epoch FROM expires_at - first_claimed_at) = 3 * 86400 FROM idem_claim('new-after', 'pay')")" 't'
expect "guard still refuses" "$(sql_new -c "DO \$\$ BEGIN UPDATE orders SET status = 'CREATED' WHERE id = 1; EXCEPTION WHEN OTHERS THEN RAISE NOTICE '%', SQLSTATE; END \$\$" 2>&1 | sed -n 's/^NOTICE:  //p')" 'ID002'
expect "token spent once" "$(sql_new -c "SELECT idem_consume_token(t, 'form') || '|' || idem_consume_token(t, 'form') FROM tok")" 'true|false'
expect "maintenance runs" "$(sql_new -c "SELECT idem_maintain() ? 'partitions_created'")" 't'
expect "digest unchanged" "$(sql_new -c "SELECT idem.key_hash('payment', 'req-42')")" -1710364826077851957
finish pg_upgrade
}

scenario_main "$@"
