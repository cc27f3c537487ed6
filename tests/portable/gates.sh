#!/usr/bin/env bash
# The portable edition's key locks (gate rows, docs/design.md §14) under
# load and against a hostile role (tests/portable/gates.py): a transaction
# of 100,000 claims while other roles connect to another database and claim
# there, eight sessions of 2,000 claims each with a business row per key, a
# LOGIN role with nothing granted that blocks, watches and forges, a gate
# restored from another cluster that names an xid this one hands out later
# (a plain-script pg_dump carries the gates), and what
# maintenance removes and keeps. The edition is installed through pg_tle by
# the databases' owner, who is not a superuser; the claims are made by
# another role without grants.
#
#   bash tests/portable/gates.sh [SOCKET_DIR [PORT]]     (tests/portable/lib.sh)
#
# GATES_BATCH sets the size of the one-transaction batch (default 100000).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DB=portable_gates
OTHER_DB=portable_gates_other
OWNER=portable_gates_owner
APP=portable_gates_app
INTRUDER=portable_gates_intruder
work=$(mktemp -d /tmp/idem-portable-gates.XXXXXX)
trap 'pp_drop "$DB $OTHER_DB" "$APP $INTRUDER $OWNER"; rm -rf "$work"; pp_cleanup_dist' EXIT
pp_drop "$DB $OTHER_DB" "$APP $INTRUDER $OWNER"
pp_roles "$OWNER" "$APP" "$INTRUDER"
pp_tle_install "$DB" "$OWNER"
pp_tle_install "$OTHER_DB" "$OWNER"
timeout 1800 "$IDEM_PY" "$ROOT/tests/portable/gates.py" "$PORTABLE_HOST" "$PORTABLE_PORT" "$DB" "$OTHER_DB" \
  "$OWNER" "$APP" "$INTRUDER" --batch "${GATES_BATCH:-100000}" > "$work/gates.log" 2>&1 || true
cat "$work/gates.log"
fails=$((fails + $(grep -c '^FAIL: ' "$work/gates.log" || true)))
grep -q '^summary: ' "$work/gates.log" || fail "gates.py did not finish: $(tail -3 "$work/gates.log")"
finish "portable gates"
