-- Batch M: one idem_claim_many of :batch new keys in one transaction (a
-- consumer's poll), the business insert of the claimed ones in the same
-- statement.
\set n :n + 1
\set kid ((:run * 1000 + :client_id) * 1000000 + :n) * 10000
BEGIN;
INSERT INTO orders (key, amount)
  SELECT c.key, 1
    FROM idem_claim_many(ARRAY(SELECT md5((:kid::bigint + g)::text) FROM generate_series(1, :batch::int) g), 'bench') c
   WHERE c.claimed;
END;
