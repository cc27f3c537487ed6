#!/usr/bin/env bash
# clients/java (the Spring Boot starter, @Idempotent) built offline with
# Maven from the repository scripts/setup.d/85-java.sh filled, in a copy
# of the folder. The build runs the starter's own test (a call outside a
# transaction is refused before it runs) and clients/java/it: the README's
# example application started from its jar (java -jar), driven over HTTP
# against this cluster, verdicts from the business rows: 20 concurrent
# duplicates (JdbcTemplate; JPA and JdbcTemplate in one transaction) make
# one row and one answer, a retry replays, another payload gets ID001, a
# rollback in the method leaves no claim, a duplicate of an open first call
# gets 409 after idem.wait-timeout, SIGKILL mid-handler and after COMMIT
# (at states the app reports) then a retry: one charge. A failing JUnit
# test fails the build and this scenario.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/cluster.sh"
db=java_spring
work=$(mktemp -d /tmp/java_spring.XXXXXX)
cleanup() {
  # An application the test started and could not stop (the test died): by this run's path.
  kill_matching "java -jar $work/"
  rm -rf "$work"
  psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" 2>/dev/null || true
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
command -v mvn >/dev/null || fail "mvn missing: run scripts/setup.d/85-java.sh"

psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
psql_idem -q -d $db -c "CREATE EXTENSION idem"

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
tar -C "$ROOT/clients/java" --exclude=target -cf - . | tar -C "$work" -xf -
t0=$(date +%s)
if ! (cd "$work" && mvn_idem -o verify -Didem.it.pghost="$(client_host)" -Didem.it.pgport="$(client_port)" \
        -Didem.it.database=$db) > "$work/mvn.log" 2>&1; then
  grep -E "Tests run:|FAIL|ERROR" "$work/mvn.log" | grep -v "^\s*at " | head -60
  for f in "$work"/it/target/app-logs/*.log; do [ -f "$f" ] && { echo "--- $f (last lines)"; tail -20 "$f"; }; done
  fail "mvn verify of clients/java failed (log above)"
fi
echo "mvn verify: $(( $(date +%s) - t0 )) s"
# The tests ran (not skipped by a property): Surefire's reports say how many.
for report in idem-spring-boot-starter/target/surefire-reports/TEST-dev.idem.spring.OutsideTransactionTest.xml \
              it/target/surefire-reports/TEST-dev.idem.it.ExampleAppTest.xml; do
  [ -f "$work/$report" ] || fail "no report $report"
  head -3 "$work/$report" | grep -o 'testsuite [^>]*' | grep -oE '(tests|failures|errors|skipped)="[0-9]+"' | tr '\n' ' '
  echo "($(basename "$report" .xml | sed 's/^TEST-//'))"
  head -3 "$work/$report" | grep -q 'failures="0"' && head -3 "$work/$report" | grep -q 'errors="0"' \
    && head -3 "$work/$report" | grep -q 'skipped="0"' || fail "$report: failures, errors or skipped tests"
done
[ "$(head -3 "$work/it/target/surefire-reports/TEST-dev.idem.it.ExampleAppTest.xml" | grep -o 'tests="[0-9]*"')" = 'tests="6"' ] \
  || fail "ExampleAppTest did not run its 6 tests"
q() { psql_idem -d $db -Atc "$1"; }
# Across every test: no request id was charged or ordered twice.
dups=$(q "SELECT (SELECT count(*) FROM (SELECT 1 FROM payments GROUP BY request_id HAVING count(*) > 1) p)
              + (SELECT count(*) FROM (SELECT 1 FROM shop_orders GROUP BY request_id HAVING count(*) > 1) o)")
[ "$dups" = 0 ] || fail "$dups request ids have more than one business row"
echo "business rows: $(q "SELECT count(*) FROM payments") payments, $(q "SELECT count(*) FROM shop_orders") orders, one per request id"
