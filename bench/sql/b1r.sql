-- B1r: the hand-written equivalent of claim + stored result (I2's
-- counterpart): INSERT ... ON CONFLICT DO NOTHING into a table with a result
-- column, the business insert, then UPDATE of the result in the same
-- transaction ({"ok": true}: the space keeps pgbench from reading ":true"
-- as a variable).
\set n :n + 1
\set kid (:run * 1000 + :client_id) * 10000000000 + :n
BEGIN;
INSERT INTO dedup_r (key) VALUES (md5(:kid::text)) ON CONFLICT DO NOTHING;
INSERT INTO orders (key, amount) VALUES (md5(:kid::text), 1);
UPDATE dedup_r SET result = '{"ok": true}' WHERE key = md5(:kid::text);
END;
