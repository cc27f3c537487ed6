-- On every shard database (orders_0, orders_1, orders_2), after
-- CREATE EXTENSION idem. The business row and its claim live on the same
-- shard and commit in the same transaction: the shard's own.
CREATE TABLE payments (
    payment_id bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_no   text        NOT NULL,
    amount     numeric     NOT NULL,
    request_id text        NOT NULL,
    paid_at    timestamptz NOT NULL DEFAULT now()
);

-- Order-scoped key: the dedup key contains the shard key (order_no), so every
-- arrival of one intent is routed to the shard that holds its claim.
CREATE FUNCTION pay(order_no text, amount numeric, request_id text,
                    OUT outcome text, OUT shard text, OUT result jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    k text := order_no || '/' || request_id;
    c idem_claim_result;
    id bigint;
BEGIN
    shard := current_database();
    c := idem_claim(k, 'payment', fingerprint => trim_scale(amount)::text);
    IF NOT c.claimed THEN
        outcome := 'replayed';          -- a retry: the first answer, nothing charged
        result := c.result;
        RETURN;
    END IF;
    INSERT INTO payments (order_no, amount, request_id)
    VALUES (pay.order_no, pay.amount, pay.request_id)
    RETURNING payment_id INTO id;
    result := jsonb_build_object('payment_id', id, 'order_no', order_no,
                                 'amount', amount, 'shard', shard);
    PERFORM idem_complete(k, 'payment', result);
    outcome := 'claimed';
END $$;

-- Request-id-scoped key, meant to be unique across all orders. The proxy
-- still routes by order_no, so the claim is unique only within the shard that
-- owns the order: the same request id for two orders on two shards is two
-- claims, and nothing detects it.
CREATE FUNCTION pay_by_request(order_no text, amount numeric, request_id text,
                               OUT outcome text, OUT shard text, OUT result jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    c idem_claim_result;
    id bigint;
BEGIN
    shard := current_database();
    c := idem_claim(request_id, 'payment.by_request',
                    fingerprint => order_no || ':' || trim_scale(amount)::text);
    IF NOT c.claimed THEN
        outcome := 'replayed';
        result := c.result;
        RETURN;
    END IF;
    INSERT INTO payments (order_no, amount, request_id)
    VALUES (pay_by_request.order_no, pay_by_request.amount, pay_by_request.request_id)
    RETURNING payment_id INTO id;
    result := jsonb_build_object('payment_id', id, 'order_no', order_no,
                                 'amount', amount, 'shard', shard);
    PERFORM idem_complete(request_id, 'payment.by_request', result);
    outcome := 'claimed';
END $$;

-- Per-shard operations, called on every shard at once through the proxy
-- (RUN ON ALL): totals, retention, maintenance.
CREATE FUNCTION payment_totals(OUT shard text, OUT payments bigint, OUT total numeric,
                               OUT live_claims bigint)
LANGUAGE sql AS $$
    SELECT current_database(),
           (SELECT count(*) FROM payments),
           (SELECT coalesce(sum(amount), 0) FROM payments),
           (SELECT coalesce(sum(live_keys), 0)::bigint FROM idem_stats
             WHERE biz_type IN ('payment', 'payment.by_request'))
$$;

CREATE FUNCTION set_payment_ttl(ttl interval) RETURNS text
LANGUAGE sql AS $$
    SELECT idem_configure('payment', ttl);
    SELECT idem_configure('payment.by_request', ttl);
    SELECT current_database();
$$;

CREATE FUNCTION maintain_claims(OUT shard text, OUT report jsonb)
LANGUAGE sql AS $$
    SELECT current_database(), idem_maintain()
$$;
