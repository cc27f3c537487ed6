#!/usr/bin/env bash
# Long retention at the price of short: business types at 1 hour, 1 day,
# 30 days and 400 days live in one database, each with claims spread over
# its whole TTL (as a database that has been claiming for that long holds
# them), on a throw-away cluster with PostgreSQL's default
# max_locks_per_transaction (64) and 120 connections.
#
# Checks, per type:
#   * a claim locks a bounded number of relations, the same for 1 hour as
#     for 400 days (0.3.0: 133 at 30 days, up to 1,216 at 400 days): at
#     most 21 lock entries (idem.claims, the default partition and its
#     index, idem.type_classes and its index, two per partition of the class
#     that can hold the key: at most 8);
#   * duplicates of claims anywhere in the TTL's span are found (claimed =
#     false, the stored result), new keys are claimed;
# a change of idem.partition_width loses no claim; and then 100 sessions
# that each hold an open claim of the 400-day type
# and, in the same transaction, claim a 30-day key and repeat an old
# 400-day one: no error (0.3.0: 53200 "out of shared memory" once 19-38
# sessions held a claim), one business row per key; a second wave of the
# same keys writes no business row.
#
# The aged claims are written into idem.claims as claims of that age would
# have left them (claimed_at, expires_at, ttl_class, the type registered in
# its class), then idem_maintain() moves them into their class's partitions.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
dir="$(cluster_dir)/retention"
port=5516
pgsh="$ROOT/tests/stress/pg.sh"
trap 'bash "$pgsh" destroy "$dir"' EXIT
fails=0
check() { # what expected actual
  if [ "$2" = "$3" ]; then echo "ok: $1 ($3)"; else echo "FAIL: $1: expected '$2', got '$3'"; fails=$((fails + 1)); fi
}

bash "$pgsh" destroy "$dir" 2>/dev/null || true
bash "$pgsh" init "$dir" $port
cat >> "$dir/data/postgresql.conf" <<CONF
max_connections = 120
max_locks_per_transaction = 64
CONF
bash "$pgsh" start "$dir"
q() { as_postgres psql -X -q -v ON_ERROR_STOP=1 -h "$dir" -p $port -d retention "$@"; }
as_postgres psql -X -q -h "$dir" -p $port -d postgres -c "CREATE DATABASE retention"

q <<'SQL'
CREATE EXTENSION idem;
CREATE TABLE business (key text PRIMARY KEY, by_session int NOT NULL);
SELECT idem_configure('t1h', '1 hour'), idem_configure('t1d', '1 day'),
       idem_configure('t30d', '30 days'), idem_configure('t400d', '400 days');
-- 20,000 claims per type, claimed at times spread over its TTL.
INSERT INTO idem.claims (expires_at, claimed_at, ttl_class, state, biz_type, key, result)
SELECT c.at + t.ttl, c.at, idem.ttl_class(t.ttl), 'c', t.biz_type, 'old-' || g, jsonb_build_object('n', g)
  FROM idem.biz_types t, generate_series(1, 20000) g,
       LATERAL (SELECT now() - t.ttl * (g / 20001.0) AS at) c;
INSERT INTO idem.type_classes (biz_type, ttl_class, until)
SELECT biz_type, ttl_class, max(expires_at) FROM idem.claims GROUP BY 1, 2;
SELECT idem_maintain() IS NOT NULL;
SQL
check "no claim left in the default partition" 0 "$(q -At -c "SELECT count(*) FROM idem.claims_default")"
check "one TTL class per type" 4 "$(q -At -c "SELECT count(DISTINCT ttl_class) FROM idem.claims")"

# Relations one claim locks, per type: bounded, and the same whatever the TTL.
locks=()
for t in t1h t1d t30d t400d; do
  # (A first claim in the session fills its caches, which reads more.)
  n=$(q -At <<SQL | tail -1
BEGIN;
SELECT 1 FROM idem_claim('lock-probe', '$t');
ROLLBACK;
BEGIN;
SELECT 1 FROM idem_claim('lock-probe', '$t');
SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'relation' AND relation <> 'pg_locks'::regclass;
ROLLBACK;
SQL
)
  echo "   a claim of $t locks $n relations"
  locks+=("$n")
  check "a claim of $t locks at most 21 relations" true "$([ "$n" -le 21 ] && echo true || echo false)"
