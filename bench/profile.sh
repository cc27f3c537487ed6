#!/usr/bin/env bash
# Profiles (bench/README.md; findings in docs/performance.md):
#   bash bench/profile.sh native [--preload] [--fresh] [N]   B0 B1 B1r I1 I1c I2 I3, N (3000) each, at steady
#       state (PROFILE_FILL = 200000 aged claims of the 1-day type, as many rows in dedup and dedup_r; --fresh:
#       empty tables); --preload: shared_preload_libraries = 'idem'. Writes bench/out/profile[-NN][-preload][-fresh]/
#   bash bench/profile.sh ttl [N] [SPREAD]                   per TTL (1 hour - 400 days, and 1 day alone), new
#       key and duplicate, N (300) each, SPREAD (2000) aged claims per type (the ttl section reads it)
#   bash bench/profile.sh portable [-n N] [--tcp] [REV ...]  B1 I1 I2 I3 of the portable edition of each git
#       revision (default ".", the checkout), N (300) each; --tcp: psql over 127.0.0.1:COUNT_PORT (5553)
#   bash bench/profile.sh portable-time HOST PORT [N]        the portable edition's I1 I2 I3 on a running
#       cluster, N (2000) each: time per function, per statement when it preloads pg_stat_statements
# Instructions per transaction under callgrind (valgrind, installed if missing) in single-user backends of a
# throw-away cluster of PG_CONFIG's PostgreSQL: N and N/10 transactions in two sessions, the difference over
# the difference, so the backend's start and the loading of a library are left out.
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
source "$ROOT/tests/lib/cluster.sh"
usage() { sed -n '3,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "$*" >&2; exit 1; }
need_n() { [[ "$1" =~ ^[0-9]+$ ]] && [ "$1" -ge 10 ] || die "N must be a number, at least 10"; N=$1 N0=$(($1 / 10)); }
need_valgrind() {
  command -v valgrind >/dev/null || apt_install "valgrind, for the profiles" valgrind
}
need_idem() {
  [ -f "$("$PG_CONFIG" --sharedir)/extension/idem.control" ] || die "idem is not installed into $PG_CONFIG's PostgreSQL"
}
# A throw-away cluster in $DATA (tests/lib/cluster.sh) with the server's
# own defaults where they count: the instruction counts of earlier runs
# (docs/performance.md) were taken with them.
fresh_cluster() { # [PORT]: its Unix socket's (a single-user backend opens none)
  pc_fresh "$DATA"
  pc_initdb "$PG_BIN" "$DATA" "${1:-5432}" "shared_buffers = 128MB" "fsync = on"
}
single() { # DB [OPTION...]: a single-user session of $DATA, statements on stdin
  local db=$1
  shift
  as_postgres "$PG_BIN/postgres" --single -D "$DATA/data" "$@" "$db"
}
count() { # DB NAME [OPTION...]: instructions of a single-user session running $OUT/NAME.sql in DB
  local db=$1 name=$2
  shift 2
  as_postgres valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind.$name" \
    "$PG_BIN/postgres" --single -D "$DATA/data" "$@" "$db" < "$OUT/$name.sql" > "$OUT/$name.log" 2>&1
  ! grep -q ERROR "$OUT/$name.log" || die "$name: an SQL error: $(grep -m3 ERROR "$OUT/$name.log")"
  grep -oE "Collected : [0-9]+" "$OUT/$name.log" | awk '{print $3}'
}
per_txn() { # LONG SHORT
  echo $((($1 - $2) / (N - N0)))
}
# The transactions, one per line (a single-user backend reads a statement a
# line), N in $OUT/NAME.sql and N/10 in NAME-short.sql, and the set-up SQL
# of subcommand MODE.
gen() { # MODE [ARG...]
  BENCH_DIR="$ROOT/bench" python3 - "$1" "$N" "$N0" "$OUT" "${@:2}" <<'PY'
import os, sys
sys.path.insert(0, os.environ["BENCH_DIR"])
from sections.ttl import AGE_SQL   # aged claims, one line
mode, n, n0, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
args = sys.argv[5:]

def key(prefix, i):
    return prefix + "-" + str(i).zfill(31 - len(prefix))      # 32 characters

def write(name, prep, body, prefix, dup=False):
    # the long run and the short one use different keys (new keys stay
    # new), except a duplicates' variant, whose keys were claimed before
    for suffix, count, pre in (("", n, prefix), ("-short", n0, prefix if dup else prefix + "s")):
        with open(f"{out}/{name}{suffix}.sql", "w") as f:
            f.write("SET synchronous_commit = off;\n" + prep)
            f.writelines(f"BEGIN; {body.format(k=key(pre, i))}COMMIT;\n" for i in range(count))

def prefill(t, count):   # the duplicates' keys, key("p", 0 .. count - 1)
    return (f"SELECT count(*) FROM generate_series(0, {count - 1}) g, "
            f"LATERAL idem_claim('p-' || lpad(g::text, 30, '0'), '{t}') c;")

DONE = "'{\"ok\": true}'"
if mode == "native":
    fill = int(args[0])
    if fill:
        with open(f"{out}/steady.sql", "w") as f:
            for t in ("dedup", "dedup_r"):
                f.write(f"INSERT INTO {t} (key) SELECT md5('s' || g::text) FROM generate_series(1, {fill}) g;\n")
            f.write("SELECT idem_configure('bench', '1 day');\nSET idem.premake_limit = 10000;\n"
                    f"SELECT idem_maintain();\n{AGE_SQL}\nSELECT bench_age_claims('bench', {fill});\n"
                    "SELECT idem_maintain();\n"      # moves what landed in the default partition
                    "DROP FUNCTION bench_age_claims(text, int);\nVACUUM ANALYZE;\n"
                    "SELECT 'steady: ' || count(*) || ' partitions of the class, ' || "
                    "count(*) FILTER (WHERE pg_relation_size(relid) > 0) || ' non-empty' "
                    "FROM pg_partition_tree('idem.claims') WHERE isleaf;\n")
    ins = "PREPARE ins(int) AS INSERT INTO orders (key, amount) VALUES ('x', $1);\n"
    plain = ins + "PREPARE c(text) AS SELECT idem_claim($1, 'bench');\n"
    col = ins + "PREPARE c(text) AS SELECT claimed FROM idem_claim($1, 'bench');\n"
    write("b0", ins, "EXECUTE ins(1); ", "b0")
    write("b1", ins + "PREPARE d(text) AS INSERT INTO dedup (key) VALUES ($1) ON CONFLICT DO NOTHING;\n",
          "EXECUTE d('{k}'); EXECUTE ins(1); ", "b1")
    write("b1r", ins + "PREPARE d(text) AS INSERT INTO dedup_r (key) VALUES ($1) ON CONFLICT DO NOTHING;\n"
          f"PREPARE u(text) AS UPDATE dedup_r SET result = {DONE} WHERE key = $1;\n",
          "EXECUTE d('{k}'); EXECUTE ins(1); EXECUTE u('{k}'); ", "b1r")
    write("i1", plain, "EXECUTE c('{k}'); EXECUTE ins(1); ", "i1")
    write("i1c", col, "EXECUTE c('{k}'); EXECUTE ins(1); ", "i1c")
    write("i2", col + f"PREPARE f(text) AS SELECT idem_complete($1, 'bench', {DONE});\n",
          "EXECUTE c('{k}'); EXECUTE ins(1); EXECUTE f('{k}'); ", "i2")
    write("i3", plain, "EXECUTE c('{k}'); EXECUTE ins(1); ", "i1", dup=True)   # i1's keys
elif mode == "ttl":
    spread = int(args[0])
    types = [("t1h", "1 hour"), ("t1d", "1 day"), ("t30d", "30 days"), ("t400d", "400 days")]
    for db, ts in (("ttl_mixed", types), ("ttl_base", types[1:2])):
        with open(f"{out}/setup-{db}.sql", "w") as f:
            f.write("CREATE EXTENSION idem;\n")
            f.writelines(f"SELECT idem_configure('{t}', '{ttl}');\n" for t, ttl in ts)
            f.write("SET idem.premake_limit = 10000;\nSELECT idem_maintain();\n" + AGE_SQL + "\n")
            f.writelines(f"SELECT bench_age_claims('{t}', {spread});\n" for t, _ in ts)
            f.write("SELECT idem_maintain();\n")
            f.writelines(prefill(t, n) + "\n" for t, _ in ts)
            f.write("VACUUM ANALYZE;\n")
    hdr = ("PREPARE c(text, text) AS SELECT claimed FROM idem_claim($1, $2);\n"
           f"PREPARE f(text, text) AS SELECT idem_complete($1, $2, {DONE});\n")
    for label, t in [(t, t) for t, _ in types] + [("base", "t1d")]:
        write(f"{label}-new", hdr, f"EXECUTE c('{{k}}', '{t}'); EXECUTE f('{{k}}', '{t}'); ", "n")
        write(f"{label}-dup", hdr, f"EXECUTE c('{{k}}', '{t}'); ", "p", dup=True)
elif mode == "portable":
    with open(f"{out}/setup.sql", "w") as f:
        f.write(f"SELECT idem_claim('bench-setup', 'bench');\nSELECT idem_maintain();\n{prefill('bench', n + 1)}\nVACUUM ANALYZE;\n")
    hdr = ("PREPARE ins(text) AS INSERT INTO orders (key, amount) VALUES ($1, 1);\n"
           "PREPARE c(text) AS SELECT claimed FROM idem_claim($1, 'bench');\n"
           f"PREPARE f(text) AS SELECT idem_complete($1, 'bench', {DONE});\n"
           "PREPARE d(text) AS INSERT INTO dedup (key) VALUES ($1) ON CONFLICT DO NOTHING;\n")
    write("b1", hdr, "EXECUTE d('{k}'); EXECUTE ins('{k}'); ", "b1")
    write("i1", hdr, "EXECUTE c('{k}'); EXECUTE ins('{k}'); ", "i1")
    write("i2", hdr, "EXECUTE c('{k}'); EXECUTE ins('{k}'); EXECUTE f('{k}'); ", "i2")
    write("i3", hdr, "EXECUTE c('{k}'); ", "p", dup=True)
PY
  chown -R postgres "$OUT"
}
# (per checkout, so that two worktrees profiling at once do not share it)
data_dir() { echo "/tmp/idem-profile-$1-$(echo "$ROOT" | md5sum | cut -c1-8)"; }

# ---- native -------------------------------------------------------------------
cmd_native() {
  local preload=0 steady=1 fill tag opts=() v
  while [ $# -gt 0 ]; do
    case "$1" in
      --preload) preload=1; shift ;;
      --fresh) steady=0; shift ;;
      -*) usage ;;
      *) break ;;
    esac
  done
  need_n "${1:-3000}"
  fill="${PROFILE_FILL:-200000}"
  [[ "$fill" =~ ^[0-9]+$ ]] || die "PROFILE_FILL must be a number"
  [ $steady = 1 ] || fill=0
  [ $preload = 0 ] || opts=(-c shared_preload_libraries=idem)
  need_idem; need_valgrind
  tag="$PG_SUFFIX$([ $preload = 0 ] || echo -preload)$([ $steady = 1 ] || echo -fresh)"
  OUT="$ROOT/bench/out/profile$tag" DATA="$(data_dir "native$tag")"
  rm -rf "$OUT"; mkdir -p "$OUT"
  fresh_cluster
  single postgres "${opts[@]}" >/dev/null 2>&1 <<'SQL'
