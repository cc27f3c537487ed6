#!/usr/bin/env bash
# The demo, on a fresh Debian 12 machine as root:
#   bash scripts/demo.sh
# Installs what is missing, builds and installs idem, starts a private
# PostgreSQL cluster (port 5499, under .cluster/) and plays a payment that is
# retried after its answer was lost: the card is charged once, and the retry
# gets the first answer back. Safe to run again and again. Installs only
# what the demo needs (scripts/setup.sh without --tests); prints its time.
# Needs a Rust toolchain (README: Set-up).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
demo_started=$(date +%s)

bash "$ROOT/scripts/setup.sh"
idem_locate_cluster
setup_done=$(date +%s)
bash "$ROOT/scripts/cluster.sh" start

psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS idem_demo WITH (FORCE)" -c "CREATE DATABASE idem_demo"
say "the demo (database idem_demo; psql -h $(cluster_dir) -p $IDEM_PORT -U postgres idem_demo to look around)"
psql_idem -d idem_demo --echo-queries -v ON_ERROR_STOP=1 <<'SQL'
\set QUIET on
\pset footer off
CREATE EXTENSION idem;
CREATE TABLE charges (id bigserial PRIMARY KEY, order_no text, amount_cents int, charged_at timestamptz DEFAULT now());

-- The payment service's handler: one transaction per request. The claim and
-- the charge commit (or roll back) together.
CREATE FUNCTION pay(request_id text, order_no text, amount_cents int) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
  c idem_claim_result := idem_claim(request_id, 'payment', fingerprint => order_no || ':' || amount_cents);
  charge_id bigint;
BEGIN
  IF NOT c.claimed THEN
    RAISE NOTICE 'duplicate of a request first seen at %: replaying its answer', c.first_claimed_at;
    RETURN c.result;
  END IF;
  INSERT INTO charges (order_no, amount_cents) VALUES (order_no, amount_cents) RETURNING id INTO charge_id;
  PERFORM idem_complete(request_id, 'payment', jsonb_build_object('charge_id', charge_id, 'status', 'charged'));
  RETURN jsonb_build_object('charge_id', charge_id, 'status', 'charged');
END $$;
\set QUIET off

\echo
\echo '== 1. The client sends request req-42 (order A-1001, 25.00). The answer is lost on the way back.'
SELECT pay('req-42', 'A-1001', 2500) AS answer_that_got_lost;

\echo '== 2. The client does not know whether it worked, so it retries with the same request id.'
SELECT pay('req-42', 'A-1001', 2500) AS answer_to_the_retry;

\echo '== 3. The card was charged once:'
SELECT id, order_no, amount_cents FROM charges;

\echo '== 4. A bug reuses req-42 for a different payment: refused (SQLSTATE ID001), nothing charged.'
\set ON_ERROR_STOP off
SELECT pay('req-42', 'B-2002', 9900);
\set ON_ERROR_STOP on
SELECT count(*) AS charges FROM charges;

\echo '== 5. A request that fails rolls back with its claim, so its retry runs for real:'
BEGIN;
SELECT claimed FROM idem_claim('req-43', 'payment');
ROLLBACK;
SELECT claimed, state FROM idem_claim('req-43', 'payment');

\echo '== 6. What idem keeps (operator views):'
SELECT biz_type, ttl, live_keys, completed FROM idem_stats;
SQL
say "done: request req-42 was charged once and its retry got the first answer back"
now=$(date +%s)
say "demo finished in $((now - demo_started)) s (set-up $((setup_done - demo_started)) s, cluster and demo $((now - setup_done)) s)"
