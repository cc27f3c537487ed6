-- handwritten section, the hand-written claim: INSERT ... ON CONFLICT DO
-- NOTHING RETURNING into hw_dedup (a cleanup job DELETEs its expired rows),
-- then the business insert, in one transaction.
\set n :n + 1
\set kid (:run * 1000 + :client_id) * 10000000000 + :n
BEGIN;
INSERT INTO hw_dedup (key) VALUES (md5(:kid::text)) ON CONFLICT DO NOTHING RETURNING key;
INSERT INTO orders (key, amount) VALUES (md5(:kid::text), 1);
END;
