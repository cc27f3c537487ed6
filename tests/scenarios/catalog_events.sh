#!/usr/bin/env bash
# Catalog events while sessions keep claiming (tests/stress/catalog_events.py):
# REINDEX [CONCURRENTLY], VACUUM FULL, CLUSTER, maintenance with a new width,
# DETACH/ATTACH by hand, ALTER EXTENSION UPDATE (from 0.2.0) and DROP +
# CREATE EXTENSION, each followed by every session claiming on; then every
# acknowledged claim replays and no key has two live claims.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
bash "$ROOT/scripts/cluster.sh" start >/dev/null
db=idem_catalog_events
# The previous version's install script, for ALTER EXTENSION UPDATE (as
# tests/scenarios/upgrade.sh does; only when it differs, as there).
old_script="$("$PG_CONFIG" --sharedir)/extension/idem--0.2.0.sql"
cmp -s "$ROOT/tests/upgrade/idem--0.2.0.sql" "$old_script" || install -m 644 "$ROOT/tests/upgrade/idem--0.2.0.sql" "$old_script"
psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
trap 'psql_idem -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"' EXIT
"$IDEM_PY" "$ROOT/tests/stress/catalog_events.py" --dsn "host=$(cluster_dir) port=$IDEM_PORT user=postgres dbname=$db" --old-version 0.2.0
