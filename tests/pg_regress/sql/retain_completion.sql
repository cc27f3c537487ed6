-- retain_completion: idem_configure(biz_type, ttl, on_failure, retain_from)
-- with retain_from = 'completion': a finished claim expires its TTL after
-- it was finished, not after it was claimed. A claim finished 50 minutes
-- into its 1-hour TTL (made so by moving its times back, as a lease that
-- ran long would leave it) then lives another hour: its row moves to the
-- partition of its new expiry, in the class of its span (expiry less
-- claim time), with a registration that covers it, and keeps its claim
-- time (and so its claim id). Business types used here: rc, rc.*.
CREATE EXTENSION IF NOT EXISTS idem;
\set VERBOSITY sqlstate
\set SHOW_CONTEXT never

SELECT idem_configure('rc', '1 hour', NULL, 'completion');
SELECT idem_configure('rc.claim', '1 hour', NULL, 'claim');
SELECT idem_configure('rc.retry', '1 hour', 'retry', 'completion');
SELECT biz_type, ttl = interval '1 hour' AS one_hour, on_failure, retain_from FROM idem.biz_types WHERE biz_type LIKE 'rc%' ORDER BY 1;
-- The other forms keep what they do not name.
SELECT idem_configure('rc', '1 hour');
SELECT idem_configure('rc', '1 hour', 'replay');
SELECT biz_type, on_failure, retain_from FROM idem.biz_types WHERE biz_type = 'rc';
SELECT idem_configure('rc', '1 hour', NULL, 'completion');

-- Leased claims, taken 50 minutes ago (their times moved back).
CREATE TEMP TABLE tok (biz_type text, key text, token text);
INSERT INTO tok SELECT t, k, (SELECT result->>'lease_token' FROM idem_claim(k, t, lease => '1 hour'))
  FROM (VALUES ('rc', 'late-1'), ('rc', 'late-2'), ('rc.claim', 'late-1'), ('rc.retry', 'late-1'), ('rc', 'late-3')) v(t, k);
UPDATE idem.claims SET claimed_at = claimed_at - interval '50 minutes', expires_at = expires_at - interval '50 minutes'
 WHERE biz_type LIKE 'rc%';
CREATE TEMP TABLE before AS SELECT biz_type, key, claimed_at, expires_at FROM idem.claims WHERE biz_type LIKE 'rc%';

-- Completed, failed, failed under retry, and completed where the TTL
-- counts from the claim.
SELECT idem_complete('late-1', 'rc', '{"n": 1}', (SELECT token FROM tok WHERE biz_type = 'rc' AND key = 'late-1'));
SELECT idem_fail('late-2', 'rc', '{"declined": true}', (SELECT token FROM tok WHERE biz_type = 'rc' AND key = 'late-2'));
SELECT idem_complete('late-1', 'rc.claim', '{"n": 1}', (SELECT token FROM tok WHERE biz_type = 'rc.claim' AND key = 'late-1'));
SELECT idem_fail('late-1', 'rc.retry', '{"declined": true}', (SELECT token FROM tok WHERE biz_type = 'rc.retry' AND key = 'late-1'));
SELECT c.biz_type, c.key, c.state,
       c.claimed_at = b.claimed_at AS same_claim_time,
       c.expires_at - now() BETWEEN interval '59 minutes' AND interval '61 minutes' AS an_hour_from_now,
       c.expires_at = b.expires_at AS expiry_kept,
       c.ttl_class = idem.ttl_class(c.expires_at - c.claimed_at) AS class_of_span,
       EXISTS (SELECT 1 FROM idem.type_classes t
                WHERE t.biz_type = c.biz_type AND t.ttl_class = c.ttl_class AND t.until >= c.expires_at) AS registered
  FROM idem.claims c JOIN before b USING (biz_type, key)
 WHERE c.expires_at > now()
 ORDER BY 1, 2;
-- One live row per key, found by a duplicate with its outcome, its claim
-- id the same as before; a lookup finds it as well.
SELECT biz_type, key, count(*) FROM idem.claims WHERE biz_type LIKE 'rc%' GROUP BY 1, 2 HAVING count(*) <> 1;
SELECT claimed, state, result, first_claimed_at = (SELECT claimed_at FROM before WHERE biz_type = 'rc' AND key = 'late-1') AS same_first
  FROM idem_claim('late-1', 'rc');
