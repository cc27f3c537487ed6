-- The portable edition has no Citus support: the native edition's calls on
-- a distributed idem.claims run in the library on the node that holds the
-- key's shard (src/storage/citus.rs), which PL/pgSQL cannot do. So
-- idem_distribute refuses (0A000) whether or not Citus is installed, and
-- idem.claims stays an ordinary table (docs/portable.md).

-- @helpers after: COMMENT ON FUNCTION idem_distribute
CREATE OR REPLACE FUNCTION idem_distribute(colocate_with regclass) RETURNS void
    VOLATILE SECURITY INVOKER SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
BEGIN
    RAISE EXCEPTION 'idem: the portable edition of idem cannot distribute idem.claims with Citus'
        USING ERRCODE = '0A000',
              HINT = 'Install the native edition (the idem library) on every node to use Citus (docs/scaling.md, docs/portable.md).';
END
$fn$;
COMMENT ON FUNCTION idem_distribute(regclass) IS
'Portable edition: refuses with 0A000 (Citus needs the native edition, whose calls run on the node holding the key''s shard).';
-- @end
