#!/usr/bin/env bash
# ALTER EXTENSION idem UPDATE on a Citus cluster, from every shipped version
# with a frozen install script that Citus ran (tests/upgrade/idem--V.sql,
# 0.3.0 on), to the current one. Run by tests/scenarios/scaling.sh citus on its
# cluster (coordinator and two workers, started; the database $CITUS_DB
# holds a fresh install of the current version after docs/scaling.md's
# steps, for the schema comparison). For each version V:
#   1. a database with idem V, distributed next to orders (idem_distribute),
#      and used through the coordinator: payments claimed by a distributed
#      function (three business types of 30 days, 400 days and the default
#      TTL, so three TTL classes after the update), one failed, one claimed
#      and committed unfinished, one leased, a token issued; business rows,
#      claims per state counted;
#   2. docs/scaling.md's upgrade step, verbatim (the ```sql norun block after
#      <!-- citus-upgrade: update -->), on the coordinator;
#   3. the same counts; every payment paid again is answered from its old
#      claim (no second business row), new keys claim, the lease is finished
#      with its token, the token is consumed once; every node at the new
#      version on the citus path; idem.claims distributed as before, the
#      claim functions still delegated; idem's objects on every node equal
#      those of the fresh install in $CITUS_DB (tests/upgrade/schema.sql);
#   4. DROP EXTENSION idem leaves no schema idem on any node.
# Also: the update where Citus is installed but idem.claims was never
# distributed (every node updates its own tables).
# Prints "ok - ..." / "FAIL - ..." lines; exits with the number of failures.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
CLUSTER="$ROOT/tests/citus/cluster.sh"
FRESH_DB=${CITUS_DB:-idem_citus}
current=$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -1)
extdir="$("$PG_CONFIG" --sharedir)/extension"
work=$(mktemp -d /tmp/idem-citus-upgrade.XXXXXX)
trap 'rm -rf "$work"' EXIT
fails=0
check() { # description, then a command whose success is the check
  local what=$1; shift
  if "$@"; then echo "ok - $what"; else echo "FAIL - $what"; fails=$((fails + 1)); fi
}
eq() { # description, expected, actual
  if [ "$2" = "$3" ]; then echo "ok - $1"; else echo "FAIL - $1: expected '$2', got '$3'"; fails=$((fails + 1)); fi
}
P() { local db=$1 node=$2; shift 2; CITUS_DB=$db bash "$CLUSTER" psql "$node" "$@"; }

ROOT="$ROOT" python3 - "$ROOT/docs/scaling.md" > "$work/update.sql" <<'PY'
import os, sys
sys.path.insert(0, os.path.join(os.environ["ROOT"], "tests", "docs"))
from sql_blocks import parse
path = sys.argv[1]
lines = open(path, encoding="utf-8").read().split("\n")
blocks = {b.fence_line: b for b in parse(path)[0]}
found = [blocks.get(i + 2) for i, l in enumerate(lines) if l.strip() == "<!-- citus-upgrade: update -->"]
if len(found) != 1 or found[0] is None or found[0].mode != "norun":
    sys.exit(f"FAIL {path}: want one <!-- citus-upgrade: update --> marker followed by a ```sql norun block")
print("\\set ON_ERROR_STOP 1")
print("\n".join(found[0].body))
PY
[ -s "$work/update.sql" ] || { echo "FAIL - docs/scaling.md's upgrade step not found"; exit 1; }

schema() { # db node
  P "$1" "$2" -At -f "$ROOT/tests/upgrade/schema.sql"
}
for n in coord w1 w2; do schema "$FRESH_DB" "$n" > "$work/fresh-$n.txt"; done

