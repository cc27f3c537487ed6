-- Storage for idem. Lives in schema `idem`, which PUBLIC can neither read nor
-- write. The claim functions (sql/claim.sql) are SECURITY INVOKER C
-- functions that reach it directly, or through SQL run as the extension's
-- owner (docs/design.md §8); the PL/pgSQL ones are SECURITY DEFINER.

CREATE SCHEMA idem;
REVOKE ALL ON SCHEMA idem FROM PUBLIC;
COMMENT ON SCHEMA idem IS 'idem storage: dedup records, business types, partitions. Not for direct use.';

-- Configured business types. A type needs no row to be used: claims carry
-- the type's name, so the first use of a type writes nothing here and waits
-- for nobody.
CREATE TABLE idem.biz_types (
    biz_type   text        PRIMARY KEY,
    ttl        interval,                 -- NULL: idem.default_ttl applies
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    owner      name,                     -- NULL: every role may use the type
    on_failure text CHECK (on_failure IN ('replay', 'retry')),  -- NULL: replay
    retain_from text CHECK (retain_from IN ('claim', 'completion'))  -- NULL: claim
);
COMMENT ON TABLE idem.biz_types IS 'Business type settings: the TTL of its claims, what a stored failure does to the next arrival and whether a claim''s TTL counts from its completion (idem_configure), and the role whose members alone may use it (idem_set_owner).';

-- The stable 64-bit digest a claim is indexed by (the first 8 bytes of the
-- SHA-256 of biz_type and key; docs/design.md §1). Written in Rust; the
-- claim path computes the same value itself. (0.3.0 declared it on the
-- symbol idem_key_hash: SipHash-1-3.)
CREATE FUNCTION idem.key_hash(biz_type text, key text) RETURNS bigint
    IMMUTABLE STRICT PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_key_digest';
COMMENT ON FUNCTION idem.key_hash(text, text) IS 'Digest of (biz_type, key) that idem.claims is indexed by: the first 8 bytes of the SHA-256 of the biz_type''s length, the biz_type and the key (SipHash-1-3 up to 0.3.0; the update to 0.4.0 rebuilds the indexes). The same on every platform and major, and in both editions.';

-- TTL classes (src/ttl_class.rs has the rule; docs/design.md §1): a claim
-- lives among the partitions of its TTL's class, whose width is at most a
-- quarter of that TTL, so that a claim looks into a few partitions of its
-- own class whatever the TTLs in use, and an expired claim lingers at most
-- a quarter of its TTL (a minute, under 4 minutes).
CREATE FUNCTION idem.ttl_class(ttl interval) RETURNS smallint
    IMMUTABLE STRICT PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_ttl_class';
COMMENT ON FUNCTION idem.ttl_class(interval) IS 'The TTL class of a claim with this TTL (beyond 400 days: that of 400 days), at the session''s idem.partition_width: at the default, 0 (under 4 minutes) to 34 (364 days and more); its partitions are idem.class_width(class) wide.';
CREATE FUNCTION idem.class_width(ttl_class integer) RETURNS interval
    IMMUTABLE STRICT PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_class_width';
COMMENT ON FUNCTION idem.class_width(integer) IS 'The partition width of a TTL class: idem.partition_width times the square root of 2 to the power of the class, at most 400 days; NULL for a class that does not exist.';
CREATE FUNCTION idem.class_max_ttl(ttl_class integer) RETURNS interval
    IMMUTABLE STRICT PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_class_max_ttl';
COMMENT ON FUNCTION idem.class_max_ttl(integer) IS 'The longest TTL a claim of a TTL class can have; NULL for a class that does not exist.';

-- The dedup records, range-partitioned by TTL class and expiry: a partition
-- holds the claims of one class whose expiry falls in its range, and once
-- the range has passed it holds only expired claims and is dropped whole.
-- Column order is chosen for a narrow tuple (no alignment padding).
CREATE TABLE idem.claims (
    expires_at  timestamptz NOT NULL,
    claimed_at  timestamptz NOT NULL,
    ttl_class   smallint    NOT NULL,   -- idem.ttl_class(expires_at - claimed_at)
    state       "char"      NOT NULL,   -- p: claimed, not finished; c: completed; f: failed; l: leased; r: failed after a retry
    biz_type    text        NOT NULL,
    key         text        NOT NULL,
    fingerprint text,
    result      jsonb
) PARTITION BY RANGE (ttl_class, expires_at);
COMMENT ON TABLE idem.claims IS 'Dedup records. Uniqueness of (biz_type, key) among live rows is enforced by idem_claim, not by an index.';
-- Logical replication (docs/design.md §12): no column set identifies a
-- row (the index is a non-unique digest), so an UPDATE or DELETE carries the
-- whole old row. idem.claims, its default partition and every partition
-- idem_maintain makes have it; without it a publication refuses the SQL
-- path's updates, and the direct path's would reach subscribers unmatched.
ALTER TABLE idem.claims REPLICA IDENTITY FULL;

