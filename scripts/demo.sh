#!/usr/bin/env bash
# The demo, on a fresh Debian 12 machine as root:
#   bash scripts/demo.sh
# Installs what is missing, builds and installs idem, starts a private
# PostgreSQL cluster (port 5499, under .cluster/, pg_cron preloaded) and plays
# what idem is for:
#   1-6  a payment retried after its answer was lost: the card is charged
#        once, and the retry gets the first answer back;
#   7    maintenance scheduled with pg_cron (every minute here);
#   8    keys expire: a business type with a 2-second TTL, a duplicate
#        refused while the key is live, a new claim once it has expired;
#   9    the next maintenance run drops the partition that expired;
#        maintenance then stays scheduled at the defaults (every 5 minutes,
#        the default partition width).
# Safe to run again and again. Installs only what the demo needs
# (scripts/setup.sh without --tests); prints its time.
# Needs a Rust toolchain (README: Set-up).
#
# DEMO_SKIP_SETUP=1 plays it on a cluster already started, with the idem
# already installed (to check the demo itself without building or
# installing anything: IDEM_PORT picks the cluster, as for every script).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
demo_started=$(date +%s)

if [ "${DEMO_SKIP_SETUP:-0}" != 1 ]; then
  bash "$ROOT/scripts/setup.sh"
  idem_locate_cluster
fi
setup_done=$(date +%s)
[ "${DEMO_SKIP_SETUP:-0}" = 1 ] || bash "$ROOT/scripts/cluster.sh" start

# until_true DB SQL WHAT: poll until SQL returns t. It waits for a state;
# the 150 s limit only stops a demo that went wrong.
until_true() {
  local i
  for i in $(seq 1 750); do
    [ "$(psql_idem -d "$1" -Atc "$2")" = t ] && return 0
    sleep 0.2
  done
  echo "the demo went wrong: still not true after 150 s: $3" >&2
  exit 1
}

# pg_cron runs jobs in one database (cron.database_name): the demo plays in
# it when the cluster preloads pg_cron, else in idem_demo (and runs
# maintenance itself in step 8).
cron=0
db=idem_demo
if [ "$(psql_idem -d postgres -Atc "SELECT current_setting('shared_preload_libraries') ~ 'pg_cron'")" = t ]; then
  cron=1
  db=$(psql_idem -d postgres -Atc "SHOW cron.database_name")
fi
grep -q 1 <<<"$(psql_idem -q -d postgres -tc "SELECT 1 FROM pg_database WHERE datname = '$db'")" \
  || psql_idem -q -d postgres -c "CREATE DATABASE $db"
# Restart the cluster once, when the demo creates the extension: in the
# first runs of this demo on pg_cron 1.4, a cluster whose pg_cron extension
# was created after the scheduler started ran no job until a restart (maybe
# the missed job-list change described where the demo waits for pg_cron's
# run); after a restart the scheduler starts with the extension in place.
if [ $cron = 1 ] && [ "$(psql_idem -d "$db" -Atc "SELECT count(*) FROM pg_extension WHERE extname = 'pg_cron'")" = 0 ]; then
  psql_idem -q -d "$db" -c "CREATE EXTENSION pg_cron"
  say "pg_cron created in $db: restarting the cluster so that its scheduler sees it"
  bash "$ROOT/scripts/cluster.sh" restart
fi
# A clean slate in that database (it is not dropped: pg_cron's launcher is
# connected to it): idem and the demo's objects, settings, the cron job.
psql_idem -q -d "$db" >/dev/null <<SQL
SET client_min_messages = warning;
ALTER DATABASE $db RESET ALL;
DROP EXTENSION IF EXISTS idem CASCADE;
DROP TABLE IF EXISTS charges;
DROP FUNCTION IF EXISTS pay(text, text, int);
$([ $cron = 1 ] && echo "SELECT cron.unschedule(jobid) FROM cron.job WHERE jobname = 'idem_maintain';")
CREATE EXTENSION idem;
SQL
say "the demo (database $db; to look around: bash scripts/cluster.sh psql $db, or psql -h $(cluster_dir) -p $IDEM_PORT -U postgres $db)"
play() { psql_idem -d "$db" --echo-queries -v ON_ERROR_STOP=1 "$@"; }

play <<'SQL'
\set QUIET on
\pset footer off
CREATE TABLE charges (id bigserial PRIMARY KEY, order_no text, amount_cents int, charged_at timestamptz DEFAULT now());

-- The payment service's handler: one transaction per request. The claim and
-- the charge commit (or roll back) together.
CREATE FUNCTION pay(request_id text, order_no text, amount_cents int) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
  c record;
  charge_id bigint;