for frozen in "$ROOT"/tests/upgrade/idem--*.sql; do
  old=$(basename "$frozen" .sql); old=${old#idem--}
  # Versions before 0.3.0 had no Citus path that held (docs/scaling.md).
  [ "$(printf '%s\n0.3.0\n' "$old" | sort -V | head -1)" = 0.3.0 ] || continue
  cmp -s "$frozen" "$extdir/idem--$old.sql" || install -m 644 "$frozen" "$extdir/idem--$old.sql"
  db=idem_up_${old//./_}
  say "ALTER EXTENSION idem UPDATE from $old on Citus, after idem_distribute (database $db)"
  for n in coord w1 w2; do P postgres "$n" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"; done
  CITUS_DB=$db bash "$CLUSTER" start
  P "$db" coord > /dev/null <<SQL
CREATE EXTENSION idem VERSION '$old';
CREATE TABLE orders (order_no text PRIMARY KEY);
SELECT create_distributed_table('orders', 'order_no');
CREATE TABLE payments (order_no text NOT NULL, biz_type text NOT NULL, payment_id bigserial, PRIMARY KEY (order_no, payment_id));
SELECT create_distributed_table('payments', 'order_no', colocate_with => 'orders');
SELECT idem_distribute('orders');
SELECT idem_configure('payment', '30 days');
SELECT idem_configure('deposit', '400 days');
SELECT idem_maintain();
CREATE FUNCTION pay(order_no text, biz_type text, OUT claimed boolean, OUT result jsonb)
LANGUAGE plpgsql AS \$\$
DECLARE
    c idem_claim_result;
    id bigint;
BEGIN
    c := idem_claim(order_no, biz_type);
    claimed := c.claimed;
    IF NOT c.claimed THEN
        result := c.result;
        RETURN;
    END IF;
    INSERT INTO payments (order_no, biz_type) VALUES (pay.order_no, pay.biz_type) RETURNING payment_id INTO id;
    result := jsonb_build_object('payment_id', id);
    PERFORM idem_complete(order_no, biz_type, result);
END \$\$;
SELECT create_distributed_function('pay(text,text)', distribution_arg_name := 'order_no',
                                   colocate_with := 'orders', force_delegation := true);
CREATE TABLE tok AS SELECT idem_issue_token('form') AS t;
SQL
  # One statement per call: Citus delegates a call only when it is the
  # whole statement.
  for t in payment deposit quick; do
    for i in $(seq 1 40); do echo "SELECT claimed, result FROM pay('$t-$i', '$t');"; done
  done > "$work/pay.sql"
  P "$db" coord -At -f "$work/pay.sql" > "$work/pay-1.out"
  eq "$old: 120 payments claimed before the update" 120 "$(grep -c '^t|{"payment_id": [0-9]*}$' "$work/pay-1.out")"
  P "$db" coord -At > /dev/null <<'SQL'
BEGIN;
SELECT claimed FROM idem_claim('refused', 'payment');
SELECT idem_fail('refused', 'payment', '{"reason": "card declined"}');
COMMIT;
SELECT claimed FROM idem_claim('open', 'payment');
SQL
  token=$(P "$db" coord -At -c "SELECT result->>'lease_token' FROM idem_claim('leased', 'payment', lease => '1 hour')")
  check "$old: a lease taken, its token returned" test -n "$token"
  counts() { # db: business rows, then claims per state
    P "$1" coord -At -c "SELECT (SELECT count(*) FROM payments) || ' ' ||
                                (SELECT string_agg(state::text || '=' || n, ',' ORDER BY state) FROM (SELECT state, count(*) n FROM idem.claims GROUP BY 1) s)"
  }
  before=$(counts "$db")
  results() { P "$db" coord -At -c "SELECT string_agg(key || ':' || biz_type || ':' || coalesce(result::text, '-'), ' ' ORDER BY key, biz_type) FROM idem.claims"; }
  results_before=$(results)
  echo "  before the update: business rows and claims per state: $before"

  P "$db" coord -f "$work/update.sql" > "$work/update-$old.out" 2>&1 ||
    { echo "FAIL - $old: docs/scaling.md's upgrade step failed:"; tail -15 "$work/update-$old.out"; fails=$((fails + 1)); continue; }
  echo "ok - $old: docs/scaling.md's upgrade step ran"
  eq "$old: every node at $current, on the citus path" "$current citus|$current citus|$current citus" \
    "$(P "$db" coord -At -c "SELECT string_agg(result, '|' ORDER BY nodeid) FROM run_command_on_all_nodes(
                             \$\$SELECT extversion || ' ' || idem_storage_path() FROM pg_extension WHERE extname = 'idem'\$\$)")"
  eq "$old: idem.claims hash-distributed by key in 32 shards, co-located with orders" "h key 32 t" \
    "$(P "$db" coord -At -c "SELECT format('%s %s %s %s', partmethod, column_to_column_name(logicalrelid, partkey),
                                    (SELECT count(*) FROM pg_dist_shard s WHERE s.logicalrelid = p.logicalrelid),
                                    colocationid = (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'orders'::regclass))
                        FROM pg_dist_partition p WHERE logicalrelid = 'idem.claims'::regclass")"
  eq "$old: business rows and claims per state kept" "$before" "$(counts "$db")"
  eq "$old: every claim's key, type and stored result kept" "$results_before" "$(results)"
  P "$db" coord -At -f "$work/pay.sql" > "$work/pay-2.out"
  eq "$old: 120 payments paid again after the update: each answered from its old claim, with its first payment's id" \
    "$(sed 's/^t|/f|/' "$work/pay-1.out")" "$(cat "$work/pay-2.out")"
  # Each in a form Citus delegates (docs/scaling.md, "Call forms").
  got() { P "$db" coord -At -c "$1"; }
  eq "$old: the failed claim answers failed with its result" 'f|failed|{"reason": "card declined"}' \
    "$(got "SELECT claimed, state, result FROM idem_claim('refused', 'payment')")"
  eq "$old: the claim committed unfinished answers completed" 'f|completed' \
    "$(got "SELECT claimed, state FROM idem_claim('open', 'payment')")"
  eq "$old: the lease is still held" 'f|in_progress' "$(got "SELECT claimed, state FROM idem_claim('leased', 'payment')")"
  got "SELECT idem_complete('leased', 'payment', '{\"by\": \"owner\"}', '$token')" > /dev/null
  eq "$old: the lease finished with its token" 'completed|{"by": "owner"}' \
    "$(got "SELECT state, result FROM idem_lookup('leased', 'payment')")"
  eq "$old: the token issued before the update is consumed once" 't f' \
    "$(got "SELECT idem_consume_token(t, 'form') FROM tok") $(got "SELECT idem_consume_token(t, 'form') FROM tok")"
  for i in $(seq 1 10); do echo "SELECT claimed FROM pay('new-$i', 'payment');"; done > "$work/new.sql"
  eq "$old: new keys claim after the update, one business row each" "10 $(( ${before%% *} + 10 ))" \
    "$(P "$db" coord -At -f "$work/new.sql" | grep -c '^t$') $(P "$db" coord -At -c 'SELECT count(*) FROM payments')"
  eq "$old: the registry distributed by key next to idem.claims, each of its 32 shards anchored" "h t 32" \
    "$(P "$db" coord -At -c "SELECT format('%s %s %s', partmethod,
                                    colocationid = (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'idem.claims'::regclass),
                                    (SELECT count(DISTINCT biz_type) FROM idem.type_classes WHERE ttl_class = -1))
                        FROM pg_dist_partition p WHERE logicalrelid = 'idem.type_classes'::regclass")"
  # Every (shard, type, class) of the claims registered on that shard, up
  # to its latest expiry at least (the claims were written before the
  # update: no claim registered them).
  eq "$old: the claims of three TTL classes kept, each registered on its own shard" "3 0" \
    "$(P "$db" coord -At -c "WITH c AS MATERIALIZED (
                               SELECT get_shard_id_for_distribution_column('idem.claims', min(key)) AS s, biz_type, ttl_class, max(expires_at) AS e
                                 FROM idem.claims GROUP BY width_bucket(worker_hash(key), (SELECT array_agg(shardminvalue::int ORDER BY shardminvalue::int) FROM pg_dist_shard WHERE logicalrelid = 'idem.claims'::regclass)), biz_type, ttl_class),
                                  r AS MATERIALIZED (
                               SELECT get_shard_id_for_distribution_column('idem.claims', key) AS s, biz_type, ttl_class, until FROM idem.type_classes WHERE ttl_class >= 0)
                             SELECT count(DISTINCT c.ttl_class) || ' ' || count(*) FILTER (WHERE NOT EXISTS (
                                      SELECT 1 FROM r WHERE r.s = c.s AND r.biz_type = c.biz_type AND r.ttl_class = c.ttl_class AND r.until >= c.e))
                               FROM c")"
  eq "$old: idem.claims, its default partition and the registry are no distributed objects of Citus's on any node (as after a fresh install: extension members)" "0|0|0" \
    "$(P "$db" coord -At -c "SELECT string_agg(result, '|' ORDER BY nodeid) FROM run_command_on_all_nodes(
          \$\$SELECT count(*) FROM pg_dist_object WHERE classid = 'pg_class'::regclass AND objid IN ('idem.claims'::regclass, 'idem.claims_default'::regclass, 'idem.type_classes'::regclass)\$\$)")"
  for n in coord w1 w2; do
    schema "$db" "$n" > "$work/up-$n.txt"
    if diff -u "$work/fresh-$n.txt" "$work/up-$n.txt" > "$work/diff-$n.txt"; then
      echo "ok - $old: idem's objects on $n equal a fresh $current install's"
    else
      echo "FAIL - $old: idem's objects on $n differ from a fresh $current install's:"; head -40 "$work/diff-$n.txt"; fails=$((fails + 1))
    fi
  done
  P "$db" coord -c "DROP EXTENSION idem CASCADE" > /dev/null 2>&1 || true
  eq "$old: after the update, DROP EXTENSION idem leaves no schema idem on any node" "0|0|0" \
    "$(P "$db" coord -At -c "SELECT string_agg(result, '|' ORDER BY nodeid) FROM run_command_on_all_nodes(
          \$\$SELECT count(*) FROM pg_namespace WHERE nspname = 'idem'\$\$)")"
  for n in coord w1 w2; do P postgres "$n" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"; done

  # Citus installed, idem never distributed: each node updates its own.
  db=idem_up_local_${old//./_}
  say "ALTER EXTENSION idem UPDATE from $old on Citus, idem.claims not distributed (database $db)"
  for n in coord w1 w2; do P postgres "$n" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"; done
  CITUS_DB=$db bash "$CLUSTER" start
  P "$db" coord -At > /dev/null <<SQL
CREATE EXTENSION idem VERSION '$old';
SELECT idem_configure('payment', '30 days');
BEGIN; SELECT idem_claim('done', 'payment'); SELECT idem_complete('done', 'payment', '{"n": 1}'); COMMIT;
SQL
  if P "$db" coord -c "ALTER EXTENSION idem UPDATE" > "$work/local.out" 2>&1; then
    eq "$old, not distributed: every node at $current; the claim replays on the coordinator" \
      "$current|$current|$current false/completed/{\"n\": 1}" \
      "$(P "$db" coord -At -c "SELECT string_agg(result, '|' ORDER BY nodeid) FROM run_command_on_all_nodes(\$\$SELECT extversion FROM pg_extension WHERE extname = 'idem'\$\$)") $(P "$db" coord -At -c "SELECT claimed || '/' || state || '/' || result FROM idem_claim('done', 'payment')")"
  else
    echo "FAIL - $old, not distributed: ALTER EXTENSION idem UPDATE failed:"; tail -5 "$work/local.out"; fails=$((fails + 1))
  fi
  for n in coord w1 w2; do P postgres "$n" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"; done
done
echo "Citus upgrade checks: $fails failed"
exit "$fails"
