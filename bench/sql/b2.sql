-- B2: hand-written dedup through PL/pgSQL: INSERT in a BEGIN ... EXCEPTION
-- WHEN unique_violation block (one subtransaction per call).
\set n :n + 1
\set kid (:run * 1000 + :client_id) * 10000000000 + :n
BEGIN;
SELECT dedup_claim_exc(md5(:kid::text));
INSERT INTO orders (key, amount) VALUES (md5(:kid::text), 1);
END;
