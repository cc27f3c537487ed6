#!/usr/bin/env bash
# pg_isolation_regress against the coordinator of tests/citus/cluster.sh
# (database idem_citus, idem distributed), with Citus's blocking check in
# place of PostgreSQL's so that a session waiting on a worker counts as
# blocked. Usage: bash tests/citus/isolation.sh [spec names...]
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
read -r -a CPORTS <<<"${CITUS_PORTS:-5530 5531 5532}"
db="${CITUS_DB:-idem_citus}"
sock="$(cluster_dir)/citus/coord"

bash "$here/cluster.sh" psql coord -Atc "
  SELECT citus_internal.replace_isolation_tester_func()
   WHERE to_regprocedure('pg_catalog.old_pg_isolation_test_session_is_blocked(integer, integer[])') IS NULL" >/dev/null

specs=("$@")
[ ${#specs[@]} -gt 0 ] || specs=($(cd "$here/specs" && ls *.spec | sed 's/\.spec$//'))
out="$(mktemp -d /tmp/idem-citus-iso.XXXXXX)"
# The expected outputs name the workers' default ports; on other ports
# (CITUS_PORTS) they are read with those.
input=$here
if [ "${CPORTS[1]} ${CPORTS[2]}" != "5531 5532" ]; then
  input="$out/input"
  mkdir -p "$input/expected"
  ln -s "$here/specs" "$input/specs"
  for f in "$here"/expected/*.out; do
    sed "s/\b5531\b/${CPORTS[1]}/g; s/\b5532\b/${CPORTS[2]}/g" "$f" > "$input/expected/$(basename "$f")"
  done
fi
source "$ROOT/tests/lib/regress.sh"
regress_run isolation "$sock" "${CPORTS[0]}" "$db" "$input" "$out" "$out/run.log" "${specs[@]}"
rc=$?
cat "$out/run.log"
[ $rc = 0 ] || echo "diffs: $out/regression.diffs"
exit $rc