CREATE EXTENSION idem;
SELECT idem_maintain();
CREATE TABLE orders (id bigserial primary key, key text, amount int, created_at timestamptz default now());
CREATE TABLE dedup (key text primary key, created_at timestamptz default now());
CREATE TABLE dedup_r (key text primary key, created_at timestamptz default now(), result jsonb);
SQL
  gen native "$fill"
  echo "PostgreSQL $PG_MAJOR ($PG_BIN), $N and $N0 transactions per variant, shared_preload_libraries: $([ $preload = 1 ] && echo idem || echo none)"
  if [ $steady = 1 ]; then
    single postgres "${opts[@]}" < "$OUT/steady.sql" > "$OUT/steady.log" 2>&1
    ! grep -q ERROR "$OUT/steady.log" || die "the steady-state fill failed: see $OUT/steady.log"
    echo "steady state: $fill aged claims of the 1-day type, as many rows in dedup and dedup_r;$(grep -o 'steady: [^"]*' "$OUT/steady.log" | sed 's/^steady://')"
  else
    echo "fresh tables (--fresh)"
  fi
  printf '%-5s %12s\n' variant "instr/txn"
  for v in b0 b1 b1r i1 i1c i2 i3; do
    printf '%-5s %12d\n' "$v" "$(per_txn "$(count postgres "$v" "${opts[@]}")" "$(count postgres "$v-short" "${opts[@]}")")"
  done
  echo "profiles: $OUT/callgrind.* (callgrind_annotate --inclusive=yes ...)"
  rm -rf "$DATA"
}

