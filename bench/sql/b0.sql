-- B0: the business insert alone. :kid is unique per transaction (see README).
\set n :n + 1
\set kid (:run * 1000 + :client_id) * 10000000000 + :n
BEGIN;
INSERT INTO orders (key, amount) VALUES (md5(:kid::text), 1);
END;
