-- B1d (WAL/xid section only): the hand-written duplicate path,
-- INSERT ... ON CONFLICT DO NOTHING on a key that is already there.
\set r random(1, :prefill)
BEGIN;
INSERT INTO dedup (key) VALUES (md5('p' || :r::text)) ON CONFLICT DO NOTHING;
END;
