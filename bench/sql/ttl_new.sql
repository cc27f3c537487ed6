-- ttl section, new key: idem_claim on a new key of business type :type (the
-- section runs it once per type, -D type=...), then idem_complete, in one
-- transaction. No business insert: the claim's own cost is what the section
-- compares across TTLs.
\set n :n + 1
\set kid (:run * 1000 + :client_id) * 10000000000 + :n
BEGIN;
SELECT claimed FROM idem_claim(md5(:kid::text), :type);
SELECT idem_complete(md5(:kid::text), :type, '{"ok": true}');
END;
