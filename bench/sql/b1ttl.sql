-- Cleanup section: the hand-written claim on the table with a TTL column,
-- then the business insert (its p99 is measured with and without a
-- concurrent DELETE of expired rows).
\set n :n + 1
\set kid (:run * 1000 + :client_id) * 10000000000 + :n
BEGIN;
INSERT INTO dedup_ttl (key) VALUES (md5(:kid::text)) ON CONFLICT DO NOTHING;
INSERT INTO orders (key, amount) VALUES (md5(:kid::text), 1);
END;
