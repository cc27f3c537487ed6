# Shared by the project's scripts: where things are, and how to reach the
# private cluster. Source it; it defines functions and variables only.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PG_BIN=/usr/lib/postgresql/15/bin
PG_CONFIG="$PG_BIN/pg_config"
PGXS_TEST=/usr/lib/postgresql/15/lib/pgxs/src/test
PGRX_VERSION=0.18.1
IDEM_PORT="${IDEM_PORT:-5499}"

# The cluster lives under the project folder, unless the postgres user cannot
# reach that folder (a checkout under /root, say): then under /tmp.
cluster_dir() {
  if sudo -u postgres test -x "$ROOT" 2>/dev/null; then
    echo "$ROOT/.cluster"
  else
    echo "/tmp/idem-cluster-$(echo "$ROOT" | md5sum | cut -c1-8)"
  fi
}

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

as_postgres() { (cd / && sudo -u postgres "$@"); }

# IDEM_HOST (a socket directory) and IDEM_PORT point the scripts at another
# cluster; IDEM_CLIENT_HOST / IDEM_CLIENT_PORT point the programs under test
# (the examples) at a pooler in front of it (tests/scenarios/pgbouncer.sh).
psql_idem() {
  "$PG_BIN/psql" -X -v ON_ERROR_STOP=1 -h "${IDEM_HOST:-$(cluster_dir)}" -p "$IDEM_PORT" -U postgres "$@"
}
client_host() { echo "${IDEM_CLIENT_HOST:-${IDEM_HOST:-$(cluster_dir)}}"; }
client_port() { echo "${IDEM_CLIENT_PORT:-$IDEM_PORT}"; }

# Python for the project's drivers and examples: a venv under the project
# (Debian 12's system Python refuses pip installs), made by setup.d/10-python.sh.
IDEM_VENV="$ROOT/.venv"
IDEM_PY="$IDEM_VENV/bin/python"
