#!/usr/bin/env bash
# clients/node (the npm package idem-pg), installed the way users install
# it: `npm pack`, then `npm install` of the tarball into a fresh project
# together with express, fastify and pg from npm; the tests run against that
# installed copy, never the source folder. Then, for Express and for Fastify,
# each connected to PostgreSQL directly and through PgBouncer in transaction
# mode, clients/node/test/driver.js drives a real server on loopback
# (clients/node/test/server.js) with real HTTP requests and checks the
# business rows: N concurrent identical requests (one row, N identical
# answers; with wait: false one 201 and 409s), kills before COMMIT and after
# COMMIT (at test hooks the server announces, never after a sleep), changed
# body (422), missing key (400), handler exceptions and transient SQLSTATEs
# (nothing stored, the retry runs), stored 4xx replayed, streaming, a lease
# taken over after the process died. Also type-checks the package's .d.ts
# with tsc. Its own cluster (a socket in its folder) and PgBouncer (a free
# loopback port).
# Needs bash scripts/setup.sh --tool middleware-node (npm cache) and pgbouncer.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/cluster.sh"
source "$ROOT/tests/lib/middleware.sh"
t_start=$(date +%s%N)
mw_begin middleware-node
# A test server left behind by a driver that died: this run's own, by the
# path of its script in this run's scratch folder.
MW_KILL+=("^[^ ]*node $work/app/server.js " "^[^ ]*node $work/app/[a-z]*-app.js ")
command -v node >/dev/null || fail "node missing: run bash scripts/setup.sh --tool examples"

# ---- the cluster and PgBouncer -------------------------------------------------
PG_PORT=5574
mw_cluster $PG_PORT mw "max_connections = 150"
pc_psql -q -d mw <<'SQL'
CREATE TABLE orders (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    route    text NOT NULL,
    idem_key text,
    sku      text NOT NULL,
    qty      int  NOT NULL
);
CREATE TABLE charges (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    idem_key  text NOT NULL,
    charge_id text NOT NULL
);
SQL
echo "PostgreSQL $(pc_psql -d mw -Atc "SHOW server_version"), idem $(pc_psql -d mw -Atc "SELECT extversion FROM pg_extension WHERE extname = 'idem'")"
mw_bouncer 60

# ---- the package, packed and installed as users do -----------------------------
t0=$(date +%s%N)
mkdir -p "$work/pack" "$work/app"
tarball=$(cd "$ROOT/clients/node" && npm pack --silent --pack-destination "$work/pack")
echo "npm pack: $tarball ($(tar tzf "$work/pack/$tarball" | paste -sd' '))"
# What users' projects add, from npm (the machine's npm cache: scripts/setup.sh --tool middleware_node).
cp "$ROOT/clients/node/test/package.json" "$work/app/package.json"
(cd "$work/app" && npm install --prefer-offline --no-audit --no-fund --loglevel=error "$work/pack/$tarball" >/dev/null)
resolved=$(cd "$work/app" && node -p "require.resolve('idem-pg')")
[ "$resolved" = "$work/app/node_modules/idem-pg/index.js" ] || fail "idem-pg resolves to $resolved, not the installed copy"
[ ! -L "$work/app/node_modules/idem-pg" ] || fail "node_modules/idem-pg is a link to the source"
cp "$ROOT/clients/node/test/server.js" "$ROOT/clients/node/test/driver.js" "$ROOT/clients/node/test/types.ts" \
   "$ROOT/clients/node/test/unit.test.js" "$ROOT/clients/node/test/conformance.js" \
   "$ROOT/tests/middleware/conformance.json" "$ROOT/clients/node/test/examples.js" \
   "$ROOT/clients/node/examples/express-app.js" "$ROOT/clients/node/examples/fastify-app.js" "$work/app/"
versions=$(cd "$work/app" && node -p "['idem-pg','express','fastify','pg','typescript'].map(n => n + ' ' + require(n + '/package.json').version).join(', ')")
echo "installed in a fresh project ($(ms_since "$t0") ms): $versions"

# ---- the types: a user's TypeScript file against the installed .d.ts ----------
(cd "$work/app" && npx --no-install tsc --noEmit --strict --esModuleInterop --module commonjs --target es2022 \
   --moduleResolution node --types node types.ts) || fail "tsc rejects types.ts against the installed index.d.ts"
echo "ok   tsc --strict accepts clients/node/test/types.ts against the installed index.d.ts"

# ---- the pure parts (fingerprint, stored document, key header), no database -----
(cd "$work/app" && node --test --test-reporter=spec unit.test.js) || fail "unit tests of the installed package"

# ---- each framework, directly and through PgBouncer ------------------------------
export PGHOST="$dir" PGPORT=$PG_PORT PGUSER=postgres PGDATABASE=mw
failed=()
# IDEM_MW_RUNS (e.g. "express-direct") narrows the runs, for a quick check by hand.
runs="${IDEM_MW_RUNS:-express-direct express-pgbouncer fastify-direct fastify-pgbouncer}"
for framework in express fastify; do
  for via in direct pgbouncer; do
    [[ " $runs " == *" $framework-$via "* ]] || continue
    if [ $via = direct ]; then server_host="$dir" server_port=$PG_PORT; else server_host=127.0.0.1 server_port=$PGB_PORT; fi
    echo "== $framework, pool connected $via =="
    t0=$(date +%s%N)
    if ! (cd "$work/app" && SERVER_PGHOST=$server_host SERVER_PGPORT=$server_port node driver.js $framework "$framework-$via"); then
      failed+=("$framework-$via")
    fi
    echo "($(ms_since "$t0") ms)"
  done
done
# The README's example apps, as they are: auth, rate limit and idem in order.
for framework in express fastify; do
  [[ " $runs " == *" $framework-"* ]] || continue
  echo "== the README's $framework example (examples/$framework-app.js) =="
  (cd "$work/app" && node examples.js $framework) || failed+=("$framework example")
done
xacts=$(mw_bouncer_xacts mw)
[[ "$runs" != *pgbouncer* ]] || [ "${xacts:-0}" -gt 0 ] || failed+=("no transaction went through PgBouncer")
echo "summary: runs $runs (PgBouncer: $xacts transactions through it), ${#failed[@]} failed, $(ms_since "$t_start") ms in all"
if [ ${#failed[@]} -gt 0 ]; then
  printf 'failed: %s\n' "${failed[@]}"
  exit 1
fi
