#!/usr/bin/env bash
# Instructions per transaction of B0, B1, I1 and I3, counted by callgrind in a
# single-user backend (repeatable, unlike timings on a shared 2-core box).
#   bash bench/profile.sh [N]              N transactions per variant (default 3000)
#   bash bench/profile.sh --preload [N]    the same with shared_preload_libraries = 'idem'
#                                          (the claim path then also counts idem_metrics)
#   PG_CONFIG=/path/to/pg_config bash bench/profile.sh     another PostgreSQL (default 15)
# Needs valgrind (apt-get install valgrind). Writes bench/out/profile/ (or
# bench/out/profile-preload/), with a private data folder under /tmp.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
preload=0
if [ "${1:-}" = --preload ]; then preload=1; shift; fi
N="${1:-3000}"
PG_CONFIG="${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}"
PG_BIN="$("$PG_CONFIG" --bindir)"
command -v valgrind >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
OUT="$ROOT/bench/out/profile$([ $preload = 1 ] && echo -preload || true)"
DATA=$(mktemp -d /tmp/idem-profile-data.XXXXXX)
trap 'rm -rf "$DATA"' EXIT
rm -rf "$OUT"; mkdir -p "$OUT"; chown postgres "$DATA" "$OUT"
opts=()
[ $preload = 1 ] && opts=(-c shared_preload_libraries=idem)
single() { (cd / && sudo -u postgres "$@"); }
single "$PG_BIN/initdb" -D "$DATA/pg" --auth=trust -U postgres >/dev/null
single "$PG_BIN/postgres" --single -D "$DATA/pg" "${opts[@]}" postgres >/dev/null 2>&1 <<'SQL'
CREATE EXTENSION idem;
SELECT idem_maintain();
CREATE TABLE orders (id bigserial primary key, key text, amount int, created_at timestamptz default now());
CREATE TABLE dedup (key text primary key, created_at timestamptz default now());
SQL
python3 - "$N" "$OUT" <<'PY'
import sys
n, out = int(sys.argv[1]), sys.argv[2]
hdr = "SET synchronous_commit = off;\nPREPARE ins(int) AS INSERT INTO orders (key, amount) VALUES ('x', $1);\n"
claim = "PREPARE c(text) AS SELECT claimed FROM idem_claim($1, 'bench');\n"
def write(name, prep, step):
    with open(f"{out}/{name}.sql", "w") as f:
        f.write(hdr + prep)
        for i in range(n):
            f.write(f"BEGIN; {step.format(i=i)}EXECUTE ins(1); COMMIT;\n")
write("b0", "", "")
write("b1", "PREPARE d(text) AS INSERT INTO dedup (key) VALUES ($1) ON CONFLICT DO NOTHING;\n", "EXECUTE d('k-{i:030d}'); ")
write("i1", claim, "EXECUTE c('k-{i:030d}'); ")
write("i3", claim, "EXECUTE c('k-{i:030d}'); ")   # same keys again: the duplicate path
PY
echo "PostgreSQL $("$PG_CONFIG" --version | sed 's/^PostgreSQL //'), shared_preload_libraries: $([ $preload = 1 ] && echo idem || echo none)"
printf '%-4s %12s\n' variant "instr/txn"
for v in b0 b1 i1 i3; do
  single valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind.$v" \
    "$PG_BIN/postgres" --single -D "$DATA/pg" "${opts[@]}" postgres < "$OUT/$v.sql" > "$OUT/$v.log" 2>&1
  total=$(grep -oE "Collected : [0-9]+" "$OUT/$v.log" | awk '{print $3}')
  printf '%-4s %12d\n' "$v" $((total / N))
done
echo "profiles: $OUT/callgrind.* (callgrind_annotate --inclusive=yes ...)"
