#!/usr/bin/env bash
# Instructions per transaction of B0, B1, B1r, I1, I1c, I2 and I3, counted by
# callgrind in a single-user backend (repeatable, unlike timings on a shared
# 2-core box).
#   bash bench/profile.sh [N]     N transactions per variant (default 3000)
#   bash bench/profile.sh --preload [N]   the same with shared_preload_libraries
#                                 = 'idem' (the claim path then also counts
#                                 idem_metrics); writes bench/out/profile-preload
#   bash bench/profile.sh --fresh [N]   on empty tables (the claim's class
#                                 then has one non-empty partition)
#   PG_CONFIG=/path/to/pg_config bash bench/profile.sh    another PostgreSQL
#                                 (default Debian's 15, as scripts/lib.sh)
#   PROFILE_FILL=200000           the steady state's size (below)
#
# Steady state (the default): before the runs, the 'bench' type (1 day)
# holds PROFILE_FILL completed claims aged evenly over its TTL, written as
# a database that has claimed for a whole day holds them (bench/sections/
# ttl.py's AGE_SQL), so every partition of its class that a claim probes is
# full; dedup and dedup_r hold as many rows, so that the hand-written
# variants probe an index of the same size.
# Needs valgrind (installed with apt-get if missing) and idem installed into
# that PostgreSQL. Writes bench/out/profile/ (profile-NN for another major).
#
# Each variant runs twice in its own single-user session: N transactions and
# N/10. "instr/txn" is the difference divided by the difference in
# transactions, so the backend's start, the loading of idem.so and the first
# call's catalog lookups are not in it; "total/N" (the session's whole count
# divided by N, as this script reported before) is printed next to it.
#
# The transactions (prepared statements, synchronous_commit off), as in
# bench/sql/ but with 32-character keys made by the driver:
#   b0   BEGIN; business insert; COMMIT
#   b1   + INSERT INTO dedup ... ON CONFLICT DO NOTHING
#   b1r  + the same into dedup_r, then UPDATE dedup_r SET result = ...
#   i1   + SELECT idem_claim($1, 'bench')                 (plain form)
#   i1c  + SELECT claimed FROM idem_claim($1, 'bench')    (recommended form)
#   i2   i1c, then SELECT idem_complete($1, 'bench', '{"ok": true}')
#   i3   SELECT idem_claim($1, 'bench') on i1's keys (duplicates), business insert
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
preload=0
steady=1
while [ $# -gt 0 ]; do
  case "$1" in
    --preload) preload=1; shift ;;
    --fresh) steady=0; shift ;;
    *) break ;;
  esac
done
FILL="${PROFILE_FILL:-200000}"
[[ "$FILL" =~ ^[0-9]+$ ]] || { echo "PROFILE_FILL must be a number" >&2; exit 1; }
opts=()
[ $preload = 1 ] && opts=(-c shared_preload_libraries=idem)
N="${1:-3000}"
N0=$((N / 10))
[ "$N0" -ge 1 ] || { echo "N must be at least 10" >&2; exit 1; }
[ -f "$("$PG_CONFIG" --sharedir)/extension/idem.control" ] ||
  { echo "idem is not installed into $PG_CONFIG's PostgreSQL" >&2; exit 1; }
command -v valgrind >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
OUT="$ROOT/bench/out/profile$PG_SUFFIX$([ $preload = 1 ] && echo -preload || true)$([ $steady = 0 ] && echo -fresh || true)"
# per checkout, so that two worktrees profiling at once do not share it
DATA="/tmp/idem-profile-data$PG_SUFFIX$([ $preload = 1 ] && echo -preload || true)$([ $steady = 0 ] && echo -fresh || true)-$(echo "$ROOT" | md5sum | cut -c1-8)"
rm -rf "$OUT" "$DATA"; mkdir -p "$OUT" "$DATA"; chown postgres "$DATA" "$OUT"
as_postgres "$PG_BIN/initdb" -D "$DATA" --auth=trust -U postgres >/dev/null
as_postgres "$PG_BIN/postgres" --single -D "$DATA" "${opts[@]}" postgres >/dev/null 2>&1 <<'SQL'
CREATE EXTENSION idem;
SELECT idem_maintain();
CREATE TABLE orders (id bigserial primary key, key text, amount int, created_at timestamptz default now());
CREATE TABLE dedup (key text primary key, created_at timestamptz default now());
CREATE TABLE dedup_r (key text primary key, created_at timestamptz default now(), result jsonb);
SQL
if [ $steady = 1 ]; then
  BENCH_DIR="$ROOT/bench" python3 - "$FILL" > "$OUT/steady.sql" <<'PY'
