-- The portable edition's part of idem_maintain: removing the key locks
-- (idem.key_gates, portable/claim.sql) that no transaction needs any more.

-- @helpers after: CREATE TRIGGER local_only
-- A full transaction id (xid8) from a 32-bit one that lies within 2^31 of
-- near (as every xid still running, or still a snapshot's xmin, does).
CREATE FUNCTION idem.full_xid(x xid, near xid8) RETURNS xid8
    IMMUTABLE STRICT LANGUAGE sql AS $fn$
    SELECT (n + CASE WHEN d >= 2147483648 THEN d - 4294967296 ELSE d END)::text::xid8
      FROM (SELECT near::text::bigint AS n,
                   (x::text::bigint - (near::text::bigint & 4294967295)) & 4294967295 AS d) s
$fn$;
COMMENT ON FUNCTION idem.full_xid(xid, xid8) IS 'Portable edition: the full transaction id of x, an xid within 2^31 of near.';

-- Each run of idem_maintain (it records every run in idem.maintenance_runs)
-- deletes the gate rows whose writer ended before every snapshot that can
-- still claim in this database: any claimer from now on sees what that
-- writer did, so the row no longer orders anyone (docs/design.md §14). The
-- horizon is the oldest of this statement's snapshot xmin and the
-- backend_xmin and backend_xid of every session of this database, read
-- (pg_stat_activity, which PostgreSQL shows every role) after that
-- snapshot was taken: a session whose snapshot predates the writer's end
-- had advertised its xmin by then. A row another transaction holds is
-- skipped, never waited for.
CREATE FUNCTION idem.sweep_key_gates() RETURNS trigger
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    snap pg_snapshot;
    horizon xid8;
    oldest xid8;
BEGIN
    -- pg_stat_activity is otherwise read once per transaction, maybe
    -- before this snapshot.
    PERFORM pg_stat_clear_snapshot();
    snap := pg_current_snapshot();
    SELECT x INTO oldest
      FROM (SELECT idem.full_xid(a.backend_xmin, pg_snapshot_xmax(snap)) AS x
              FROM pg_stat_activity a
             WHERE a.datid = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
               AND a.backend_xmin IS NOT NULL
            UNION ALL
            SELECT idem.full_xid(a.backend_xid, pg_snapshot_xmax(snap))
              FROM pg_stat_activity a
             WHERE a.datid = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
               AND a.backend_xid IS NOT NULL) s
     ORDER BY x LIMIT 1;
    horizon := least(pg_snapshot_xmin(snap), oldest);
    -- And the gates no transaction of this cluster wrote: a writer this
    -- statement's snapshot has not reached yet, on a version it sees (so
    -- committed), is one a plain-script dump of another cluster brought.
    DELETE FROM idem.key_gates g
     WHERE g.h IN (SELECT s.h FROM idem.key_gates s
                    WHERE s.writer < horizon OR s.writer >= pg_snapshot_xmax(pg_current_snapshot())
                      FOR UPDATE SKIP LOCKED);
    RETURN NULL;
END
$fn$;
COMMENT ON FUNCTION idem.sweep_key_gates() IS 'Portable edition, run by idem_maintain: delete the key locks (idem.key_gates) whose writer ended before every snapshot that can still claim in this database.';
CREATE TRIGGER sweep_key_gates AFTER INSERT ON idem.maintenance_runs
    FOR EACH STATEMENT EXECUTE FUNCTION idem.sweep_key_gates();
-- @end