SELECT state, result FROM idem_lookup('late-2', 'rc');
-- Once the first expiry has passed (moved forward again, as time would
-- do), the completed key is still answered; where the TTL counts from the
-- claim, it has expired and is claimed anew.
UPDATE idem.claims SET claimed_at = claimed_at - interval '15 minutes', expires_at = expires_at - interval '15 minutes'
 WHERE biz_type LIKE 'rc%';
SELECT claimed, state, result FROM idem_claim('late-1', 'rc');
SELECT claimed, state FROM idem_claim('late-1', 'rc.claim');

-- A claim completed in the transaction that made it: its expiry moves by
-- the time between, in the same class.
BEGIN;
CREATE TEMP TABLE c2 AS SELECT * FROM idem_claim('same-tx', 'rc');
SELECT idem_complete('same-tx', 'rc', '{"n": 2}');
SELECT l.expires_at >= c.expires_at AS not_earlier, l.first_claimed_at = c.first_claimed_at AS same_first
  FROM idem_lookup('same-tx', 'rc') l, c2 c;
COMMIT;
SELECT claimed, state, result FROM idem_claim('same-tx', 'rc');

-- Across a change of daylight saving time in the session's TimeZone: the
-- new expiry is the completion time plus the TTL in microseconds (the span
-- of the claim), not plus an interval of days, which the zone would stretch
-- or shrink by an hour. The TTL is as many days as reach past the zone's
-- next change from now (exactly one change: they are months apart).
SET TimeZone = 'Europe/Berlin';
SELECT idem_configure('rc.dst', '1 hour', NULL, 'completion');
CREATE TEMP TABLE dst AS
  SELECT make_interval(days => min(d)) AS ttl FROM generate_series(1, 366) d
   WHERE extract(timezone FROM now() + make_interval(days => d)) <> extract(timezone FROM now());
BEGIN;
SELECT claimed FROM idem_claim('across', 'rc.dst', ttl => (SELECT ttl FROM dst));
CREATE TEMP TABLE dst_claim AS
  SELECT claimed_at, expires_at, clock_timestamp() AS before_complete FROM idem.claims WHERE biz_type = 'rc.dst';
SELECT idem_complete('across', 'rc.dst', '{"n": 3}');
CREATE TEMP TABLE dst_done AS SELECT clock_timestamp() AS after_complete;
COMMIT;
SELECT extract(timezone FROM b.claimed_at) <> extract(timezone FROM b.expires_at) AS crosses_a_change,
       extract(epoch FROM b.expires_at) - extract(epoch FROM b.claimed_at) = extract(epoch FROM d.ttl) AS claim_span_is_ttl,
       extract(epoch FROM c.expires_at) - extract(epoch FROM b.expires_at) + extract(epoch FROM b.claimed_at)
         BETWEEN extract(epoch FROM b.before_complete) AND extract(epoch FROM a.after_complete) AS completion_plus_span,
       c.claimed_at = b.claimed_at AS same_claim_time
  FROM idem.claims c, dst_claim b, dst_done a, dst d WHERE c.biz_type = 'rc.dst' AND c.key = 'across';
SELECT claimed, state, result FROM idem_claim('across', 'rc.dst');
RESET TimeZone;

-- Maintenance after the moves: nothing live is removed, the keys answer.
-- (idem_maintain runs in READ COMMITTED only: the environment matrix runs
-- this file under other defaults too.)
SET default_transaction_isolation = 'read committed';
SELECT idem_maintain() IS NOT NULL AS maintained;
RESET default_transaction_isolation;
SELECT 'late-1' AS key, state FROM idem_lookup('late-1', 'rc')
UNION ALL SELECT 'same-tx', state FROM idem_lookup('same-tx', 'rc');

-- Bad values.
SELECT idem_configure('rc', '1 hour', NULL, 'forever');
SELECT idem_configure('rc', '1 hour', 'sometimes', 'claim');
SELECT idem_configure('bad type', '1 hour', NULL, 'claim');
BEGIN READ ONLY;
SELECT idem_configure('rc', '1 hour', NULL, 'claim');
ROLLBACK;
-- Not for PUBLIC, as the other forms.
SELECT has_function_privilege('public', 'idem_configure(text, interval, text, text)', 'EXECUTE') AS public_execute;

DELETE FROM idem.claims WHERE biz_type LIKE 'rc%';
DELETE FROM idem.biz_types WHERE biz_type LIKE 'rc%';
