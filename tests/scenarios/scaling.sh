#!/usr/bin/env bash
# Scaling out: a Citus cluster (coordinator and two workers), a PL/Proxy deployment.
# One scenario per function: bash tests/scenarios/scaling.sh NAME (NAME: citus, plproxy);
# scripts/test.sh runs each as scenario/NAME (tests/lib/scenarios.sh).
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/scenarios.sh"

# Citus for real: a coordinator and two workers (Citus 13.2.2, built once
# from ../shared/vendor by citus_build into a private copy of Debian's
# PostgreSQL 15 made by citus_tree, with this build of idem copied there;
# the cluster is tests/lib/cluster.sh's), started here and removed on exit.
# Runs docs/scaling.md's Citus steps verbatim (read from the page:
# tests/citus/doc_steps.py), ALTER EXTENSION idem UPDATE from 0.3.0 after
# idem_distribute with live claims, a lease and a token (citus_upgrade,
# running the page's upgrade step), the Citus isolation specs
# (tests/citus/specs, citus_isolation: call forms that double-claimed under
# 0.2.0, two-claim transactions across workers), then
# tests/citus/scenario.py: claim semantics through the coordinator, every
# call form, business type settings reaching pooled worker sessions,
# concurrent stress through the coordinator and directly on the workers
# with invariant checks, maintenance rotating partitions under load (also
# under claims in multi-statement transactions, and its skips in
# idem_health), a shard move racing a claim, moves under load, replica
# identity repaired after moves (one of them logical), a worker crashed
# under paying clients who retry with the same key, DROP EXTENSION /
# reinstall in a fresh database, and the update from 0.3.0 with a claim
# queued behind it on a worker, and under claims from every node (all
# complete, no deadlock). Without ../shared/vendor/ it fails (Citus is not
# in Debian's archive; the test is not skipped).
#   CITUS_KEEP=1 bash tests/scenarios/scaling.sh citus    leave the cluster running
#   CITUS_PORTS="5560 5561 5562" bash tests/scenarios/scaling.sh citus
#       other ports than 5530-5532 (coordinator, worker 1, worker 2), e.g.
#       beside another checkout's run
#   IDEM_STAGE=target/stage bash tests/scenarios/scaling.sh citus
#       take idem from a staging folder made by `cargo pgrx package
#       --pg-config /usr/lib/postgresql/15/bin/pg_config --out-dir target/stage` instead of the
#       build installed into $PG_CONFIG's server (which then needs no install)
#   PG_CONFIG=$(bash tests/scenarios/scaling.sh citus --server)
#       only make the Citus server (citus_server), print its pg_config
#       (bench/citus.sh)

CITUS_TARBALL="$(cd "$ROOT/.." && pwd)/shared/vendor/citus-13.2.2-pg15.20.tar.gz"

