-- Tables and functions of the benchmark database (bench/run.sh).
-- The business table every variant inserts into, once per transaction.
CREATE TABLE orders (
    id         bigserial PRIMARY KEY,
    key        text        NOT NULL,
    amount     int         NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- B1: the hand-written dedup table (INSERT ... ON CONFLICT DO NOTHING).
CREATE TABLE dedup (
    key        text PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- B1r: the hand-written table of claim + stored result (INSERT ... ON
-- CONFLICT DO NOTHING, then UPDATE ... SET result in the same transaction).
CREATE TABLE dedup_r (
    key        text PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now(),
    result     jsonb
);

-- B2: the same table shape, written through PL/pgSQL with an EXCEPTION
-- block (a subtransaction per call). Own table, so B1 and B2 never share
-- an index.
CREATE TABLE dedup_exc (
    key        text PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION dedup_claim_exc(k text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO dedup_exc (key) VALUES (k);
    RETURN true;
EXCEPTION WHEN unique_violation THEN
    RETURN false;
END
$$;

-- The cleanup section's hand-written table: a TTL column and an index on it,
-- so that DELETE ... WHERE expires_at < now() does not scan the whole table.
CREATE TABLE dedup_ttl (
    key        text PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL DEFAULT now() + interval '24 hours'
);
CREATE INDEX dedup_ttl_expires_at ON dedup_ttl (expires_at);

-- The handwritten and kills sections' table: what a user writes instead of
-- idem, with the usual cleanup job (DELETE FROM hw_dedup WHERE created_at <
-- now() - ttl, every few seconds), which the index on created_at serves.
CREATE TABLE hw_dedup (
    key        text PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now(),
    result     jsonb
);
CREATE INDEX hw_dedup_created_at ON hw_dedup (created_at);