BEGIN
  SELECT claimed, result, first_claimed_at INTO c
    FROM idem_claim(request_id, 'payment', fingerprint => order_no || ':' || amount_cents);
  IF NOT c.claimed THEN
    RAISE NOTICE 'duplicate of a request first seen at %: replaying its answer', c.first_claimed_at;
    RETURN c.result;
  END IF;
  INSERT INTO charges (order_no, amount_cents) VALUES (order_no, amount_cents) RETURNING id INTO charge_id;
  PERFORM idem_complete(request_id, 'payment', jsonb_build_object('charge_id', charge_id, 'status', 'charged'));
  RETURN jsonb_build_object('charge_id', charge_id, 'status', 'charged');
END $$;
\set QUIET off

\echo
\echo '== 1. The client sends request req-42 (order A-1001, 25.00). The answer is lost on the way back.'
SELECT pay('req-42', 'A-1001', 2500) AS answer_that_got_lost;

\echo '== 2. The client does not know whether it worked, so it retries with the same request id.'
SELECT pay('req-42', 'A-1001', 2500) AS answer_to_the_retry;

\echo '== 3. The card was charged once:'
SELECT id, order_no, amount_cents FROM charges;

\echo '== 4. A bug reuses req-42 for a different payment: refused (SQLSTATE ID001), nothing charged.'
\set ON_ERROR_STOP off
SELECT pay('req-42', 'B-2002', 9900);
\set ON_ERROR_STOP on
SELECT count(*) AS charges FROM charges;

\echo '== 5. A request that fails rolls back with its claim, so its retry runs for real:'
BEGIN;
SELECT claimed FROM idem_claim('req-43', 'payment');
ROLLBACK;
SELECT claimed, state FROM idem_claim('req-43', 'payment');

\echo '== 6. What idem keeps (operator views):'
SELECT biz_type, ttl, live_keys, completed FROM idem_stats;
SQL

# Step 8 needs maintenance running before the short-lived claims are made:
# partitions are created ahead of the claims that go into them. The demo
# makes the narrowest partitions (TTL class 0, where 2-second claims go) one
# second wide with idem.partition_width, so that one expires within the
# demo; the setting is checked for first, should a later layout drop it.
psql_idem -q -d "$db" >/dev/null <<SQL
SELECT idem_storage_path() IS NOT NULL;  -- loads the library: its settings are known from here
DO \$\$ BEGIN
  IF EXISTS (SELECT FROM pg_settings WHERE name = 'idem.partition_width') THEN
    EXECUTE 'ALTER DATABASE $db SET idem.partition_width = ''1 second''';
  END IF;
END \$\$;
SQL
# The short TTL first: maintenance makes partitions ahead for the TTL
# classes of the types it knows, so it must know "demo" before it runs.
psql_idem -q -d "$db" -Atc "SELECT idem_configure('demo', '2 seconds')" >/dev/null
# Maintenance once before scheduling it: the first run creates the
# partitions ahead (dozens of one-second ranges), and pg_cron 1.4's
# scheduler can miss a job registered in the same transaction as that much
# DDL until the next change to cron.job.
psql_idem -q -d "$db" -Atc "SELECT idem_maintain() IS NOT NULL" >/dev/null
if [ $cron = 1 ]; then
  play <<'SQL'
\pset footer off
\echo '== 7. Maintenance, scheduled with pg_cron: every minute here (the default is every 5 minutes).'
\echo '   It runs once now too: it creates the partitions ahead that the next claims go into.'
SELECT idem_schedule_maintenance('* * * * *') AS cron_job_id;
SELECT jobname, schedule, command FROM cron.job WHERE jobname = 'idem_maintain';
SQL
else
  play -c "SELECT idem_maintain() IS NOT NULL AS maintained" >/dev/null
fi

