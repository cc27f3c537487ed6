-- I2: claim + stored result, B1r's counterpart: idem_claim on a new key (in
-- the form the README recommends, as I1c), the business insert, then
-- idem_complete with a small result ({"ok": true}: the space keeps pgbench
-- from reading ":true" as a variable).
\set n :n + 1
\set kid (:run * 1000 + :client_id) * 10000000000 + :n
BEGIN;
SELECT claimed FROM idem_claim(md5(:kid::text), 'bench');
INSERT INTO orders (key, amount) VALUES (md5(:kid::text), 1);
SELECT idem_complete(md5(:kid::text), 'bench', '{"ok": true}');
END;
