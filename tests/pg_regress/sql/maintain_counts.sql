-- maintain_counts: idem_maintain reports exactly how many claims it
-- removed: rows_in_dropped_partitions counts the rows of the partitions it
-- dropped (counted before it takes its lock: no claim can write into a
-- partition whose range is over), whether or not the partition was ever
-- analyzed (0.3.0 reported its reltuples: 0 for a partition dropped with
-- one expired claim in it); expired_rows_deleted_from_default those it
-- deleted from the default partition; rows_removed both. In a database of
-- its own, so that no other test's partition ends meanwhile.
SET client_min_messages = warning;
DROP DATABASE IF EXISTS regress_idem_counts;
CREATE DATABASE regress_idem_counts;
\set suite_db :DBNAME
\c regress_idem_counts
SET client_min_messages = warning;
CREATE EXTENSION idem;
RESET client_min_messages;
\set SHOW_CONTEXT never
\set VERBOSITY sqlstate
-- (idem_maintain runs in READ COMMITTED only; the environment matrix
-- runs this file under other defaults, which this new session has too.)
SET default_transaction_isolation = 'read committed';

-- Partitions whose range is over, as a server that was down for an hour
-- finds them: one with three expired claims and one with one, never
-- analyzed (reltuples unknown), made as idem_maintain makes partitions;
-- and two claims that expired in the default partition.
SELECT idem_maintain() IS NOT NULL AS first_run;
DO $$
DECLARE
    k smallint := idem.ttl_class('1 hour');
    w interval := idem.class_width(idem.ttl_class('1 hour'));
    t timestamptz := date_trunc('hour', now()) - interval '1 day';
BEGIN
    -- (bounds as ISO 8601 UTC text: a time printed in the session's
    -- DateStyle can carry an ambiguous zone abbreviation)
    EXECUTE format('CREATE TABLE idem.claims_counted_a PARTITION OF idem.claims FOR VALUES FROM (%s, %L) TO (%s, %L)',
                   k, idem.time_text(t), k, idem.time_text(t + w));
    EXECUTE format('CREATE TABLE idem.claims_counted_b PARTITION OF idem.claims FOR VALUES FROM (%s, %L) TO (%s, %L)',
                   k, idem.time_text(t + w), k, idem.time_text(t + 2 * w));
    CREATE INDEX ON idem.claims_counted_a (idem.key_hash(biz_type, key));
    CREATE INDEX ON idem.claims_counted_b (idem.key_hash(biz_type, key));
    ALTER TABLE idem.claims_counted_a REPLICA IDENTITY FULL;
    ALTER TABLE idem.claims_counted_b REPLICA IDENTITY FULL;
    INSERT INTO idem.claims (expires_at, claimed_at, ttl_class, state, biz_type, key)
    SELECT t + interval '1 second' * g, t + interval '1 second' * g - interval '1 hour', k, 'c', 'mc', 'a' || g
      FROM generate_series(1, 3) g
    UNION ALL
    SELECT t + w + interval '1 second', t + w + interval '1 second' - interval '1 hour', k, 'c', 'mc', 'b1'
    UNION ALL
    SELECT now() - interval '1 minute' * g, now() - interval '1 minute' * g - interval '1 hour', k + 1, 'c', 'mc', 'd' || g
      FROM generate_series(1, 2) g;
END
$$;
SELECT c.relname, c.reltuples, (SELECT count(*) FROM idem.claims_counted_a) AS a_rows,
       (SELECT count(*) FROM idem.claims_counted_b) AS b_rows,
       (SELECT count(*) FROM idem.claims_default) AS default_rows
  FROM pg_class c WHERE c.oid = 'idem.claims_counted_b'::regclass;
-- A claim forgotten before maintenance is not among what it removed.
DELETE FROM idem.claims_counted_a WHERE key = 'a3';
SELECT r->'partitions_dropped' AS dropped, r->'rows_in_dropped_partitions' AS in_dropped,
       r->'expired_rows_deleted_from_default' AS from_default, r->'rows_removed' AS removed
  FROM idem_maintain() r;
SELECT count(*) AS left_over FROM idem.claims WHERE biz_type = 'mc';
-- Nothing more to remove: zero, not NULL.
SELECT r->'rows_in_dropped_partitions' AS in_dropped, r->'rows_removed' AS removed FROM idem_maintain() r;

\c :suite_db
SET client_min_messages = warning;
DROP DATABASE regress_idem_counts;