# ---- ttl ----------------------------------------------------------------------
cmd_ttl() {
  local spread=${2:-2000} db kind label
  need_n "${1:-300}"
  [[ "$spread" =~ ^[0-9]+$ ]] || die "SPREAD must be a number"
  need_idem; need_valgrind
  OUT="$ROOT/bench/out/profile-ttl$PG_SUFFIX" DATA="$(data_dir "ttl$PG_SUFFIX")"
  rm -rf "$OUT"; mkdir -p "$OUT"
  fresh_cluster
  printf 'CREATE DATABASE ttl_mixed;\nCREATE DATABASE ttl_base;\n' | single postgres >/dev/null 2>&1
  gen ttl "$spread"
  for db in ttl_mixed ttl_base; do
    single "$db" < "$OUT/setup-$db.sql" > "$OUT/setup-$db.log" 2>&1
    ! grep -q ERROR "$OUT/setup-$db.log" || die "setup of $db failed: see $OUT/setup-$db.log"
  done
  echo "PostgreSQL $PG_MAJOR ($PG_BIN), $N and $N0 transactions per variant, $spread spread claims per type"
  printf '%-10s %12s\n' variant "instr/txn"
  for kind in new dup; do
    for label in t1h t1d t30d t400d base; do
      db=ttl_mixed; [ "$label" = base ] && db=ttl_base
      # (the new-key variants add N + N/10 claims to their type: a few
      # hundred rows next to the prefill, the same on every run)
      printf '%-10s %12d\n' "$label-$kind" "$(per_txn "$(count "$db" "$label-$kind")" "$(count "$db" "$label-$kind-short")")"
    done
  done
  rm -rf "$DATA"
}

