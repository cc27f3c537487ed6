-- I2, B1r's counterpart: I1c, the business insert, idem_complete (as b1r.sql).
\set n :n + 1
\set kid (:run * 1000 + :client_id) * 10000000000 + :n
BEGIN;
SELECT claimed FROM idem_claim(md5(:kid::text), 'bench');
INSERT INTO orders (key, amount) VALUES (md5(:kid::text), 1);
SELECT idem_complete(md5(:kid::text), 'bench', '{"ok": true}');
END;
