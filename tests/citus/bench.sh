#!/usr/bin/env bash
# A first throughput look through the coordinator (issue 14, item 6):
# pgbench, CLIENTS clients, SECS seconds per run, variants interleaved over
# ROUNDS rounds, fresh random keys (first arrivals). Needs bench_orders and
# bench_dedup distributed by text and co-located with idem.claims, and for
# the last two variants checked_claim / plain_claim (see docs/citus-notes.md).
#   bash tests/citus/bench.sh [CLIENTS] [SECS] [ROUNDS] [variant...]
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
clients=${1:-2}; secs=${2:-30}; rounds=${3:-2}; shift $(( $# < 3 ? $# : 3 ))
db="${CITUS_DB:-idem_citus}"
read -r -a CPORTS <<<"${CITUS_PORTS:-5530 5531 5532}"
dir="$(mktemp -d /tmp/idem-citus-bench.XXXXXX)"
trap 'rm -rf "$dir"' EXIT
key='\set a random(1, 2000000000)
\set b random(1, 2000000000)'
K="'k' || :a || '-' || :b"
cat > "$dir/insert.sql" <<SQL
$key
BEGIN;
INSERT INTO bench_orders (order_no, amount) VALUES ($K, 1);
COMMIT;
SQL
cat > "$dir/dedup_insert.sql" <<SQL
$key
BEGIN;
INSERT INTO bench_dedup (key) VALUES ($K) ON CONFLICT DO NOTHING;
INSERT INTO bench_orders (order_no, amount) VALUES ($K, 1);
COMMIT;
SQL
cat > "$dir/claim_insert.sql" <<SQL
$key
BEGIN;
SELECT idem_claim($K, 'bench');
INSERT INTO bench_orders (order_no, amount) VALUES ($K, 1);
COMMIT;
SQL
cat > "$dir/dedup.sql" <<SQL
$key
INSERT INTO bench_dedup (key) VALUES ($K) ON CONFLICT DO NOTHING;
SQL
cat > "$dir/claim.sql" <<SQL
$key
SELECT idem_claim($K, 'bench');
SQL
cat > "$dir/plain_claim.sql" <<SQL
$key
SELECT plain_claim($K, 'bench');
SQL
cat > "$dir/checked_claim.sql" <<SQL
$key
SELECT checked_claim($K, 'bench');
SQL
variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=(insert dedup_insert claim_insert dedup claim)
for r in $(seq 1 "$rounds"); do
  for v in "${variants[@]}"; do
    tps=$("$PG_BIN/pgbench" -n -M simple -h 127.0.0.1 -p "${CPORTS[0]}" -U postgres -c "$clients" -j "$clients" \
            -T "$secs" -f "$dir/$v.sql" "$db" 2>&1 | awk '/^tps/ {print $3}')
    printf '%s round %d %-14s %s tps\n' "$(date +%T)" "$r" "$v" "$tps"
  done
done
