#!/usr/bin/env bash
# Instructions per transaction of B0, B1, I1 and I3, counted by callgrind in a
# single-user backend (repeatable, unlike timings on a shared 2-core box).
#   bash bench/profile.sh [N]     N transactions per variant (default 3000)
# Needs valgrind (apt-get install valgrind). Writes bench/out/profile/.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
N="${1:-3000}"
PG_BIN=/usr/lib/postgresql/15/bin
command -v valgrind >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
OUT="$ROOT/bench/out/profile"
DATA=/tmp/idem-profile-data
rm -rf "$OUT" "$DATA"; mkdir -p "$OUT" "$DATA"; chown postgres "$DATA" "$OUT"
single() { (cd / && sudo -u postgres "$@"); }
single "$PG_BIN/initdb" -D "$DATA" --auth=trust -U postgres >/dev/null
single "$PG_BIN/postgres" --single -D "$DATA" postgres >/dev/null 2>&1 <<'SQL'
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
printf '%-4s %12s\n' variant "instr/txn"
for v in b0 b1 i1 i3; do
  single valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind.$v" \
    "$PG_BIN/postgres" --single -D "$DATA" postgres < "$OUT/$v.sql" > "$OUT/$v.log" 2>&1
  total=$(grep -oE "Collected : [0-9]+" "$OUT/$v.log" | awk '{print $3}')
  printf '%-4s %12d\n' "$v" $((total / N))
done
echo "profiles: $OUT/callgrind.* (callgrind_annotate --inclusive=yes ...)"
