CREATE TABLE IF NOT EXISTS ledger_entries (
  id bigserial PRIMARY KEY,
  event_id text NOT NULL,
  account text NOT NULL,
  amount_cents bigint NOT NULL);
-- an order's state, moved by idem_transition along the machine 'order'
-- (idem_define_machine, run once by the operator: see the README)
CREATE TABLE IF NOT EXISTS orders (
  id text PRIMARY KEY,
  status text NOT NULL);
CREATE TABLE IF NOT EXISTS order_history (
  id bigserial PRIMARY KEY,
  order_id text NOT NULL,
  status text NOT NULL);
-- events that came before the state they follow (Kafka orders only within a partition)
CREATE TABLE IF NOT EXISTS parked_order_events (
  id bigserial PRIMARY KEY,
  order_id text NOT NULL,
  status text NOT NULL);