play <<'SQL'
\pset footer off
\echo '== 8. Keys expire. Business type "demo" keeps its keys 2 seconds (the default is 24 hours):'
\echo '   (set with idem_configure before maintenance ran: it makes partitions ahead for the types it knows)'
SELECT biz_type, ttl FROM idem_stats WHERE biz_type = 'demo';
SELECT claimed, state, expires_at FROM idem_claim('nightly-report:2026-12-03', 'demo');
\echo '   A duplicate while the key is live is refused:'
SELECT claimed, state FROM idem_claim('nightly-report:2026-12-03', 'demo');
SQL
say "waiting until the key has expired (polling idem_lookup until it says absent)"
until_true "$db" "SELECT state = 'absent' FROM idem_lookup('nightly-report:2026-12-03', 'demo')" "the key expires"
play <<'SQL'
\pset footer off
\echo '   Expired: the same key can be claimed again, and the work runs again.'
SELECT claimed, state, expires_at FROM idem_claim('nightly-report:2026-12-03', 'demo');
\echo '   This claim expires in 2 seconds too; then its partition holds only expired claims.'
SQL
# The partition that holds the key's new claim, read while it is live (the
# row's own table: partitions are ranges of expiry, one set per TTL class).
# The new claim, not the first: a type's first claim can land in the
# default partition, before maintenance has made partitions for its TTL
# class.
held=$(psql_idem -d "$db" -Atc "SELECT c.relname FROM idem.claims k JOIN pg_class c ON c.oid = k.tableoid
                                 WHERE k.biz_type = 'demo' AND k.key = 'nightly-report:2026-12-03'
                                   AND c.relname IN (SELECT partition FROM idem_partitions WHERE NOT is_default)
                                 ORDER BY k.claimed_at DESC LIMIT 1")

if [ -n "$held" ]; then
  say "waiting until $held, which holds that claim, holds only expired claims (polling idem_partitions)"
  until_true "$db" "SELECT expired FROM idem_partitions WHERE partition = '$held'" "the claim's partition expires"
else
  say "the claim is in the default partition; waiting until a range partition holds only expired claims"
  until_true "$db" "SELECT coalesce(bool_or(expired), false) FROM idem_partitions" "a partition expires"
  held=$(psql_idem -d "$db" -Atc "SELECT min(partition) FROM idem_partitions WHERE expired")
fi
marker=$(psql_idem -d "$db" -Atc "SELECT now()")
if [ $cron = 1 ]; then
  say "waiting for pg_cron's next run of idem_maintain (it fires at the start of each minute)"
  # pg_cron 1.4 (Debian 12's) can miss a change to its job list committed
  # beside much DDL, as this demo's set-up and maintenance make (creating
  # and dropping the extension, dozens of one-second partitions): its
  # scheduler then keeps the old list until the next change
  # (docs/operations.md, Scheduling maintenance). So once the job's first
  # minute has passed without a run, the demo registers the same job again,
  # a change with no DDL beside it, and goes on waiting for the run.
  ran="SELECT count(*) > 0 FROM cron.job_run_details d JOIN cron.job j USING (jobid)
        WHERE j.jobname = 'idem_maintain' AND d.status = 'succeeded' AND d.start_time > '$marker'"
  due=$(psql_idem -d "$db" -Atc "SELECT extract(epoch FROM date_trunc('minute', now()) + interval '1 minute')::bigint")
  registered_again=0
  for i in $(seq 1 1000); do
    [ "$(psql_idem -d "$db" -Atc "$ran")" = t ] && break
    if [ $registered_again = 0 ] && [ "$(date +%s)" -gt $((due + 5)) ]; then
      say "pg_cron let the job's first minute pass without running it: registering the same job again"
      psql_idem -q -d "$db" -Atc "SELECT cron.schedule(jobname, schedule, command) FROM cron.job WHERE jobname = 'idem_maintain'" >/dev/null
      registered_again=1
    fi
    sleep 0.2
  done
  [ "$(psql_idem -d "$db" -Atc "$ran")" = t ] || { echo "the demo went wrong: pg_cron did not run idem_maintain within 200 s" >&2; exit 1; }
else
  psql_idem -d "$db" -Atc "SELECT idem_maintain() IS NOT NULL" >/dev/null
fi
play -v marker="$marker" -v held="$held" <<'SQL'
\pset footer off
\echo '== 9. Maintenance dropped the expired partitions whole: no DELETE, no bloat, the space back at once.'
SELECT jsonb_array_length(run.report->'partitions_dropped') AS partitions_dropped,
       run.report->'partitions_dropped' ? :'held' AS with_the_one_that_held_the_claim
  FROM idem.maintenance_runs run WHERE run.started_at > :'marker' ORDER BY run.run_id DESC LIMIT 1;
SELECT count(*) AS is_it_still_there FROM idem_partitions WHERE partition = :'held';
SELECT last_run_at, last_partitions_dropped FROM idem_maintenance;
SQL
left=$(psql_idem -d "$db" -Atc "SELECT count(*) FROM idem_partitions WHERE partition = '$held'")
[ "$left" = 0 ] || { echo "the demo went wrong: $held, which held only expired claims, is still there" >&2; exit 1; }
# Leave maintenance as a server would run it: the default partition width
# and the default schedule (every 5 minutes), not one-second partitions made
# and dropped every minute.
psql_idem -q -d "$db" -c "ALTER DATABASE $db RESET ALL" >/dev/null
if [ $cron = 1 ]; then
  psql_idem -q -d "$db" -Atc "SELECT cron.schedule(jobname, '*/5 * * * *', command) FROM cron.job WHERE jobname = 'idem_maintain'" >/dev/null
  say "maintenance stays scheduled every 5 minutes; to stop it: psql -h $(cluster_dir) -p $IDEM_PORT -U postgres $db -c \"SELECT cron.unschedule('idem_maintain')\""
fi
say "done: request req-42 was charged once, its retry got the first answer back, an expired key was claimed again and maintenance dropped its partition"
now=$(date +%s)
say "demo finished in $((now - demo_started)) s (set-up $((setup_done - demo_started)) s, cluster and demo $((now - setup_done)) s)"
