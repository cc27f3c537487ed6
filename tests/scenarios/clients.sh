#!/usr/bin/env bash
# Clients: the example programs, the Java starter and filter with Kafka, the HTTP middleware in Go, Node and Python, PgBouncer in front of them.
# One scenario per function: bash tests/scenarios/clients.sh NAME (NAME: examples, java_spring, middleware_go, middleware_node, middleware_python, pgbouncer);
# scripts/test.sh runs each as scenario/NAME (tests/lib/scenarios.sh).
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/scenarios.sh"

# The example programs in examples/ against the shared cluster, each checked
# from the database (below, one function per example):
#   bash tests/scenarios/clients.sh examples            every example, each in a process of its own;
#                                               one line "ok: NAME" or "FAIL: NAME" each
#   bash tests/scenarios/clients.sh examples NAME       one of them (java, node, python, rust)
# Their toolchains and drivers: bash scripts/setup.sh --tool examples (and the
# Python venv, scripts/setup.sh --tool python).
scenario_examples() {

# Shared by the examples: each works in a fresh database $db with idem.
fail() { echo "FAIL: $*"; exit 1; }
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
q() { psql_idem -d $db -Atc "$1"; }
new_db() {
  psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
  psql_idem -q -d $db -c "CREATE EXTENSION idem"
}
drop_db() { psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" 2>/dev/null || true; }

# examples/java-payment against the shared cluster (JDBC, Debian's pgjdbc):
# a payment call whose answer to COMMIT is lost on the network, retried with
# the request key made before the retry loop. Checks from the database: the
# card was charged once, the retry got the stored result of the committed
# charge; and the labelled anti-pattern (a key per attempt) charged twice.
example_java() {
db=ex_java
work=$(mktemp -d /tmp/ex_java.XXXXXX)
cleanup() {
  rm -rf "$work"
  drop_db
}
trap cleanup EXIT
JDBC=/usr/share/java/postgresql.jar
[ -f "$JDBC" ] || fail "$JDBC missing: run bash scripts/setup.sh --tool examples"

new_db

t0=$(date +%s%N)
javac -d "$work/classes" "$ROOT/examples/java-payment/PaymentRetry.java"
echo "javac: $(ms "$t0") ms"
export PGHOST="$(client_host)" PGPORT="$(client_port)" PGUSER=postgres PGDATABASE=$db
t0=$(date +%s%N)
java -cp "$work/classes:$JDBC" PaymentRetry | tee "$work/log"
echo "program run: $(ms "$t0") ms"

# The right way: one charge, and the client's answer is that charge's stored result.
[ "$(q "SELECT count(*) FROM card_charges WHERE order_no LIKE 'ORD-%-A'")" = 1 ] \
  || fail "order A charged $(q "SELECT count(*) FROM card_charges WHERE order_no LIKE 'ORD-%-A'") times, not once"
key=$(q "SELECT request_key FROM card_charges WHERE order_no LIKE 'ORD-%-A'")
answer=$(sed -n "s/^client's answer for ORD-.*-A: //p" "$work/log")
[ -n "$answer" ] || fail "no answer for order A in the program's output"
check=$(q "SELECT r.state || ' ' || (r.result = '$answer'::jsonb) || ' ' || ((r.result->>'charge_id')::bigint = c.id)
             FROM idem_lookup('$key', 'card-charge') r, card_charges c WHERE c.order_no LIKE 'ORD-%-A'")
[ "$check" = "completed true true" ] || fail "order A: stored claim vs client's answer vs charge row: $check"
grep -q "^attempt 1: no answer to COMMIT" "$work/log" || fail "the first attempt's answer was not lost"
grep -q "^attempt 2: replayed" "$work/log" || fail "the second attempt did not replay"
# The anti-pattern: the lost answer plus a new key per attempt = a second charge.
[ "$(q "SELECT count(DISTINCT request_key) || '/' || count(*) FROM card_charges WHERE order_no LIKE 'ORD-%-B'")" = 2/2 ] \
  || fail "order B (key inside the loop) was expected to be charged twice under two keys"
echo "summary: order A (key before the loop): answer to COMMIT lost, retry replayed, charged 1 time;" \
     "order B (ANTI-PATTERN, key inside the loop): charged $(q "SELECT count(*) FROM card_charges WHERE order_no LIKE 'ORD-%-B'") times"
}

# examples/node-consumer against the shared cluster (node-postgres): an order
# event stream with duplicates, out-of-order events (SHIPPED before PAID,
# PAID before CREATED, a late PAID after SHIPPED) and a crash (SIGKILL)
# between the database commit and the offset commit, then a restart that gets
# the uncommitted events redelivered. Checks from the database: every order
# ends SHIPPED and every side effect (outbox row) exists exactly once.
example_node() {
db=ex_node
dir="$ROOT/examples/node-consumer"
work=$(mktemp -d /tmp/ex_node.XXXXXX)
cleanup() {
  rm -rf "$work"
  drop_db
}
trap cleanup EXIT
[ -f "$dir/node_modules/pg/package.json" ] || fail "examples/node-consumer/node_modules missing: run bash scripts/setup.sh --tool examples"

new_db
export PGHOST="$(client_host)" PGPORT="$(client_port)" PGUSER=postgres PGDATABASE=$db
events=$(grep -c . "$dir/events.jsonl")

# Run 1 dies right after offset 8's transaction committed.
t0=$(date +%s%N)
set +e
node "$dir/consumer.js" --topic "$dir/events.jsonl" --offsets "$work/offsets.json" --crash-after 8 | tee "$work/run1"
rc=${PIPESTATUS[0]}
set -e
echo "run 1: exit $rc after $(ms "$t0") ms, committed offset $(cat "$work/offsets.json")"
[ "$rc" = 137 ] || fail "run 1 was to be killed by SIGKILL (exit 137), exited $rc"
# Offset 7 (order 1003 PAID, early) is parked, so the committed offset stays
# at 7 although offset 8 (order 1003 CREATED) committed in the database.
[ "$(cat "$work/offsets.json")" = '{"committed":7}' ] || fail "committed offset after the crash: $(cat "$work/offsets.json")"
[ "$(q "SELECT status FROM orders WHERE id = '1003'")" = CREATED ] || fail "offset 8 had not committed before the crash"
before=$(q "SELECT count(*) FROM outbox")

# Run 2: offsets 7 and 8 are delivered again, then the rest of the log.
t0=$(date +%s%N)
node "$dir/consumer.js" --topic "$dir/events.jsonl" --offsets "$work/offsets.json" | tee "$work/run2"
echo "run 2: $(ms "$t0") ms, committed offset $(cat "$work/offsets.json")"
[ "$(cat "$work/offsets.json")" = "{\"committed\":$events}" ] || fail "run 2 did not consume the whole log"
grep -q "^offset 8 ev-07 order 1003 CREATED: already" "$work/run2" || fail "the redelivered offset 8 was not dropped as a duplicate"

# The database: final states, and each side effect exactly once.
[ "$(q "SELECT string_agg(id || '=' || status, ' ' ORDER BY id) FROM orders")" = "1001=SHIPPED 1002=SHIPPED 1003=SHIPPED" ] \
  || fail "final states: $(q "SELECT string_agg(id || '=' || status, ' ' ORDER BY id) FROM orders")"
dups=$(q "SELECT count(*) FROM (SELECT order_id, effect FROM outbox GROUP BY 1, 2 HAVING count(*) > 1) d")
[ "$dups" = 0 ] || fail "$dups side effect(s) happened more than once: $(q "SELECT order_id, effect, count(*) FROM outbox GROUP BY 1, 2 HAVING count(*) > 1")"
[ "$(q "SELECT count(*) FROM outbox")" = 9 ] || fail "expected 9 side effects (3 orders x 3 states), got $(q "SELECT count(*) FROM outbox")"
# The parked SHIPPED of 1002 was applied once, after its PAID.
[ "$(q "SELECT string_agg(effect, ',' ORDER BY id) FROM outbox WHERE order_id = '1002'")" = reserve_stock,send_receipt,notify_customer ] \
  || fail "order 1002's side effects out of order"
verdicts=$(cat "$work/run1" "$work/run2" | sed -n 's/^offset [0-9]* [^:]*: \([a-z]*\).*/\1/p' | sort | uniq -c | tr -s ' ' | paste -sd, -)
echo "summary: $events events, 2 runs (one killed), deliveries by verdict:$verdicts; side effects: $before before the crash, $(q "SELECT count(*) FROM outbox") in all, none twice; orders: $(q "SELECT string_agg(id || ' ' || status, ', ' ORDER BY id) FROM orders")"
}

# examples/python-http against the shared cluster: a real HTTP server and real
# HTTP requests with Idempotency-Key headers (psycopg 3). The program checks
# the HTTP answers; this test then checks the database: every payment charged
# exactly once, the stored response equal to the one sent and replayed, the
# declined card stored as a failure with no payment row, keys scoped per client.
example_python() {
db=ex_python
report=$(mktemp /tmp/ex_python.XXXXXX.json)
cleanup() {
  rm -f "$report"
  drop_db
}
trap cleanup EXIT
new_db

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
}

# examples/rust-batch against the shared cluster (tokio-postgres): a batch
# job that claims its run with a lease and checkpoints every item in the
# item's own transaction. The test kills it (SIGKILL) mid-batch, runs it
# again and checks from the database: every item settled exactly once, the
# checkpoint at the kill equal to the last item that committed, the rerun
# starting right after that checkpoint, and a third run doing nothing. The
# kill point is announced by the program itself (--hang-at-item: it stops
# inside an item's transaction before COMMIT and says so), so the outcome
# is known exactly and no verdict depends on timing.
example_rust() {
db=ex_rust
dir="$ROOT/examples/rust-batch"
items=120
job="daily_settle:2026-11-30:shard-3"
work=$(mktemp -d /tmp/ex_rust.XXXXXX)
pid=
cleanup() {
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
  rm -rf "$work"
  drop_db
}
trap cleanup EXIT

t0=$(date +%s%N)
(cd "$dir" && cargo build --locked --quiet --target-dir "$dir/target$IDEM_OS_SUFFIX")
echo "cargo build (dev profile, no debug info; incremental): $(ms "$t0") ms"
bin="$dir/target$IDEM_OS_SUFFIX/debug/idem-example-batch"

new_db
export PGHOST="$(client_host)" PGPORT="$(client_port)" PGUSER=postgres PGDATABASE=$db
args=(--job "$job" --items $items --item-ms 15 --lease-secs 2)

# Run 1, killed (SIGKILL) at a point the program announces: in item 40's
# transaction, its settlement and checkpoint written, not committed. Nothing
# here depends on timing: the test waits for the line, then kills.
hang=40
t0=$(date +%s%N)
"$bin" "${args[@]}" --hang-at-item $hang > "$work/run1" 2>&1 &
pid=$!
for _ in $(seq 1 6000); do     # (a safety limit of 10 minutes, for a program that hangs elsewhere)
  grep -q "^item $hang: written, not committed; hanging until killed" "$work/run1" && break
  kill -0 $pid 2>/dev/null || fail "run 1 ended before item $hang: $(cat "$work/run1")"
  sleep 0.1
done
grep -q "^item $hang: written, not committed" "$work/run1" || fail "run 1 never reached item $hang: $(cat "$work/run1")"
kill -9 $pid
wait $pid 2>/dev/null || true
pid=
cat "$work/run1"
echo "run 1: killed (SIGKILL) in item $hang's transaction after $(ms "$t0") ms"
# The dead client's backend rolls item $hang back when it sees the
# connection closed: wait until it is gone before reading.
for _ in $(seq 1 600); do
  [ "$(q "SELECT count(*) FROM pg_stat_activity WHERE datname = '$db' AND application_name = 'idem-example-batch'")" = 0 ] && break
  sleep 0.1
done
[ "$(q "SELECT count(*) FROM pg_stat_activity WHERE datname = '$db' AND application_name = 'idem-example-batch'")" = 0 ] \
  || fail "the killed client's backend is still there after 60 s"
# The settlements and what the claim says (idem_leases, the operators' view
# of live leases), in one snapshot.
IFS='|' read -r count last checkpoint < <(q "SELECT (SELECT count(*) FROM settlements WHERE attempt = 1),
                                                   (SELECT max(item) FROM settlements WHERE attempt = 1),
                                                   (SELECT recovery_data->>'last_item' FROM idem_leases
                                                     WHERE key = '$job' AND biz_type = 'batch')")
echo "at the kill: $count items settled, the last one $last; checkpoint in the claim: $checkpoint"
[ "$count|$last|$checkpoint" = "$((hang - 1))|$((hang - 1))|$((hang - 1))" ] \
  || fail "expected items 1..$((hang - 1)) settled and checkpoint $((hang - 1)) (item $hang rolled back with its checkpoint), got $count items, last $last, checkpoint $checkpoint"

# Run 2: waits out the dead run's lease, takes over, resumes after the checkpoint.
t0=$(date +%s%N)
"$bin" "${args[@]}" | tee "$work/run2"
echo "run 2: $(ms "$t0") ms (including the wait for the lease to run out)"
grep -q "took the claim over (attempt 2): the last committed checkpoint is item $checkpoint, resuming at item $((checkpoint + 1))" "$work/run2" \
  || fail "run 2 did not resume from checkpoint $checkpoint"
[ "$(q "SELECT min(item) FROM settlements WHERE attempt = 2")" = $((checkpoint + 1)) ] \
  || fail "run 2's first item is $(q "SELECT min(item) FROM settlements WHERE attempt = 2"), not $((checkpoint + 1))"

# Run 3: the job is completed; nothing happens.
"$bin" "${args[@]}" | tee "$work/run3"
grep -q "already completed" "$work/run3" || fail "run 3 did not see the job completed"

# Every item exactly once.
stats=$(q "SELECT count(*) || '|' || count(DISTINCT item) || '|' || min(item) || '|' || max(item) FROM settlements")
[ "$stats" = "$items|$items|1|$items" ] || fail "settlements (rows|distinct|min|max): $stats, expected $items|$items|1|$items"
twice=$(q "SELECT count(*) FROM (SELECT item FROM settlements GROUP BY item HAVING count(*) > 1) t")
[ "$twice" = 0 ] || fail "$twice item(s) settled twice"
[ "$(q "SELECT state || ' ' || (result->>'items') FROM idem_lookup('$job', 'batch')")" = "completed $items" ] \
  || fail "the job's claim: $(q "SELECT state, result FROM idem_lookup('$job', 'batch')")"
echo "summary: $items items, run 1 killed after item $checkpoint, run 2 resumed at item $((checkpoint + 1))," \
     "$(q "SELECT count(*) FROM settlements WHERE attempt = 2") items in run 2; every item settled once; run 3 did nothing"
}


if [ $# -gt 0 ]; then
  "example_$1"
  exit
fi
failed=0
for name in java node python rust; do
  say "example: $name"
  if bash "${BASH_SOURCE[0]}" examples "$name"; then echo "ok: $name"; else echo "FAIL: $name"; failed=$((failed + 1)); fi
done
echo "examples failed: $failed"
[ "$failed" = 0 ]
}

# clients/java (the Spring Boot starter: @Idempotent, and the
# Idempotency-Key filter of Spring MVC) built offline with Maven from the
# repository scripts/setup.sh --tool java filled, in a copy of the folder,
# under Spring Boot 3.5 and 4.0 at once (each its own database; one Kafka
# broker), against this scenario's own cluster (port 5441, or
# JAVA_SPRING_PORT) and PgBouncer in transaction mode in front of it (the
# next port). The build
# runs the starter's own tests (a call outside a transaction is refused
# before it runs; the conformance table's canonical JSON, body and target
# pairs and problem types) and clients/java/it:
#   * StarterRulesTest in process (a claim whose method threw never
#     commits, read-only refused, TransactionTemplate);
#   * ExampleAppTest: the README's example application started from its
#     jar (java -jar), driven over HTTP, verdicts from the business rows:
#     20 concurrent duplicates (JdbcTemplate; JPA and JdbcTemplate in one
#     transaction) make one row and one answer, a retry replays, another
#     payload gets ID001, a rollback in the method leaves no claim, a
#     duplicate of an open first call gets 409 after idem.wait-timeout,
#     SIGKILL mid-handler and after COMMIT (at states the app reports) then
#     a retry: one charge;
#   * ConformanceTest: the Java runner of tests/middleware/conformance.json
#     (the rules of docs/http.md, shared with the Python, Node and Go
#     clients: 400s, tenants whose names collide kept apart, 401/403/429/5xx
#     not stored and the retry runs, 409 + Retry-After, 422, 503, claims
#     finished by other code, lease mode) against the conformance server's
#     jar (the filter on Spring MVC), connected directly and through
#     PgBouncer; 20 concurrent duplicates through each: one business row,
#     one answer; a lease takeover through each: the recovery point given;
#   * KafkaLedgerTest (under both Boot lines): the Kafka example's jar
#     against a real KRaft broker, SIGKILLed after COMMIT before the ack,
#     and across rebalances: every event booked once;
#   * then the filter's exchanges with PostgreSQL per request, counted by a
#     protocol proxy (tests/middleware/roundtrips.py): 4 per new key, 3 per
#     replay, of which the client waits for 3 and 2 (clients/java/README.md).
# it/'s test classes run at once (it/src/test/resources/junit-platform.properties).
# A failing JUnit test fails the build and this scenario.
scenario_java_spring() {
source "$ROOT/tests/lib/cluster.sh"
source "$ROOT/tests/lib/middleware.sh"   # (mw_roundtrips; it sets work= as it is read)
# Each Boot line has its own database; they share one Kafka broker, each
# test run on topics and consumer groups of its own (KafkaLedgerTest): the
# two lines run at once (their test phases wait on applications, the broker
# and locks much of the time), neither seeing the other's rows or events.
dbs=(java_spring java_spring_4)
# Four TCP ports from JAVA_SPRING_PORT (default 5441) on: the cluster (on
# 127.0.0.1, which pgJDBC reaches without the tests' socket forwarder),
# PgBouncer, then the broker's listener and controller.
PG_PORT=${JAVA_SPRING_PORT:-5441}
PGB_PORT=$((PG_PORT + 1))
work= kafka_pids=()
cleanup() {
  local p
  for p in "${kafka_pids[@]}"; do kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null || true; done
  # An application the test started and could not stop (the test died): by this run's path.
  [ -z "$work" ] || kill_matching " -jar $work/"
  pgb_stop
  pc_stop
  [ -z "$work" ] || rm -rf "$work"
  return 0
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
command -v mvn >/dev/null || fail "mvn missing: run bash scripts/setup.sh --tool java"
[ -x /usr/sbin/pgbouncer ] || fail "pgbouncer missing: run bash scripts/setup.sh --tool pgbouncer"
# Every POM parses, the broker's too, which only a machine without the
# broker's jars reads (scripts/setup.sh's tool java): an XML comment with a
# double hyphen in it stopped a fresh machine's set-up.
python3 - "$ROOT" <<'PY' || fail "a POM under clients/java does not parse"
import glob, sys, xml.dom.minidom
for p in glob.glob(sys.argv[1] + "/clients/java/**/pom.xml", recursive=True):
    try:
        xml.dom.minidom.parse(p)
    except Exception as e:
        sys.exit(f"{p}: {e}")
PY
t_start=$(date +%s)
work=$(mktemp -d /tmp/java_spring.XXXXXX)

pc_init "$(cluster_dir)/java-spring" $PG_PORT "max_connections = 300" "listen_addresses = '127.0.0.1'"
pc_start
for db in "${dbs[@]}"; do
  pc_psql -q -d postgres -c "CREATE DATABASE $db"
  pc_psql -q -d $db <<'SQL'
CREATE EXTENSION idem;
-- tests/middleware/README.md, "The server a runner needs"
CREATE TABLE conformance_rows (id bigserial PRIMARY KEY, run text NOT NULL, tenant text, status int NOT NULL);
CREATE FUNCTION raise_sqlstate(code text) RETURNS void LANGUAGE plpgsql AS
  $$ BEGIN RAISE EXCEPTION 'failure % raised by the test handler', code USING ERRCODE = code; END $$;
SQL
done
pgb_start $PGB_PORT 60

# The Kafka broker: Kafka 4.1 in KRaft mode (one node, broker and
# controller), its own process, as operators run it; the jars are Maven
# Central's (scripts/setup.sh --tool java). It starts while Maven builds;
# KafkaLedgerTest waits until it answers.
[ -f "$IDEM_KAFKA_LIBS/.complete" ] || fail "no Kafka broker in $IDEM_KAFKA_LIBS: run bash scripts/setup.sh --tool java"
# C1 only and the serial collector: a JVM that lives minutes on 2 busy cores
# spends less CPU so.
java_quick="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
kafka_java=(java -Xmx512m $java_quick -cp "$IDEM_KAFKA_LIBS/*")
kafka_start() { # NAME PORT (its controller: PORT + 1)
  local dir="$work/kafka-$1"
  mkdir -p "$dir"
  cat > "$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$(($2 + 1))
listeners=PLAINTEXT://127.0.0.1:$2,CONTROLLER://127.0.0.1:$(($2 + 1))
advertised.listeners=PLAINTEXT://127.0.0.1:$2
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$dir/data
offsets.topic.replication.factor=1
offsets.topic.num.partitions=2
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
PROPS
  ("${kafka_java[@]}" kafka.tools.StorageTool format -c "$dir/server.properties" \
     --cluster-id="$(python3 -c 'import base64, uuid
while True:  # (an id that starts with "-" would read as an option)
    i = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    if not i.startswith("-"): break
print(i)')" \
     > "$dir/format.log" 2>&1 && exec "${kafka_java[@]}" kafka.Kafka "$dir/server.properties") > "$dir/broker.log" 2>&1 &
  kafka_pids+=($!)
}
kafka_start broker $((PG_PORT + 2))

# The README's application is the one tested: each block it marks with
# "<!-- file: PATH -->" is that file, to the byte.
python3 - "$ROOT/clients/java" <<'PY' || fail "clients/java/README.md and the example's files differ"
import pathlib, re, sys
root = pathlib.Path(sys.argv[1])
blocks = re.findall(r"<!-- file: (\S+) -->\n```[a-z]*\n(.*?)```\n", (root / "README.md").read_text(), re.S)
bad = [path for path, text in blocks if (root / path).read_text() != text]
print(f"README: {len(blocks)} files shown, {len(bad)} differ {bad or ''}")
sys.exit(1 if bad or len(blocks) < 8 else 0)
PY
# Spring Boot 3.5 runs every test; 4.0 (the same code: its Jackson 3
# mapper, Hibernate 7, Spring MVC 7, Spring Kafka 4) what differs by Boot
# line: the starter's tests, the example's first tests (the JSON round
# trip, JdbcTemplate, JPA, ID001, the filter's route) through one start,
# the conformance table through the direct server, and the Kafka consumer
# (PgBouncer's path is the same code on both lines; it runs under 3.5).
pass() { # boot-version database tests-expected surefire-filter("": all) jackson-major conformance-via
  local boot=$1 db=$2 expected=$3 filter=$4 jackson=$5 via=$6 dir="$work/boot-$1"
  mkdir -p "$dir"
  tar -C "$ROOT/clients/java" --exclude=target -cf - . | tar -C "$dir" -xf -
  local t0=$(date +%s)
  # Maven and the tests' JVMs started as the broker and the applications
  # (ExampleApp) are: less CPU for JVMs that live a minute or two.
  if ! (cd "$dir" && MAVEN_OPTS="$java_quick" mvn_idem -o verify -DargLine="$java_quick" -Dspring-boot.version=$boot -Didem.it.pghost=127.0.0.1 \
          -Didem.it.pgport=$PG_PORT -Didem.it.database=$db -Didem.it.pgbouncer=127.0.0.1:$PGB_PORT -Didem.it.kafka=127.0.0.1:$((PG_PORT + 2)) \
          -Didem.it.conformance="$ROOT/tests/middleware/conformance.json" -Didem.it.conformance-via=$via ${filter:+"-Dtest=$filter" -Dsurefire.failIfNoSpecifiedTests=false}) > "$dir/mvn.log" 2>&1; then
    grep -E "Tests run:|FAIL|ERROR" "$dir/mvn.log" | grep -v "^\s*at " | sed -n 1,60p
    for f in "$dir"/it/target/app-logs/*.log; do [ -f "$f" ] && { echo "--- $f (last lines)"; tail -20 "$f"; }; done
    fail "Boot $boot: mvn verify of clients/java failed (log above)"
  fi
  echo "Boot $boot: mvn verify $(( $(date +%s) - t0 )) s (its tests started $(( $(stat -c %Y "$dir/it/target/test-classes") - t0 )) s in)"
  # The tests ran (not skipped by a property): Surefire's reports say how many.
  local report
  for report in idem-spring-boot-starter/target/surefire-reports/TEST-dev.idem.spring.OutsideTransactionTest.xml \
                idem-spring-boot-starter/target/surefire-reports/TEST-dev.idem.spring.web.ConformancePairsTest.xml \
                it/target/surefire-reports/TEST-dev.idem.it.StarterRulesTest.xml \
                it/target/surefire-reports/TEST-dev.idem.it.ExampleAppTest.xml \
                it/target/surefire-reports/TEST-dev.idem.it.ConformanceTest.xml \
                it/target/surefire-reports/TEST-dev.idem.it.KafkaLedgerTest.xml; do
    [ -f "$dir/$report" ] || fail "Boot $boot: no report $report"
    local counts=$(head -3 "$dir/$report" | grep -o 'testsuite [^>]*' | grep -oE '(tests|failures|errors|skipped)="[0-9]+"|time="[0-9.,]+"' | tr '\n' ' ')
    echo "  $counts($(basename "$report" .xml | sed 's/^TEST-//'))"
    case "$counts" in *'failures="0"'*'errors="0"'*|*'errors="0"'*'failures="0"'*) ;; *) fail "Boot $boot: $report: failures or errors";; esac
    case "$counts" in *'skipped="0"'*) ;; *) fail "Boot $boot: $report: skipped tests";; esac
  done
  case "$(head -3 "$dir/it/target/surefire-reports/TEST-dev.idem.it.ExampleAppTest.xml")" in
    *"tests=\"$expected\""*) ;; *) fail "Boot $boot: ExampleAppTest did not run its $expected tests";; esac
  # Every case of the table, through each server, and 20 duplicates and a lease takeover through each.
  local cases=$(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["cases"]))' "$ROOT/tests/middleware/conformance.json")
  local servers=$(echo "$via" | tr ',' '\n' | wc -l)
  case "$(head -3 "$dir/it/target/surefire-reports/TEST-dev.idem.it.ConformanceTest.xml")" in
    *"tests=\"$(( servers * (cases + 2) ))\""*) ;; *) fail "Boot $boot: ConformanceTest did not run the table's $cases cases via $via";; esac
  echo "  the conformance table: all $cases cases through each server ($via), none skipped"
  # The application's mapper is the one of its Boot line.
  grep -qh "Spring Boot ::  *(v$boot)" "$dir"/it/target/app-logs/*.log || fail "Boot $boot: the application did not run on $boot"
  grep -qh "results as JSON through the application's Jackson $jackson ObjectMapper" "$dir"/it/target/app-logs/*.log \
    || fail "Boot $boot: results not through the application's Jackson $jackson mapper"
}
echo "set-up (cluster, databases, PgBouncer): $(( $(date +%s) - t_start )) s"
pass 3.5.7 ${dbs[0]} 6 "" 2 direct,pgbouncer > "$work/pass-3.5.7.out" 2>&1 &
pass_pids=($!)
pass 4.0.7 ${dbs[1]} 3 "OutsideTransactionTest,ConformancePairsTest,StarterRulesTest,ExampleAppTest#twentyConcurrentDuplicatesChargeOnce+jpaAndJdbcTemplateInTheClaimsTransaction+idempotencyKeyFilterRoute,ConformanceTest,KafkaLedgerTest" 3 direct \
  > "$work/pass-4.0.7.out" 2>&1 &
pass_pids+=($!)
failed=0
for i in 0 1; do wait "${pass_pids[$i]}" || failed=1; done
cat "$work/pass-3.5.7.out" "$work/pass-4.0.7.out"
[ $failed = 0 ] || fail "a Boot line failed (above)"
xacts=$("$PG_BIN/psql" -X -h 127.0.0.1 -p $PGB_PORT -U postgres -d pgbouncer -Atc "SHOW STATS" -F '|' | awk -F'|' -v db=${dbs[0]} '$1 == db {print $2}')
[ "${xacts:-0}" -gt 0 ] || fail "no transaction went through PgBouncer"
for db in "${dbs[@]}"; do
  q() { pc_psql -d $db -Atc "$1"; }
  # Across every test: no request id was charged or ordered twice, no event booked twice.
  dups=$(q "SELECT (SELECT count(*) FROM (SELECT 1 FROM payments GROUP BY request_id HAVING count(*) > 1) p)
                + (SELECT count(*) FROM (SELECT 1 FROM shop_orders GROUP BY request_id HAVING count(*) > 1) o)
                + (SELECT count(*) FROM (SELECT 1 FROM ledger_entries GROUP BY event_id HAVING count(*) > 1) l)")
  [ "$dups" = 0 ] || fail "$db: $dups request or event ids have more than one business row"
  echo "$db: $(q "SELECT count(*) FROM payments") payments, $(q "SELECT count(*) FROM shop_orders") orders," \
    "$(q "SELECT count(*) FROM ledger_entries") ledger entries, one per request or event id"
done
# The Spring MVC filter's exchanges with PostgreSQL per request, counted by
# the protocol proxy the other middleware's scenarios use
# (tests/middleware/roundtrips.py), one pooled connection whose liveness
# checks are counted apart: 4 per new key, 3 per replay. pgJDBC sends a
# transaction's BEGIN as a simple query of its own and the first statement
# right behind it, without waiting for BEGIN's answer, so the proxy, which
# counts each Sync or simple query, sees one exchange more than the client
# waits for (3 and 2: BEGIN with the claim; the handler's insert; the
# stored response with COMMIT; clients/java/README.md).
dir=$PC_DIR MW_DB=${dbs[0]}
mw_roundtrips "java filter" 4 3 clients/java/README.md -- java $java_quick -jar "$work/boot-3.5.7/conformance-server/target/idem-conformance-server.jar" \
  --server.port={httpport} "--spring.datasource.url=jdbc:postgresql://127.0.0.1:{pgport}/$MW_DB?user=postgres" \
  --spring.datasource.hikari.maximum-pool-size=1 || fail "the Spring MVC filter's round trips per request (above)"
echo "PgBouncer: $xacts transactions; $(( $(date +%s) - t_start )) s in all"
}

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
#   * the complete app of clients/go/README.md, built and run as written;
#   * the round trips to PostgreSQL per request, counted by a protocol proxy
#     (tests/middleware/roundtrips.py): 3 per new key, 2 per replay, with
#     pgx's statement cache and with exec mode.
# No verdict by the clock: every wait is for an observed state. Exits 1 on
# any failure.
scenario_middleware_go() {
source "$ROOT/tests/lib/cluster.sh"
source "$ROOT/tests/lib/middleware.sh"
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

# ---- round trips to PostgreSQL per request, counted by a proxy ----------------
# (clients/go/README.md): the same server, without -race, its pool of one
# connection, with pgx's statement cache and with exec mode (PgBouncer's).
(cd "$ROOT/clients/go/test" && go build -o "$work/rt-server" ./server) || failed+=("building the round-trip server")
for mode in "" " default_query_exec_mode=exec"; do
  mw_roundtrips "go nethttp$mode" 3 2 clients/go/README.md -- \
    env IDEM_TEST_DSN="host=127.0.0.1 port={pgport} user=postgres dbname=mw pool_max_conns=1$mode" \
    IDEM_TEST_ADDR=127.0.0.1:{httpport} IDEM_TEST_SIGNAL=/dev/null IDEM_TEST_PROBLEM_BASE=https://idem.invalid/ \
    "$work/rt-server" -router nethttp || failed+=("go round trips$mode")
done
xacts=$(mw_bouncer_xacts mw)
[ "${xacts:-0}" -gt 0 ] || failed+=("no transaction went through PgBouncer")
echo "summary: PgBouncer: ${xacts:-0} transactions through it, ${#failed[@]} failed, $(ms_since "$t_start") ms in all"
if [ ${#failed[@]} -gt 0 ]; then
  printf 'failed: %s\n' "${failed[@]}"
  exit 1
fi
}

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
# taken over after the process died; then the round trips to PostgreSQL per
# request, counted by a protocol proxy (tests/middleware/roundtrips.py): 3
# per new key, 2 per replay. Also type-checks the package's .d.ts with tsc.
# Its own cluster (a socket in its folder) and PgBouncer (a free loopback
# port).
# Needs bash scripts/setup.sh --tool middleware-node (npm cache) and pgbouncer.
scenario_middleware_node() {
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
# Round trips to PostgreSQL per request (clients/node/README.md), counted by a proxy.
for framework in express fastify; do
  [[ " $runs " == *" $framework-direct "* ]] || continue
  echo "== $framework: round trips to PostgreSQL =="
  mw_roundtrips "node $framework" 3 2 clients/node/README.md -- \
    env PGHOST=127.0.0.1 PGPORT={pgport} node "$work/app/server.js" $framework || failed+=("$framework round trips")
done
xacts=$(mw_bouncer_xacts mw)
[[ "$runs" != *pgbouncer* ]] || [ "${xacts:-0}" -gt 0 ] || failed+=("no transaction went through PgBouncer")
echo "summary: runs $runs (PgBouncer: $xacts transactions through it), ${#failed[@]} failed, $(ms_since "$t_start") ms in all"
if [ ${#failed[@]} -gt 0 ]; then
  printf 'failed: %s\n' "${failed[@]}"
  exit 1
fi
}

# The Python middleware package (clients/python, "idem-http") as users get it:
# its wheel is built and installed into a fresh venv with FastAPI, uvicorn,
# Django, SQLAlchemy and httpx (from the wheelhouse that `bash scripts/setup.sh
# --tool middleware_python` downloaded from PyPI), then three real servers on
# loopback (uvicorn + FastAPI with the ASGI middleware, Django's runserver with
# its middleware and ATOMIC_REQUESTS, uvicorn + SQLAlchemy sessions) are sent
# real HTTP requests (httpx) against this scenario's own PostgreSQL cluster
# with idem, first directly and then through PgBouncer in transaction mode.
# tests/middleware/python/driver.py checks, per server:
#   * 20 concurrent identical requests -> one business row and 20 identical
#     201s (wait mode), or one 201 and 19 x 409 + Retry-After (409 mode);
#     held at a gate (an advisory lock) until pg_stat_activity shows the 19
#     duplicates waiting in idem_claim;
#   * the server killed (SIGKILL) before COMMIT and after COMMIT, at a
#     test-only hook that signals on a FIFO and blocks: the retry runs the
#     operation, or gets the stored answer; one row either way;
#   * a changed body -> 422, nothing written; a missing / malformed key -> 400;
#     a handler exception -> 500, nothing stored, the retry runs; SQLSTATE 40001
#     -> 503 + Retry-After; a stored business failure (422) replayed; another
#     tenant's same key is its own claim; a streamed response passed through
#     unstored; lease mode (FastAPI, Django), with a server killed after an
#     external call's recovery point: the retry takes the lease over once
#     idem_leases shows it ran out, and does not call again.
# Then the round trips to PostgreSQL per request, counted by a protocol
# proxy (tests/middleware/roundtrips.py): 3 per new key (Django's
# ATOMIC_REQUESTS: 5, with SAVEPOINT and RELEASE), 2 per replay.
# Before the servers: the package's own tests (clients/python/tests) and
# mypy --strict on the installed package (its py.typed hints).
# No verdict by the clock: every wait is for an observed state. Exits 1 on
# any failure.
scenario_middleware_python() {
source "$ROOT/tests/lib/cluster.sh"
source "$ROOT/tests/lib/middleware.sh"
WHEELHOUSE="$ROOT/.venv-wheels$IDEM_OS_SUFFIX/middleware-python"
mw_begin middleware-python
# A test server left behind by a driver that died: this run's own, by the
# path of this run's venv.
MW_KILL+=("^$work/venv/bin/python -m \(uvicorn\|django\) ")
HTTP_PORT=$(free_port)

bash "$ROOT/scripts/setup.sh" --tool middleware_python   # a no-op once the wheelhouse is complete

# ---- the package, built and installed as a user would ------------------------
say "building idem-http's wheel and installing it into a fresh venv"
cp -r "$ROOT/clients/python" "$work/src"
venv="$work/venv"
python3 -m venv "$venv"
export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELHOUSE" PIP_DISABLE_PIP_VERSION_CHECK=1
"$venv/bin/pip" install -q build
"$venv/bin/python" -m build --wheel --outdir "$work/dist" "$work/src" > "$out/build.log" 2>&1 || { cat "$out/build.log"; exit 1; }
wheel=$(ls "$work"/dist/idem_http-*.whl)
echo "built $(basename "$wheel")"
"$venv/bin/pip" install -q "$wheel[fastapi,django,sqlalchemy]" "psycopg[binary]" psycopg-pool uvicorn httpx
installed=$(cd "$work" && "$venv/bin/python" -c "import idem_http, os; print(os.path.dirname(idem_http.__file__))")
case "$installed" in
  "$venv"/lib/python3*/site-packages/idem_http) echo "idem_http imported from $installed" ;;
  *) echo "FAIL idem_http imported from $installed, not the installed wheel"; exit 1 ;;
esac
[ -f "$installed/py.typed" ] || { echo "FAIL the wheel has no py.typed"; exit 1; }
(cd "$work" && "$venv/bin/python" "$ROOT/clients/python/tests/test_policy.py")
# The installed package's type hints, as a user's type checker reads them.
"$venv/bin/pip" install -q mypy
printf '[mypy]\nstrict = True\n[mypy-django.*]\nignore_missing_imports = True\n' > "$work/mypy.ini"
(cd "$work" && "$venv/bin/mypy" --config-file mypy.ini -p idem_http) || { echo "FAIL mypy --strict on the installed idem_http"; exit 1; }

# ---- the cluster and PgBouncer (transaction mode) ---------------------------
PG_PORT=5570
mw_cluster $PG_PORT mw "max_connections = 120"
mw_bouncer 40

# ---- the servers, directly and through PgBouncer ----------------------------
direct="host=$dir port=$PG_PORT dbname=mw user=postgres"
bouncer="host=127.0.0.1 port=$PGB_PORT dbname=mw user=postgres"
failed=()
# The core claim API (sync and async), on both paths.
for conninfo in "$direct" "$bouncer"; do
  say "the claim API: $conninfo"
  (cd "$work" && "$venv/bin/python" "$ROOT/clients/python/tests/test_claim_db.py" "$conninfo") \
    || failed+=("the claim API ($conninfo)")
done
fifo="$work/signal"
mkfifo "$fifo"
for target in direct pgbouncer; do
  conninfo=$([ $target = direct ] && echo "$direct" || echo "$bouncer")
  for server in fastapi django sqlalchemy; do
    say "$server, $target"
    if (cd "$work" && "$venv/bin/python" "$ROOT/tests/middleware/python/driver.py" \
          $server $HTTP_PORT "$conninfo" "$direct" $target "$fifo") 2>&1 | tee "$out/$server-$target.log"; then
      :
    fi
    grep -q "^summary \[$server, $target\]: [0-9]* checks, 0 failed" "$out/$server-$target.log" \
      || failed+=("$server through $target")
  done
done
# The README's example apps, as they are (clients/python/examples): auth,
# rate limit (and Django's CSRF) placed as the README says.
for example in fastapi django; do
  say "the README's $example example"
  (cd "$work" && "$venv/bin/python" "$ROOT/tests/middleware/python/examples.py" $example $HTTP_PORT "$direct") \
    2>&1 | tee "$out/example-$example.log"
  grep -q "^summary \[$example example\]: [0-9]* checks, 0 failed" "$out/example-$example.log" \
    || failed+=("the $example example")
done
# Round trips to PostgreSQL per request (clients/python/README.md), counted by a proxy.
for server in fastapi django sqlalchemy; do
  say "$server: round trips to PostgreSQL"
  new=3
  if [ $server = django ]; then
    new=5   # the test app's ATOMIC_REQUESTS adds SAVEPOINT and RELEASE
    cmd=(env DJANGO_SETTINGS_MODULE=django_app IDEM_TEST_CONN_MAX_AGE=600 "$venv/bin/python" -m django runserver --noreload --nothreading "127.0.0.1:{httpport}")
  else
    cmd=("$venv/bin/python" -m uvicorn ${server}_app:app --host 127.0.0.1 --port "{httpport}" --log-level warning)
  fi
  mw_roundtrips "python $server" $new 2 clients/python/README.md -- env PYTHONPATH="$ROOT/tests/middleware/python" \
    IDEM_TEST_CONNINFO="host=127.0.0.1 port={pgport} dbname=mw user=postgres" IDEM_TEST_SIGNAL="$fifo" IDEM_TEST_KILL_POINTS=0 "${cmd[@]}" \
    || failed+=("$server round trips")
done
xacts=$(mw_bouncer_xacts mw)
echo "transactions through PgBouncer: ${xacts:-0}"
[ "${xacts:-0}" -gt 0 ] || failed+=("no transaction went through PgBouncer")

echo
if [ ${#failed[@]} -gt 0 ]; then
  printf 'failed: %s\n' "${failed[@]}"
  exit 1
fi
echo "summary: the middleware passed for fastapi, django and sqlalchemy, directly and through PgBouncer"
}

# idem behind a real PgBouncer (Debian's 1.18, scripts/setup.sh --tool pgbouncer),
# in transaction mode and in session mode, in front of its own small cluster,
# with real clients: psql, psycopg 3, pgjdbc, node-postgres, tokio-postgres.
#   * the lease-stealing attempt with psql: client A takes a lease, client B on the
#     same server session (pool_size 1) tries to checkpoint, complete, fail
#     and take it over without the token: ID003 / in_progress; A, with its
#     token, finishes; duplicates replay A's result;
#   * tests/pooler/pooler.py, once per mode: claim, duplicate, rollback,
#     wait => false, waiting duplicates (seen waiting in pg_stat_activity; a
#     third client seen queued in SHOW POOLS), leases across clients, what
#     session state one client leaves to the next (SET, SET ROLE), prepared
#     statements, 8 clients x 400 claims through pool_size 2;
#   * each driver's protocol-level prepared statements, on one shared server
#     session, with its default and with the setting docs/operations.md gives;
#   * the four example programs' own tests, the programs connected through
#     PgBouncer in transaction mode.
# Synchronization is by observation (pg_stat_activity, SHOW POOLS, a probe's
# "ready" line), never by sleeping. Ends with a summary; exits 1 on any failure.
scenario_pgbouncer() {
source "$ROOT/tests/lib/cluster.sh"
PG_PORT=5460
TX_PORT=5461
SESSION_PORT=5462
dir="$(cluster_dir)/pgbouncer"
out="$IDEM_TARGET/test-out/pgbouncer"
t_start=$(date +%s%N)
PSQL="$PG_BIN/psql"
client_a_pid=
work=

# Stop what this scenario started: its PgBouncers (by the pid in their pid
# files, after checking that the pid is one of them), a probe left waiting,
# its cluster, its scratch directory.
stop_all() {
  local m p
  if [ -n "$client_a_pid" ]; then kill "$client_a_pid" 2>/dev/null || true; fi
  for m in transaction session; do
    p=$(cat "$dir/pgbouncer-$m.pid" 2>/dev/null) || continue
    if grep -q "pgbouncer.*$dir/pgbouncer-$m.ini" <<<"$(tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null)"; then
      kill -TERM "$p"
      for _ in $(seq 1 200); do kill -0 "$p" 2>/dev/null || break; sleep 0.02; done
    fi
    rm -f "$dir/pgbouncer-$m.pid"
  done
  pc_stop
  if [ -n "$work" ]; then rm -rf "$work"; fi
  return 0
}
trap stop_all EXIT
stop_all
work=$(mktemp -d /tmp/pgbouncer-scenario.XXXXXX)

checks=0
failed=()
pass() { checks=$((checks + 1)); echo "ok   $*"; }
fail() { checks=$((checks + 1)); failed+=("$*"); echo "FAIL $*"; }
expect() { # description, actual, expected
  if [ "$2" = "$3" ]; then pass "$1: $2"; else fail "$1: got '$2', expected '$3'"; fi
}
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

# ---- the cluster and the two PgBouncers --------------------------------------
rm -rf "$out"
mkdir -p "$out"
pc_init "$dir" "$PG_PORT" "max_connections = 50"
pc_start
direct() { "$PSQL" -X -q -v ON_ERROR_STOP=1 -h "$dir" -p $PG_PORT -U postgres "$@"; }
direct -d postgres -c "CREATE DATABASE pgb" \
  -c "CREATE ROLE app LOGIN NOINHERIT" -c "CREATE ROLE app_a" -c "GRANT app_a TO app"
direct -d pgb -c "CREATE EXTENSION idem"

printf '"postgres" ""\n"app" ""\n' > "$dir/userlist.txt"
for mode in transaction session; do
  port=$([ $mode = transaction ] && echo $TX_PORT || echo $SESSION_PORT)
  {
    echo "[databases]"
    # Aliases of the one database, each its own pool: pool_size 1 makes
    # every client of the alias share one server session.
    for alias in pool1 prep1 psql1 tokio1 tokio2 jdbc1 jdbc0 jdbcc1 jdbcc0 node1; do
      echo "$alias = host=$dir port=$PG_PORT dbname=pgb pool_size=1"
    done
    for alias in pool2 prep2; do
      echo "$alias = host=$dir port=$PG_PORT dbname=pgb pool_size=2"
    done
    echo "* = host=$dir port=$PG_PORT"
    cat <<INI
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
pool_mode = $mode
default_pool_size = 2
max_client_conn = 200
admin_users = postgres
ignore_startup_parameters = extra_float_digits
log_connections = 0
log_disconnections = 0
logfile = $dir/pgbouncer-$mode.log
pidfile = $dir/pgbouncer-$mode.pid
INI
  } > "$dir/pgbouncer-$mode.ini"
  chown postgres:postgres "$dir/pgbouncer-$mode.ini" "$dir/userlist.txt"
  as_postgres /usr/sbin/pgbouncer -d "$dir/pgbouncer-$mode.ini"
  ready=
  for _ in $(seq 1 250); do
    "$PSQL" -X -h 127.0.0.1 -p "$port" -U postgres -d pgbouncer -Atc "SHOW VERSION" >/dev/null 2>&1 && ready=1 && break
    sleep 0.02
  done
  if [ -z "$ready" ]; then
    echo "FAIL PgBouncer ($mode) did not start on 127.0.0.1:$port:"
    tail -5 "$dir/pgbouncer-$mode.log"
    exit 1
  fi
  echo "$(/usr/sbin/pgbouncer --version | sed -n 1p), pool_mode = $mode, on 127.0.0.1:$port"
done

# ---- the issue's attack, with psql (transaction mode, pool_size 1) ---------
echo "== psql: a lease on a server session shared by two clients (transaction mode, pool_size 1) =="
# Each call is a new client connection; psql's LAST_ERROR_SQLSTATE tells the outcome.
client() { # SQL... -> its server session's pid, the statements' output, the last SQLSTATE
  local args=(-c "SELECT pg_backend_pid()")
  for s in "$@"; do args+=(-c "$s"); done
  "$PSQL" -X -At -h 127.0.0.1 -p $TX_PORT -U postgres -d psql1 "${args[@]}" -c '\echo :LAST_ERROR_SQLSTATE' 2>/dev/null
}
IFS='|' read -r pid_a claimed token < <(client "SELECT pg_backend_pid(), claimed, result->>'lease_token'
                                                 FROM idem_claim('L1', 'job', lease => '1 minute')" | sed -n 2p)
expect "client A: idem_claim('L1', 'job', lease => '1 minute') claimed" "$claimed" t
for call in "idem_checkpoint('L1', 'job', 'forged', '{\"by\":\"B\"}')" \
            "idem_complete('L1', 'job', '{\"by\":\"B\"}')" \
            "idem_fail('L1', 'job', '{\"by\":\"B\"}')"; do
  res=$(client "SELECT $call")
  pid_b=$(echo "$res" | sed -n 1p)
  expect "client B (server session $pid_b, A's was $pid_a) without the token: $call" \
    "$([ "$pid_b" = "$pid_a" ] && echo same-session) $(echo "$res" | tail -1)" "same-session ID003"
done
expect "client B: idem_claim('L1', 'job', lease => '1 minute') while A's lease runs" \
  "$(client "SELECT claimed || ' ' || state FROM idem_claim('L1', 'job', lease => '1 minute')" | sed -n 2p)" "false in_progress"
expect "client A, with its token: checkpoint and complete" \
  "$(client "SELECT idem_checkpoint('L1', 'job', 'charged', '{\"charge\":1}', '$token')" \
            "SELECT idem_complete('L1', 'job', '{\"by\":\"A\"}', '$token')" | tail -1)" "00000"
expect "a later duplicate (another client) replays" \
  "$(client "SELECT state || ' ' || result FROM idem_claim('L1', 'job')" | sed -n 2p)" 'completed {"by": "A"}'
expect "stored in the database (read directly)" \
  "$(direct -d pgb -Atc "SELECT state || ' ' || result FROM idem_lookup('L1', 'job')")" 'completed {"by": "A"}'

# After an upgrade, server sessions must load the new library: RECONNECT on
# the console replaces each one once its client releases it.
before=$(client "SELECT 1" | sed -n 1p)
"$PSQL" -X -q -h 127.0.0.1 -p $TX_PORT -U postgres -d pgbouncer -c "RECONNECT psql1"
after=$(client "SELECT 1" | sed -n 1p)
expect "RECONNECT psql1 on PgBouncer's console: the next client's server session (was $before)" \
  "$([ "$after" != "$before" ] && echo new || echo same)" new

# ---- psycopg: both pool modes --------------------------------------------
for mode in transaction session; do
  port=$([ $mode = transaction ] && echo $TX_PORT || echo $SESSION_PORT)
  echo "== psycopg $("$IDEM_PY" -c 'import psycopg; print(psycopg.__version__)'): pool_mode = $mode =="
  t0=$(date +%s%N)
  "$IDEM_PY" "$ROOT/tests/pooler/pooler.py" $mode $port "$dir" $PG_PORT > "$out/pooler-$mode.log" 2>&1 || true
  cat "$out/pooler-$mode.log"
  while read -r line; do
    case "$line" in
      "ok   "*) checks=$((checks + 1)) ;;
      "FAIL "*) checks=$((checks + 1)); failed+=("${line#FAIL }") ;;
    esac
  done < "$out/pooler-$mode.log"
  grep -q "^summary \[$mode\]: 0 failed" "$out/pooler-$mode.log" || fail "pooler.py $mode did not finish cleanly"
  echo "($(ms_since "$t0") ms)"
done

# ---- each driver's prepared statements (transaction mode, pool_size 1) --------
echo "== tokio-postgres: Client::query (named statement) vs query_typed (unnamed) =="
rust_dir="$ROOT/examples/rust-batch"
t0=$(date +%s%N)
(cd "$ROOT/tests/pooler/tokio_probe" && cargo build --locked --quiet --target-dir "$rust_dir/target")
echo "(probe built in $(ms_since "$t0") ms)"
probe="$rust_dir/target/debug/idem-pooler-probe"
export PGHOST=127.0.0.1 PGPORT=$TX_PORT PGUSER=postgres
# Client A talks through two FIFOs, not a coproc: bash unsets a coproc's
# variables as soon as it reaps the process, and A exits right after
# answering "go", so its pipes could vanish before its answer was read.
# A's shell opens its stdin FIFO, then its stdout FIFO, and each open waits
# for this side's, made in the same order: A cannot be gone before both
# ends are held here, and its stdout reaches end-of-file when it exits.
mkfifo "$work/hold.in" "$work/hold.out"
PGDATABASE=tokio1 "$probe" hold < "$work/hold.in" > "$work/hold.out" &
client_a_pid=$!
exec {hold_in}> "$work/hold.in" {hold_out}< "$work/hold.out"
hold_pid=
while read -r line <&"$hold_out"; do
  echo "  client A (prepare, then wait): $line"
  case "$line" in "pid "*) hold_pid=${line#pid } ;; ready|error*) break ;; esac
done
q=$(PGDATABASE=tokio1 "$probe" query)
echo "$q" | sed 's/^/  client B, Client::query: /'
expect "tokio-postgres Client::query while A holds its prepared \"s0\" on the same session ($hold_pid)" \
  "$(echo "$q" | sed -n 's/^pid //p') $(echo "$q" | tail -1)" "$hold_pid error 42P05: prepared statement \"s0\" already exists"
q=$(PGDATABASE=tokio1 "$probe" typed)
echo "$q" | sed 's/^/  client B, Client::query_typed: /'
expect "tokio-postgres Client::query_typed on the same session" "$(echo "$q" | tail -1)" \
  "result: statement of the second client: y"
# (if A has ended, "go" finds no reader: the subshell takes the SIGPIPE,
# and A's answer is empty)
(echo go >&"$hold_in") 2>/dev/null || true
a_result=$(cat <&"$hold_out")
exec {hold_in}>&- {hold_out}<&-
wait "$client_a_pid" 2>/dev/null || true
client_a_pid=
expect "tokio-postgres: A then runs its own prepared statement" "$a_result" "result: statement of the first client: x"
q1=$(PGDATABASE=tokio2 "$probe" leftover)
q2=$(PGDATABASE=tokio2 "$probe" leftover)
echo "$q1" | sed 's/^/  client C, query_typed of a composite: /'
echo "$q2" | sed 's/^/  client D, the same: /'
expect "tokio-postgres query_typed returning a non-built-in type leaves named statements (type lookup)" \
  "$(echo "$q1" | tail -1)" "result: named statements left on the server session: [s0,s1]"
expect "... and the next such client on that session collides with them" \
  "$(echo "$q2" | sed -n 2p)" "error 42P05: prepared statement \"s0\" already exists"

echo "== pgjdbc (Debian's /usr/share/java/postgresql.jar): prepareThreshold =="
javac -d "$work" "$ROOT/tests/pooler/JdbcProbe.java"
jdbc() { # alias, URL options, mode
  local r pids
  r=$(java -cp "$work:/usr/share/java/postgresql.jar" JdbcProbe "jdbc:postgresql://127.0.0.1:$TX_PORT/$1?user=postgres$2" "$3")
  echo "$r" | sed "s/^/  $3, ${2:-default}: /" >&2
  pids=$(echo "$r" | sed -n 's/^pids //p')
  echo "$([ "${pids% *}" = "${pids#* }" ] && echo shared || echo "not shared ($pids)")" \
       "$(echo "$r" | sed -n 's/^[AB] //p' | paste -sd' ')"
}
# B's first named statement is "S_1", like A's: 42P05; its later
# executions go through again (pgjdbc prepares the statement anew).
expect "pgjdbc default (prepareThreshold=5), a statement run 7 times by A, then by B" \
  "$(jdbc jdbc1 "" repeat)" "shared 00000,00000,00000,00000,00000,00000,00000 00000,00000,00000,00000,42P05,00000,00000"
expect "pgjdbc default, autocommit off: A's commit(), then B's first commit()" \
  "$(jdbc jdbcc1 "" commit)" "shared 00000 42P05"
expect "pgjdbc prepareThreshold=0: the same statements" "$(jdbc jdbc0 "&prepareThreshold=0" repeat)" \
  "shared 00000,00000,00000,00000,00000,00000,00000 00000,00000,00000,00000,00000,00000,00000"
expect "pgjdbc prepareThreshold=0: the same commits" "$(jdbc jdbcc0 "&prepareThreshold=0" commit)" "shared 00000 00000"

echo "== node-postgres $(node -p "require('$ROOT/examples/node-consumer/node_modules/pg/package.json').version"): named vs unnamed queries =="
r=$(NODE_PATH="$ROOT/examples/node-consumer/node_modules" PGDATABASE=node1 node "$ROOT/tests/pooler/node_probe.js")
echo "$r" | sed 's/^/  /'
pids=$(echo "$r" | sed -n 's/^pids //p')
expect "node-postgres: two clients, one server session; unnamed queries of both" \
  "$([ "${pids% *}" = "${pids#* }" ] && echo shared) $(echo "$r" | sed -n 's/^unnamed [AB] //p' | paste -sd' ')" \
  "shared 00000,00000,00000 00000,00000,00000"
expect "node-postgres: a query with a name (named prepared statement), second client" \
  "$(echo "$r" | sed -n 's/^named B //p')" "42P05,42P05,42P05"
unset PGHOST PGPORT PGUSER

# ---- the four examples through PgBouncer (transaction mode) -----------------
for ex in python node rust java; do
  echo "== example $ex through PgBouncer (transaction mode, pool_size 2) =="
  t0=$(date +%s%N)
  if IDEM_HOST="$dir" IDEM_PORT=$PG_PORT IDEM_CLIENT_HOST=127.0.0.1 IDEM_CLIENT_PORT=$TX_PORT \
      bash "$ROOT/tests/scenarios/clients.sh" examples "$ex" > "$out/example-$ex.log" 2>&1; then
    status=0
  else
    status=1
  fi
  secs=$(ms_since "$t0")
  xacts=$("$PSQL" -X -h 127.0.0.1 -p $TX_PORT -U postgres -d pgbouncer -Atc "SHOW STATS" -F '|' \
            | awk -F'|' -v db="ex_$ex" '$1 == db {print $2}')
  grep -E "^summary|FAIL" "$out/example-$ex.log" | sed 's/^/  /' || true
  if [ "$status" = 0 ] && [ "${xacts:-0}" -gt 0 ]; then
    pass "example $ex passes its own test through PgBouncer: $xacts transactions went through it, $secs ms"
  else
    tail -20 "$out/example-$ex.log"
    fail "example $ex through PgBouncer (exit $status, ${xacts:-0} transactions through it)"
  fi
done

# ---- summary ---------------------------------------------------------------
echo
echo "summary: $checks checks, ${#failed[@]} failed, $(ms_since "$t_start") ms in all" \
     "(PgBouncer $(/usr/sbin/pgbouncer --version | awk 'NR == 1 {print $2}'), transaction and session mode)"
if [ ${#failed[@]} -gt 0 ]; then
  printf 'failed: %s\n' "${failed[@]}"
  exit 1
fi
}

scenario_main "$@"
