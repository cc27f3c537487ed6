#!/usr/bin/env bash
# The matrix's B0, B1, I1 and I2 (bench/sql/*.sql) through the coordinator of
# the Citus test cluster (tests/lib/cluster.sh citus: coordinator :5530,
# workers :5531 and :5532; Citus built by tests/scenarios/scaling.sh citus
# --server), in database idem_bench: orders, dedup and idem.claims
# distributed by the key and co-located, so each transaction runs on one
# worker; synchronous_commit on, fsync off (the test cluster's). Per round and
# client count each variant (rotating order) runs DURATION s after a TRUNCATE.
# Writes OUT/report.md (median TPS, min-max, ratios, the target I1 >= 0.9 x B1)
# and OUT/raw.csv; about 9 minutes with the defaults.
#
#   bash bench/citus.sh [--rounds 3] [--duration 20] [--clients "2 4"] [--variants "b0 b1 i1 i2"]
#                       [--out bench/out/citus] [--keep-cluster]
# The PostgreSQL Citus is built into: the private copy of Debian's 15.
# (made once, Citus built into it once, then cached)
PG_CONFIG=$(bash "$(dirname "${BASH_SOURCE[0]}")/../tests/scenarios/scaling.sh" citus --server)
export PG_CONFIG
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
ROUNDS=3 DURATION=20 CLIENTS="2 4" VARIANTS="b0 b1 i1 i2" OUT="$ROOT/bench/out/citus" KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --clients) CLIENTS=$2; shift 2 ;;
    --variants) VARIANTS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --keep-cluster) KEEP=1; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT/logs"
OUT="$(cd "$OUT" && pwd)"
[ -f "$("$PG_CONFIG" --sharedir)/extension/idem.control" ] ||
  { echo "idem is not installed into the PostgreSQL of $PG_CONFIG (cargo pgrx install --release --pg-config $PG_CONFIG)" >&2; exit 1; }

export CITUS_DB=idem_bench
source "$ROOT/tests/lib/cluster.sh"
was_running=0
citus_running coord && was_running=1
cleanup() { [ "$KEEP" = 1 ] || [ "$was_running" = 1 ] || citus_stop; }
trap cleanup EXIT
citus_reset
C() { citus_psql coord "$@"; }
C >/dev/null <<'SQL'
CREATE EXTENSION idem;
CREATE TABLE orders (
    id         bigserial,
    key        text        NOT NULL,
    amount     int         NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (key, id)
);
SELECT create_distributed_table('orders', 'key');
CREATE TABLE dedup (
    key        text PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);
SELECT create_distributed_table('dedup', 'key', colocate_with => 'orders');
SELECT idem_distribute('orders');
SELECT idem_maintain();
SQL

declare -A SCRIPT=([b0]=b0.sql [b1]=b1.sql [i1]=i1.sql [i2]=i2.sql)
read -r -a variants <<<"$VARIANTS"
n=${#variants[@]}
raw="$OUT/raw.csv"
echo "round,clients,variant,tps,failed" > "$raw"
run=0
say "Citus section: ${ROUNDS} rounds × clients ($CLIENTS) × variants (${VARIANTS}), ${DURATION} s each; raw in $raw"
for r in $(seq 1 "$ROUNDS"); do
  for c in $CLIENTS; do
    for i in $(seq 0 $((n - 1))); do
      v=${variants[$(( (i + (r - 1) * n / ROUNDS) % n ))]}
      run=$((run + 1))
      C -c "TRUNCATE orders, dedup, idem.claims" >/dev/null
      log="$OUT/logs/round$r-c$c-$v.log"
      "$PG_BIN/pgbench" -n -M prepared -h 127.0.0.1 -p 5530 -U postgres -c "$c" -j "$c" -T "$DURATION" \
        -D n=0 -D "run=$run" -D prefill=1 -f "$ROOT/bench/sql/${SCRIPT[$v]}" "$CITUS_DB" > "$log" 2>&1 || true
      tps=$(awk '/^tps = .*without initial/ {print $3}' "$log")
      failed=$(awk -F': ' '/^number of failed transactions/ {split($2, a, " "); print a[1]}' "$log")
      if [ -z "$tps" ] || grep -q "aborted\|^pgbench: error" "$log"; then
        echo "pgbench $v with $c clients failed; see $log" >&2; tail -5 "$log" >&2; exit 1
      fi
      printf '%s round %d, %d clients, %-3s %8.0f TPS\n' "$(date +%T)" "$r" "$c" "$v" "$tps"
      echo "$r,$c,$v,$tps,${failed:-0}" >> "$raw"
    done
  done
done

BENCH_DIR="$ROOT/bench" python3 - "$raw" "$OUT/report.md" "$ROUNDS" "$DURATION" "$("$PG_CONFIG" --version)" <<'PY'
import csv, datetime, os, sys
sys.path.insert(0, os.environ["BENCH_DIR"])
from lib import median, table
raw, out, rounds, duration, pgv = sys.argv[1:6]
tps = {}
for r in csv.DictReader(open(raw)):
    tps.setdefault((r["variant"], int(r["clients"])), []).append(float(r["tps"]))
clients = sorted({c for _, c in tps})
vs = [v for v in ("b0", "b1", "i1", "i2") if (v, clients[0]) in tps]
names = {"b0": "B0 business insert only", "b1": "B1 + `INSERT … ON CONFLICT DO NOTHING` (co-located)",
         "i1": "I1 + `idem_claim` (new key)", "i2": "I2 + `idem_claim` + `idem_complete`"}
cell = lambda x: f"{median(x):,.0f} ({min(x):,.0f}–{max(x):,.0f})"
ratio = lambda n, d, c: (f"**{median(tps[(n, c)]) / median(tps[(d, c)]):.2f}** (rounds "
                         + "–".join(f"{f(a / b for a, b in zip(tps[(n, c)], tps[(d, c)])):.2f}" for f in (min, max)) + ")")
lines = ["# idem benchmark, Citus section", "",
         f"{datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, `bash bench/citus.sh`, {rounds} rounds × {duration} s, "
         f"{os.cpu_count()} cores, {pgv}, Citus (coordinator + 2 workers on this machine), synchronous_commit on, "
         "fsync off. TPS through the coordinator: median over rounds (min–max).", ""] + \
    table(["variant"] + [f"{c} clients" for c in clients], [[names[v]] + [cell(tps[(v, c)]) for c in clients] for v in vs]
          + [[f"{n.upper()} / {d.upper()}"] + [ratio(n, d, c) for c in clients]
             for n, d in (("b1", "b0"), ("i1", "b1"), ("i2", "b1"), ("i1", "b0")) if n in vs and d in vs])
if "i1" in vs and "b1" in vs:
    worst = min(median(tps[("i1", c)]) / median(tps[("b1", c)]) for c in clients)
    lines += [f"Target `idem_claim` ≥ 0.9 × the co-located ON CONFLICT table (I1/B1): {worst:.2f} at worst — "
              f"**{'PASS' if worst >= 0.9 else 'MISS'}**."]
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
