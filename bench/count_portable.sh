#!/usr/bin/env bash
# Instructions per transaction of the portable edition (docs/portable.md),
# counted by callgrind in a single-user backend, as bench/profile.sh counts
# the native edition's: deterministic, so a change to portable/ can be
# measured on a machine shared with other work, where TPS moves by tens of
# percent from run to run. For each git revision named (default: the
# checkout as it is, "."), the plain script that revision's
# scripts/portable.py writes goes into a fresh cluster of the system's
# PostgreSQL 15; then B1 (the hand-written ON CONFLICT DO NOTHING + business
# insert: the reference), I1 (claim + business insert, new keys), I2 (I1 +
# idem_complete) and I3 (duplicate claims) run N and N/10 transactions each
# (prepared statements, synchronous_commit off), and the difference over the
# difference is printed per transaction (the backend's start left out).
#
# With --tcp the transactions come from psql over TCP (127.0.0.1, port
# COUNT_PORT, default 5553) to a server running under callgrind, and only
# that session's backend is counted: what a client connected over the
# network costs (a single-user backend, like a Unix-socket client, has no
# client address; idem.require_writable tells them apart). Autovacuum is
# off there, as it is in a single-user backend: an ANALYZE during a run
# would make the session plan its statements again.
#
#   bash bench/count_portable.sh [-n N] [--tcp] [REV ...]     # N = 300
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
N=300
TCP=0
COUNT_PORT="${COUNT_PORT:-5553}"
while [ $# -gt 0 ]; do
  case "$1" in
    -n) N="$2"; shift 2 ;;
    --tcp) TCP=1; shift ;;
    *) break ;;
  esac
