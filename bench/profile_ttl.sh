#!/usr/bin/env bash
# Instructions per claim per business-type TTL, counted by callgrind in a
# single-user backend, as bench/profile.sh counts its variants (the ttl
# section of bench/run.sh calls this; it can run alone too).
#   bash bench/profile_ttl.sh [N] [SPREAD]
#       N transactions per variant (default 300), SPREAD claims per type
#       spread over its TTL (default 2000)
#
# Two databases in one single-user cluster: ttl_mixed with business types of
# 1 hour, 1 day, 30 days and 400 days, ttl_base with the 1-day type only;
# each type holds SPREAD claims aged evenly over its TTL (every partition of
# its range non-empty) and N claims made now (the duplicates' keys), as the
# ttl section's databases (sections/ttl.py, AGE_SQL).
# Variants: <type>-new (idem_claim + idem_complete on a new key, one
# transaction) and <type>-dup (idem_claim on a live key), for each type of
# ttl_mixed and for base (ttl_base's t1d). Each runs N and N/10 transactions
# in two sessions; instructions per transaction are the difference over the
# difference (the backend's start and the partition cache's first fill are
# not in it). Prints "variant instr/txn" lines; writes bench/out/profile-ttl/.
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
N="${1:-300}"
SPREAD="${2:-2000}"
N0=$((N / 10))
[ "$N0" -ge 1 ] || { echo "N must be at least 10" >&2; exit 1; }
[ -f "$("$PG_CONFIG" --sharedir)/extension/idem.control" ] ||
  { echo "idem is not installed into $PG_CONFIG's PostgreSQL" >&2; exit 1; }
command -v valgrind >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
OUT="$ROOT/bench/out/profile-ttl$PG_SUFFIX"
DATA="/tmp/idem-profile-ttl-data$PG_SUFFIX-$(echo "$ROOT" | md5sum | cut -c1-8)"
rm -rf "$OUT" "$DATA"; mkdir -p "$OUT" "$DATA"; chown postgres "$DATA" "$OUT"
as_postgres "$PG_BIN/initdb" -D "$DATA" --auth=trust -U postgres >/dev/null
single() {   # single-user session in database $1, statements on stdin
  as_postgres "$PG_BIN/postgres" --single -D "$DATA" "$1"
}
printf 'CREATE DATABASE ttl_mixed;\nCREATE DATABASE ttl_base;\n' | single postgres >/dev/null 2>&1
BENCH_DIR="$ROOT/bench" python3 - "$N" "$SPREAD" "$N0" "$OUT" <<'PY'
import hashlib, os, sys
sys.path.insert(0, os.environ["BENCH_DIR"])
from sections.ttl import AGE_SQL   # the ttl section's aged claims, one line
n, spread, n0, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
types = [("t1h", "1 hour", 3600), ("t1d", "1 day", 86400), ("t30d", "30 days", 30 * 86400),
         ("t400d", "400 days", 400 * 86400)]
for db, ts in (("ttl_mixed", types), ("ttl_base", [types[1]])):
    with open(f"{out}/setup-{db}.sql", "w") as f:
        f.write("CREATE EXTENSION idem;\n")
        for t, ttl, _ in ts:
            f.write(f"SELECT idem_configure('{t}', '{ttl}');\n")
        f.write("SET idem.premake_limit = 10000;\nSELECT idem_maintain();\n" + AGE_SQL + "\n")
        for t, _, _ in ts:
            f.write(f"SELECT bench_age_claims('{t}', {spread});\n")
        f.write("SELECT idem_maintain();\n")
        for t, _, _ in ts:
            f.write(f"SELECT count(*) FROM generate_series(1, {n}) g, LATERAL idem_claim(md5('p' || g::text), '{t}') c;\n")
        f.write("VACUUM ANALYZE;\n")
hdr = ("SET synchronous_commit = off;\n"
       "PREPARE c(text, text) AS SELECT claimed FROM idem_claim($1, $2);\n"
       "PREPARE f(text, text) AS SELECT idem_complete($1, $2, '{\"ok\": true}');\n")
for label, t in [(t, t) for t, _, _ in types] + [("base", "t1d")]:
    for suffix, count in (("", n), ("-short", n0)):
        with open(f"{out}/{label}-new{suffix}.sql", "w") as f:
            f.write(hdr)
            for i in range(count):
                k = f"new{suffix}-{i}".ljust(32, "x")
                f.write(f"BEGIN; EXECUTE c('{k}', '{t}'); EXECUTE f('{k}', '{t}'); COMMIT;\n")
        with open(f"{out}/{label}-dup{suffix}.sql", "w") as f:
            f.write(hdr)
            for i in range(count):
                k = hashlib.md5(f"p{i % n + 1}".encode()).hexdigest()
                f.write(f"BEGIN; EXECUTE c('{k}', '{t}'); COMMIT;\n")
PY
chown postgres "$OUT"/*.sql
for db in ttl_mixed ttl_base; do
  single "$db" < "$OUT/setup-$db.sql" > "$OUT/setup-$db.log" 2>&1
  grep -q ERROR "$OUT/setup-$db.log" && { echo "setup of $db failed: see $OUT/setup-$db.log" >&2; exit 1; }
done
count() {   # instructions of one single-user session running $2.sql in database $1
  as_postgres valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind.$2" \
    "$PG_BIN/postgres" --single -D "$DATA" "$1" < "$OUT/$2.sql" > "$OUT/$2.log" 2>&1
  grep -q "ERROR" "$OUT/$2.log" && { echo "$2: an SQL error, see $OUT/$2.log" >&2; exit 1; }
  grep -oE "Collected : [0-9]+" "$OUT/$2.log" | awk '{print $3}'
}
echo "PostgreSQL $PG_MAJOR ($PG_BIN), $N and $N0 transactions per variant, $SPREAD spread claims per type"
printf '%-10s %12s\n' variant "instr/txn"
for kind in new dup; do
  for label in t1h t1d t30d t400d base; do
    db=ttl_mixed; [ "$label" = base ] && db=ttl_base
    # (the new-key variants add N + N/10 claims to their type: a few
    # hundred rows next to the prefill, the same on every run)
    long=$(count "$db" "$label-$kind")
    short=$(count "$db" "$label-$kind-short")
    printf '%-10s %12d\n' "$label-$kind" $(((long - short) / (N - N0)))
  done
done
rm -rf "$DATA"
