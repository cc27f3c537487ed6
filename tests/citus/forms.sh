#!/usr/bin/env bash
# Which call forms does Citus delegate to the worker owning the key?
# Runs each form through the coordinator of tests/citus/cluster.sh twice:
#  - with idem_claim itself (a fresh key): "delegated" if Citus sent one
#    SELECT public.idem_claim(...) to a worker (citus.log_remote_commands);
#  - with whereami(key, biz_type), a function registered like idem_claim
#    (create_distributed_function, key, colocated with idem.claims,
#    force_delegation) that reports where it ran and what the candidate check
#    "does this node hold the placement of the key's shard" says there.
# Needs idem distributed (idem_distribute('orders')).
#   bash tests/citus/forms.sh [coord|w1|w2] [remote|local]
# runs the forms on that node (default coord) with keys whose shard is on
# another node (remote, default) or on that node (local; workers only).
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
here="$(dirname "${BASH_SOURCE[0]}")"
C() { bash "$here/cluster.sh" psql coord "$@"; }

C >/dev/null <<'SQL'
CREATE OR REPLACE FUNCTION idem_key_is_local(key text) RETURNS boolean
    LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_placement p
                  WHERE p.shardid = pg_catalog.get_shard_id_for_distribution_column('idem.claims', key)
                    AND p.groupid = (SELECT groupid FROM pg_catalog.pg_dist_local_group))
$$;
DO $$ BEGIN
  IF to_regtype('whereami_t') IS NULL THEN
    CREATE TYPE whereami_t AS (claimed boolean, state text);
  END IF;
END $$;
CREATE OR REPLACE FUNCTION whereami(key text, biz_type text) RETURNS whereami_t LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  RAISE NOTICE 'whereami port=% local_shard=% app=%', current_setting('port'), idem_key_is_local(key),
    split_part(current_setting('application_name'), ' ', 1);
  RETURN ROW(true, 'new')::whereami_t;
END $$;
SELECT create_distributed_function('whereami(text,text)', 'key', colocate_with => 'idem.claims', force_delegation => true)
 WHERE NOT EXISTS (SELECT 1 FROM pg_dist_object WHERE objid = 'whereami(text,text)'::regprocedure AND distribution_argument_index IS NOT NULL);
SELECT create_distributed_function('idem_key_is_local(text)')
 WHERE NOT EXISTS (SELECT 1 FROM pg_dist_object WHERE objid = 'idem_key_is_local(text)'::regprocedure);
-- PL/pgSQL callers on the coordinator (not distributed), for both functions
DO $do$ DECLARE f text; BEGIN
  FOREACH f IN ARRAY ARRAY['idem_claim', 'whereami'] LOOP
    EXECUTE format($f$CREATE OR REPLACE FUNCTION caller_assign_%1$s(k text) RETURNS boolean LANGUAGE plpgsql AS $b$
      DECLARE c record; BEGIN c := %1$s(k, 't'); RETURN c.claimed; END $b$$f$, f);
    EXECUTE format($f$CREATE OR REPLACE FUNCTION caller_select_into_%1$s(k text) RETURNS boolean LANGUAGE plpgsql AS $b$
      DECLARE c record; BEGIN SELECT * INTO c FROM %1$s(k, 't'); RETURN c.claimed; END $b$$f$, f);
    EXECUTE format($f$CREATE OR REPLACE FUNCTION caller_perform_%1$s(k text) RETURNS void LANGUAGE plpgsql AS $b$
      BEGIN PERFORM %1$s(k, 't'); END $b$$f$, f);
    EXECUTE format($f$CREATE OR REPLACE FUNCTION caller_execute_%1$s(k text) RETURNS boolean LANGUAGE plpgsql AS $b$
      DECLARE c boolean; BEGIN EXECUTE 'SELECT claimed FROM %1$s($1, ''t'')' INTO c USING k; RETURN c; END $b$$f$, f);
  END LOOP;
END $do$;
SQL

