#!/usr/bin/env bash
# clients/java (the Spring Boot starter: @Idempotent, and the
# Idempotency-Key filter of Spring MVC) built offline with Maven from the
# repository scripts/setup.sh --tool java filled, in a copy of the folder,
# under Spring Boot 3.5 and 4.0 at once (each its own database and Kafka
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
#     and across rebalances: every event booked once.
# it/'s test classes run at once (it/src/test/resources/junit-platform.properties).
# A failing JUnit test fails the build and this scenario.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/cluster.sh"
# Each Boot line has its own database and Kafka broker: the two lines run
# at once (their test phases wait on applications, brokers and locks much
# of the time), neither seeing the other's rows, topics or consumer groups.
dbs=(java_spring java_spring_4)
# Six TCP ports from JAVA_SPRING_PORT (default 5441) on: the cluster,
# PgBouncer, then each broker's listener and controller.
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
t_start=$(date +%s)
work=$(mktemp -d /tmp/java_spring.XXXXXX)

pc_init "$(cluster_dir)/java-spring" $PG_PORT "max_connections = 300"
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

# The Kafka brokers: Kafka 4.1 in KRaft mode (one node, broker and
# controller), each its own process, as operators run it; the jars are
# Maven Central's (scripts/setup.sh --tool java). They start while Maven
# builds; KafkaLedgerTest waits until its broker answers.
[ -f "$IDEM_KAFKA_LIBS/.complete" ] || fail "no Kafka broker in $IDEM_KAFKA_LIBS: run bash scripts/setup.sh --tool java"
kafka_java=(java -Xmx512m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -cp "$IDEM_KAFKA_LIBS/*")
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
     -t "$(python3 -c 'import base64, uuid; print(base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("="))')" \
     > "$dir/format.log" 2>&1 && exec "${kafka_java[@]}" kafka.Kafka "$dir/server.properties") > "$dir/broker.log" 2>&1 &
  kafka_pids+=($!)
}
kafka_start 3.5.7 $((PG_PORT + 2))
kafka_start 4.0.7 $((PG_PORT + 4))

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
pass() { # boot-version database kafka-port tests-expected surefire-filter("": all) jackson-major conformance-via
  local boot=$1 db=$2 kafka=$3 expected=$4 filter=$5 jackson=$6 via=$7 dir="$work/boot-$1"
  mkdir -p "$dir"
  tar -C "$ROOT/clients/java" --exclude=target -cf - . | tar -C "$dir" -xf -
  local t0=$(date +%s)
  if ! (cd "$dir" && mvn_idem -o verify -Dspring-boot.version=$boot -Didem.it.pghost="$PC_DIR" \
          -Didem.it.pgport=$PG_PORT -Didem.it.database=$db -Didem.it.pgbouncer=127.0.0.1:$PGB_PORT -Didem.it.kafka=127.0.0.1:$kafka \
          -Didem.it.conformance="$ROOT/tests/middleware/conformance.json" -Didem.it.conformance-via=$via ${filter:+"-Dtest=$filter" -Dsurefire.failIfNoSpecifiedTests=false}) > "$dir/mvn.log" 2>&1; then
    grep -E "Tests run:|FAIL|ERROR" "$dir/mvn.log" | grep -v "^\s*at " | head -60
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
pass 3.5.7 ${dbs[0]} $((PG_PORT + 2)) 7 "" 2 direct,pgbouncer > "$work/pass-3.5.7.out" 2>&1 &
pass_pids=($!)
pass 4.0.7 ${dbs[1]} $((PG_PORT + 4)) 3 "OutsideTransactionTest,ConformancePairsTest,StarterRulesTest,ExampleAppTest#twentyConcurrentDuplicatesChargeOnce+jpaAndJdbcTemplateInTheClaimsTransaction+idempotencyKeyFilterRoute,ConformanceTest,KafkaLedgerTest" 3 direct \
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
echo "PgBouncer: $xacts transactions; $(( $(date +%s) - t_start )) s in all"
