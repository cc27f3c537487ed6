#!/usr/bin/env bash
# The README's demo plays to the end on the test cluster: scripts/demo.sh
# without its set-up (DEMO_SKIP_SETUP=1: the build under test is installed
# already), so that a change to idem that breaks what the demo shows (a
# payment replayed, ID001, a key that expires and is claimed again, the
# pg_cron job that drops the expired partition) fails the suite. The demo
# itself waits for each state it shows and exits non-zero when one does not
# come. It plays in the cluster's pg_cron database (idem_cron, as the cron
# scenario) and waits for pg_cron's next minute; its job is unscheduled
# afterwards so that it does not run under the scenarios after it.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
[ "$(psql_idem -d postgres -Atc "SELECT current_setting('shared_preload_libraries') ~ 'pg_cron'")" = t ] \
  || { echo "FAIL: the test cluster does not preload pg_cron (bash scripts/cluster.sh start turns it on once postgresql-15-cron is installed)"; exit 1; }
db=$(psql_idem -d postgres -Atc "SHOW cron.database_name")
unschedule() {
  psql_idem -q -d "$db" -c "SELECT cron.unschedule(jobid) FROM cron.job WHERE jobname = 'idem_maintain'" >/dev/null 2>&1 || true
}
trap unschedule EXIT
out="$IDEM_TARGET/test-out/demo.log"
mkdir -p "$(dirname "$out")"
if ! DEMO_SKIP_SETUP=1 bash "$ROOT/scripts/demo.sh" > "$out" 2>&1; then
  tail -40 "$out"; echo "FAIL: the demo did not play to the end (log: $out)"; exit 1
fi
sed 's/\x1b\[[0-9;]*m//g' "$out" | grep -E '^==>|^== ' | sed 's/^/  /'
fails=0
check() { # WHAT PATTERN: the demo's output shows it
  if grep -qE "$2" "$out"; then echo "ok: $1"; else echo "FAIL: the demo's output lacks $1"; fails=$((fails + 1)); fi
}
check "the retry's replayed answer" 'duplicate of a request first seen at'
check "ID001 for a reused key" 'first claimed with a different fingerprint'
check "the card charged once" '^ +1 \| A-1001 +\| +2500$'
check "the expired key claimed again" 'Expired: the same key can be claimed again'
check "the expired claim's partition dropped" '^ +[0-9]+ \| t$'
gone=$(grep -A2 -E '^ +is_it_still_there *$' "$out" | tail -1 | tr -d ' ')
if [ "$gone" = 0 ]; then echo "ok: the partition gone"; else echo "FAIL: the demo's partition check shows '$gone', not 0"; fails=$((fails + 1)); fi
check "the end" 'maintenance dropped its partition'
if grep -q 'the claim is in the default partition' "$out"; then
  echo "FAIL: the demo's new claim went to the default partition, so the partition dropped is not the one that held it"; fails=$((fails + 1))
else echo "ok: the partition dropped is the one that held the claim"; fi
# The README's follow-up, as it is written: psql into the demo's database,
# wherever the cluster lives (under the checkout, or /tmp for a checkout
# under /root).
charged=$(bash "$ROOT/scripts/cluster.sh" psql "$db" -X -Atc "SELECT count(*) FROM charges WHERE order_no = 'A-1001'" 2>&1 || true)
if [ "$charged" = 1 ]; then echo "ok: bash scripts/cluster.sh psql $db reaches the demo's database"
else echo "FAIL: bash scripts/cluster.sh psql $db answered '$charged', not the demo's one charge"; fails=$((fails + 1)); fi
echo "demo checks failed: $fails"
[ "$fails" = 0 ]
