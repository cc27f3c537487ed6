CREATE TABLE IF NOT EXISTS accounts (
  id text PRIMARY KEY,
  balance_cents bigint NOT NULL);
CREATE TABLE IF NOT EXISTS payments (
  id bigserial PRIMARY KEY,
  request_id text NOT NULL,
  account_id text NOT NULL REFERENCES accounts,
  order_no text NOT NULL,
  amount_cents bigint NOT NULL);
CREATE TABLE IF NOT EXISTS shop_orders (
  id bigserial PRIMARY KEY,
  request_id text NOT NULL,
  sku text NOT NULL,
  quantity int NOT NULL);
CREATE TABLE IF NOT EXISTS order_events (
  id bigserial PRIMARY KEY,
  order_id bigint NOT NULL,
  kind text NOT NULL);
CREATE TABLE IF NOT EXISTS refunds (
  id bigserial PRIMARY KEY,
  payment_id bigint NOT NULL,
  amount_cents bigint NOT NULL);
