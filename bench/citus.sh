#!/usr/bin/env bash
# The benchmark's Citus section: the single-node variants through a Citus
# coordinator (tests/lib/cluster.sh citus: coordinator 127.0.0.1:5530, workers
# :5531 and :5532, Citus 13.2.2 from ../shared/vendor via
# tests/scenarios/scaling.sh citus --server), in a database of its own (idem_bench):
#
#   B0  BEGIN; INSERT INTO orders ...; END
#   B1  BEGIN; INSERT INTO dedup ... ON CONFLICT DO NOTHING; INSERT INTO orders ...; END
#   I1  BEGIN; SELECT idem_claim(key, 'bench'); INSERT INTO orders ...; END
#   I2  I1 plus SELECT idem_complete(key, 'bench', '{"ok": true}')
#
# orders, dedup and idem.claims distributed by the key (32 shards),
# co-located, so that every statement of a transaction goes to one worker.
# The same pgbench scripts as the single-node matrix (bench/sql/*.sql: new
# 32-character md5 keys, -M prepared; idem_claim's call form is delegated),
# synchronous_commit on. For each round, each client count and each variant
# (in an order that rotates from round to round) the tables are emptied
# (TRUNCATE), then pgbench runs for DURATION seconds. Reports the median TPS
# over rounds, the min-max, and the ratios to B0 and B1.
#
#   bash bench/citus.sh [--rounds 3] [--duration 20] [--clients "2 4"] [--variants "b0 b1 i1 i2"]
#                       [--out bench/out/citus] [--keep-cluster]
#
# About 9 minutes with the defaults (after the Citus build). The cluster is
# the test cluster's (fsync off, synchronous_commit on: commits still wait
# for the WAL write, not for the disk), created if missing and stopped at the
# end unless --keep-cluster; the numbers compare variants on one cluster,
# not with the single-node matrix.
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
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
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

python3 - "$raw" "$OUT/report.md" "$ROUNDS" "$DURATION" "$("$PG_CONFIG" --version)" <<'PY'
import csv, statistics, sys, os, datetime
raw, out, rounds, duration, pgv = sys.argv[1:6]
rows = list(csv.DictReader(open(raw)))
tps = {}
for r in rows:
    tps.setdefault((r["variant"], int(r["clients"])), []).append(float(r["tps"]))
clients = sorted({k[1] for k in tps})
variants = [v for v in ("b0", "b1", "i1", "i2") if any(k[0] == v for k in tps)]
names = {"b0": "B0 business insert only", "b1": "B1 + `INSERT … ON CONFLICT DO NOTHING` (co-located)",
         "i1": "I1 + `idem_claim` (new key)", "i2": "I2 + `idem_claim` + `idem_complete`"}
med = {k: statistics.median(v) for k, v in tps.items()}
lines = [f"# idem benchmark, Citus section",
         "",
         f"{datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, `bash bench/citus.sh`, {rounds} rounds × {duration} s, "
         f"{os.cpu_count()} cores, {pgv}, Citus 13.2.2 (coordinator + 2 workers on this machine), "
         "synchronous_commit on, fsync off. TPS through the coordinator: median over rounds (min–max).",
         "",
         "| variant | " + " | ".join(f"{c} clients" for c in clients) + " |",
         "|---|" + "---|" * len(clients)]
for v in variants:
    cells = []
    for c in clients:
        vals = tps.get((v, c))
        cells.append(f"{med[(v, c)]:,.0f} ({min(vals):,.0f}–{max(vals):,.0f})" if vals else "")
    lines.append(f"| {names[v]} | " + " | ".join(cells) + " |")
for num, den in (("b1", "b0"), ("i1", "b1"), ("i2", "b1"), ("i1", "b0")):
    if num in variants and den in variants:
        cells = []
        for c in clients:
            ratio = med[(num, c)] / med[(den, c)]
            same = [a / b for a, b in zip(tps[(num, c)], tps[(den, c)])]
            cells.append(f"**{ratio:.2f}** (rounds {min(same):.2f}–{max(same):.2f})")
        lines.append(f"| {num.upper()} / {den.upper()} | " + " | ".join(cells) + " |")
if "i1" in variants and "b1" in variants:
    worst = min(med[("i1", c)] / med[("b1", c)] for c in clients)
    lines += ["", f"Target `idem_claim` ≥ 0.9 × the co-located ON CONFLICT table (I1/B1): "
              f"{worst:.2f} at worst — **{'PASS' if worst >= 0.9 else 'MISS'}**."]
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
