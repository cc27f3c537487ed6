-- Batch H: the hand-written batch dedup: INSERT ... SELECT unnest(...) ON
-- CONFLICT DO NOTHING RETURNING of :batch new keys, the business insert of
-- the returned (new) ones in the same statement.
\set n :n + 1
\set kid ((:run * 1000 + :client_id) * 1000000 + :n) * 10000
BEGIN;
WITH fresh AS (
  INSERT INTO dedup (key)
  SELECT unnest(ARRAY(SELECT md5((:kid::bigint + g)::text) FROM generate_series(1, :batch::int) g))
  ON CONFLICT DO NOTHING RETURNING key)
INSERT INTO orders (key, amount) SELECT key, 1 FROM fresh;
END;