-- Catches claims whose expiry no partition covers yet (maintenance late or
-- never run, or a TTL past the premade horizon); idem_maintain moves them out.
CREATE TABLE idem.claims_default PARTITION OF idem.claims DEFAULT;
ALTER TABLE idem.claims_default REPLICA IDENTITY FULL;

-- Every partition has exactly one index, on the digest; idem_maintain creates
-- it with the partition. Not unique: an expired row of a key may share a
-- partition with its live successor, and uniqueness across partitions is the
-- claim protocol's job. Deliberately no index on the parent: ATTACH would
-- then create one on each partition by itself, and a pg_restore (which
-- attaches partitions before it creates their indexes) would fail.
CREATE INDEX claims_default_key_hash ON idem.claims_default (idem.key_hash(biz_type, key));

-- A partition's TTL class and range of expires_at, read from its bound in
-- binary (the claim path reads it the same way): no session setting can
-- change them. NULL for the default partition and for anything that is not
-- a partition.
CREATE FUNCTION idem.partition_from(partition regclass) RETURNS timestamptz
    STABLE STRICT PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_partition_from';
COMMENT ON FUNCTION idem.partition_from(regclass) IS 'Lower bound (inclusive) of a partition of idem.claims, read in binary; NULL for the default partition.';
CREATE FUNCTION idem.partition_to(partition regclass) RETURNS timestamptz
    STABLE STRICT PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_partition_to';
COMMENT ON FUNCTION idem.partition_to(regclass) IS 'Upper bound (exclusive) of a partition of idem.claims, read in binary; NULL for the default partition.';
CREATE FUNCTION idem.partition_class(partition regclass) RETURNS smallint
    STABLE STRICT PARALLEL SAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'idem_partition_class';
COMMENT ON FUNCTION idem.partition_class(regclass) IS 'TTL class of a partition of idem.claims, read in binary; NULL for the default partition.';

-- Which TTL classes may hold claims of which business type: a claim looks
-- into the partitions of these classes only (and the default partition).
-- Written by the claim that first puts a type's claim into a class, in its
-- own transaction (so the row commits, or rolls back, with the claim), for
-- claims expiring up to `until`; deleted by idem_maintain once no partition
-- that could hold such a claim is left. No unique index: two first claims
-- at once each write a row rather than one waiting for the other's commit.
-- Under Citus it is distributed by `key` next to idem.claims (sql/scaling.sql):
-- a registration lives on the shard of the claim that wrote it.
CREATE TABLE idem.type_classes (
    biz_type  text     COLLATE "C" NOT NULL,
    ttl_class smallint NOT NULL,
    until     timestamptz NOT NULL,
    key       text                  -- Citus: the registering claim's key, which places the row (NULL otherwise)
);
CREATE INDEX type_classes_biz_type ON idem.type_classes (biz_type);
ALTER TABLE idem.type_classes REPLICA IDENTITY FULL;
COMMENT ON TABLE idem.type_classes IS 'TTL classes that may hold claims of a business type expiring up to until; claims of the type look into those classes'' partitions only.';

-- The rule for business type and machine names, for the PL/pgSQL functions
-- (the C functions apply the same rule in src/key.rs, valid_biz_type; a
-- pg_test checks that the two agree).
CREATE FUNCTION idem.check_name(what text, value text) RETURNS void
    IMMUTABLE LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    IF value !~ '^[A-Za-z0-9_.:-]{1,64}$' THEN
        RAISE EXCEPTION 'idem: % "%" is not valid: it must match ^[A-Za-z0-9_.:-]{1,64}$', what, value
            USING ERRCODE = '22023';
    END IF;
END
$fn$;
COMMENT ON FUNCTION idem.check_name(text, text) IS 'Raise 22023 unless value is a valid biz_type / machine name.';
