-- I1f: I1 with the field-selection form SELECT (idem_claim(...)).claimed.
\set n :n + 1
\set kid (:run * 1000 + :client_id) * 10000000000 + :n
BEGIN;
SELECT (idem_claim(md5(:kid::text), 'bench')).claimed;
INSERT INTO orders (key, amount) VALUES (md5(:kid::text), 1);
END;
