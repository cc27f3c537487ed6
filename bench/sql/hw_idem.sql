-- handwritten section, idem's counterpart: SELECT claimed FROM idem_claim()
-- on business type hw (TTL as the hand-written table's), then the business
-- insert, in one transaction.
\set n :n + 1
\set kid (:run * 1000 + :client_id) * 10000000000 + :n
BEGIN;
SELECT claimed FROM idem_claim(md5(:kid::text), 'hw');
INSERT INTO orders (key, amount) VALUES (md5(:kid::text), 1);
END;
