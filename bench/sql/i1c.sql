-- I1c: I1 in the form the README recommends, SELECT claimed FROM
-- idem_claim(...): only the column the application branches on is sent
-- back (and it is the form Citus delegates to the worker).
\set n :n + 1
\set kid (:run * 1000 + :client_id) * 10000000000 + :n
BEGIN;
SELECT claimed FROM idem_claim(md5(:kid::text), 'bench');
INSERT INTO orders (key, amount) VALUES (md5(:kid::text), 1);
END;
