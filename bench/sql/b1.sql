-- B1: hand-written dedup: INSERT ... ON CONFLICT DO NOTHING into a plain
-- table with a unique index, then the business insert.
\set n :n + 1
\set kid (:run * 1000 + :client_id) * 10000000000 + :n
BEGIN;
INSERT INTO dedup (key) VALUES (md5(:kid::text)) ON CONFLICT DO NOTHING;
INSERT INTO orders (key, amount) VALUES (md5(:kid::text), 1);
END;
