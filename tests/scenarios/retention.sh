#!/usr/bin/env bash
# Long retention at the price of short: business types at 1 hour, 1 day,
# 30 days and 400 days live in one database, each with claims spread over
# 90% of its TTL (as a database that has been claiming for that long holds
# them; the last tenth kept so that none expires before it is checked), on
# a throw-away cluster with PostgreSQL's default max_locks_per_transaction
# (64) and 120 connections.
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
source "$ROOT/tests/lib/assert.sh"
dir="$(cluster_dir)/retention"
port=$(major_port 5516)
pgsh="$ROOT/tests/lib/cluster.sh"
trap 'bash "$pgsh" destroy "$dir"' EXIT

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
-- 20,000 claims per type, claimed at times spread over 90% of its TTL:
-- the oldest still has a tenth of its TTL to live (6 minutes for 1 hour),
-- so that none expires before the checks below, however slowly the
-- machine gets to them (spread over the whole TTL, the oldest probed claim
-- of t1h expired 3 s after this, and a loaded run missed it).
INSERT INTO idem.claims (expires_at, claimed_at, ttl_class, state, biz_type, key, result)
SELECT c.at + t.ttl, c.at, idem.ttl_class(t.ttl), 'c', t.biz_type, 'old-' || g, jsonb_build_object('n', g)
  FROM idem.biz_types t, generate_series(1, 20000) g,
       LATERAL (SELECT now() - t.ttl * 0.9 * (g / 20001.0) AS at) c;
INSERT INTO idem.type_classes (biz_type, ttl_class, until)
SELECT biz_type, ttl_class, max(expires_at) FROM idem.claims GROUP BY 1, 2;
SELECT idem_maintain() IS NOT NULL;
SQL
expect "no claim left in the default partition" "$(q -At -c "SELECT count(*) FROM idem.claims_default")" 0
expect "one TTL class per type" "$(q -At -c "SELECT count(DISTINCT ttl_class) FROM idem.claims")" 4

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
  expect "a claim of $t locks at most 21 relations" "$([ "$n" -le 21 ] && echo true || echo false)" true
done
spread=$(printf '%s\n' "${locks[@]}" | sort -n | sed -n '1p;$p' | paste -sd' ' | awk '{print $2 - $1}')
expect "lock counts of 1 hour and 400 days differ by at most 4" "$([ "$spread" -le 4 ] && echo true || echo false)" true

# Duplicates of claims anywhere in each type's span are found.
for t in t1h t1d t30d t400d; do
  found=$(q -At -c "SELECT count(*) FILTER (WHERE NOT r.claimed AND r.state = 'completed' AND r.result = jsonb_build_object('n', g))
                      FROM generate_series(1, 20000, 97) g, LATERAL idem_claim('old-' || g, '$t') r")
  expect "duplicates of $t found across 90% of its TTL" "$found" 207
done

q -At -c "SELECT check_name || '=' || severity FROM idem_health WHERE check_name IN ('claim_locks', 'partition_horizon', 'default_partition') ORDER BY 1" > "$dir/health.txt"
expect "idem_health" "$(paste -sd' ' "$dir/health.txt")" "claim_locks=ok default_partition=ok partition_horizon=ok"

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
expect "claims across a change of idem.partition_width" "$(paste -sd' ' "$dir/width.txt")" "t f t t f f 2"

# A type's TTL changed while its claims are live: the old claims (in the old
# TTL's class) answer duplicates, new ones go to the new class. (The
# isolation spec claim_partition_race has two classes of one key in flight.)
q -At > "$dir/ttl.txt" <<'SQL'
SELECT claimed FROM idem_claim('c-1', 'tchange');
SELECT idem_configure('tchange', '30 days');
SELECT claimed FROM idem_claim('c-1', 'tchange');
SELECT claimed FROM idem_claim('c-2', 'tchange');
SELECT idem_configure('tchange', '5 minutes');
SELECT claimed FROM idem_claim('c-2', 'tchange');
SELECT claimed FROM idem_claim('c-1', 'tchange');
SELECT count(DISTINCT ttl_class) FROM idem.type_classes WHERE biz_type = 'tchange';
SQL
expect "claims across changes of the type's TTL (1 day, 30 days, 5 minutes)" "$(grep -v '^$' "$dir/ttl.txt" | paste -sd' ')" "t f t f f 2"

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
expect "100 sessions holding 400-day claims: no error, 100 claimed, 100 old duplicates found" "$(echo "$out1" | head -1)" "errors=0 new=100 dup=100"
out2=$("$IDEM_PY" "$dir/sessions.py" "$dsn" 2)
echo "   second wave: $out2"
expect "the same keys again: no error, none claimed" "$(echo "$out2" | head -1)" "errors=0 new=0 dup=100"
expect "one business row per key" "$(q -At -c "SELECT count(*), count(DISTINCT key) FROM business" | tr '|' ' ')" "100 100"

finish "retention"
