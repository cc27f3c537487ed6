-- I3: the duplicate path: idem_claim on a key claimed (and committed) before
-- the run. A duplicate does not redo the business work: the application
-- returns the stored outcome, so there is no business insert.
\set r random(1, :prefill)
BEGIN;
SELECT idem_claim(md5('p' || :r::text), 'bench');
END;