# ---- portable: instructions per transaction by git revision ---------------------
tcp_count() { # NAME: instructions of the backend of one psql session over TCP running $OUT/NAME.sql
  local pid f
  "$PG_BIN/psql" -X -q -At -h 127.0.0.1 -p "$COUNT_PORT" -U postgres -d bench \
    -c "SELECT pg_backend_pid()" -f "$OUT/$1.sql" > "$OUT/$1.out" 2> "$OUT/$1.log"
  pid=$(head -1 "$OUT/$1.out")
  ! grep -q ERROR "$OUT/$1.log" || die "$1: an SQL error: $(grep -m3 ERROR "$OUT/$1.log")"
  # (the backend writes its counts when it exits, after psql has gone)
  f="$OUT/callgrind.tcp.$pid"
  for _ in $(seq 600); do grep -q "^totals:" "$f" 2>/dev/null && break; sleep 0.1; done
  sed -n 's/^totals: *//p' "$f"
}
cmd_portable() {
  local tcp=0 rev label src v long short row
  need_n 300
  while [ $# -gt 0 ]; do
    case "$1" in
      -n) need_n "${2:-}"; shift 2 ;;
      --tcp) tcp=1; shift ;;
      -*) usage ;;
      *) break ;;
    esac
  done
  [ $# -gt 0 ] || set -- .
  COUNT_PORT="${COUNT_PORT:-5553}"
  need_valgrind
  OUT="$(mktemp -d /tmp/idem-profile-portable.XXXXXX)" DATA="$OUT/cluster"
  chmod 755 "$OUT"
  trap 'pc_server_stop "$DATA"; rm -rf "$OUT"' EXIT
  gen portable
  echo "PostgreSQL $PG_MAJOR ($PG_BIN): instructions per transaction ($N and $N0 transactions per variant)"
  printf '%-14s %12s %12s %12s %12s\n' revision B1 I1 I2 I3
  for rev in "$@"; do
    label="$(git -C "$ROOT" rev-parse --short "${rev/#./HEAD}")$([ "$rev" = . ] && echo '+wt' || true)"
    src="$OUT/src"
    rm -rf "$src"; mkdir -p "$src"
    # (what scripts/portable.py reads; src/lib.rs lists the SQL modules)
    if [ "$rev" = . ]; then
      mkdir -p "$src/src"
      cp -r "$ROOT/scripts" "$ROOT/sql" "$ROOT/portable" "$ROOT/idem.control" "$ROOT/Cargo.toml" "$src/"
      cp "$ROOT/src/lib.rs" "$src/src/"
    else
      git -C "$ROOT" archive "$rev" scripts sql portable idem.control Cargo.toml src/lib.rs | tar -x -C "$src"
    fi
    python3 "$src/scripts/portable.py" --out "$OUT/dist" >/dev/null
    chown -R postgres "$OUT"
    fresh_cluster 5553
    pc_server_start "$DATA"
    psql_w() { "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$DATA" -p 5553 -U postgres "$@"; }
    psql_w -d postgres -c "CREATE DATABASE bench"
    psql_w -d bench -f "$ROOT/bench/sql/schema.sql" -f "$OUT/dist/idem_portable.sql" -f "$OUT/setup.sql" >/dev/null
    pc_server_stop "$DATA" fast
    if [ $tcp = 1 ]; then
      as_postgres valgrind --tool=callgrind --trace-children=yes --callgrind-out-file="$OUT/callgrind.tcp.%p" \
        "$PG_BIN/postgres" -D "$DATA/data" -c listen_addresses=127.0.0.1 -p "$COUNT_PORT" -c autovacuum=off \
        > "$OUT/server-tcp.log" 2>&1 &
      for _ in $(seq 600); do "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$COUNT_PORT" && break; sleep 0.2; done
    fi
    row=()
    for v in b1 i1 i2 i3; do
      if [ $tcp = 1 ]; then long=$(tcp_count "$v") short=$(tcp_count "$v-short")
      else long=$(count bench "$v") short=$(count bench "$v-short"); fi
      row+=("$(per_txn "$long" "$short")")
    done
    if [ $tcp = 1 ]; then   # (and wait for valgrind to write its last counts)
      pc_server_stop "$DATA" fast
      wait
    fi
    printf '%-14s %12d %12d %12d %12d\n' "$label" "${row[@]}"
  done
}

# ---- portable-time: time per function and statement ----------------------------
cmd_portable_time() {
  [ $# -ge 2 ] || usage
  local host=$1 port=$2 db=bench_profile_portable pgss run=0 v
  N=${3:-2000}
  [[ "$N" =~ ^[0-9]+$ ]] || die "N must be a number"
  OUT="$(mktemp -d)"
  trap 'rm -rf "$OUT"' EXIT
  q() { "$PG_BIN/psql" -X -A -t -q -v ON_ERROR_STOP=1 -h "$host" -p "$port" -U postgres -d "$1" -c "$2"; }
  per_call() { # SQL: its execution time per call of 20000
    q $db "EXPLAIN (ANALYZE, TIMING OFF, SUMMARY ON) $1" |
      sed -n 's/^Execution Time: \([0-9.]*\) ms/\1/p' | awk '{ printf "%.1f µs per call (20000 calls)\n", $1 * 1000 / 20000 }'
  }
  python3 "$ROOT/scripts/portable.py" --out "$OUT" >/dev/null
  q postgres "DROP DATABASE IF EXISTS $db WITH (FORCE)"
  q postgres "CREATE DATABASE $db"
  "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$host" -p "$port" -U postgres -d $db \
    -f "$ROOT/bench/sql/schema.sql" -f "$OUT/idem_portable.sql" >/dev/null
  pgss=$(q $db "SELECT count(*) FROM pg_settings WHERE name = 'pg_stat_statements.track'")
  [ "$pgss" = 1 ] && q $db "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"
  q $db "SELECT idem_claim('bench-setup', 'bench'); SELECT idem_maintain()" >/dev/null
  q $db "SELECT count(*) FROM generate_series(1, $N) g, LATERAL idem_claim(md5('p' || g::text), 'bench') c" >/dev/null
  q $db "VACUUM ANALYZE"
  for v in i1 i2 i3; do
    run=$((run + 1))
    q $db "SELECT pg_stat_reset()" >/dev/null
    [ "$pgss" != 1 ] || q $db "SELECT pg_stat_statements_reset()" >/dev/null
    PGOPTIONS="-c synchronous_commit=off -c track_functions=all -c pg_stat_statements.track=all" \
      "$PG_BIN/pgbench" -n -M prepared -c 1 -j 1 -t "$N" -D n=0 -D run=$((900 + run)) -D prefill="$N" \
      -f "$ROOT/bench/sql/$v.sql" -h "$host" -p "$port" -U postgres $db | grep -E "^(tps|latency average)"
    # the backend flushed its counters when pgbench disconnected
    echo "== $v: per function, per transaction ($N transactions)"
    q $db "SELECT format('%-28s %6s calls %9s µs total %9s µs self', schemaname || '.' || funcname,
                         round(calls::numeric / $N, 1), round((total_time * 1000 / $N)::numeric, 1),
                         round((self_time * 1000 / $N)::numeric, 1))
             FROM pg_stat_user_functions ORDER BY self_time DESC LIMIT 25"
    [ "$pgss" = 1 ] || continue
    echo "== $v: per statement (pg_stat_statements, track = all), per transaction"
    q $db "SELECT format('%9s µs %6s calls  %s', round((total_exec_time * 1000 / $N)::numeric, 1),
                         round(calls::numeric / $N, 1), left(regexp_replace(query, '\s+', ' ', 'g'), 110))
             FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
            ORDER BY total_exec_time DESC LIMIT 30"
  done
  echo "== the digest alone: idem.key_hash('bench', 32-character key), per call"
  per_call "SELECT idem.key_hash('bench', md5(g::text)) FROM generate_series(1, 20000) g"
  echo "== the same loop with md5() alone (the loop's own cost)"
  per_call "SELECT md5(g::text) FROM generate_series(1, 20000) g"
  q postgres "DROP DATABASE $db WITH (FORCE)"
}

case "${1:-}" in
  native | ttl | portable) cmd="cmd_$1"; shift; "$cmd" "$@" ;;
  portable-time) shift; cmd_portable_time "$@" ;;
  *) usage ;;
esac
