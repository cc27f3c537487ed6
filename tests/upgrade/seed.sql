-- Live state in a database with idem installed (any shipped version), for
-- the tests that move it to the current version and check it there: the
-- update from every shipped version (tests/scenarios/packaging.sh upgrade)
-- and pg_upgrade from 15 to 18 (tests/versions/majors.sh pg_upgrade).
-- A business type with its TTL; claims completed, failed, in the default
-- partition (400 days), committed unfinished; a lease (its token in
-- lease_token.t); a state machine guarding a table that has made one
-- transition; a one-time token (tok.t).
SELECT idem_configure('pay', '3 days');
SELECT idem_maintain();
BEGIN; SELECT idem_claim('done', 'pay'); SELECT idem_complete('done', 'pay', '{"charged": 42}'); COMMIT;
BEGIN; SELECT idem_claim('refused', 'pay'); SELECT idem_fail('refused', 'pay', '{"reason": "card declined"}'); COMMIT;
BEGIN; SELECT idem_claim('far', 'pay', ttl => '400 days'); SELECT idem_complete('far', 'pay', '{"far": true}'); COMMIT;
SELECT idem_claim('open', 'pay');
CREATE TABLE lease_token AS SELECT result->>'lease_token' AS t FROM idem_claim('leased', 'pay', lease => '1 hour');
SELECT idem_define_machine('order', '{"CREATED": ["PAID"], "PAID": ["SHIPPED"]}');
CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL);
SELECT idem_guard('orders', 'status', 'order');
INSERT INTO orders VALUES (1, 'CREATED');
UPDATE orders SET status = 'PAID' WHERE id = 1;
CREATE TABLE tok AS SELECT idem_issue_token('form') AS t;
