#!/usr/bin/env bash
# Hostile input: property/fuzz tests over every idem function's arguments
# (tests/fuzz/hostile.py, hypothesis, derandomized), against the shared
# cluster, in a database of its own. Fails on any SQLSTATE README.md does
# not document, any storage change by an erroring call, any broken
# property, and any PANIC / crash / "terminated by signal" the server wrote
# to its log while the test ran.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
db=hostile_fuzz
log="$(cluster_dir)/server.log"   # scripts/cluster.sh starts the server with -l this file
[ -f "$log" ] || { echo "server log $log not found" >&2; exit 1; }
[ -x "$IDEM_PY" ] || { echo "no venv python at $IDEM_PY (scripts/setup.d/10-python.sh)" >&2; exit 1; }

cleanup() { psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true; }
trap cleanup EXIT
cleanup
psql_idem -q -d postgres -c "CREATE DATABASE $db"
psql_idem -q -d $db -c "CREATE EXTENSION idem" -c "SELECT idem_maintain()" >/dev/null

log_from=$(stat -c %s "$log")
set +e
"$IDEM_PY" "$ROOT/tests/fuzz/hostile.py" --dsn "host=$(cluster_dir) port=$IDEM_PORT user=postgres dbname=$db"
rc=$?
set -e

# The server's log lines written during the run (by any session: a crash in
# this test shows as the postmaster's report of a terminated backend).
new_log=$(tail -c +"$((log_from + 1))" "$log")
bad=$(grep -E 'PANIC|terminated by signal|server process .* (was terminated|exited with exit code)|database system is in recovery mode|TRAP:' <<<"$new_log" || true)
echo "server log: $(wc -l <<<"$new_log") lines written during the run, $(grep -c . <<<"$bad" || true) crash lines"
if [ -n "$bad" ]; then
  echo "CRASH LINES IN THE SERVER LOG:"; echo "$bad" | head -20
  rc=1
fi
psql_idem -q -d postgres -c "SELECT 1" >/dev/null || { echo "server not answering after the run"; rc=1; }
exit $rc
