-- Citus: idem's storage distributed next to the business tables
-- (docs/scaling.md; tested by tests/scenarios/citus.sh on a real Citus 13
-- cluster). Once idem.claims is distributed, every idem call on a key runs
-- only on the node that holds the key's shard (src/storage/citus.rs).

CREATE FUNCTION idem_distribute(colocate_with regclass) RETURNS void
    VOLATILE SECURITY INVOKER SET search_path = pg_catalog, pg_temp
    LANGUAGE plpgsql AS $fn$
DECLARE
    dist_type regtype;
BEGIN
    IF colocate_with IS NULL THEN
        RAISE EXCEPTION 'idem: colocate_with must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        RAISE EXCEPTION 'idem: idem_distribute needs the Citus extension in this database'
            USING ERRCODE = '55000',
                  HINT = 'Install Citus on every node, put citus first in shared_preload_libraries, CREATE EXTENSION citus, distribute the business table, then call idem_distribute again (docs/scaling.md).';
    END IF;
    IF coalesce(current_setting('idem.storage_access', true), 'auto') = 'direct' THEN
        -- The direct path reaches partitions by OID: on a worker it would
        -- miss the shard tables and let duplicates through.
        RAISE EXCEPTION 'idem: idem.storage_access is direct; distributed storage needs sql (or auto)'
            USING ERRCODE = '55000',
                  HINT = 'Set idem.storage_access = auto (or sql) on every node and reload.';
    END IF;
    -- Citus co-locates tables whose distribution columns have the same type;
    -- idem's key is text.
    EXECUTE 'SELECT a.atttypid::regtype FROM pg_catalog.pg_dist_partition p
               JOIN pg_catalog.pg_attribute a ON a.attrelid = p.logicalrelid
                AND a.attname = pg_catalog.column_to_column_name(p.logicalrelid, p.partkey)
              WHERE p.logicalrelid = $1'
       INTO dist_type USING colocate_with;
    IF dist_type IS NULL THEN
        RAISE EXCEPTION 'idem: % is not a hash-distributed table', colocate_with
            USING ERRCODE = '22023', HINT = 'Distribute it first: SELECT create_distributed_table(''table'', ''column'').';
    END IF;
    IF dist_type <> 'text'::regtype THEN
        RAISE EXCEPTION 'idem: % is distributed by a % column; idem''s key is text', colocate_with, dist_type
            USING ERRCODE = '22023', HINT = 'Co-location needs the same type: distribute the business table by a text column (the key).';
    END IF;
    -- Run again (after an upgrade), what is distributed stays as it is and
    -- the functions are registered again, new ones included.
    IF NOT idem.is_distributed('idem.biz_types') THEN
        PERFORM pg_catalog.create_reference_table('idem.biz_types');
    END IF;
    IF NOT idem.is_distributed('idem.machines') THEN
        PERFORM pg_catalog.create_reference_table('idem.machines');
    END IF;
    IF NOT idem.is_distributed('idem.claims') THEN
        PERFORM pg_catalog.create_distributed_table('idem.claims', 'key', colocate_with => colocate_with::text);
    END IF;
    -- Citus makes the shards of a partitioned table without its replica
    -- identity; set on the distributed table, it reaches every shard.
    ALTER TABLE idem.claims REPLICA IDENTITY FULL;
    -- Delegated to the worker that owns the key, inside the caller's
    -- transaction, next to the business rows of the same value.
    PERFORM pg_catalog.create_distributed_function(f, 'key', colocate_with => 'idem.claims', force_delegation => true)
       FROM unnest(ARRAY[
           '@extschema@.idem_claim(text, text, interval, text, boolean, interval)',
           '@extschema@.idem_complete(text, text, jsonb, text)',
           '@extschema@.idem_fail(text, text, jsonb, text)',
           '@extschema@.idem_checkpoint(text, text, text, jsonb, text)',
           '@extschema@.idem_lookup(text, text)',
           '@extschema@.idem_forget(text, text)']::regprocedure[]) AS f;
END
$fn$;
COMMENT ON FUNCTION idem_distribute(regclass) IS
'Citus only: distribute idem.claims by key co-located with colocate_with (a table distributed by a text column), make idem.biz_types and idem.machines reference tables, and register the claim functions (claim, complete, fail, checkpoint, lookup, forget) for delegation to the worker owning the key. Run it again after an upgrade: what is distributed stays, the functions are registered again. 55000 without Citus or with idem.storage_access = direct. See docs/scaling.md.';
REVOKE EXECUTE ON FUNCTION idem_distribute(regclass) FROM PUBLIC;
