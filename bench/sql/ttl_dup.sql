-- ttl section, duplicate: idem_claim on a key of business type :type claimed
-- (with the type's TTL, so still live) before the run.
\set r random(1, :prefill)
BEGIN;
SELECT claimed FROM idem_claim(md5('p' || :r::text), :type);
END;
