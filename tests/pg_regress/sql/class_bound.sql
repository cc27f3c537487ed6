-- class_bound: a business type claimed with TTLs of every TTL class goes
-- into at most three classes, so one claim of it locks at most 55 relations
-- (docs/design.md §1, "At most three classes per type"), in whatever order
-- the TTLs came; every claim is still found, and expires when its TTL says.
-- idem_health's claim_locks reports at least what a claim locks.
-- Business types used here: cb.*.
SET idem.partition_width = '1 minute';
-- (idem_maintain runs in READ COMMITTED only, whatever the session's default:
-- the environment matrix runs this file under SERIALIZABLE too.)
SET default_transaction_isolation = 'read committed';
-- One TTL per class at this width: the shortest of class k (4 of its widths).
CREATE TEMP TABLE cb_ttls AS
SELECT k, CASE WHEN k = 0 THEN interval '1 minute' ELSE 4 * idem.class_width(k::smallint) END AS ttl
  FROM generate_series(0, 34) k;
SELECT count(*) AS ttls, bool_and(idem.ttl_class(ttl) = k) AS one_per_class, max(ttl) <= interval '400 days' AS within_400_days
  FROM cb_ttls;
CREATE TABLE cb_orders (biz_type text, k int);
-- Ascending, descending and scattered orders, each type in its own transaction.
INSERT INTO cb_orders SELECT 'cb.up', t.k FROM (SELECT * FROM cb_ttls ORDER BY k) t, LATERAL idem_claim('k' || t.k, 'cb.up', ttl => t.ttl) c WHERE c.claimed;
INSERT INTO cb_orders SELECT 'cb.down', t.k FROM (SELECT * FROM cb_ttls ORDER BY k DESC) t, LATERAL idem_claim('k' || t.k, 'cb.down', ttl => t.ttl) c WHERE c.claimed;
INSERT INTO cb_orders SELECT 'cb.mixed', t.k FROM (SELECT * FROM cb_ttls ORDER BY (k * 7) % 35) t, LATERAL idem_claim('k' || t.k, 'cb.mixed', ttl => t.ttl) c WHERE c.claimed;
SELECT idem_maintain() IS NOT NULL AS maintained;
-- The classes each type's claims went into, and their registrations.
SELECT biz_type, array_agg(DISTINCT ttl_class ORDER BY ttl_class) AS classes FROM idem.claims WHERE biz_type LIKE 'cb.%' GROUP BY 1 ORDER BY 1;
SELECT biz_type, array_agg(DISTINCT ttl_class ORDER BY ttl_class) AS registered FROM idem.type_classes WHERE biz_type LIKE 'cb.%' GROUP BY 1 ORDER BY 1;
-- No claim went into a class narrower than its TTL's, and each expires
-- when its TTL says.
SELECT c.biz_type, count(*) AS claims,
       count(*) FILTER (WHERE c.ttl_class >= t.k) AS at_least_as_wide,
       count(*) FILTER (WHERE c.expires_at - c.claimed_at = t.ttl) AS expiry_by_ttl
  FROM idem.claims c JOIN cb_ttls t ON c.key = 'k' || t.k
 WHERE c.biz_type LIKE 'cb.%' GROUP BY 1 ORDER BY 1;
-- Every claim is found again (a duplicate), and each business row was written once.
SELECT o.biz_type, count(*) AS orders, count(*) FILTER (WHERE NOT c.claimed) AS duplicates
  FROM cb_orders o, cb_ttls t, LATERAL idem_claim('k' || t.k, o.biz_type, ttl => t.ttl) c
 WHERE o.k = t.k GROUP BY 1 ORDER BY 1;
-- Relations one claim locks (a new key and a duplicate, with the TTL of
-- each tenth class), against the bound; the session's caches are filled
-- by the claims above.
CREATE TEMP TABLE cb_locks (biz_type text, k int, key text, n bigint);
SELECT idem_maintain() IS NOT NULL AS maintained;
DO $$
DECLARE
    r record;
    n bigint;
BEGIN
    FOR r IN SELECT b.biz_type, t.k, t.ttl, kk.key
               FROM (VALUES ('cb.up'), ('cb.down'), ('cb.mixed')) b(biz_type), cb_ttls t, (VALUES ('new'), ('k0')) kk(key)
              WHERE t.k % 10 = 0 LOOP
        BEGIN
            PERFORM idem_claim(r.key, r.biz_type, ttl => r.ttl);
            SELECT count(DISTINCT relation) INTO n FROM pg_locks
             WHERE pid = pg_backend_pid() AND locktype = 'relation'
               AND relation NOT IN ('pg_locks'::regclass, 'cb_locks'::regclass, 'cb_ttls'::regclass);
            RAISE SQLSTATE 'XX999';  -- roll the claim (and its locks) back
        EXCEPTION WHEN SQLSTATE 'XX999' THEN
            INSERT INTO cb_locks VALUES (r.biz_type, r.k, r.key, n);
        END;
    END LOOP;
END
$$;
-- The bound: 55 (docs/design.md §1), 65 on the portable edition (10 more
-- fixed relations: its two gate tables and the catalogs its SQL reads).
CREATE TEMP TABLE cb_bound AS
SELECT 55 + CASE WHEN to_regclass('idem.key_gates') IS NULL THEN 0 ELSE 10 END AS bound;
SELECT biz_type, count(*) AS claims, max(n) <= (SELECT bound FROM cb_bound) AS within_bound, min(n) >= 5 AS counted FROM cb_locks GROUP BY 1 ORDER BY 1;
-- The bound holds while maintenance keeps up: partitions that ended since
-- its last run (the narrow classes' end every few seconds) count two more
-- each until it drops them.
SELECT idem_maintain() IS NOT NULL AS maintained;
SELECT h.value >= (SELECT max(n) FROM cb_locks) AS health_sees_it, h.value <= (SELECT bound FROM cb_bound) AS health_within_bound
  FROM idem_health h WHERE h.check_name = 'claim_locks';
DROP TABLE cb_orders;
RESET idem.partition_width;
RESET default_transaction_isolation;
