#!/usr/bin/env bash
# examples/python-http against the shared cluster: a real HTTP server and real
# HTTP requests with Idempotency-Key headers (psycopg 3). The program checks
# the HTTP answers; this test then checks the database: every payment charged
# exactly once, the stored response equal to the one sent and replayed, the
# declined card stored as a failure with no payment row, keys scoped per client.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
db=ex_python
report=$(mktemp /tmp/ex_python.XXXXXX.json)
cleanup() {
  rm -f "$report"
  psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" 2>/dev/null || true
}
trap cleanup EXIT
psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
psql_idem -q -d $db -c "CREATE EXTENSION idem"

export PGHOST="$(client_host)" PGPORT="$(client_port)" PGUSER=postgres PGDATABASE=$db
t0=$(date +%s%N)
# The program imports idem_http (clients/python) from the source tree.
(cd "$ROOT/examples/python-http" && PYTHONPATH="$ROOT/clients/python/src" "$IDEM_PY" demo.py --report "$report")
echo "program run: $(( ($(date +%s%N) - t0) / 1000000 )) ms"

# The database's side, compared with what the client saw.
"$IDEM_PY" - "$report" <<'PY'
import json, sys
import psycopg

rep = json.load(open(sys.argv[1]))
k1, k2, k3 = rep["keys"]["k1"], rep["keys"]["k2"], rep["keys"]["k3"]
by_label = {e["label"].split(" ")[0] + " " + e["label"].split(" ")[1]: e for e in rep["exchanges"]}
failures = []
def check(cond, msg):
    print(("ok    " if cond else "FAIL  ") + msg)
    if not cond:
        failures.append(msg)

with psycopg.connect() as db:
    def payments(client, key):
        return db.execute("SELECT count(*), coalesce(sum(amount), 0)::text FROM payments WHERE client = %s AND idem_key = %s",
                          (client, key)).fetchone()
    def stored(client, key):
        return db.execute("SELECT state, result FROM idem_lookup(%s, 'payment-api')", (f"{client}/{key}",)).fetchone()

    n, total = payments("shop-1", k1)
    check(n == 1 and total == "42.00", f"key 1 (request, retry, reuse with 43.00): {n} payment(s), {total} charged")
    state, result = stored("shop-1", k1)
    check(state == "completed" and result["status"] == 201, f"key 1 stored as {state}, status {result and result['status']}")
    check(result["body"] == by_label["request 1"]["body"] == by_label["request 2"]["body"],
          "key 1: stored body == body sent to request 1 == body replayed to request 2")
    check(by_label["request 3"]["status"] == 422, f"key 1 reused for 43.00: {by_label['request 3']['status']}")

    n, total = payments("shop-1", k2)
    check(n == 1 and total == "19.90", f"key 2 (request, concurrent retry, late retry): {n} payment(s), {total} charged")
    state, result = stored("shop-1", k2)
    check(by_label["request 5"]["status"] == 409 and by_label["request 5"]["retry_after"] == "1",
          "key 2: the retry during the first request got 409 with Retry-After")
    check(result["body"] == by_label["request 4"]["body"] == by_label["request 6"]["body"],
          "key 2: stored body == body sent to request 4 == body replayed to request 6")

    n, _ = payments("shop-1", k3)
    state, result = stored("shop-1", k3)
    check(n == 0 and state == "failed" and result["status"] == 402,
          f"key 3 (declined card): {n} payment(s), stored as {state}, status {result['status']}")
    check(by_label["request 8"]["status"] == 402 and by_label["request 8"]["replayed"], "key 3: the retry replayed 402")

    n, total = payments("shop-2", k1)
    check(n == 1 and total == "42.00", f"shop-2 with shop-1's key: its own payment ({n}, {total})")

    (all_rows,) = db.execute("SELECT count(*) FROM payments").fetchone()
    bad = [e["status"] for e in rep["exchanges"] if e["label"].split(" ")[1] in ("10", "11", "12")]
    check(all_rows == 3 and bad == [400, 400, 400],
          f"payments in all: {all_rows} for 12 requests; missing/malformed keys: {bad}")

print(f"summary: 12 HTTP requests, 3 payments, {len(failures)} failed check(s)")
sys.exit(1 if failures else 0)
PY