done
spread=$(printf '%s\n' "${locks[@]}" | sort -n | sed -n '1p;$p' | paste -sd' ' | awk '{print $2 - $1}')
check "lock counts of 1 hour and 400 days differ by at most 4" true "$([ "$spread" -le 4 ] && echo true || echo false)"

# Duplicates of claims anywhere in each type's span are found.
for t in t1h t1d t30d t400d; do
  found=$(q -At -c "SELECT count(*) FILTER (WHERE NOT r.claimed AND r.state = 'completed' AND r.result = jsonb_build_object('n', g))
                      FROM generate_series(1, 20000, 97) g, LATERAL idem_claim('old-' || g, '$t') r")
  check "duplicates of $t found across its whole TTL" 207 "$found"
done

q -At -c "SELECT check_name || '=' || severity FROM idem_health WHERE check_name IN ('claim_locks', 'partition_horizon', 'default_partition') ORDER BY 1" > "$dir/health.txt"
check "idem_health" "claim_locks=ok default_partition=ok partition_horizon=ok" "$(paste -sd' ' "$dir/health.txt")"

# A change of idem.partition_width moves coming claims to other classes and
# loses none: claims made at one width are found at another, before and
# after maintenance makes the new widths' partitions.
q -At > "$dir/width.txt" <<'SQL'
SELECT claimed FROM idem_claim('w-1', 't1h');
SET idem.partition_width = '10 minutes';
SELECT claimed FROM idem_claim('w-1', 't1h');
SELECT claimed FROM idem_claim('w-2', 't1h');
SELECT idem_maintain() IS NOT NULL;
SELECT claimed FROM idem_claim('w-1', 't1h');
RESET idem.partition_width;
SELECT claimed FROM idem_claim('w-2', 't1h');
SELECT count(DISTINCT ttl_class) FROM idem.claims WHERE biz_type = 't1h' AND key LIKE 'w-%';
SQL
check "claims across a change of idem.partition_width" "t f t t f f 2" "$(paste -sd' ' "$dir/width.txt")"

# 100 sessions, each holding an open 400-day claim, then claiming more.
cat > "$dir/sessions.py" <<'PY'
import sys, threading, psycopg
dsn, wave = sys.argv[1], sys.argv[2]
n = 100
conns = [psycopg.connect(dsn, autocommit=False) for _ in range(n)]
errors, new = [], []
def step(i, sql, args=()):
    try:
        return conns[i].execute(sql, args).fetchone()
    except Exception as e:
        errors.append(f"{i}: {getattr(e, 'sqlstate', '')} {e}")
        return None
# Phase 1: every session claims its 400-day key and writes its business row;
# all 100 transactions stay open (the locks are held together).
for i in range(n):
    r = step(i, "SELECT claimed FROM idem_claim(%s, 't400d')", (f"s-{i}",))
    if r and r[0]:
        new.append(i)
        step(i, "INSERT INTO business VALUES (%s, %s) RETURNING 1", (f"s-{i}", i))
# Phase 2, with every transaction still open: a 30-day claim and a
# duplicate of an old 400-day claim in each.
dup = 0
for i in range(n):
    step(i, "SELECT claimed FROM idem_claim(%s, 't30d')", (f"m-{wave}-{i}",))
    r = step(i, "SELECT claimed, state FROM idem_claim(%s, 't400d')", (f"old-{1 + i * 199}",))
    if r and not r[0] and r[1] == "completed":
        dup += 1
for c in conns:
    try:
        c.commit()
    except Exception as e:
        errors.append(str(e))
    c.close()
print(f"errors={len(errors)} new={len(new)} dup={dup}")
for e in errors[:5]:
    print("  ", e)
PY
dsn="host=127.0.0.1 port=$port dbname=retention user=postgres"
out1=$("$IDEM_PY" "$dir/sessions.py" "$dsn" 1)
echo "   first wave: $out1"
check "100 sessions holding 400-day claims: no error, 100 claimed, 100 old duplicates found" "errors=0 new=100 dup=100" "$(echo "$out1" | head -1)"
out2=$("$IDEM_PY" "$dir/sessions.py" "$dsn" 2)
echo "   second wave: $out2"
check "the same keys again: no error, none claimed" "errors=0 new=0 dup=100" "$(echo "$out2" | head -1)"
check "one business row per key" "100 100" "$(q -At -c "SELECT count(*), count(DISTINCT key) FROM business" | tr '|' ' ')"

echo "retention checks failed: $fails"
[ "$fails" = 0 ]
