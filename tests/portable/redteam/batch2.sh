#!/usr/bin/env bash
# Q5: one transaction of N first claims, wait => true vs wait => false:
# elapsed server time and this backend's pg_locks rows at the end.
source /tmp/rt/env.sh
N=${1:-2000}
for w in true false; do
P rt_app rt -v ON_ERROR_STOP=1 -At <<SQL 2>&1 | tail -2
\set VERBOSITY terse
begin;
select clock_timestamp() as t0 \gset
select '$w' as wait, count(*) filter (where (idem_claim('nb' || g || '-' || txid_current(), 'rt', wait => $w)).claimed) from generate_series(1, $N) g;
select clock_timestamp() - :'t0'::timestamptz as elapsed, (select count(*) from pg_locks where pid = pg_backend_pid()) as lock_rows;
rollback;
SQL
done
