-- claim_ttl: how long a claim lives. Per-call ttl > idem_configure > idem.default_ttl,
-- and an expired claim no longer counts. Business types used here: ttl, ttl.*.
-- (Intervals are printed as seconds: the output must not depend on the
-- session's IntervalStyle; tests/scenarios/hardening.sh environments varies it.)
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idem;
RESET client_min_messages;
\set SHOW_CONTEXT never
\set VERBOSITY sqlstate

-- The idem.* settings exist once the library is loaded in the session (the
-- first call of an idem function does it; the extension is not preloaded).
SELECT state FROM idem_lookup('nothing', 'ttl');
-- An unconfigured type uses idem.default_ttl, 24 hours by default.
SHOW idem.default_ttl;
SELECT claimed, expires_at - first_claimed_at = interval '24 hours' AS ttl_24h
  FROM idem_claim('a', 'ttl.guc');

-- The per-call ttl decides expires_at exactly: expires_at = first_claimed_at + ttl.
SELECT claimed, extract(epoch FROM expires_at - first_claimed_at) AS ttl_seconds FROM idem_claim('b', 'ttl.guc', ttl => '90 minutes');
SELECT claimed, extract(epoch FROM expires_at - first_claimed_at) AS ttl_seconds FROM idem_claim('c', 'ttl.guc', ttl => '1 second');
SELECT claimed, extract(epoch FROM expires_at - first_claimed_at) AS ttl_seconds FROM idem_claim('d', 'ttl.guc', ttl => '400 days');
-- A duplicate reports the original expiry, not one computed from its own ttl.
SELECT claimed, extract(epoch FROM expires_at - first_claimed_at) AS ttl_seconds FROM idem_claim('b', 'ttl.guc', ttl => '5 hours');

-- Changing idem.default_ttl changes the TTL of unconfigured types for later claims.
SET idem.default_ttl = '2 hours';
SHOW idem.default_ttl;
SELECT claimed, extract(epoch FROM expires_at - first_claimed_at) AS ttl_seconds FROM idem_claim('e', 'ttl.guc');
-- ... and SET LOCAL only for the transaction.
BEGIN;
SET LOCAL idem.default_ttl = '3 hours';
SELECT claimed, extract(epoch FROM expires_at - first_claimed_at) AS ttl_seconds FROM idem_claim('f', 'ttl.guc');
COMMIT;
SELECT claimed, extract(epoch FROM expires_at - first_claimed_at) AS ttl_seconds FROM idem_claim('g', 'ttl.guc');

-- idem_configure sets a type's TTL; it beats idem.default_ttl (still 2 hours here).
SELECT idem_configure('ttl.conf', '45 minutes');
SELECT biz_type, extract(epoch FROM ttl) AS ttl_seconds FROM idem.biz_types WHERE biz_type = 'ttl.conf';
SELECT claimed, extract(epoch FROM expires_at - first_claimed_at) AS ttl_seconds FROM idem_claim('a', 'ttl.conf');
-- The per-call ttl beats idem_configure.
SELECT claimed, extract(epoch FROM expires_at - first_claimed_at) AS ttl_seconds FROM idem_claim('b', 'ttl.conf', ttl => '10 minutes');
-- Other types keep using the GUC.
SELECT claimed, extract(epoch FROM expires_at - first_claimed_at) AS ttl_seconds FROM idem_claim('h', 'ttl.guc');
-- Reconfiguring an existing type applies to the next claim.
SELECT idem_configure('ttl.conf', '6 hours');
SELECT claimed, extract(epoch FROM expires_at - first_claimed_at) AS ttl_seconds FROM idem_claim('c', 'ttl.conf');
-- NULL returns the type to idem.default_ttl.
SELECT idem_configure('ttl.conf', NULL);
SELECT biz_type, extract(epoch FROM ttl) AS ttl_seconds FROM idem.biz_types WHERE biz_type = 'ttl.conf';
SELECT claimed, extract(epoch FROM expires_at - first_claimed_at) AS ttl_seconds FROM idem_claim('d', 'ttl.conf');
-- Configuring a type already in use does not change its existing claims.
SELECT claimed, extract(epoch FROM expires_at - first_claimed_at) AS ttl_seconds FROM idem_claim('a', 'ttl.conf');

-- idem_configure rolled back leaves the type as it was, for this session too.
BEGIN;
SELECT idem_configure('ttl.conf', '7 hours');
SELECT claimed, extract(epoch FROM expires_at - first_claimed_at) AS ttl_seconds FROM idem_claim('e', 'ttl.conf');
ROLLBACK;
SELECT biz_type, extract(epoch FROM ttl) AS ttl_seconds FROM idem.biz_types WHERE biz_type = 'ttl.conf';
SELECT claimed, extract(epoch FROM expires_at - first_claimed_at) AS ttl_seconds FROM idem_claim('e', 'ttl.conf');

-- idem_configure may name a type before its first claim.
SELECT idem_configure('ttl.early', '15 minutes');
SELECT claimed, extract(epoch FROM expires_at - first_claimed_at) AS ttl_seconds FROM idem_claim('a', 'ttl.early');
RESET idem.default_ttl;
-- A configured type ignores idem.default_ttl whatever its value.
SELECT claimed, extract(epoch FROM expires_at - first_claimed_at) AS ttl_seconds FROM idem_claim('b', 'ttl.early');

-- Expiry: a claim past expires_at no longer counts. Claim with a 1-second TTL and outlive it.
BEGIN;
SELECT claimed, state FROM idem_claim('short', 'ttl', ttl => '1 second', fingerprint => 'v1');
SELECT idem_complete('short', 'ttl', '{"v": 1}');
COMMIT;
SELECT extract(epoch FROM first_claimed_at) AS short_first FROM idem_lookup('short', 'ttl') \gset
-- Before it expires: a duplicate.
SELECT claimed, state, result FROM idem_lookup('short', 'ttl');
SELECT pg_sleep(1.2);
-- After: lookup says absent and idem_forget finds nothing.
SELECT claimed, state, result, first_claimed_at, expires_at FROM idem_lookup('short', 'ttl');
SELECT idem_forget('short', 'ttl');
-- A new claim succeeds, even with another fingerprint (the expired one is not checked).
BEGIN;
SELECT claimed, state, result, extract(epoch FROM first_claimed_at) > :short_first AS later_first
  FROM idem_claim('short', 'ttl', fingerprint => 'v2');
SELECT idem_complete('short', 'ttl', '{"v": 2}');
COMMIT;
-- From then on duplicates see the new claim.
SELECT claimed, state, result, extract(epoch FROM expires_at - first_claimed_at) AS ttl_seconds FROM idem_claim('short', 'ttl', fingerprint => 'v2');
SELECT claimed FROM idem_claim('short', 'ttl', fingerprint => 'v1');

-- Interval settings are checked when set: a bad value is refused by SET
-- itself (22023), not by the next claim.
\set VERBOSITY sqlstate
SET idem.default_ttl = 'banana';
SET idem.default_ttl = '0';
SET idem.default_ttl = '401 days';
SET idem.partition_width = '10 milliseconds';
SET idem.maintenance_lock_timeout = '2 hours';
SET idem.default_ttl = 'P2D';
SELECT extract(epoch FROM expires_at - first_claimed_at) AS iso8601_ttl_seconds FROM idem_claim('iso-ttl', 'ttl.iso');
RESET idem.default_ttl;
\set VERBOSITY default
