-- On the proxy database. The cluster is defined with SQL/MED, the way the
-- PL/Proxy documentation recommends since 2.x. Three partitions: not a power
-- of two, hence modular_mapping (partition = abs(hash % 3)).
CREATE EXTENSION plproxy;

CREATE SERVER orders FOREIGN DATA WRAPPER plproxy OPTIONS (
    modular_mapping '1',
    connection_lifetime '1800',
    p0 'host=127.0.0.1 port=5521 dbname=orders_0 connect_timeout=5',
    p1 'host=127.0.0.1 port=5522 dbname=orders_1 connect_timeout=5',
    p2 'host=127.0.0.1 port=5523 dbname=orders_2 connect_timeout=5'
);
-- Connect to the shards as the calling role (with its password from
-- ~/.pgpass, or a pooler with trust on localhost).
CREATE USER MAPPING FOR PUBLIC SERVER orders;

-- Each call runs the function of the same name on the shard that owns
-- order_no, in that shard's own transaction.
CREATE FUNCTION pay(order_no text, amount numeric, request_id text,
                    OUT outcome text, OUT shard text, OUT result jsonb)
LANGUAGE plproxy AS $$
    CLUSTER 'orders';
    RUN ON hashtext(order_no);
$$;

CREATE FUNCTION pay_by_request(order_no text, amount numeric, request_id text,
                               OUT outcome text, OUT shard text, OUT result jsonb)
LANGUAGE plproxy AS $$
    CLUSTER 'orders';
    RUN ON hashtext(order_no);
$$;

-- PL/Proxy reports an unreachable shard as XX000, like its own bugs. This
-- wrapper gives the application a retryable SQLSTATE instead: 08006
-- (connection_failure), with the rule in the hint.
CREATE FUNCTION pay_or_retry(order_no text, amount numeric, request_id text,
                             OUT outcome text, OUT shard text, OUT result jsonb)
LANGUAGE plpgsql AS $$
BEGIN
    SELECT p.outcome, p.shard, p.result INTO outcome, shard, result
      FROM pay(order_no, amount, request_id) p;
EXCEPTION WHEN internal_error THEN
    IF SQLERRM LIKE 'PL/Proxy function %: [%] PQ%' THEN
        RAISE EXCEPTION 'shard unreachable for order %: %', order_no, SQLERRM
            USING ERRCODE = '08006',
                  HINT = 'The payment may or may not have been made: retry with the same request id.';
    END IF;
    RAISE;
END $$;

-- The shard that owns an order, as PL/Proxy computes it.
CREATE FUNCTION shard_of(order_no text) RETURNS int
LANGUAGE sql IMMUTABLE AS $$ SELECT abs(hashtext(order_no) % 3) $$;

CREATE FUNCTION payment_totals(OUT shard text, OUT payments bigint, OUT total numeric,
                               OUT live_claims bigint)
RETURNS SETOF record
LANGUAGE plproxy AS $$
    CLUSTER 'orders';
    RUN ON ALL;
$$;

CREATE FUNCTION set_payment_ttl(ttl interval) RETURNS SETOF text
LANGUAGE plproxy AS $$
    CLUSTER 'orders';
    RUN ON ALL;
$$;

CREATE FUNCTION maintain_claims(OUT shard text, OUT report jsonb)
RETURNS SETOF record
LANGUAGE plproxy AS $$
    CLUSTER 'orders';
    RUN ON ALL;
$$;
