-- completer: idem_take_expired_leases hands each lease that ran out (or was
-- released) to one caller, taking it over as the next idem_claim would,
-- with what a re-drive needs. Leases are made to run out with idem_release
-- (no sleeping). Business types used here: ct, ct.*.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idem;
DROP ROLE IF EXISTS regress_idem_ct_owner;
DROP ROLE IF EXISTS regress_idem_ct_other;
DROP ROLE IF EXISTS regress_idem_ct_cron;
RESET client_min_messages;
\set SHOW_CONTEXT never
\set VERBOSITY sqlstate

-- A lease whose holder checkpointed (merging recovery data) and then gave
-- it back; one still running; one released without a checkpoint; a claim
-- without a lease; a completed lease; a failure of a type that retries.
SELECT result->>'lease_token' AS tok1 FROM idem_claim('c1', 'ct', lease => '1 hour') \gset
SELECT idem_checkpoint('c1', 'ct', 'charge_created', '{"charge":"ch_1"}', :'tok1');
SELECT idem_checkpoint('c1', 'ct', 'receipt_sent', '{"receipt":7}', :'tok1', true);
SELECT idem_release('c1', 'ct', :'tok1');
SELECT result->>'lease_token' AS tok2 FROM idem_claim('c2', 'ct', lease => '1 hour') \gset
SELECT result->>'lease_token' AS tok3 FROM idem_claim('c3', 'ct', lease => '1 hour') \gset
SELECT idem_release('c3', 'ct', :'tok3');
SELECT claimed FROM idem_claim('c4', 'ct');
SELECT result->>'lease_token' AS tok5 FROM idem_claim('c5', 'ct', lease => '1 hour') \gset
SELECT idem_release('c5', 'ct', :'tok5');
SELECT idem_complete('c5', 'ct', '{"done":true}', (SELECT result->>'lease_token' FROM idem_claim('c5', 'ct', lease => '1 hour')));
SELECT idem_configure('ct.retry', '1 day', 'retry');
SELECT result->>'lease_token' AS tok6 FROM idem_claim('c6', 'ct.retry', lease => '1 hour') \gset
SELECT idem_fail('c6', 'ct.retry', '{"declined":true}', :'tok6');

-- The two run-out leases are taken (and nothing else):
-- attempt 2, the recovery point and (merged) data, a fresh token, the
-- lease as long as the last one, the claim's own id.
CREATE TEMP TABLE taken AS SELECT * FROM idem_take_expired_leases('ct');
SELECT key, attempt, recovery_point, recovery_data, length(lease_token) AS token_length,
       lease_token NOT IN (:'tok1', :'tok3') AS new_token,
       lease_until > now() + interval '59 minutes' AND lease_until <= expires_at AS lease_as_before,
       claim_id = idem_claim_id(key, 'ct', first_claimed_at) AS claim_id_ok
  FROM taken ORDER BY key;
-- Taken over: nothing is left for a second completer, a duplicate finds the
-- lease running again, and the former holder's token is refused.
SELECT count(*) AS left_over FROM idem_take_expired_leases('ct');
SELECT claimed, state FROM idem_claim('c1', 'ct', lease => '1 hour');
SELECT idem_checkpoint('c1', 'ct', 'late', NULL, :'tok1');
SELECT key, attempt, ran_out FROM idem_leases WHERE biz_type = 'ct' ORDER BY key;
-- The re-drive finishes with the token it was handed.
SELECT idem_complete('c1', 'ct', '{"charged":true}', (SELECT lease_token FROM taken WHERE key = 'c1'));
SELECT claimed, state, result FROM idem_claim('c1', 'ct');
-- The completer never claims a key anew: the failure of a type that retries
-- stays as it is (its next arrival claims it).
SELECT count(*) AS taken FROM idem_take_expired_leases('ct.retry');
SELECT state FROM idem_lookup('c6', 'ct.retry');

-- max_leases caps what one call takes; lease sets the new lease's length,
-- never past the claim's expiry.
SELECT idem_release(k, 'ct.many', (SELECT result->>'lease_token' FROM idem_claim(k, 'ct.many', ttl => '2 hours', lease => '1 hour')))
  FROM unnest(ARRAY['m1', 'm2', 'm3']) AS k;
SELECT count(*) AS first_call FROM idem_take_expired_leases('ct.many', 2);
SELECT count(*) AS second_call FROM idem_take_expired_leases('ct.many', 2);
SELECT idem_release(k, 'ct.long', (SELECT result->>'lease_token' FROM idem_claim(k, 'ct.long', ttl => '2 hours', lease => '1 minute')))
  FROM unnest(ARRAY['l1', 'l2']) AS k;
