-- claim_bulk: one transaction can claim 30,000 keys (in one statement), four
-- times what the shared lock table holds on default settings (64 entries per
-- connection), without running out of it; the key lock is not held past
-- each claim.
-- Business type used here: bulk.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idem;
RESET client_min_messages;
\set SHOW_CONTEXT never
\set VERBOSITY sqlstate

BEGIN;
-- 30,000 distinct keys in one statement: every one is claimed.
SELECT count(*) FILTER (WHERE (idem_claim('k' || g, 'bulk')).claimed) AS claimed
  FROM generate_series(1, 30000) g;
-- The transaction holds a handful of locks, not one per key (max_locks_per_transaction is 64 by default).
SELECT count(*) < 64 AS few_locks FROM pg_locks WHERE pid = pg_backend_pid();
SELECT count(*) AS advisory_locks FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory';
-- The same keys again in the same transaction: all in progress, none claimed.
SELECT count(*) FILTER (WHERE (idem_claim('k' || g, 'bulk')).state = 'in_progress') AS in_progress
  FROM generate_series(1, 30000) g;
-- Finish a few of them.
SELECT count(*) FROM (SELECT idem_complete('k' || g, 'bulk', to_jsonb(g)) FROM generate_series(1, 10) g) s;
COMMIT;

-- After commit: all 30,000 are duplicates; the finished ones carry their result.
SELECT (idem_claim('k' || g, 'bulk')).state AS state, count(*)
  FROM generate_series(1, 30000) g GROUP BY 1 ORDER BY 1;
SELECT sum((idem_claim('k' || g, 'bulk')).result::int) AS sum_of_results
  FROM generate_series(1, 10) g;
SELECT count(*) AS rows_stored
  FROM idem.claims c WHERE c.biz_type = 'bulk';

-- A bulk claim that rolls back leaves nothing.
BEGIN;
SELECT count(*) FILTER (WHERE (idem_claim('r' || g, 'bulk')).claimed) AS claimed
  FROM generate_series(1, 20000) g;
ROLLBACK;
SELECT count(*) FILTER (WHERE (idem_lookup('r' || g, 'bulk')).state = 'absent') AS absent
  FROM generate_series(1, 20000) g;

-- Clean up (idem.claims is the superuser's to prune).
DELETE FROM idem.claims WHERE biz_type = 'bulk';
