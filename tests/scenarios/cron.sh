#!/usr/bin/env bash
# pg_cron for real: the test cluster preloads Debian's pg_cron (1.4), whose
# database is idem_cron. idem_schedule_maintenance registers one job; we wait
# for pg_cron to run it and check that the run did maintenance (dropped the
# partitions that expired since scheduling) and that pg_cron saw it succeed.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
db=idem_cron
psql_idem -q -d postgres -tc "SELECT 1 FROM pg_database WHERE datname = '$db'" | grep -q 1 \
  || psql_idem -q -d postgres -c "CREATE DATABASE $db"
psql_idem -q -d $db <<'SQL'
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS idem CASCADE;
CREATE EXTENSION IF NOT EXISTS pg_cron;
SELECT cron.unschedule(jobid) FROM cron.job WHERE jobname = 'idem_maintain';
DELETE FROM cron.job_run_details;
-- one-second partitions and short TTLs, so that a minute later there is
-- plenty to drop; pg_cron's sessions read these database settings too
ALTER DATABASE idem_cron SET idem.partition_width = '1 second';
ALTER DATABASE idem_cron SET idem.default_ttl = '2 seconds';
CREATE EXTENSION idem;
SQL
psql_idem -d $db -v ON_ERROR_STOP=1 <<'SQL'
-- scheduling twice under one name updates the job, and runs maintenance once now
SELECT idem_schedule_maintenance('*/5 * * * *') AS job \gset
SELECT idem_schedule_maintenance('* * * * *') = :job AS same_job;
SELECT schedule, command, active FROM cron.job WHERE jobname = 'idem_maintain';
SELECT count(*) AS job_count FROM cron.job WHERE jobname = 'idem_maintain';
SELECT claimed FROM idem_claim('order-1', 'cron.test');
SQL
scheduled_at=$(psql_idem -d $db -Atc "SELECT now()")
echo "waiting for pg_cron to run the job (it fires at the start of each minute)"
ok=0
for i in $(seq 1 150); do
  n=$(psql_idem -d $db -Atc "SELECT count(*) FROM cron.job_run_details d JOIN cron.job j USING (jobid)
                              WHERE j.jobname = 'idem_maintain' AND d.status = 'succeeded'
                                AND d.start_time > '$scheduled_at'")
  if [ "$n" -ge 1 ]; then ok=1; break; fi
  sleep 1
done
psql_idem -d $db -c "SELECT status, return_message, command FROM cron.job_run_details ORDER BY start_time DESC LIMIT 3"
[ $ok = 1 ] || { echo "FAIL: pg_cron did not run idem_maintain within 150 s"; exit 1; }
# the cron run left its report; it dropped the partitions that expired in between
dropped=$(psql_idem -d $db -Atc "SELECT jsonb_array_length(report->'partitions_dropped') FROM idem.maintenance_runs
                                  WHERE started_at > '$scheduled_at' ORDER BY run_id DESC LIMIT 1")
echo "partitions dropped by the cron run: $dropped"
[ -n "$dropped" ] && [ "$dropped" -ge 1 ] || { echo "FAIL: the cron run did no maintenance"; exit 1; }
psql_idem -q -d $db -c "SELECT cron.unschedule('idem_maintain')" >/dev/null
echo "ok"
