#!/usr/bin/env bash
# The SQL in the documentation runs. Every fenced block whose info string is
# `sql` in README.md, docs/*.md and examples/*.md is run, file by file, in a
# fresh database with CREATE EXTENSION idem, in order, in one psql session
# with ON_ERROR_STOP; a failure names the file and line. `sql norun` blocks
# are shown only (other engines, placeholders, pg_cron: this cluster's cron
# database is idem_cron, which belongs to the cron scenario); `sql error`
# blocks must raise an error (`sql error ID001`: that SQLSTATE).
# tests/docs/sql_blocks.py does the parsing and the line mapping. Then
# tests/docs/names.py: every idem.* setting and SQLSTATE the pages name
# exists (pg_settings with the library loaded; idem's objects; the README's
# SQLSTATE table, src/errors.rs or PostgreSQL's codes). And tests/docs/paths.py:
# the files, links, `bash …` and `make …` commands and the project layout
# that README.md and docs/development.md name exist.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
export PGHOST="$(cluster_dir)" PGPORT="$IDEM_PORT" PGUSER=postgres PG_BIN
export DOC_LOG="$ROOT/target/docs_sql.log"
mkdir -p "$ROOT/target"
: > "$DOC_LOG"
helper="$ROOT/tests/docs/sql_blocks.py"

# Docs may create roles (grants examples); roles are cluster-wide, so the
# ones that did not exist before this run are dropped after it.
roles_before=$(psql_idem -d postgres -Atc "SELECT string_agg(quote_literal(rolname), ',') FROM pg_roles")
dbs=()
drop_new_roles() {
  psql_idem -q -d postgres -Atc "SELECT format('DROP ROLE %I;', rolname) FROM pg_roles
                                 WHERE rolname NOT IN ($roles_before)" \
    | psql_idem -q -d postgres
}
cleanup() {
  for db in "${dbs[@]}"; do
    psql_idem -q -d postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" || true
  done
  drop_new_roles || true
}
trap cleanup EXIT

files=0 runnable=0 failed=0
for md in "$ROOT"/README.md "$ROOT"/docs/*.md "$ROOT"/examples/*.md; do
  [ -f "$md" ] || continue
  rel=${md#"$ROOT"/}
  read -r n_run n_norun n_error n_bad < <(python3 "$helper" count "$md")
  [ $((n_run + n_norun + n_error + n_bad)) -gt 0 ] || continue
  files=$((files + 1))
  runnable=$((runnable + n_run + n_error))
  slug=$(echo "$rel" | tr 'A-Z' 'a-z' | sed -E 's/\.md$//; s/[^a-z0-9]+/_/g')
  db="doc_${slug}"
  dbs+=("$db")
  psql_idem -q -d postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
  psql_idem -q -d "$db" -c "CREATE EXTENSION idem"
  say "$rel (database $db)"
  # Relative paths in messages: the reader's editor opens README.md:42.
  if ! (cd "$ROOT" && python3 "$helper" run "$rel" "$db"); then failed=$((failed + 1)); fi
  # Drop the database, then the roles its docs created: the next file may
  # create roles of the same names.
  psql_idem -q -d postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"
  drop_new_roles
done

# The settings and SQLSTATEs the pages name exist (tests/docs/names.py).
say "settings and SQLSTATEs named in the docs"
dbs+=(doc_names)
psql_idem -q -d postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS doc_names WITH (FORCE)" -c "CREATE DATABASE doc_names"
psql_idem -q -d doc_names -c "CREATE EXTENSION idem"
PG_CONFIG="$PG_CONFIG" python3 "$ROOT/tests/docs/names.py" "$ROOT" doc_names || failed=$((failed + 1))

say "files, links and commands named in the README and the development guide"
python3 "$ROOT/tests/docs/paths.py" "$ROOT" || failed=$((failed + 1))

echo
echo "$files files with sql blocks, $runnable blocks to run, $failed files failed (psql output: $DOC_LOG)"
# The README has runnable examples; finding none means the parser broke.
[ "$runnable" -gt 0 ] || { echo "FAIL: no runnable sql block found"; exit 1; }
[ "$failed" = 0 ]
