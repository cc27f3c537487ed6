CREATE EXTENSION IF NOT EXISTS idem;
\set VERBOSITY sqlstate
\set SHOW_CONTEXT never

-- A machine: orders go CREATED -> PAID -> SHIPPED -> DONE; CREATED or PAID may be cancelled/refunded.
SELECT idem_define_machine('order', '{"CREATED":["PAID","CANCELLED"],"PAID":["SHIPPED","REFUNDED"],"SHIPPED":["DONE"]}');
SELECT idem_machine('order') -> 'reachable' -> 'CREATED' AS reachable_from_created;

-- Bad definitions: 22023 (or 22004 for NULL), and nothing is stored.
SELECT idem_define_machine('', '{"A":["B"]}');
SELECT idem_define_machine('bad name', '{"A":["B"]}');
SELECT idem_define_machine('m', '[]');
SELECT idem_define_machine('m', '{}');
SELECT idem_define_machine('m', '{"A":"B"}');
SELECT idem_define_machine('m', '{"A":[""]}');
SELECT idem_define_machine('m', '{"A":[1]}');
SELECT idem_define_machine('m', '{"":["B"]}');
SELECT idem_define_machine('m', '{"A":["A"]}');
SELECT idem_define_machine(NULL, '{"A":["B"]}');
SELECT idem_machine('m');  -- nothing stored: no such machine (22023)

-- Redefining replaces.
SELECT idem_define_machine('tmp', '{"A":["B"]}');
SELECT idem_define_machine('tmp', '{"X":["Y"]}');
SELECT idem_machine('tmp') -> 'transitions' AS replaced;

CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL, version int NOT NULL DEFAULT 0);
INSERT INTO orders VALUES (1, 'CREATED'), (2, 'CREATED'), (3, 'CREATED');

-- A payment callback, then its retry: applied, then already.
SELECT idem_transition('orders', 'id', '1', 'status', 'PAID', 'order');
SELECT idem_transition('orders', 'id', '1', 'status', 'PAID', 'order');

-- Out of order: SHIPPED before PAID is premature (nothing changes) ...
SELECT idem_transition('orders', 'id', '2', 'status', 'SHIPPED', 'order');
SELECT status FROM orders WHERE id = 2;
-- ... PAID arrives and applies, the retried SHIPPED applies, a late PAID is stale.
SELECT idem_transition('orders', 'id', '2', 'status', 'PAID', 'order');
SELECT idem_transition('orders', 'id', '2', 'status', 'SHIPPED', 'order');
SELECT idem_transition('orders', 'id', '2', 'status', 'PAID', 'order');
SELECT idem_transition('orders', 'id', '2', 'status', 'CREATED', 'order');
SELECT status FROM orders WHERE id = 2;

-- Illegal: a cancelled order cannot be paid (ID002); SHIPPED cannot be cancelled.
SELECT idem_transition('orders', 'id', '3', 'status', 'CANCELLED', 'order');
SELECT idem_transition('orders', 'id', '3', 'status', 'PAID', 'order');
SELECT idem_transition('orders', 'id', '2', 'status', 'CANCELLED', 'order');
\set VERBOSITY default
SELECT idem_transition('orders', 'id', '3', 'status', 'PAID', 'order');
\set VERBOSITY sqlstate

-- Missing row: P0002. Unknown state or machine: 22023. Unknown column: 42703. NULLs: 22004.
SELECT idem_transition('orders', 'id', '99', 'status', 'PAID', 'order');
SELECT idem_transition('orders', 'id', '1', 'status', 'LOST', 'order');
SELECT idem_transition('orders', 'id', '1', 'status', 'PAID', 'nope');
SELECT idem_transition('orders', 'nope', '1', 'status', 'PAID', 'order');
SELECT idem_transition('orders', 'id', NULL, 'status', 'PAID', 'order');
-- A bad id for the column's type is the type's own error (22P02).
SELECT idem_transition('orders', 'id', 'abc', 'status', 'PAID', 'order');

-- Injection through any argument fails cleanly and changes nothing.
SELECT idem_transition('orders', 'id', '1; DROP TABLE orders', 'status', 'SHIPPED', 'order');
SELECT idem_transition('orders', 'id = id OR true; --', '1', 'status', 'SHIPPED', 'order');
SELECT idem_transition('orders', 'id', '1', 'status = ''DONE'' --', 'SHIPPED', 'order');
SELECT idem_transition('orders', 'id', '1', 'status', 'SHIPPED''; DROP TABLE orders; --', 'order');
SELECT idem_transition('orders; DROP TABLE orders', 'id', '1', 'status', 'SHIPPED', 'order');
SELECT id, status FROM orders ORDER BY id;

-- Any key type: text keys, quoted identifiers.
CREATE TABLE "Shipments" ("Ref" text PRIMARY KEY, "State" text);
INSERT INTO "Shipments" VALUES ('S-1', 'CREATED');
SELECT idem_transition('"Shipments"', 'Ref', 'S-1', 'State', 'PAID', 'order');
SELECT * FROM "Shipments";

-- Optimistic locking: the version guard and the bump.
SELECT idem_transition('orders', 'id', '1', 'status', 'SHIPPED', 'order', 'version', 5);
SELECT idem_transition('orders', 'id', '1', 'status', 'SHIPPED', 'order', 'version', 0);
SELECT status, version FROM orders WHERE id = 1;
SELECT idem_transition('orders', 'id', '1', 'status', 'DONE', 'order', 'version');
SELECT status, version FROM orders WHERE id = 1;
SELECT idem_transition('orders', 'id', '1', 'status', 'DONE', 'order', NULL, 3);

-- Guard: no UPDATE from any code path can make an illegal transition.
INSERT INTO orders VALUES (10, 'CREATED'), (11, 'PAID');
SELECT idem_guard('orders', 'status', 'order');
UPDATE orders SET status = 'SHIPPED' WHERE id = 10;
\set VERBOSITY default
UPDATE orders SET status = 'SHIPPED' WHERE id = 10;
\set VERBOSITY sqlstate
UPDATE orders SET status = 'PAID' WHERE id = 10;
UPDATE orders SET status = 'PAID' WHERE id = 10;
UPDATE orders SET version = version + 1 WHERE id = 10;
UPDATE orders SET status = 'CREATED' WHERE id IN (10, 11);
SELECT id, status FROM orders WHERE id IN (10, 11) ORDER BY id;
-- idem_transition still classifies under the guard.
SELECT idem_transition('orders', 'id', '10', 'status', 'SHIPPED', 'order');
SELECT idem_transition('orders', 'id', '10', 'status', 'DONE', 'order');
-- Unguarded, anything goes again.
SELECT idem_unguard('orders', 'status');
UPDATE orders SET status = 'CREATED' WHERE id = 10;
SELECT status FROM orders WHERE id = 10;
SELECT idem_guard('orders', 'status', 'nope');
SELECT idem_guard('orders', 'nope', 'order');
