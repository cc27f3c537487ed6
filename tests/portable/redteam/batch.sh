#!/usr/bin/env bash
# Q5: one transaction of N wait => false first claims (the subtransaction
# path of idem.take_gate), and the lock table it leaves.
source /tmp/rt/env.sh
N=${1:-20000}
P postgres rt -Atc "show max_locks_per_transaction" -c "show max_connections"
P rt_app rt -v ON_ERROR_STOP=1 -At <<SQL 2>&1 | tail -3
\set VERBOSITY terse
begin;
select count(*) filter (where (idem_claim('nb' || g || '-' || txid_current(), 'rt', wait => false)).claimed) from generate_series(1, $N) g;
select count(*) as my_lock_rows from pg_locks where pid = pg_backend_pid();
rollback;
SQL
