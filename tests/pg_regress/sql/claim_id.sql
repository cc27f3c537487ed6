-- claim_id: idem_claim_id(key, biz_type, first_claimed_at), the id of one
-- claim of a key: the same on every attempt, takeover and retry of the
-- claim, another for the key's next claim. Business types used here:
-- cid.charge, cid.retry, cid.other.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idem;
RESET client_min_messages;
\set SHOW_CONTEXT never
\set VERBOSITY sqlstate

-- The bytes are fixed (src/key.rs, claim_id); this value was computed
-- outside PostgreSQL, with Python's hashlib, and is the same on both
-- editions. A version 8 UUID.
SELECT idem_claim_id('order-1', 'pay', '2026-01-01 00:00:00+00') AS id;
SELECT idem_claim_id('order-1', 'pay', '2026-01-01 00:00:00+00') = '92dde4a1-1e1d-8daf-b176-a1873557421a' AS fixed;
-- Each input counts; NULL in, NULL out.
SELECT count(DISTINCT id) AS distinct_ids FROM (VALUES
    (idem_claim_id('order-1', 'pay', '2026-01-01 00:00:00+00')),
    (idem_claim_id('order-2', 'pay', '2026-01-01 00:00:00+00')),
    (idem_claim_id('order-1', 'pay2', '2026-01-01 00:00:00+00')),
    (idem_claim_id('order-1', 'pay', '2026-01-01 00:00:00.000001+00')),
    (idem_claim_id('pay', 'order-1', '2026-01-01 00:00:00+00'))) v(id);
SELECT idem_claim_id(NULL, 'pay', now()) IS NULL AS null_key, idem_claim_id('k', 'pay', NULL) IS NULL AS null_time;

-- A lease handed back and taken over: the same claim, the same id, which a
-- duplicate computes too.
CREATE TEMP TABLE ids (step text, id uuid);
CREATE TEMP TABLE tok (t text);
WITH c AS (SELECT * FROM idem_claim('C-1', 'cid.charge', lease => '5 minutes')),
     k AS (INSERT INTO tok SELECT result->>'lease_token' FROM c)
INSERT INTO ids SELECT 'first', idem_claim_id('C-1', 'cid.charge', first_claimed_at) FROM c;
SELECT idem_release('C-1', 'cid.charge', t) FROM tok;
INSERT INTO ids SELECT 'takeover', idem_claim_id('C-1', 'cid.charge', first_claimed_at)
  FROM idem_claim('C-1', 'cid.charge', lease => '5 minutes') WHERE claimed;
INSERT INTO ids SELECT 'duplicate', idem_claim_id('C-1', 'cid.charge', first_claimed_at)
  FROM idem_claim('C-1', 'cid.charge', wait => false) WHERE NOT claimed;
INSERT INTO ids SELECT 'lookup', idem_claim_id('C-1', 'cid.charge', first_claimed_at) FROM idem_lookup('C-1', 'cid.charge');
SELECT step, id = (SELECT id FROM ids WHERE step = 'first') AS same FROM ids ORDER BY step;

-- A retry after a stored failure (on_failure = retry) is the same claim.
SELECT idem_configure('cid.retry', '1 hour', 'retry');
BEGIN;
INSERT INTO ids SELECT 'retry 1', idem_claim_id('R-1', 'cid.retry', first_claimed_at) FROM idem_claim('R-1', 'cid.retry');
SELECT idem_fail('R-1', 'cid.retry', '"declined"');
COMMIT;
INSERT INTO ids SELECT 'retry 2', idem_claim_id('R-1', 'cid.retry', first_claimed_at) FROM idem_claim('R-1', 'cid.retry') WHERE claimed;
SELECT count(*) AS claims, count(DISTINCT id) AS ids FROM ids WHERE step LIKE 'retry%';

-- The key's next claim (here after an operator's eviction) has another id.
BEGIN;
INSERT INTO ids SELECT 'before', idem_claim_id('O-1', 'cid.other', first_claimed_at) FROM idem_claim('O-1', 'cid.other');
COMMIT;
SELECT idem_forget('O-1', 'cid.other');
INSERT INTO ids SELECT 'after', idem_claim_id('O-1', 'cid.other', first_claimed_at) FROM idem_claim('O-1', 'cid.other') WHERE claimed;
SELECT count(*) AS claims, count(DISTINCT id) AS ids FROM ids WHERE step IN ('before', 'after');

-- Callable by PUBLIC (it reads nothing).
SELECT has_function_privilege('public', 'idem_claim_id(text, text, timestamptz)', 'EXECUTE') AS public_execute;

DELETE FROM idem.claims WHERE biz_type LIKE 'cid.%';
DELETE FROM idem.biz_types WHERE biz_type LIKE 'cid.%';