# citus_tree: a private PostgreSQL 15 for Citus: Debian 12's own
# postgresql-15 packages (the very versions installed on the host, so that
# the idem library built for the host's server loads here too), unpacked
# with dpkg-deb under $IDEM_CACHE/pg15-citus (default
# /var/cache/idem/pg15-citus) instead of installed. Citus (citus_build) and
# idem go into this tree, never into the system's /usr/lib/postgresql/15.
# PostgreSQL finds its files relative to its programs, so the unpacked tree
# works where it lies. Prints its pg_config. Once: a stamp names the
# packages it was made from.
citus_tree() (
  source "$ROOT/tests/servers/common.sh"
  PREFIX="$IDEM_CACHE/pg15-citus"
  STAMP="$PREFIX/.idem-stamp"
  PKGS=(postgresql-15 postgresql-client-15 postgresql-server-dev-15 libpq5 libpq-dev postgresql-15-cron)
  # The host's versions of the packages (its server must be installed: the
  # suite's setup installs it).
  want=""
  for p in "${PKGS[@]}"; do
    v=$(dpkg-query -W -f='${Version}' "$p" 2>/dev/null) || die "$p is not installed on the host (bash scripts/setup.sh installs it)"
    want+="$p=$v "
  done
  want="${want% }"
  made() { [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$PREFIX/bin/pg_config" ]; }
  if made; then echo "$PREFIX/bin/pg_config"; exit 0; fi
  take_lock pg15-citus
  if made; then echo "$PREFIX/bin/pg_config"; exit 0; fi
  log "unpacking Debian's PostgreSQL 15 into $PREFIX (${want})"
  debs="$IDEM_CACHE/build/pg15-citus/debs"
  for p in "${PKGS[@]}"; do
    download_deb "$debs" "$p=$(dpkg-query -W -f='${Version}' "$p")" >/dev/null
  done
  # A tree made from other versions is replaced whole (a Citus built into
  # it goes with it, and citus_build builds it again).
  new="$PREFIX.new"
  rm -rf "$new"
  mkdir -p "$new"
  for p in "${PKGS[@]}"; do
    v=$(dpkg-query -W -f='${Version}' "$p")
    dpkg-deb -x "$(ls "$debs/${p}_${v//:/%3a}_"*.deb | sed -n 1p)" "$new"
  done
  ln -s usr/lib/postgresql/15/bin "$new/bin"
  "$new/bin/pg_config" --version >/dev/null || die "the unpacked pg_config does not run"
  echo "$want" > "$new/.idem-stamp"
  rm -rf "$PREFIX"
  mv "$new" "$PREFIX"
  log "PostgreSQL 15 unpacked: $PREFIX"
  echo "$PREFIX/bin/pg_config"
)

# citus_build PG_CONFIG: Citus 13.2.2, built from the vendored source in
# ../shared/vendor/ (not in Debian's archive; AGPL-3.0, see the README
# there) and installed into citus_tree's PostgreSQL, never into Debian's
# installed server (refused). Run on demand by the scenario, not by
# scripts/setup.sh: the demo does not need Citus. Once: skipped when the
# installed Citus carries the stamp of this very tarball and server. Cold
# build on 2 cores: 4.5-6.5 minutes (make -j2; measured 5m04 with the
# apt-get step, 5m31 and 6m22 without it under other load).
citus_build() (
  pg_config=$1
  case "$pg_config" in
  "$IDEM_CACHE"/pg15-citus/*) ;;
  *) echo "citus: Citus goes into the private copy of Debian's 15 that citus_tree makes, not into $pg_config" >&2; exit 1 ;;
  esac
  if [ ! -f "$CITUS_TARBALL" ]; then
    echo "citus: $CITUS_TARBALL is missing." >&2
    echo "citus: the Citus scenario needs the vendored Citus source in ../shared/vendor/ (relative to $ROOT);" >&2
    echo "citus: Citus is not in Debian's archive. Without it the Citus scenario fails." >&2
    exit 1
  fi
  pkglib="$("$pg_config" --pkglibdir)"
  stamp="$pkglib/citus.idem-vendor-stamp"
  want="$(sha256sum "$CITUS_TARBALL" | cut -d' ' -f1) $("$pg_config" --version)"
  if [ -f "$pkglib/citus.so" ] && [ -f "$("$pg_config" --sharedir)/extension/citus.control" ] &&
     [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    exit 0
  fi
  deps=(build-essential autoconf flex bison libcurl4-openssl-dev liblz4-dev
        libzstd-dev libkrb5-dev libssl-dev libselinux1-dev libxslt1-dev libpam0g-dev libreadline-dev)
  apt_install "Citus's build dependencies" "${deps[@]}"
  # (The headers are the tree's own: citus_tree unpacks the server and its
  # -dev package of one version.)
  say "building Citus 13.2.2 from $CITUS_TARBALL into $pkglib (about 5 minutes on 2 cores, once)"
  scratch="$(mktemp -d /tmp/idem-citus-build.XXXXXX)"
  trap 'rm -rf "$scratch"' EXIT
  tar -xzf "$CITUS_TARBALL" -C "$scratch"
  log="$scratch/build.log"
  (
    cd "$scratch/citus-13.2.2"
    ./configure PG_CONFIG="$pg_config" >"$log" 2>&1
    make -j2 >>"$log" 2>&1
    make install >>"$log" 2>&1
  ) || { echo "citus: the Citus build failed; last lines of its log:" >&2; tail -30 "$log" >&2; exit 1; }
  echo "$want" > "$stamp"
  say "Citus installed: $pkglib/citus.so"
)

# citus_server: citus_tree with Citus built into it; prints its pg_config.
citus_server() {
  local pg_config
  pg_config=$(citus_tree)
  citus_build "$pg_config" >&2
  echo "$pg_config"
}

check() { # description, then a command whose success is the check
  local what=$1; shift
  if "$@"; then echo "ok - $what"; else echo "FAIL - $what"; fails=$((fails + 1)); fi
}
eq() { # description, expected, actual
  if [ "$2" = "$3" ]; then echo "ok - $1"; else echo "FAIL - $1: expected '$2', got '$3'"; fails=$((fails + 1)); fi
}

# citus_isolation: pg_isolation_regress against the coordinator (database
# $CITUS_DB, idem distributed), with Citus's blocking check in place of
# PostgreSQL's so that a session waiting on a worker counts as blocked.
# Its output on stdout; its status is the verdict.
citus_isolation() {
  local here="$ROOT/tests/citus" out input specs f rc=0
  citus_psql coord -Atc "
    SELECT citus_internal.replace_isolation_tester_func()
     WHERE to_regprocedure('pg_catalog.old_pg_isolation_test_session_is_blocked(integer, integer[])') IS NULL" >/dev/null
  specs=($(cd "$here/specs" && ls *.spec | sed 's/\.spec$//'))
  out="$(mktemp -d /tmp/idem-citus-iso.XXXXXX)"
  # The expected outputs name the workers' default ports; on other ports
  # (CITUS_PORTS) they are read with those.
  input=$here
  if [ "$(citus_port w1) $(citus_port w2)" != "5531 5532" ]; then
    input="$out/input"
    mkdir -p "$input/expected"
    ln -s "$here/specs" "$input/specs"
    for f in "$here"/expected/*.out; do
      sed "s/\b5531\b/$(citus_port w1)/g; s/\b5532\b/$(citus_port w2)/g" "$f" > "$input/expected/$(basename "$f")"
    done
  fi
  source "$ROOT/tests/lib/suite.sh"
  regress_run isolation "$(citus_base)/coord" "$(citus_port coord)" "${CITUS_DB:-idem_citus}" "$input" "$out" "$out/run.log" "${specs[@]}" || rc=$?
  cat "$out/run.log"
  [ $rc = 0 ] || echo "diffs: $out/regression.diffs"
  return $rc
}

# citus_upgrade WORK: ALTER EXTENSION idem UPDATE on the Citus cluster, from
# every shipped version with a frozen install script that Citus ran
# (tests/upgrade/idem--V.sql, 0.3.0 on), to the current one (files in the
# folder WORK). On the started cluster, whose database $CITUS_DB holds a
# fresh install of the current version after docs/scaling.md's steps, for
# the schema comparison. For each version V:
#   1. a database with idem V, distributed next to orders (idem_distribute),
#      and used through the coordinator: payments claimed by a distributed
#      function (three business types of 30 days, 400 days and the default
#      TTL, so three TTL classes after the update), one failed, one claimed
#      and committed unfinished, one leased, a token issued; business rows,
#      claims per state counted;
#   2. docs/scaling.md's upgrade step, verbatim (the ```sql norun block after
#      <!-- citus-upgrade: update -->), on the coordinator;
#   3. the same counts; every payment paid again is answered from its old
#      claim (no second business row), new keys claim, the lease is finished
#      with its token, the token is consumed once; every node at the new
#      version on the citus path; idem.claims distributed as before, the
#      claim functions still delegated; idem's objects on every node equal
#      those of the fresh install in $CITUS_DB (tests/upgrade/schema.sql);
#   4. DROP EXTENSION idem leaves no schema idem on any node.
# Also: the update where Citus is installed but idem.claims was never
# distributed (every node updates its own tables).
# Prints "ok - ..." / "FAIL - ..." lines; its status is the number of failures.
citus_upgrade() (
  fails=0
  local work=$1 fresh_db=${CITUS_DB:-idem_citus} current extdir frozen old db n t i token before results_before
  current=$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml" | sed -n 1p)
  extdir="$("$PG_CONFIG" --sharedir)/extension"
  P() { local db=$1 node=$2; shift 2; citus_sql "$node" "$db" "$@"; }

  ROOT="$ROOT" python3 - "$ROOT/docs/scaling.md" > "$work/update.sql" <<'PY'
import os, sys
sys.path.insert(0, os.path.join(os.environ["ROOT"], "tests", "docs"))
from sql_blocks import parse
path = sys.argv[1]
lines = open(path, encoding="utf-8").read().split("\n")
blocks = {b.fence_line: b for b in parse(path)[0]}
found = [blocks.get(i + 2) for i, l in enumerate(lines) if l.strip() == "<!-- citus-upgrade: update -->"]
if len(found) != 1 or found[0] is None or found[0].mode != "norun":
    sys.exit(f"FAIL {path}: want one <!-- citus-upgrade: update --> marker followed by a ```sql norun block")
print("\\set ON_ERROR_STOP 1")
print("\n".join(found[0].body))
PY
  [ -s "$work/update.sql" ] || { echo "FAIL - docs/scaling.md's upgrade step not found"; exit 1; }

  schema() { # db node
    P "$1" "$2" -At -f "$ROOT/tests/upgrade/schema.sql"
  }
  for n in coord w1 w2; do schema "$fresh_db" "$n" > "$work/fresh-$n.txt"; done

  for frozen in "$ROOT"/tests/upgrade/idem--*.sql; do
    old=$(basename "$frozen" .sql); old=${old#idem--}
    # Versions before 0.3.0 had no Citus path that held (docs/scaling.md).
    [ "$(printf '%s\n0.3.0\n' "$old" | sort -V | sed -n 1p)" = 0.3.0 ] || continue
    cmp -s "$frozen" "$extdir/idem--$old.sql" || install -m 644 "$frozen" "$extdir/idem--$old.sql"
    db=idem_up_${old//./_}
    say "ALTER EXTENSION idem UPDATE from $old on Citus, after idem_distribute (database $db)"
    for n in coord w1 w2; do P postgres "$n" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"; done
    CITUS_DB=$db citus_start
    P "$db" coord > /dev/null <<SQL
CREATE EXTENSION idem VERSION '$old';
CREATE TABLE orders (order_no text PRIMARY KEY);
SELECT create_distributed_table('orders', 'order_no');
CREATE TABLE payments (order_no text NOT NULL, biz_type text NOT NULL, payment_id bigserial, PRIMARY KEY (order_no, payment_id));
SELECT create_distributed_table('payments', 'order_no', colocate_with => 'orders');
SELECT idem_distribute('orders');
SELECT idem_configure('payment', '30 days');
SELECT idem_configure('deposit', '400 days');
SELECT idem_maintain();
CREATE FUNCTION pay(order_no text, biz_type text, OUT claimed boolean, OUT result jsonb)
LANGUAGE plpgsql AS \$\$
DECLARE
    c idem_claim_result;
    id bigint;
BEGIN
    c := idem_claim(order_no, biz_type);
    claimed := c.claimed;
    IF NOT c.claimed THEN
        result := c.result;
        RETURN;
    END IF;
    INSERT INTO payments (order_no, biz_type) VALUES (pay.order_no, pay.biz_type) RETURNING payment_id INTO id;
    result := jsonb_build_object('payment_id', id);
    PERFORM idem_complete(order_no, biz_type, result);
END \$\$;
SELECT create_distributed_function('pay(text,text)', distribution_arg_name := 'order_no',
                                   colocate_with := 'orders', force_delegation := true);
CREATE TABLE tok AS SELECT idem_issue_token('form') AS t;
SQL
    # One statement per call: Citus delegates a call only when it is the
    # whole statement.
    for t in payment deposit quick; do
      for i in $(seq 1 40); do echo "SELECT claimed, result FROM pay('$t-$i', '$t');"; done
    done > "$work/pay.sql"
    P "$db" coord -At -f "$work/pay.sql" > "$work/pay-1.out"
    eq "$old: 120 payments claimed before the update" 120 "$(grep -c '^t|{"payment_id": [0-9]*}$' "$work/pay-1.out")"
    P "$db" coord -At > /dev/null <<'SQL'
BEGIN;
SELECT claimed FROM idem_claim('refused', 'payment');
SELECT idem_fail('refused', 'payment', '{"reason": "card declined"}');
COMMIT;
SELECT claimed FROM idem_claim('open', 'payment');
SQL
    token=$(P "$db" coord -At -c "SELECT result->>'lease_token' FROM idem_claim('leased', 'payment', lease => '1 hour')")
    check "$old: a lease taken, its token returned" test -n "$token"
    counts() { # db: business rows, then claims per state
      P "$1" coord -At -c "SELECT (SELECT count(*) FROM payments) || ' ' ||
                                  (SELECT string_agg(state::text || '=' || n, ',' ORDER BY state) FROM (SELECT state, count(*) n FROM idem.claims GROUP BY 1) s)"
    }
    before=$(counts "$db")
    results() { P "$db" coord -At -c "SELECT string_agg(key || ':' || biz_type || ':' || coalesce(result::text, '-'), ' ' ORDER BY key, biz_type) FROM idem.claims"; }
    results_before=$(results)
    echo "  before the update: business rows and claims per state: $before"

    P "$db" coord -f "$work/update.sql" > "$work/update-$old.out" 2>&1 ||
      { echo "FAIL - $old: docs/scaling.md's upgrade step failed:"; tail -15 "$work/update-$old.out"; fails=$((fails + 1)); continue; }
    echo "ok - $old: docs/scaling.md's upgrade step ran"
    eq "$old: every node at $current, on the citus path" "$current citus|$current citus|$current citus" \
      "$(P "$db" coord -At -c "SELECT string_agg(result, '|' ORDER BY nodeid) FROM run_command_on_all_nodes(
                               \$\$SELECT extversion || ' ' || idem_storage_path() FROM pg_extension WHERE extname = 'idem'\$\$)")"
    eq "$old: idem.claims hash-distributed by key in 32 shards, co-located with orders" "h key 32 t" \
      "$(P "$db" coord -At -c "SELECT format('%s %s %s %s', partmethod, column_to_column_name(logicalrelid, partkey),
                                      (SELECT count(*) FROM pg_dist_shard s WHERE s.logicalrelid = p.logicalrelid),
                                      colocationid = (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'orders'::regclass))
                          FROM pg_dist_partition p WHERE logicalrelid = 'idem.claims'::regclass")"
    eq "$old: business rows and claims per state kept" "$before" "$(counts "$db")"
    eq "$old: every claim's key, type and stored result kept" "$results_before" "$(results)"
    P "$db" coord -At -f "$work/pay.sql" > "$work/pay-2.out"
    eq "$old: 120 payments paid again after the update: each answered from its old claim, with its first payment's id" \
      "$(sed 's/^t|/f|/' "$work/pay-1.out")" "$(cat "$work/pay-2.out")"
    # Each in a form Citus delegates (docs/scaling.md, "Call forms").
    got() { P "$db" coord -At -c "$1"; }
    eq "$old: the failed claim answers failed with its result" 'f|failed|{"reason": "card declined"}' \
      "$(got "SELECT claimed, state, result FROM idem_claim('refused', 'payment')")"
    eq "$old: the claim committed unfinished answers completed" 'f|completed' \
      "$(got "SELECT claimed, state FROM idem_claim('open', 'payment')")"
    eq "$old: the lease is still held" 'f|in_progress' "$(got "SELECT claimed, state FROM idem_claim('leased', 'payment')")"
    got "SELECT idem_complete('leased', 'payment', '{\"by\": \"owner\"}', '$token')" > /dev/null
    eq "$old: the lease finished with its token" 'completed|{"by": "owner"}' \
      "$(got "SELECT state, result FROM idem_lookup('leased', 'payment')")"
    eq "$old: the token issued before the update is consumed once" 't f' \
      "$(got "SELECT idem_consume_token(t, 'form') FROM tok") $(got "SELECT idem_consume_token(t, 'form') FROM tok")"
    for i in $(seq 1 10); do echo "SELECT claimed FROM pay('new-$i', 'payment');"; done > "$work/new.sql"
    eq "$old: new keys claim after the update, one business row each" "10 $(( ${before%% *} + 10 ))" \
      "$(P "$db" coord -At -f "$work/new.sql" | grep -c '^t$') $(P "$db" coord -At -c 'SELECT count(*) FROM payments')"
    eq "$old: the registry distributed by key next to idem.claims, each of its 32 shards anchored" "h t 32" \
      "$(P "$db" coord -At -c "SELECT format('%s %s %s', partmethod,
                                      colocationid = (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'idem.claims'::regclass),
                                      (SELECT count(DISTINCT biz_type) FROM idem.type_classes WHERE ttl_class = -1))
                          FROM pg_dist_partition p WHERE logicalrelid = 'idem.type_classes'::regclass")"
    # Every (shard, type, class) of the claims registered on that shard, up
    # to its latest expiry at least (the claims were written before the
    # update: no claim registered them).
    eq "$old: the claims of three TTL classes kept, each registered on its own shard" "3 0" \
      "$(P "$db" coord -At -c "WITH c AS MATERIALIZED (
                                 SELECT get_shard_id_for_distribution_column('idem.claims', min(key)) AS s, biz_type, ttl_class, max(expires_at) AS e
                                   FROM idem.claims GROUP BY width_bucket(worker_hash(key), (SELECT array_agg(shardminvalue::int ORDER BY shardminvalue::int) FROM pg_dist_shard WHERE logicalrelid = 'idem.claims'::regclass)), biz_type, ttl_class),
                                    r AS MATERIALIZED (
                                 SELECT get_shard_id_for_distribution_column('idem.claims', key) AS s, biz_type, ttl_class, until FROM idem.type_classes WHERE ttl_class >= 0)
                               SELECT count(DISTINCT c.ttl_class) || ' ' || count(*) FILTER (WHERE NOT EXISTS (
                                        SELECT 1 FROM r WHERE r.s = c.s AND r.biz_type = c.biz_type AND r.ttl_class = c.ttl_class AND r.until >= c.e))
                                 FROM c")"
    eq "$old: idem.claims, its default partition and the registry are no distributed objects of Citus's on any node (as after a fresh install: extension members)" "0|0|0" \
      "$(P "$db" coord -At -c "SELECT string_agg(result, '|' ORDER BY nodeid) FROM run_command_on_all_nodes(
            \$\$SELECT count(*) FROM pg_dist_object WHERE classid = 'pg_class'::regclass AND objid IN ('idem.claims'::regclass, 'idem.claims_default'::regclass, 'idem.type_classes'::regclass)\$\$)")"
    for n in coord w1 w2; do
      schema "$db" "$n" > "$work/up-$n.txt"
      if diff -u "$work/fresh-$n.txt" "$work/up-$n.txt" > "$work/diff-$n.txt"; then
        echo "ok - $old: idem's objects on $n equal a fresh $current install's"
      else
        echo "FAIL - $old: idem's objects on $n differ from a fresh $current install's:"; head -40 "$work/diff-$n.txt"; fails=$((fails + 1))
      fi
    done
    P "$db" coord -c "DROP EXTENSION idem CASCADE" > /dev/null 2>&1 || true
    eq "$old: after the update, DROP EXTENSION idem leaves no schema idem on any node" "0|0|0" \
      "$(P "$db" coord -At -c "SELECT string_agg(result, '|' ORDER BY nodeid) FROM run_command_on_all_nodes(
            \$\$SELECT count(*) FROM pg_namespace WHERE nspname = 'idem'\$\$)")"
    for n in coord w1 w2; do P postgres "$n" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"; done

    # Citus installed, idem never distributed: each node updates its own.
    db=idem_up_local_${old//./_}
    say "ALTER EXTENSION idem UPDATE from $old on Citus, idem.claims not distributed (database $db)"
    for n in coord w1 w2; do P postgres "$n" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"; done
    CITUS_DB=$db citus_start
    P "$db" coord -At > /dev/null <<SQL
CREATE EXTENSION idem VERSION '$old';
SELECT idem_configure('payment', '30 days');
BEGIN; SELECT idem_claim('done', 'payment'); SELECT idem_complete('done', 'payment', '{"n": 1}'); COMMIT;
SQL
    if P "$db" coord -c "ALTER EXTENSION idem UPDATE" > "$work/local.out" 2>&1; then
      eq "$old, not distributed: every node at $current; the claim replays on the coordinator" \
        "$current|$current|$current false/completed/{\"n\": 1}" \
        "$(P "$db" coord -At -c "SELECT string_agg(result, '|' ORDER BY nodeid) FROM run_command_on_all_nodes(\$\$SELECT extversion FROM pg_extension WHERE extname = 'idem'\$\$)") $(P "$db" coord -At -c "SELECT claimed || '/' || state || '/' || result FROM idem_claim('done', 'payment')")"
    else
      echo "FAIL - $old, not distributed: ALTER EXTENSION idem UPDATE failed:"; tail -5 "$work/local.out"; fails=$((fails + 1))
    fi
    for n in coord w1 w2; do P postgres "$n" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"; done
  done
  echo "Citus upgrade checks: $fails failed"
  exit "$fails"
)

scenario_citus() {
source "$ROOT/tests/lib/cluster.sh"
if [ "${1:-}" = --server ]; then citus_server; return; fi
started=$(date +%s)
if [ ! -f "$CITUS_TARBALL" ]; then
  echo "FAIL: $CITUS_TARBALL is missing. The Citus scenario needs the vendored Citus source in ../shared/vendor/"
  echo "      (relative to the project folder $ROOT); Citus is not in Debian's archive. Not skipped: failed."
  exit 1
fi
# Where this build of idem comes from: the server of $PG_CONFIG (the suite
# installs it there), or IDEM_STAGE, a `cargo pgrx package` staging folder
# (its usr/lib/postgresql/15/lib/idem.so and usr/share/postgresql/15/extension/).
if [ -n "${IDEM_STAGE:-}" ]; then
  IDEM_STAGE="$(cd "$IDEM_STAGE" && pwd)"
  IDEM_LIB="$IDEM_STAGE$("$PG_CONFIG" --pkglibdir)"
  IDEM_SHARE="$IDEM_STAGE$("$PG_CONFIG" --sharedir)"
else
  IDEM_LIB="$("$PG_CONFIG" --pkglibdir)"
  IDEM_SHARE="$("$PG_CONFIG" --sharedir)"
fi
if [ ! -f "$IDEM_SHARE/extension/idem.control" ] || [ ! -f "$IDEM_LIB/idem.so" ]; then
  echo "FAIL: no build of idem in $IDEM_LIB and $IDEM_SHARE/extension"
  echo "      (bash scripts/setup.sh installs it into $PG_CONFIG's server; or IDEM_STAGE=<cargo pgrx package output>)"; exit 1
fi
# The update scripts the cluster runs are this checkout's (the build copies
# sql/idem--A--B.sql as they are): a build of another checkout left in the
# server (a run with IDEM_SETUP=0 from a fresh clone) would test that
# checkout's updates under this one's checks.
for f in "$ROOT"/sql/idem--*--*.sql; do
  if ! cmp -s "$f" "$IDEM_SHARE/extension/$(basename "$f")"; then
    echo "FAIL: $IDEM_SHARE/extension/$(basename "$f") is not this checkout's sql/$(basename "$f"):"
    echo "      another build of idem is installed (bash scripts/setup.sh installs this one; or IDEM_STAGE=...)"; exit 1
  fi
done
# One Citus scenario at a time on this machine, held until this one exits:
# the Citus tree is shared by every checkout, and another run copying its
# build into it would swap the update script under this run's cluster (a
# second run waits here, then copies its own; the cluster's servers inherit
# the lock, so a cluster kept with CITUS_KEEP=1 holds it until stopped).
exec {citus_run_lock}>"$IDEM_CACHE/pg15-citus-run.lock"
if ! flock -n "$citus_run_lock"; then
  say "waiting for another run of the Citus scenario ($IDEM_CACHE/pg15-citus-run.lock)"
  flock "$citus_run_lock"
fi

# Citus and idem go into a private copy of Debian's PostgreSQL 15
# (citus_tree), never into the system's: the build of idem the
# suite installed into $PG_CONFIG's server (or the one in IDEM_STAGE) is
# copied there (same server version, so the same library loads).
SUITE_PG_CONFIG=$PG_CONFIG
say "a private PostgreSQL 15 for Citus (made once, then cached)"
t=$(date +%s)
CITUS_PG_CONFIG=$(citus_tree)
if [ "$("$SUITE_PG_CONFIG" --version)" != "$("$CITUS_PG_CONFIG" --version)" ]; then
  echo "FAIL: the Citus scenario runs on Debian 12's PostgreSQL 15 (the vendored Citus is patched for 15.20);"
  echo "      this build of idem is for $("$SUITE_PG_CONFIG" --version), the private tree is $("$CITUS_PG_CONFIG" --version)"
  exit 1
fi
export PG_CONFIG=$CITUS_PG_CONFIG
PG_BIN="$("$PG_CONFIG" --bindir)"
citus_build "$PG_CONFIG"
build_s=$(( $(date +%s) - t ))
if [ "$IDEM_LIB" != "$("$PG_CONFIG" --pkglibdir)" ]; then
  say "this build of idem ($IDEM_LIB) into $("$PG_CONFIG" --pkglibdir)"
  install -m 755 "$IDEM_LIB/idem.so" "$("$PG_CONFIG" --pkglibdir)/idem.so"
  install -m 644 "$IDEM_SHARE"/extension/idem.control \
                 "$IDEM_SHARE"/extension/idem--*.sql "$("$PG_CONFIG" --sharedir)/extension/"
fi
bash "$ROOT/scripts/setup.sh" --tool python

export CITUS_DB=idem_citus PG_BIN
work=$(mktemp -d /tmp/idem-citus-scenario.XXXXXX)
cleanup() {
  rc=$?
  if [ $rc != 0 ]; then
    for n in coord w1 w2; do
      log="$(citus_base)/$n/server.log"
      [ -f "$log" ] && { echo "--- $n server.log (tail)"; tail -12 "$log"; }
    done
  fi
  [ "${CITUS_KEEP:-0}" = 1 ] || citus_destroy
  rm -rf "$work"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "a fresh cluster: coordinator 127.0.0.1:$(citus_port coord), workers :$(citus_port w1) and :$(citus_port w2)"
t=$(date +%s)
citus_destroy
citus_start
cluster_s=$(( $(date +%s) - t ))
C() { citus_psql coord "$@"; }

fails=0

say "docs/scaling.md's Citus steps, verbatim"
python3 "$ROOT/tests/citus/doc_steps.py" "$ROOT/docs/scaling.md" > "$work/steps.sql"
grep "^.echo '@@step " "$work/steps.sql" | sed "s/^\\\\echo '@@step /  step /; s/'$//"
if C -f "$work/steps.sql" > "$work/steps.out" 2>&1; then echo "ok - the steps ran without error"
else echo "FAIL - a step failed:"; tail -20 "$work/steps.out"; exit 1; fi
check "step 1 before idem_distribute: idem_storage_path() is sql" grep -qx ' sql' "$work/steps.out"
check "step 3: idem.claims hash-distributed by key in 32 shards, co-located with orders" \
  test "$(C -Atc "SELECT format('%s %s %s %s', partmethod, column_to_column_name(logicalrelid, partkey),
                                (SELECT count(*) FROM pg_dist_shard s WHERE s.logicalrelid = p.logicalrelid),
                                colocationid = (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'orders'::regclass))
                    FROM pg_dist_partition p WHERE logicalrelid = 'idem.claims'::regclass")" = "h key 32 t"
check "step 3: idem_storage_path() is citus on the coordinator and both workers" \
  test "$(C -Atc "SELECT string_agg(result, ' ' ORDER BY nodeid) FROM run_command_on_all_nodes('SELECT idem_storage_path()')")" = "citus citus citus"
check "step 5: pay() claimed, then replayed; the refund claimed: 2 payments rows for A-0001, both claims completed" \
  test "$(C -Atc "SELECT (SELECT count(*) FROM payments WHERE order_no = 'A-0001') || ' ' ||
                         (SELECT state FROM idem_lookup('A-0001', 'payment')) || ' ' ||
                         (SELECT state FROM idem_lookup('A-0001', 'refund'))")" = "2 completed completed"
check "step 5: a third pay() replays the first answer" \
  test "$(C -Atc "SELECT outcome || ' ' || (result->>'amount') FROM pay('A-0001', 25.00)")" = "replayed 25.00"
refused_0A000() { grep -q 'ERROR:  0A000' <<<"$(citus_psql coord -v VERBOSITY=verbose -c "SELECT (idem_claim('A-0001', 'refund')).claimed" 2>&1 || true)"; }
check "step 5: the form that Citus does not delegate is refused with 0A000" refused_0A000
check "step 6: idem_schedule_maintenance() made the pg_cron job (unscheduled now: the checks run maintenance themselves)" \
  test "$(C -Atc "SELECT count(cron.unschedule(jobid)) FROM cron.job WHERE jobname = 'idem_maintain'")" = 1
check "step 6: maintenance made the partitions of the 30-day TTL class, reaching past 30 days" \
  test "$(C -Atc "SELECT count(*) >= 6 AND max(range_to) > now() + interval '30 days' FROM idem_partitions WHERE ttl_class = idem.ttl_class('30 days')")" = t

say "relations one claim locks on a worker, whatever TTLs the database's types use (the registry on the shard)"
# Claims directly on worker 1 (keys whose shard is elsewhere are refused with
# 0A000 and skipped). first_claims commits 3 claims of a type; claim_locks
# counts idem's relations one claim of a new key holds in pg_locks, rolled
# back (Citus locks its catalogs too; a worker's pg_class hides the shards
# from other sessions' queries, so they are told by name). Each count right
# after a maintenance run: partitions that ended since the last one add two
# each (docs/design.md §1).
W1() { citus_psql w1 "$@"; }
first_claims() { # type ttl
  W1 -q <<SQL
DO \$\$
DECLARE n int := 0;
BEGIN
    FOR i IN 1..300 LOOP
        BEGIN
            PERFORM idem_claim('first-$1-' || i, '$1', ttl => interval '$2');
            n := n + 1;
            EXIT WHEN n = 3;
        EXCEPTION WHEN SQLSTATE '0A000' THEN NULL;
        END;
    END LOOP;
END
\$\$;
SQL
}
# What one claim of TYPE on worker 1 locks, printed as "ALL OTHER CLASSES":
# how many of idem's relations; how many of those are not partitions of a
# TTL class or their indexes (the tables, the default partition, the
# registry); the classes whose partitions it locks, comma-separated.
# (Counted apart because the partitions of the claim's own class come and
# go with the clock: maintenance drops one whose range has ended, a later
# expiry reaches the next one.)
claim_locks() { # type ttl
  W1 -At <<SQL | tail -1
DO \$\$
DECLARE
    n text;
BEGIN
    FOR i IN 1..300 LOOP
        BEGIN
            PERFORM idem_claim('locks-$1-' || i, '$1', ttl => interval '$2');
            SELECT count(DISTINCT r) || ' ' || count(DISTINCT r) FILTER (WHERE r !~ '^idem\.claims_c[0-9]+_')
                   || ' ' || coalesce(string_agg(DISTINCT substring(r from '^idem\.claims_c([0-9]+)_'), ','), '-')
              INTO n
              FROM (SELECT l.relation::regclass::text AS r FROM pg_locks l
                     WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation' AND l.relation::regclass::text LIKE 'idem.%') AS locked;
            RAISE SQLSTATE 'XX999';
        EXCEPTION
            WHEN SQLSTATE 'XX999' THEN PERFORM set_config('idem_test.locks', n, false); RETURN;
            WHEN SQLSTATE '0A000' THEN NULL;
        END;
    END LOOP;
END
\$\$;
SELECT current_setting('idem_test.locks', true);
SQL
}
first_claims lk.1h '1 hour'
C -qAtc "SELECT idem_maintain()" > /dev/null
read -r alone alone_other alone_classes <<<"$(claim_locks lk.1h '1 hour')"
for t in "lk.1d 1 day" "lk.30d 30 days" "lk.400d 400 days"; do first_claims ${t%% *} "${t#* }"; done
C -qAtc "SELECT idem_maintain()" > /dev/null
declare -A per_type
for t in "lk.1h 1 hour" "lk.1d 1 day" "lk.30d 30 days" "lk.400d 400 days"; do
  read -r n _ _ <<<"$(claim_locks ${t%% *} "${t#* }")"; per_type[${t%% *}]=$n
done
read -r _ with_other with_classes <<<"$(claim_locks lk.1h '1 hour')"
health=$(C -Atc "SELECT value::int FROM idem_health WHERE check_name = 'claim_locks'")
classes_w1=$(W1 -Atc "SELECT count(DISTINCT ttl_class) FROM idem.claims WHERE biz_type LIKE 'lk.%'")
max=0; for t in "${!per_type[@]}"; do [ "${per_type[$t]:-999}" -gt "$max" ] && max=${per_type[$t]:-999}; done
echo "   a claim on worker 1 locks: lk.1h alone $alone; with 1 h / 1 d / 30 d / 400 d types ($classes_w1 classes on worker 1):" \
     "1 h ${per_type[lk.1h]}, 1 d ${per_type[lk.1d]}, 30 d ${per_type[lk.30d]}, 400 d ${per_type[lk.400d]}; idem_health's claim_locks says $health"
echo "   lk.1h alone: $alone_other relations besides the class partitions, partitions of class(es) $alone_classes;" \
     "with the four types: $with_other, class(es) $with_classes"
check "a claim of a 1-hour type locks the same relations besides its class's partitions, and partitions of its class only, with 4 types of 4 classes in the database as alone ($alone_other; class $alone_classes)" \
  test "${with_other:-x} ${with_classes:-x}" = "${alone_other:-y} ${alone_classes:-y}" -a "${alone_classes:-,}" = "${alone_classes//,/}"
check "no claim locks more than the bound of 8 + 2 x 3 x 8 = 56 relations on a worker (max $max)" test "$max" -le 56
check "idem_health's claim_locks sees at least what a worker's claim locks (and the claim locks more than the tables)" \
  test "$max" -le "${health:-0}" -a "${per_type[lk.1h]:-0}" -gt 6
check "each of the registry's 32 shards carries its anchor (its registrations complete)" \
  test "$(C -Atc "SELECT count(DISTINCT biz_type) FROM idem.type_classes WHERE ttl_class = -1")" = 32

say "a shard split: claims on the new shards look into every class until maintenance registers them anew"
# Six keys of one shard claimed with two TTLs (the type's registrations
# are written by its first claims, placed by their keys), the shard split
# in two on its node: the registrations are divided by the keys that wrote
# them, not by the claims they cover, and the new shards have no anchor.
# In a database of its own (the other checks count on 32 shards).
CITUS_DB=idem_split citus_start
S() { citus_sql coord idem_split "$@"; }
S -q >/dev/null <<'SQL'
CREATE EXTENSION idem;
CREATE TABLE s_orders (order_no text PRIMARY KEY);
SELECT create_distributed_table('s_orders', 'order_no');
SELECT idem_distribute('s_orders');
SQL
split_shard=$(S -Atc "SELECT get_shard_id_for_distribution_column('idem.claims', 'split-0')")
split_keys=$(S -Atc "SELECT string_agg(k, ' ') FROM (SELECT 'split-' || i AS k FROM generate_series(0, 5000) i
                      WHERE get_shard_id_for_distribution_column('idem.claims', 'split-' || i) = $split_shard LIMIT 6) s")
n=0; for k in $split_keys; do
  ttl='1 hour'; [ $n -ge 3 ] && ttl='30 days'; n=$((n + 1))
  S -qAtc "SELECT claimed FROM idem_claim('$k', 'split.t', ttl => '$ttl')" > /dev/null
done
S -qAtc "SELECT citus_split_shard_by_split_points($split_shard,
           ARRAY[((shardminvalue::bigint + shardmaxvalue::bigint) / 2)::text],
           ARRAY[(SELECT nodeid FROM pg_dist_placement JOIN pg_dist_node USING (groupid) WHERE shardid = $split_shard),
                 (SELECT nodeid FROM pg_dist_placement JOIN pg_dist_node USING (groupid) WHERE shardid = $split_shard)],
           'block_writes')
           FROM pg_dist_shard WHERE shardid = $split_shard" > /dev/null
again() { for k in $split_keys; do S -Atc "SELECT claimed, state FROM idem_claim('$k', 'split.t', ttl => '1 hour')"; done | sort | uniq -c | xargs; }
check "after the split, the six keys (on $(S -Atc "SELECT count(DISTINCT get_shard_id_for_distribution_column('idem.claims', k)) FROM unnest(string_to_array('$split_keys', ' ')) k") new shards) are each found: completed, none claimed again" \
  test "$(again)" = "6 f|completed"
check "the new shards' registrations are not known complete (no anchor)" test "$(S -Atc "SELECT idem.registry_incomplete()")" = t
split_report=$(S -Atc "SELECT idem_maintain()")
check "idem_maintain registers the claims anew ($(echo "$split_report" | grep -o '"registry_filled": [0-9]*')) and anchors all 33 shards" \
  test "$(S -Atc "SELECT idem.registry_incomplete() || ' ' || count(DISTINCT biz_type) FROM idem.type_classes WHERE ttl_class = -1")" = "false 33"
check "after maintenance, the six keys are still each found" test "$(again)" = "6 f|completed"

say "ALTER EXTENSION idem UPDATE on the cluster, from every shipped version after idem_distribute (citus_upgrade)"
citus_upgrade "$work" || fails=$((fails + $?))

say "a second database for the maintenance checks (short partition widths)"
CITUS_DB=idem_m citus_start
citus_sql coord idem_m >/dev/null <<'SQL'
CREATE EXTENSION idem;
CREATE TABLE m_orders (order_no text PRIMARY KEY);
SELECT create_distributed_table('m_orders', 'order_no');
SELECT idem_distribute('m_orders');
SQL

say "isolation specs against the coordinator (tests/citus/specs)"
if citus_isolation > "$work/isolation.out" 2>&1; then
  grep -E "^(test|     ) *[a-z_]+ +\.\.\. " "$work/isolation.out" || cat "$work/isolation.out"
  echo "ok - isolation specs"
else
  cat "$work/isolation.out"; d=$(grep -o '/tmp/idem-citus-iso[^ "]*/regression.diffs' "$work/isolation.out" | sed -n 1p)
  [ -n "$d" ] && cat "$d"
  echo "FAIL - isolation specs"; fails=$((fails + 1))
fi

say "checks (tests/citus/scenario.py)"
export CITUS_SUMMARY="$IDEM_TARGET/test-out/citus-summary.json"
mkdir -p "$(dirname "$CITUS_SUMMARY")"
"$IDEM_PY" "$ROOT/tests/citus/scenario.py" || fails=$((fails + $?))

total=$(( $(date +%s) - started ))
echo "Citus scenario: $fails failed; $total s in all (Citus build step $build_s s, cluster $cluster_s s); summary in $CITUS_SUMMARY"
[ "$fails" = 0 ]
}

# Sharding with PL/Proxy, for real: three shard clusters (each its own
# initdb, idem installed) and a proxy cluster, all on loopback, started here
# and torn down on exit even on failure. tests/plproxy/driver.py plays the
# traffic and checks the invariants; see docs/scaling.md.
#
# The proxy lives on a fourth, small cluster rather than on shard 0's: the
# failure test stops a shard with `pg_ctl stop -m immediate`, and the proxy
# must stay up whichever shard goes down (as in production, where proxies
# and shards are separate machines).
scenario_plproxy() {
source "$ROOT/tests/lib/cluster.sh"
started=$(date +%s.%N)

base="$(cluster_dir)/shard"
PROXY_PORT=5520
SHARD_PORTS=(5521 5522 5523)
nodes=(proxy s0 s1 s2)
ports=("$PROXY_PORT" "${SHARD_PORTS[@]}")

# Each node is a cluster of the cluster library (tests/lib/cluster.sh) in
# $base/NODE: PC_DIR names it for pc_start and pc_stop.
stop_all() {
  for n in "${nodes[@]}"; do
    [ ! -f "$base/$n/data/postmaster.pid" ] || (PC_DIR="$base/$n"; pc_stop)
  done
  true
}
cleanup() {
  rc=$?
  stop_all
  if [ $rc != 0 ]; then
    for n in "${nodes[@]}"; do
      [ -f "$base/$n/server.log" ] && { echo "--- $n server.log (tail)"; tail -15 "$base/$n/server.log"; }
    done
  fi
  rm -rf "$base"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

stop_all             # leftovers of an interrupted run
rm -rf "$base"
mkdir -p "$base"
chown postgres:postgres "$base"
chmod 700 "$base"

say "creating 4 clusters under $base (proxy :$PROXY_PORT, shards :${SHARD_PORTS[*]})"
for i in "${!nodes[@]}"; do
  n=${nodes[$i]}
  as_postgres mkdir -p "$base/$n"
  # synchronous_commit stays on: an acknowledged commit must survive the
  # immediate stop below (fsync off is fine, the kernel keeps the writes).
  # TCP only: no socket path length limit.
  conf=("listen_addresses = '127.0.0.1'" "unix_socket_directories = ''" "shared_buffers = 16MB"
        "max_connections = 40" "max_wal_senders = 0" "wal_level = minimal" "full_page_writes = off"
        "max_worker_processes = 8" "log_min_messages = warning")
  [ "$n" = proxy ] || conf+=("shared_preload_libraries = 'pg_cron'" "cron.database_name = 'orders_${n#s}'")
  pc_initdb "$PG_BIN" "$base/$n" "${ports[$i]}" "${conf[@]}"
done
for n in "${nodes[@]}"; do
  (PC_DIR="$base/$n"; pc_start) &
done
wait

psql_at() { # port db [psql args...]
  local port=$1 db=$2; shift 2
  PGOPTIONS="-c client_min_messages=warning" "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d "$db" "$@"
}

# (Re)create the shard databases and the proxy database from the SQL files.
make_dbs() {
  for i in 0 1 2; do
    psql_at "${SHARD_PORTS[$i]}" postgres -c "DROP DATABASE IF EXISTS orders_$i WITH (FORCE)" \
      -c "CREATE DATABASE orders_$i"
    psql_at "${SHARD_PORTS[$i]}" "orders_$i" -c "CREATE EXTENSION idem" -c "CREATE EXTENSION pg_cron" \
      -f "$ROOT/tests/plproxy/shard.sql"
  done
  psql_at $PROXY_PORT postgres -c "DROP DATABASE IF EXISTS proxy WITH (FORCE)" -c "CREATE DATABASE proxy"
  psql_at $PROXY_PORT proxy -f "$ROOT/tests/plproxy/proxy.sql"
}

# docs/scaling.md shows the deployment's SQL; it must be this SQL, verbatim.
"$IDEM_PY" - "$ROOT" <<'PY'
import sys, pathlib
root = pathlib.Path(sys.argv[1])
doc = (root / "docs/scaling.md").read_text()
for f in ("tests/plproxy/shard.sql", "tests/plproxy/proxy.sql"):
    if (root / f).read_text().strip() not in doc:
        sys.exit(f"FAIL: docs/scaling.md does not contain {f} verbatim")
print("docs/scaling.md shows shard.sql and proxy.sql verbatim")
PY

# The storage paths to run the traffic under: the default, and the SQL path
# (idem.storage_access = sql, the one Citus needs) when this build has it.
# PLPROXY_MODES="direct" (or "sql") runs one path only.
modes=(direct)
if grep -q 1 <<<"$(psql_at "${SHARD_PORTS[0]}" postgres -Atc "LOAD 'idem'; SELECT 1 FROM pg_settings WHERE name = 'idem.storage_access'")"; then
  modes+=(sql)
else
  echo "note: this build of idem has no idem.storage_access; the SQL storage path is not exercised"
fi

[ -n "${PLPROXY_MODES:-}" ] && read -r -a modes <<< "$PLPROXY_MODES"
failed_modes=()
for mode in "${modes[@]}"; do
  for i in 0 1 2; do
    if [ "$mode" != direct ] || [ "${#modes[@]}" -gt 1 ]; then
      psql_at "${SHARD_PORTS[$i]}" postgres -c "LOAD 'idem'" -c "ALTER SYSTEM SET idem.storage_access = '$mode'" \
        -c "SELECT pg_reload_conf()" >/dev/null
    fi
  done
  make_dbs
  if [ "$mode" = sql ]; then
    # proof that the SQL path is the one running: it refuses REPEATABLE READ
    st=$(psql_at "${SHARD_PORTS[0]}" orders_0 -v VERBOSITY=verbose -c "BEGIN ISOLATION LEVEL REPEATABLE READ" \
           -c "SELECT idem_claim('rr-probe', 'probe')" 2>&1 | grep -o "0A000" | sed -n 1p || true)
    echo "idem.storage_access = sql on the shards; a claim under REPEATABLE READ: ${st:+refused with }${st:-accepted}"
    [ -n "$st" ] || { echo "FAIL: the SQL storage path is not in effect"; exit 1; }
  fi
  say "traffic through the proxy ($mode storage path): retries, key scopes, lost answers, a shard stopped and restarted"
  # a failing path does not hide the next one's numbers; the run fails at the end
  BASE="$base" PROXY_PORT=$PROXY_PORT SHARD_PORTS="${SHARD_PORTS[*]}" PG_BIN="$PG_BIN" \
    "$IDEM_PY" "$ROOT/tests/plproxy/driver.py" || failed_modes+=("$mode")
done

say "retention and maintenance, per shard"
psql_at $PROXY_PORT proxy -c "SELECT * FROM set_payment_ttl('7 days') ORDER BY 1" \
  -c "SELECT shard, report->'partitions_created' IS NOT NULL AS maintained FROM maintain_claims() ORDER BY 1"
for i in 0 1 2; do
  # pg_cron on each shard node, in the shard's database (cron.database_name)
  job=$(psql_at "${SHARD_PORTS[$i]}" "orders_$i" -Atc "SELECT idem_schedule_maintenance();")
  jobs=$(psql_at "${SHARD_PORTS[$i]}" "orders_$i" -Atc \
    "SELECT count(*) FROM cron.job WHERE jobname = 'idem_maintain' AND command LIKE '%idem_maintain()%'")
  ttl=$(psql_at "${SHARD_PORTS[$i]}" "orders_$i" -Atc "SELECT ttl FROM idem.biz_types WHERE biz_type = 'payment'")
  echo "orders_$i: pg_cron job $job scheduled ($jobs job named idem_maintain), payment ttl $ttl"
  [ "$jobs" = 1 ] && [ "$ttl" = "7 days" ] || { echo "FAIL: per-shard maintenance/retention on orders_$i"; exit 1; }
done

awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "run time: %.1f s\n", b - a }'
if [ ${#failed_modes[@]} -gt 0 ]; then
  echo "FAIL: invariants broken under the storage path(s): ${failed_modes[*]}"
  exit 1
fi
echo "ok"
}

scenario_main "$@"