# name|SQL with FN (function), K (the key), KO (a key on the other worker)
FORMS=(
"select fn()|SELECT FN('K','t');"
"select * from fn()|SELECT * FROM FN('K','t');"
"select claimed from fn()|SELECT claimed FROM FN('K','t');"
"select (fn()).claimed|SELECT (FN('K','t')).claimed;"
"select (fn()).*|SELECT (FN('K','t')).*;"
"from fn() where claimed|SELECT claimed FROM FN('K','t') WHERE claimed;"
"select fn(), 1|SELECT FN('K','t'), 1;"
"cte|WITH c AS (SELECT * FROM FN('K','t')) SELECT claimed FROM c;"
# (not here: SELECT c.claimed FROM (VALUES ('K')) v(k), LATERAL FN(v.k, 't') c;
#  crashes the coordinator backend, SIGSEGV in Citus 13.2.2's TryToDelegateFunctionCall
#  -> SetTaskQueryIfShouldLazyDeparse -> AcquireRewriteLocks, for any force-delegated function)
"lateral join on orders row|INSERT INTO orders (order_no, amount) VALUES ('K', 1); SELECT c.claimed FROM orders o, LATERAL FN(o.order_no, 't') c WHERE o.order_no = 'K';"
"router query on orders|INSERT INTO orders (order_no, amount) VALUES ('K', 1); SELECT FN(order_no, 't') FROM orders WHERE order_no = 'K';"
"plpgsql c := fn(k)|SELECT caller_assign_FN('K');"
"plpgsql select * into c from fn(k)|SELECT caller_select_into_FN('K');"
"plpgsql perform fn(k)|SELECT caller_perform_FN('K');"
"plpgsql execute .. using k|SELECT caller_execute_FN('K');"
"DO perform fn('K')|DO \$\$ BEGIN PERFORM FN('K', 't'); END \$\$;"
"prepare/execute x7|PREPARE p(text) AS SELECT FN(\$1, 't'); EXECUTE p('K'); EXECUTE p('K-2'); EXECUTE p('K-3'); EXECUTE p('K-4'); EXECUTE p('K-5'); EXECUTE p('K-6'); EXECUTE p('K-7');"
"begin; select fn(); commit|BEGIN; SELECT FN('K','t'); COMMIT;"
"begin; select * from fn(); commit|BEGIN; SELECT * FROM FN('K','t'); COMMIT;"
"begin; select (fn()).claimed; commit|BEGIN; SELECT (FN('K','t')).claimed; COMMIT;"
"begin; insert same key; select fn()|BEGIN; INSERT INTO orders (order_no, amount) VALUES ('K', 1); SELECT FN('K','t'); COMMIT;"
"begin; select fn(); insert same key|BEGIN; SELECT FN('K','t'); INSERT INTO orders (order_no, amount) VALUES ('K', 1); COMMIT;"
"begin; insert other worker; select fn()|BEGIN; INSERT INTO orders (order_no, amount) VALUES ('KO', 1); SELECT FN('K','t'); COMMIT;"
"begin; multi-shard read; select fn()|BEGIN; SELECT count(*) FROM orders; SELECT FN('K','t'); COMMIT;"
"begin; select fn(); select fn(other worker)|BEGIN; SELECT FN('K','t'); SELECT FN('KO','t'); COMMIT;"
)

node=${1:-coord}; where=${2:-remote}
N() { bash "$here/cluster.sh" psql "$node" "$@"; }
[ "$node" = coord ] && [ "$where" = local ] && { echo "the coordinator holds no shards" >&2; exit 2; }
run=$(date +%s%N | tail -c 7)
echo "node $node, keys $where"
printf '%-42s | %-28s | %s\n' "form" "idem_claim" "whereami (port, local_shard, app)"
i=0
for f in "${FORMS[@]}"; do
  i=$((i + 1))
  name=${f%%|*}; sql=${f#*|}
  for fn in idem_claim whereami; do
    k=$(N -At -c "SELECT k FROM (SELECT 'form$i-$run-$fn-' || g AS k FROM generate_series(1, 50) g) s
                  WHERE (SELECT groupid FROM pg_dist_placement WHERE shardid = get_shard_id_for_distribution_column('idem.claims', s.k))
                        $( [ "$where" = local ] && echo "=" || echo "<>" ) (SELECT groupid FROM pg_dist_local_group)
                  LIMIT 1")
    ko=$(C -At -c "SELECT k FROM (SELECT '$k-o' || g AS k FROM generate_series(1, 50) g) s
                   WHERE (SELECT groupid FROM pg_dist_placement WHERE shardid = get_shard_id_for_distribution_column('idem.claims', s.k))
                      <> (SELECT groupid FROM pg_dist_placement WHERE shardid = get_shard_id_for_distribution_column('idem.claims', '$k'))
                   LIMIT 1")
    s=${sql//FN/$fn}; s=${s//KO/$ko}; s=${s//K/$k}
    out=$(PGOPTIONS="-c client_min_messages=notice -c citus.log_remote_commands=on" N -c "$s" 2>&1 || true)
    if [ $fn = idem_claim ]; then
      sent=$(grep -c "issuing .*public.idem_claim(" <<<"$out" || true)
      stmts=$(grep -c "issuing .*idem\.claims_[0-9]" <<<"$out" || true)
      err=$(grep -m1 "^ERROR" <<<"$out" || true)
      routed=$(grep "issuing .*public\.idem_claim(" <<<"$out" | grep -c "orders_[0-9]" || true)
      if [ "$routed" -gt 0 ]; then r="query pushed down to a shard"
      elif [ "$sent" -gt 0 ] && [ "$stmts" = 0 ]; then r="delegated ($sent)"
      elif [ "$sent" = 0 ] && [ "$stmts" = 0 ]; then r="ran here, nothing remote"
      else r="NOT delegated ($stmts stmts)"; fi
      [ -n "$err" ] && r="$r $err"
      res1="$r"
    else
      w=$(grep -o "whereami port=[0-9]* local_shard=[a-z]* app=[a-z_]*" <<<"$out" | sed 's/whereami //' | sort | uniq -c | sed 's/^ *//' | paste -sd';' -)
      err=$(grep -m1 "^ERROR" <<<"$out" || true)
      printf '%-42s | %-28s | %s %s\n' "$name" "$res1" "$w" "$err"
    fi
  done
done
