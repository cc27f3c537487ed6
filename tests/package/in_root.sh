#!/usr/bin/env bash
# Run by tests/scenarios/packaging.sh package inside a Debian 12 root that has only
# Debian's PostgreSQL 15 (tests/servers/debian-root.sh bookworm, through in-trixie.sh):
# install idem's package with apt-get as a server's operator would, create
# the extension from it in a cluster of that PostgreSQL, use it, remove the
# package. IDEM_PKG_DEB is the .deb, IDEM_PKG_PORT the cluster's port.
set -euo pipefail
deb=$IDEM_PKG_DEB
port=${IDEM_PKG_PORT:-5475}
bin=/usr/lib/postgresql/15/bin
lib=$("$bin/pg_config" --pkglibdir)
ext="$("$bin/pg_config" --sharedir)/extension"
fail() { echo "FAIL: $*"; exit 1; }

echo "root: $(. /etc/os-release && echo "$PRETTY_NAME"), $("$bin/postgres" --version)"
[ ! -e "$lib/idem.so" ] || fail "$lib/idem.so exists before the package is installed"
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$deb" 2>&1 | grep -E "^(Setting up|Unpacking|E:)" || true
status=$(dpkg-query -W -f='${Status} ${Version}' postgresql-15-idem 2>/dev/null || true)
echo "dpkg: postgresql-15-idem $status"
[[ "$status" == "install ok installed "* ]] || fail "the package is not installed: $status"
for f in "$lib/idem.so" "$ext/idem.control"; do
  dpkg -S "$f" >/dev/null 2>&1 && echo "owned by the package: $f" || fail "$f is not installed by the package"
done

data=$(mktemp -d /tmp/idem-package.XXXXXX)
chown postgres:postgres "$data"
stop() { runuser -u postgres -- "$bin/pg_ctl" -D "$data/data" -m fast -w stop >/dev/null 2>&1 || true; rm -rf "$data"; }
trap stop EXIT
runuser -u postgres -- "$bin/initdb" -D "$data/data" --auth=trust -U postgres >/dev/null
runuser -u postgres -- "$bin/pg_ctl" -D "$data/data" -l "$data/server.log" -w \
  -o "-c listen_addresses='' -c unix_socket_directories='$data' -c port=$port" start >/dev/null
out=$("$bin/psql" -X -At -v ON_ERROR_STOP=1 -h "$data" -p "$port" -U postgres -d postgres <<'SQL'
CREATE EXTENSION idem;
SELECT 'version=' || extversion FROM pg_extension WHERE extname = 'idem';
SELECT 'maintain=' || (idem_maintain() ? 'partitions_created');
SELECT 'claim=' || claimed || '/' || state FROM idem_claim('pkg-1', 'package');
SELECT 'again=' || claimed || '/' || state FROM idem_claim('pkg-1', 'package');
SELECT 'update-path=' || path FROM pg_extension_update_paths('idem') WHERE source = '0.2.0' AND target = (SELECT extversion FROM pg_extension WHERE extname = 'idem');
SQL
)
echo "$out"
grep -q "^version=" <<<"$out" && grep -qx "maintain=true" <<<"$out" || fail "CREATE EXTENSION or idem_maintain failed"
grep -qx "claim=true/new" <<<"$out" && grep -qx "again=false/completed" <<<"$out" || fail "claims did not work"
grep -q "^update-path=0.2.0--" <<<"$out" || fail "no update path from 0.2.0 in the package"
"$bin/psql" -X -q -h "$data" -p "$port" -U postgres -d postgres -c "DROP EXTENSION idem"
stop
trap - EXIT

DEBIAN_FRONTEND=noninteractive apt-get remove -y -q postgresql-15-idem 2>&1 | grep -E "^Removing" || true
[ ! -e "$lib/idem.so" ] && [ ! -e "$ext/idem.control" ] || fail "apt-get remove left idem's files"
echo "apt-get remove: the package's files are gone"
echo "ok: installed with apt-get, created, used, removed"
