-- B1r, I2's counterpart: ON CONFLICT DO NOTHING, the business insert, UPDATE
-- of the result ({"ok": true}: the space keeps pgbench from reading ":true").
\set n :n + 1
\set kid (:run * 1000 + :client_id) * 10000000000 + :n
BEGIN;
INSERT INTO dedup_r (key) VALUES (md5(:kid::text)) ON CONFLICT DO NOTHING;
INSERT INTO orders (key, amount) VALUES (md5(:kid::text), 1);
UPDATE dedup_r SET result = '{"ok": true}' WHERE key = md5(:kid::text);
END;