import os, sys
sys.path.insert(0, os.environ["BENCH_DIR"])
from sections.ttl import AGE_SQL   # aged claims, one line
fill = int(sys.argv[1])
print("SELECT idem_configure('bench', '1 day');")
print("SET idem.premake_limit = 10000;")
print("SELECT idem_maintain();")
print(AGE_SQL)
print(f"SELECT bench_age_claims('bench', {fill});")
print("SELECT idem_maintain();")   # moves what landed in the default partition
print("DROP FUNCTION bench_age_claims(text, int);")
for t in ("dedup", "dedup_r"):
    print(f"INSERT INTO {t} (key) SELECT md5('s' || g::text) FROM generate_series(1, {fill}) g;")
print("VACUUM ANALYZE;")
print("SELECT 'steady: ' || count(*) || ' partitions of the class, ' || "
      "count(*) FILTER (WHERE pg_relation_size(relid) > 0) || ' non-empty' "
      "FROM pg_partition_tree('idem.claims') WHERE isleaf;")
PY
  chown postgres "$OUT/steady.sql"
  as_postgres "$PG_BIN/postgres" --single -D "$DATA" "${opts[@]}" postgres < "$OUT/steady.sql" > "$OUT/steady.log" 2>&1
  grep -q ERROR "$OUT/steady.log" && { echo "the steady-state fill failed: see $OUT/steady.log" >&2; exit 1; }
fi
python3 - "$N" "$N0" "$OUT" <<'PY'
import sys
n, n0, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
hdr = "SET synchronous_commit = off;\nPREPARE ins(int) AS INSERT INTO orders (key, amount) VALUES ('x', $1);\n"
plain = "PREPARE c(text) AS SELECT idem_claim($1, 'bench');\n"
col = "PREPARE c(text) AS SELECT claimed FROM idem_claim($1, 'bench');\n"
def key(prefix, i):
    return prefix + "-" + str(i).zfill(31 - len(prefix))      # 32 characters
def write(name, prep, before, prefix, after=""):
    # the long run and the short one use different keys (new keys stay new),
    # except i3, whose keys are i1's on purpose
    for suffix, count, pre in (("", n, prefix), ("-short", n0, prefix if name == "i3" else prefix + "s")):
        with open(f"{out}/{name}{suffix}.sql", "w") as f:
            f.write(hdr + prep)
            for i in range(count):
                k = key(pre, i)
                f.write(f"BEGIN; {before.format(k=k)}EXECUTE ins(1); {after.format(k=k)}COMMIT;\n")
write("b0", "", "", "b0")
write("b1", "PREPARE d(text) AS INSERT INTO dedup (key) VALUES ($1) ON CONFLICT DO NOTHING;\n",
      "EXECUTE d('{k}'); ", "b1")
write("b1r", "PREPARE d(text) AS INSERT INTO dedup_r (key) VALUES ($1) ON CONFLICT DO NOTHING;\n"
             "PREPARE u(text) AS UPDATE dedup_r SET result = '{\"ok\": true}' WHERE key = $1;\n",
      "EXECUTE d('{k}'); ", "b1r", after="EXECUTE u('{k}'); ")
write("i1", plain, "EXECUTE c('{k}'); ", "i1")
write("i1c", col, "EXECUTE c('{k}'); ", "i1c")
write("i2", col + "PREPARE f(text) AS SELECT idem_complete($1, 'bench', '{\"ok\": true}');\n",
      "EXECUTE c('{k}'); ", "i2", after="EXECUTE f('{k}'); ")
write("i3", plain, "EXECUTE c('{k}'); ", "i1")
PY
chown postgres "$OUT"/*.sql
count() {   # instructions of one single-user session running $1.sql
  as_postgres valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind.$1" \
    "$PG_BIN/postgres" --single -D "$DATA" "${opts[@]}" postgres < "$OUT/$1.sql" > "$OUT/$1.log" 2>&1
  grep -q "ERROR" "$OUT/$1.log" && { echo "$1: an SQL error, see $OUT/$1.log" >&2; exit 1; }
  grep -oE "Collected : [0-9]+" "$OUT/$1.log" | awk '{print $3}'
}
echo "PostgreSQL $PG_MAJOR ($PG_BIN), $N and $N0 transactions per variant, shared_preload_libraries: $([ $preload = 1 ] && echo idem || echo none)"
if [ $steady = 1 ]; then
  echo "steady state: $FILL aged claims of the 1-day type, as many rows in dedup and dedup_r;$(grep -o 'steady: [^"]*' "$OUT/steady.log" | sed 's/^steady://')"
else
  echo "fresh tables (--fresh)"
fi
printf '%-5s %12s %12s\n' variant "instr/txn" "total/N"
for v in b0 b1 b1r i1 i1c i2 i3; do
  long=$(count "$v")
  short=$(count "$v-short")
  printf '%-5s %12d %12d\n' "$v" $(((long - short) / (N - N0))) $((long / N))
done
echo "profiles: $OUT/callgrind.* (callgrind_annotate --inclusive=yes ...)"
rm -rf "$DATA"
