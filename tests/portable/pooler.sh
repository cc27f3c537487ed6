#!/usr/bin/env bash
# The portable edition behind PgBouncer (Debian's, transaction pooling), as
# tests/scenarios/clients.sh pgbouncer runs the native one: the edition installed
# through pg_tle by a role that is not a superuser, clients that are not
# superusers either, and tests/portable/pooler.py's checks (the same keys
# claimed at the same moment with business rows counted, duplicates
# answered with the first outcome, the key lock gone when the transaction
# ends, for the next client of a shared server session too, and a lease
# that only its token finishes).
#
#   bash tests/portable/pooler.sh [SOCKET_DIR [PORT]]     (tests/portable/lib.sh)
#
# PgBouncer listens on 127.0.0.1:$POOLER_PORT (default PORT + 1000).
# PORTABLE_BREAK=no_lock runs the negative control (the key lock taken
# out): the run must then fail.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
POOLER_PORT="${POOLER_PORT:-$((PORTABLE_PORT + 1000))}"
DB=portable_pooler
ADMIN=portable_pooler_admin
APP=portable_pooler_app
work=$(mktemp -d /tmp/idem-portable-pooler.XXXXXX)
chown postgres:postgres "$work"

stop_all() {
  local p
  p=$(cat "$work/pgbouncer.pid" 2>/dev/null) || p=
  # Only the PgBouncer this script started (its pid file names it).
  if [ -n "$p" ] && tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -q "pgbouncer.*$work/pgbouncer.ini"; then
    kill -TERM "$p"
    for _ in $(seq 1 250); do kill -0 "$p" 2>/dev/null || break; sleep 0.02; done
  fi
  pp_drop "$DB" "$APP $ADMIN"
  rm -rf "$work"
  pp_cleanup_dist
}
trap stop_all EXIT

pp_roles "$ADMIN" "$APP"
pp_tle_install "$DB" "$ADMIN"
pp_psql "$ADMIN" "$DB" -c "CREATE TABLE pooler_payments (id bigserial PRIMARY KEY, key text NOT NULL, paid_by int NOT NULL)" \
  -c "GRANT ALL ON pooler_payments, pooler_payments_id_seq TO $APP" -c "GRANT USAGE ON SCHEMA public TO $APP"

printf '"postgres" ""\n"%s" ""\n' "$APP" > "$work/userlist.txt"
cat > "$work/pgbouncer.ini" <<INI
[databases]
pp1 = host=$PORTABLE_HOST port=$PORTABLE_PORT dbname=$DB pool_size=1
pp3 = host=$PORTABLE_HOST port=$PORTABLE_PORT dbname=$DB pool_size=3
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $POOLER_PORT
unix_socket_dir =
auth_type = trust
auth_file = $work/userlist.txt
pool_mode = transaction
max_client_conn = 100
admin_users = postgres
ignore_startup_parameters = extra_float_digits
log_connections = 0
log_disconnections = 0
logfile = $work/pgbouncer.log
pidfile = $work/pgbouncer.pid
INI
chown postgres:postgres "$work"/*
as_postgres /usr/sbin/pgbouncer -d "$work/pgbouncer.ini"
ready=
for _ in $(seq 1 250); do
  "$PG_BIN/psql" -X -h 127.0.0.1 -p "$POOLER_PORT" -U postgres -d pgbouncer -Atc "SHOW VERSION" >/dev/null 2>&1 && ready=1 && break
  sleep 0.02
done
[ -n "$ready" ] || { fail "PgBouncer did not start on 127.0.0.1:$POOLER_PORT: $(tail -3 "$work/pgbouncer.log")"; finish "portable pooler"; exit 1; }
echo "$(/usr/sbin/pgbouncer --version | sed -n 1p), pool_mode = transaction, on 127.0.0.1:$POOLER_PORT, in front of $PORTABLE_HOST:$PORTABLE_PORT"

timeout 600 "$IDEM_PY" "$ROOT/tests/portable/pooler.py" "$POOLER_PORT" "$PORTABLE_HOST" "$PORTABLE_PORT" "$DB" "$APP" \
  ${PORTABLE_BREAK:+--break "$PORTABLE_BREAK"} > "$work/pooler.log" 2>&1 || true
cat "$work/pooler.log"
fails=$((fails + $(grep -c '^FAIL: ' "$work/pooler.log" || true)))
grep -q '^summary: ' "$work/pooler.log" || fail "pooler.py did not finish: $(tail -3 "$work/pooler.log")"
xacts=$("$PG_BIN/psql" -X -h 127.0.0.1 -p "$POOLER_PORT" -U postgres -d pgbouncer -Atc "SHOW STATS" -F '|' \
          | awk -F'|' '$1 == "pp3" || $1 == "pp1" {n += $2} END {print n + 0}')
expect "the clients' transactions went through PgBouncer" "$([ "$xacts" -gt 300 ] && echo yes || echo "no ($xacts)")" yes
finish "portable pooler"