SELECT key, lease_until = expires_at AS capped_at_expiry,
       lease_until BETWEEN now() + interval '29 minutes' AND now() + interval '31 minutes' AS thirty_minutes
  FROM idem_take_expired_leases('ct.long', 1, lease => '30 minutes')
UNION ALL
SELECT key, lease_until = expires_at, false
  FROM idem_take_expired_leases('ct.long', 1, lease => '5 hours')
 ORDER BY 1;

-- In the transaction that took them, the completer's leases are its own:
-- a rollback gives them back, run out, for the next completer.
BEGIN;
SELECT result->>'lease_token' AS tok7 FROM idem_claim('c7', 'ct.tx', lease => '1 hour') \gset
SELECT idem_release('c7', 'ct.tx', :'tok7');
SELECT count(*) AS own_claim_not_taken FROM idem_take_expired_leases('ct.tx');
COMMIT;
BEGIN;
SELECT key, attempt FROM idem_take_expired_leases('ct.tx');
ROLLBACK;
SELECT key, attempt FROM idem_take_expired_leases('ct.tx');

-- The request kept for a re-drive (docs/patterns.md, "External charge with
-- recovery points"): checkpointed in the claim's own transaction, without
-- the token there, it commits with the claim; a later step merges into it;
-- the completer hands the whole of it over. A claim whose transaction rolled
-- back leaves nothing for the completer.
BEGIN;
SELECT result->>'lease_token' AS tokq FROM idem_claim('q1', 'ct.request', lease => '1 hour') \gset
SELECT idem_checkpoint('q1', 'ct.request', 'received', '{"request": {"order": "A-7", "amount_cents": 2500}}');
COMMIT;
SELECT idem_checkpoint('q1', 'ct.request', 'charged', '{"charge_id": "ch_9"}', :'tokq', merge => true);
SELECT idem_release('q1', 'ct.request', :'tokq');
BEGIN;
SELECT claimed FROM idem_claim('q2', 'ct.request', lease => '1 hour');
SELECT idem_checkpoint('q2', 'ct.request', 'received', '{"request": {"order": "A-8"}}');
ROLLBACK;
SELECT key, attempt, recovery_point, recovery_data FROM idem_take_expired_leases('ct.request');
SELECT state FROM idem_lookup('q2', 'ct.request');

-- The recipe of docs/patterns.md ("A completer for leases nobody came
-- back for"; its business type here ct.charge), run as its pg_cron job
-- would: CALL complete_charges() in a transaction of its own, by a role
-- that owns the type and has no right on schema idem.
CREATE TABLE charge_redrives (
    key            text   NOT NULL,
    attempt        bigint NOT NULL,
    recovery_point text,
    recovery_data  jsonb,
    lease_token    text   NOT NULL,
    claim_id       uuid   NOT NULL,
    PRIMARY KEY (key, attempt)
);
CREATE PROCEDURE redrive_charge(key text, attempt bigint, recovery_point text,
                                recovery_data jsonb, lease_token text, claim_id uuid)
LANGUAGE plpgsql AS $$
BEGIN
    IF attempt > 5 THEN
        PERFORM idem_fail(key, 'ct.charge',
                          jsonb_build_object('gave_up', true, 'recovery_point', recovery_point), lease_token);
    ELSE
        INSERT INTO charge_redrives VALUES (key, attempt, recovery_point, recovery_data, lease_token, claim_id);
    END IF;
END
$$;
CREATE PROCEDURE complete_charges()
LANGUAGE plpgsql AS $$
DECLARE
    l record;
BEGIN
    FOR l IN SELECT * FROM idem_take_expired_leases('ct.charge', 100, lease => '10 minutes') LOOP
        CALL redrive_charge(l.key, l.attempt, l.recovery_point, l.recovery_data, l.lease_token, l.claim_id);
    END LOOP;
END
$$;
CREATE ROLE regress_idem_ct_cron;
GRANT SELECT, INSERT, DELETE ON charge_redrives TO regress_idem_ct_cron;
SELECT idem_set_owner('ct.charge', 'regress_idem_ct_cron');
SET ROLE regress_idem_ct_cron;
-- r1: its worker charged, checkpointed and died (its lease given back
-- here: run out); r2: given back five times; r3: its worker is at work.
SELECT result->>'lease_token' AS tokr1 FROM idem_claim('r1', 'ct.charge', lease => '1 hour') \gset
SELECT idem_checkpoint('r1', 'ct.charge', 'charge_created', '{"charge_id":"ch_1"}', :'tokr1');
SELECT idem_release('r1', 'ct.charge', :'tokr1');
SELECT idem_release('r2', 'ct.charge', (SELECT result->>'lease_token' FROM idem_claim('r2', 'ct.charge', lease => '1 hour')));
SELECT idem_release('r2', 'ct.charge', (SELECT result->>'lease_token' FROM idem_claim('r2', 'ct.charge', lease => '1 hour')));
SELECT idem_release('r2', 'ct.charge', (SELECT result->>'lease_token' FROM idem_claim('r2', 'ct.charge', lease => '1 hour')));
SELECT idem_release('r2', 'ct.charge', (SELECT result->>'lease_token' FROM idem_claim('r2', 'ct.charge', lease => '1 hour')));
SELECT idem_release('r2', 'ct.charge', (SELECT result->>'lease_token' FROM idem_claim('r2', 'ct.charge', lease => '1 hour')));
SELECT claimed FROM idem_claim('r3', 'ct.charge', lease => '1 hour');
CALL complete_charges();
-- r1 queued as attempt 2 with its recovery point; r2 given up (failed,
-- with the error); r3 left to its worker. A second run finds nothing.
SELECT key, attempt, recovery_point, recovery_data, claim_id = idem_claim_id(key, 'ct.charge', (SELECT first_claimed_at FROM idem_lookup(key, 'ct.charge'))) AS same_claim_id
  FROM charge_redrives ORDER BY key, attempt;
SELECT state, result FROM idem_lookup('r2', 'ct.charge');
SELECT state FROM idem_lookup('r3', 'ct.charge');
CALL complete_charges();
SELECT count(*) AS queued FROM charge_redrives;
-- The worker resumes r1 with the token it was queued with, and finishes.
SELECT idem_complete(key, 'ct.charge', recovery_data || '{"resumed": true}', lease_token)
  FROM charge_redrives WHERE key = 'r1';
DELETE FROM charge_redrives WHERE key = 'r1';
SELECT state, result FROM idem_lookup('r1', 'ct.charge');
RESET ROLE;
SELECT idem_set_owner('ct.charge', NULL);
DROP PROCEDURE complete_charges();
DROP PROCEDURE redrive_charge(text, bigint, text, jsonb, text, uuid);
DROP TABLE charge_redrives;
DROP ROLE regress_idem_ct_cron;

-- Bad arguments.
SELECT * FROM idem_take_expired_leases(NULL);
SELECT * FROM idem_take_expired_leases('bad type');
SELECT * FROM idem_take_expired_leases('ct', NULL);
SELECT * FROM idem_take_expired_leases('ct', 0);
SELECT * FROM idem_take_expired_leases('ct', 10001);
SELECT * FROM idem_take_expired_leases('ct', 10, interval '0 seconds');
SELECT * FROM idem_take_expired_leases('ct', 10, interval '401 days');
BEGIN READ ONLY;
SELECT * FROM idem_take_expired_leases('ct');
ROLLBACK;

-- Privileges: a role without any right on schema idem (it cannot read
-- idem_leases) completes the leases of a type reserved for it; another
-- role is refused (42501) and takes nothing.
CREATE ROLE regress_idem_ct_owner;
CREATE ROLE regress_idem_ct_other;
SELECT idem_set_owner('ct.owned', 'regress_idem_ct_owner');
SET ROLE regress_idem_ct_owner;
SELECT idem_release('o1', 'ct.owned', (SELECT result->>'lease_token' FROM idem_claim('o1', 'ct.owned', lease => '1 hour')));
SELECT count(*) FROM idem_leases;
SET ROLE regress_idem_ct_other;
SELECT * FROM idem_take_expired_leases('ct.owned');
SET ROLE regress_idem_ct_owner;
SELECT key, attempt FROM idem_take_expired_leases('ct.owned');
RESET ROLE;
SELECT key, attempt, ran_out FROM idem_leases WHERE biz_type = 'ct.owned';
SELECT idem_set_owner('ct.owned', NULL);
DROP ROLE regress_idem_ct_owner;
DROP ROLE regress_idem_ct_other;
DELETE FROM idem.claims WHERE biz_type LIKE 'ct%';
DELETE FROM idem.biz_types WHERE biz_type LIKE 'ct%';
