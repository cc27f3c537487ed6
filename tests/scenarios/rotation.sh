#!/usr/bin/env bash
# Hundreds of partition rotations (250, at 100 ms partitions and a 1 s TTL:
# about half a minute), with claims and maintenance committed separately, as in production.
# Proves: no live claim is lost across rotations, storage stays bounded and
# the catalog does not grow.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
report="$IDEM_TARGET/test-out/rotation.out"   # (per checkout and major, not /tmp: runs go side by side)
mkdir -p "$(dirname "$report")"
db=idem_rotation
psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
psql_idem -q -d $db <<'SQL'
CREATE EXTENSION idem;
ALTER DATABASE idem_rotation SET idem.partition_width = '100 milliseconds';
ALTER DATABASE idem_rotation SET idem.default_ttl = '1 second';
SELECT idem_configure('rot', '1 second');
CREATE TABLE rot_log (it int, dropped int, live_checked int, lost int, partitions int, idem_relations int, idem_bytes bigint);
CREATE TABLE claimed (key text PRIMARY KEY, expires_at timestamptz);
CREATE PROCEDURE rotate(rotations int, max_iterations int) LANGUAGE plpgsql AS $$
DECLARE
  lost int; checked int; k text; r record; rep jsonb; it int := 0; dropped_total int := 0;
BEGIN
  -- Until enough partitions have rotated out (the count per second depends
  -- on the machine's speed, not the test's).
  WHILE dropped_total < rotations AND it < max_iterations LOOP
    it := it + 1;
    -- ten new claims, committed
    INSERT INTO claimed SELECT 'it' || it || '-' || g, (idem_claim('it' || it || '-' || g, 'rot')).expires_at
      FROM generate_series(1, 10) g;
    COMMIT;
    rep := idem_maintain();
    dropped_total := dropped_total + jsonb_array_length(rep->'partitions_dropped');
    COMMIT;
    -- every claim still live (with a margin for this loop's own duration)
    -- must be found by a duplicate
    checked := 0; lost := 0;
    FOR r IN SELECT key FROM claimed WHERE expires_at > clock_timestamp() + interval '200 milliseconds' LOOP
      checked := checked + 1;
      IF (idem_claim(r.key, 'rot')).claimed THEN lost := lost + 1; END IF;
    END LOOP;
    DELETE FROM claimed WHERE expires_at < clock_timestamp() - interval '1 second';
    INSERT INTO rot_log SELECT it, jsonb_array_length(rep->'partitions_dropped'), checked, lost,
      (SELECT count(*) FROM idem_partitions),
      (SELECT count(*) FROM pg_class WHERE relnamespace = 'idem'::regnamespace),
      (SELECT sum(bytes) FROM idem_partitions);
    COMMIT;
    PERFORM pg_sleep(0.05);
  END LOOP;
END $$;
SQL
start=$(date +%s.%N)
psql_idem -q -d $db -c "SET idem.partition_width = '100 milliseconds'" -c "CALL rotate(250, 3000)"
end=$(date +%s.%N)
psql_idem -d $db -At -F ' ' <<'SQL' > "$report"
SELECT 'iterations', count(*) FROM rot_log;
SELECT 'lost', sum(lost) FROM rot_log;
SELECT 'checked', sum(live_checked) FROM rot_log;
SELECT 'dropped_total', sum(dropped) FROM rot_log;
-- after warm-up (first 50 iterations) the catalog and the storage stay level
SELECT 'relations_min_max', min(idem_relations), max(idem_relations) FROM rot_log WHERE it > 50;
SELECT 'relations_first_last', (SELECT idem_relations FROM rot_log WHERE it = 51), (SELECT idem_relations FROM rot_log ORDER BY it DESC LIMIT 1);
SELECT 'bytes_max_after_warmup', max(idem_bytes) FROM rot_log WHERE it > 50;
SELECT 'bytes_max_second_half', max(idem_bytes) FROM rot_log WHERE it > (SELECT max(it) / 2 FROM rot_log);
SELECT 'live_keys', count(*) FROM idem.claims WHERE expires_at > now();
SELECT 'all_rows', count(*) FROM idem.claims;
SQL
cat "$report"
echo "elapsed: $(echo "$end - $start" | bc) s"
val() { awk -v k="$1" '$1 == k { print $2 }' "$report"; }
val2() { awk -v k="$1" '$1 == k { print $3 }' "$report"; }
fail=0
[ "$(val iterations)" -ge 200 ] || { echo "FAIL: too few iterations ran"; fail=1; }
[ "$(val lost)" = 0 ] || { echo "FAIL: live claims were lost across rotations"; fail=1; }
[ "$(val checked)" -ge 3000 ] || { echo "FAIL: too few live claims were checked"; fail=1; }
[ "$(val dropped_total)" -ge 250 ] || { echo "FAIL: fewer than 250 partitions rotated out"; fail=1; }
# the partition count moves by a partition or two as ranges come and go
[ $(( $(val2 relations_min_max) - $(val relations_min_max) )) -le 12 ] || { echo "FAIL: catalog grows"; fail=1; }
[ "$(val2 relations_first_last)" -le $(( $(val relations_first_last) + 8 )) ] || { echo "FAIL: catalog grows"; fail=1; }
[ "$(val bytes_max_second_half)" -le $(( $(val bytes_max_after_warmup) * 3 / 2 + 1 )) ] || { echo "FAIL: storage grows"; fail=1; }
# (second half: iterations past the middle of the run)
# Only ~1 s of claims (~1.3 s with the partition and run lag) may remain.
[ "$(val all_rows)" -le 400 ] || { echo "FAIL: expired rows accumulate"; fail=1; }
exit $fail
