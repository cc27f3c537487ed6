#!/usr/bin/env bash
# The Go client (clients/go: idem.Claim over pgx and database/sql, and the
# net/http middleware), built offline from the module cache that
# scripts/setup.sh --tool middleware_go filled from the Go module proxy:
#   * go vet and go test -race of the package itself (the key field, the
#     scope, RFC 8785 canonical JSON against the conformance table's pairs,
#     the stored document; no database);
#   * clients/go/test (go vet; go test -race) against this scenario's own
#     cluster with idem: Claim, Complete and Fail over pgx.Tx and *sql.Tx
#     with the SQLSTATEs as typed errors (ID001, ID003, 55P03, 40001);
#     then a test server compiled with -race (clients/go/test/server),
#     behind net/http's ServeMux, chi, echo and gin, its pgx pool connected
#     directly and through PgBouncer in transaction mode, driven by real
#     HTTP requests: every case of tests/middleware/conformance.json (the
#     rules of docs/http.md, shared with the Python and Node clients:
#     400s, tenants whose names collide kept apart, 401/403/429/5xx not
#     stored and the retry runs, 409 + Retry-After, 422, 503), 20
#     concurrent duplicates (one business row; waiting, and with 409s),
#     and the server SIGKILLed before and after COMMIT at a kill point it
#     announces on a FIFO (the retry runs, or is replayed);
#   * the complete app of clients/go/README.md, built and run as written.
# No verdict by the clock: every wait is for an observed state. Exits 1 on
# any failure.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/cluster.sh"
source "$ROOT/tests/lib/middleware.sh"
source "$ROOT/tests/lib/go.sh"
t_start=$(date +%s%N)
mw_begin middleware-go
# A test server or README app left behind by a test that died: this run's
# own, by the path of its binary in this run's scratch folder.
MW_KILL+=("^$work/")
bash "$ROOT/scripts/setup.sh" --tool middleware_go   # a no-op once the module cache is complete
go_env
go_new_enough || fail "no Go $GO_MIN or newer: run bash scripts/setup.sh --tool middleware_go"
export TMPDIR=$work   # go test's scratch folders (the test server's binary) are this run's

# ---- the cluster and PgBouncer -------------------------------------------------
PG_PORT=5578
mw_cluster $PG_PORT mw "max_connections = 150"
pc_psql -q -d mw <<'SQL'
-- tests/middleware/README.md, "The server a runner needs"
CREATE TABLE conformance_rows (id bigserial PRIMARY KEY, run text NOT NULL, tenant text, status int NOT NULL);
CREATE FUNCTION raise_sqlstate(code text) RETURNS void LANGUAGE plpgsql AS
  $$ BEGIN RAISE EXCEPTION 'failure % raised by the test handler', code USING ERRCODE = code; END $$;
SQL
echo "PostgreSQL $(pc_psql -d mw -Atc "SHOW server_version"), idem $(pc_psql -d mw -Atc "SELECT extversion FROM pg_extension WHERE extname = 'idem'"), $(go version)"
mw_bouncer 60

failed=()
# ---- the package's own tests, no database --------------------------------------
t0=$(date +%s%N)
if (cd "$ROOT/clients/go" && go vet ./... && go test -race -count=1 ./...) > "$out/unit.log" 2>&1; then
  echo "ok   clients/go: go vet, go test -race ($(grep -c '^ok' "$out/unit.log") package, $(ms_since "$t0") ms)"
else
  cat "$out/unit.log"; failed+=("clients/go unit tests")
fi

# ---- real servers, real HTTP ------------------------------------------------------
direct="host=$dir port=$PG_PORT user=postgres dbname=mw"
export IDEM_TEST_REQUIRED=1 IDEM_TEST_CHECK_DSN="$direct pool_max_conns=30"
# PgBouncer 1.18 keeps no prepared statements across transactions: pgx's
# exec mode (one unnamed statement per query) is what the README says.
export IDEM_TEST_SERVER_DSNS="direct=$direct pool_max_conns=40|pgbouncer=host=127.0.0.1 port=$PGB_PORT user=postgres dbname=mw pool_max_conns=40 default_query_exec_mode=exec"
export IDEM_TEST_CONFORMANCE="$ROOT/tests/middleware/conformance.json"
t0=$(date +%s%N)
status=0
(cd "$ROOT/clients/go/test" && go vet ./... && go test -race -count=1 -timeout 30m -v ./...) > "$out/test.log" 2>&1 || status=$?
grep -E '^(=== RUN|\s*--- (PASS|FAIL|SKIP)|PASS|FAIL|ok)' "$out/test.log" | grep -vE '^=== RUN|--- PASS: TestMiddleware/[^/]+/conformance/' > "$out/summary.log" || true
grep -E '^\s*--- (FAIL|SKIP)' "$out/test.log" && failed+=("a test failed or was skipped")
[ $status = 0 ] || { tail -60 "$out/test.log"; failed+=("clients/go/test (exit $status)"); }
passed=$(grep -cE '^\s*--- PASS' "$out/test.log" || true)
echo "clients/go/test: $passed tests and subtests passed ($(ms_since "$t0") ms; log: $out/test.log)"
grep -E '^\s{0,4}--- (PASS|FAIL)' "$out/test.log" | grep -v '/conformance/' || true
xacts=$(mw_bouncer_xacts mw)
[ "${xacts:-0}" -gt 0 ] || failed+=("no transaction went through PgBouncer")
echo "summary: PgBouncer: ${xacts:-0} transactions through it, ${#failed[@]} failed, $(ms_since "$t_start") ms in all"
if [ ${#failed[@]} -gt 0 ]; then
  printf 'failed: %s\n' "${failed[@]}"
  exit 1
fi