done
N0=$((N / 10))
[ "$N0" -ge 1 ] || { echo "N must be at least 10" >&2; exit 1; }
[ $# -gt 0 ] || set -- .
command -v valgrind >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
WORK="$(mktemp -d /tmp/idem-count-portable.XXXXXX)"
chmod 755 "$WORK"
DATA="$WORK/data"
trap 'as_postgres "$PG_BIN/pg_ctl" -D "$DATA" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT

# The transactions, one per line (single-user mode reads a statement a line).
python3 - "$N" "$N0" "$WORK" <<'PY'
import sys
n, n0, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
hdr = ("SET synchronous_commit = off;\n"
       "PREPARE ins(text) AS INSERT INTO orders (key, amount) VALUES ($1, 1);\n"
       "PREPARE c(text) AS SELECT claimed FROM idem_claim($1, 'bench');\n"
       "PREPARE f(text) AS SELECT idem_complete($1, 'bench', '{\"ok\": true}');\n"
       "PREPARE d(text) AS INSERT INTO dedup (key) VALUES ($1) ON CONFLICT DO NOTHING;\n")
def key(prefix, i):
    return prefix + "-" + str(i).zfill(31 - len(prefix))      # 32 characters
for name, steps, prefix in (("b1", "EXECUTE d('{k}'); EXECUTE ins('{k}'); ", "b1"),
                            ("i1", "EXECUTE c('{k}'); EXECUTE ins('{k}'); ", "i1"),
                            ("i2", "EXECUTE c('{k}'); EXECUTE ins('{k}'); EXECUTE f('{k}'); ", "i2"),
                            ("i3", "EXECUTE c('{k}'); ", "p")):
    for suffix, count, pre in (("", n, prefix), ("-short", n0, prefix if name == "i3" else prefix + "s")):
        with open(f"{out}/{name}{suffix}.sql", "w") as f:
            f.write(hdr)
            for i in range(count):
                f.write("BEGIN; " + steps.format(k=key(pre, i)) + "COMMIT;\n")
PY
chown -R postgres "$WORK"

count() {   # instructions of one session running $1.sql
  if [ "$TCP" = 1 ]; then
    local pid f
    "$PG_BIN/psql" -X -q -At -h 127.0.0.1 -p "$COUNT_PORT" -U postgres -d bench \
      -c "SELECT pg_backend_pid()" -f "$WORK/$1.sql" > "$WORK/$1.out" 2> "$WORK/$1.log"
    pid=$(head -1 "$WORK/$1.out")
    grep -q "ERROR" "$WORK/$1.log" && { echo "$1: an SQL error:" >&2; grep -m3 ERROR "$WORK/$1.log" >&2; exit 1; }
    # (the backend writes its counts when it exits, after psql has gone)
    f="$WORK/callgrind.tcp.$pid"
    for _ in $(seq 600); do grep -q "^totals:" "$f" 2>/dev/null && break; sleep 0.1; done
    sed -n 's/^totals: *//p' "$f"
    return
  fi
  as_postgres valgrind --tool=callgrind --callgrind-out-file="$WORK/callgrind.$1" \
    "$PG_BIN/postgres" --single -D "$DATA" bench < "$WORK/$1.sql" > "$WORK/$1.log" 2>&1
  grep -q "ERROR" "$WORK/$1.log" && { echo "$1: an SQL error:" >&2; grep -m3 ERROR "$WORK/$1.log" >&2; exit 1; }
  grep -oE "Collected : [0-9]+" "$WORK/$1.log" | awk '{print $3}'
}

echo "PostgreSQL $PG_MAJOR ($PG_BIN): instructions per transaction ($N and $N0 transactions per variant)"
printf '%-14s %12s %12s %12s %12s\n' revision B1 I1 I2 I3
for rev in "$@"; do
  src="$WORK/src"
  rm -rf "$src" "$DATA"; mkdir -p "$src"
  if [ "$rev" = . ]; then
    cp -r "$ROOT/scripts" "$ROOT/sql" "$ROOT/portable" "$ROOT/idem.control" "$ROOT/Cargo.toml" "$src/"
  else
    git -C "$ROOT" archive "$rev" scripts sql portable idem.control Cargo.toml | tar -x -C "$src"
  fi
  python3 "$src/scripts/portable.py" --out "$WORK/dist" >/dev/null
  chown -R postgres "$WORK"
  as_postgres "$PG_BIN/initdb" -D "$DATA" --auth=trust -U postgres >/dev/null
  as_postgres "$PG_BIN/pg_ctl" -D "$DATA" -o "-c listen_addresses='' -c unix_socket_directories='$WORK' -p 5553" \
    -l "$WORK/server.log" -w start >/dev/null
  psql_w() { "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$WORK" -p 5553 -U postgres "$@"; }
  psql_w -d postgres -c "CREATE DATABASE bench"
  psql_w -d bench -f "$ROOT/bench/sql/schema.sql" -f "$WORK/dist/idem_portable.sql" >/dev/null
  psql_w -d bench -c "SELECT idem_claim('bench-setup', 'bench')" -c "SELECT idem_maintain()" \
    -c "SELECT count(*) FROM generate_series(0, $N) g, LATERAL idem_claim('p-' || lpad(g::text, 30, '0'), 'bench') c" \
    -c "VACUUM ANALYZE" >/dev/null
  as_postgres "$PG_BIN/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null
  if [ "$TCP" = 1 ]; then
    as_postgres valgrind --tool=callgrind --trace-children=yes --callgrind-out-file="$WORK/callgrind.tcp.%p" \
      "$PG_BIN/postgres" -D "$DATA" -c listen_addresses=127.0.0.1 -c unix_socket_directories="$WORK" \
      -p "$COUNT_PORT" -c autovacuum=off > "$WORK/server-tcp.log" 2>&1 &
    for _ in $(seq 600); do "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$COUNT_PORT" && break; sleep 0.2; done
  fi
  row=()
  for v in b1 i1 i2 i3; do
    long=$(count "$v")
    short=$(count "$v-short")
    row+=($(((long - short) / (N - N0))))
  done
  if [ "$TCP" = 1 ]; then   # (and wait for valgrind to write its last counts)
    as_postgres "$PG_BIN/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null
    wait
  fi
  printf '%-14s %12d %12d %12d %12d\n' "$(git -C "$ROOT" rev-parse --short "${rev/#./HEAD}")$([ "$rev" = . ] && echo '+wt' || true)" "${row[@]}"
done
