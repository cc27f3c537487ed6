#!/usr/bin/env bash
# No Rust backtrace ever reaches a client, whatever the server's
# environment: a cluster of its own (port ${IDEM_BT_PORT:-5473}) whose
# postmaster runs with RUST_BACKTRACE=1 and RUST_LIB_BACKTRACE=1, first
# loading idem on demand, then preloading it (shared_preload_libraries).
# Each time, errors of every kind idem can send, read in psql's verbose
# form (message, DETAIL, HINT, CONTEXT, location):
#   - an internal error (XX000): a damaged lease document;
#   - idem's own SQLSTATEs (ID001, ID003);
#   - PostgreSQL errors raised inside idem's Rust frames, which pgrx
#     re-raises with a backtrace when one was captured: lock_timeout
#     (55P03) and statement_timeout (57014) while waiting for a concurrent
#     claim;
#   - a Rust panic: a lease document whose attempt counter is at its
#     maximum; arithmetic overflow panics where overflow checks are
#     compiled in (debug builds), and wraps in a release build, where the
#     scenario says no panic was reachable.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/assert.sh"
source "$ROOT/tests/lib/cluster.sh"
trap pc_stop EXIT
# Signs of a Rust backtrace (std's format: numbered frames, "at file:line").
BACKTRACE='stack backtrace|^ *[0-9]+: |[[:space:]]at [^ ]+\.rs:[0-9]+|rust_begin_unwind|std::panicking|core::panicking|pgrx_pg_sys::'

start() { # extra postgresql.conf lines...
  pc_init "$(cluster_dir)/backtraces" "${IDEM_BT_PORT:-5473}" "$@"
  pc_start RUST_BACKTRACE=1 RUST_LIB_BACKTRACE=1
  local pm
  pm=$(head -1 "$PC_DIR/data/postmaster.pid")
  tr '\0' '\n' < "/proc/$pm/environ" | grep -qx RUST_BACKTRACE=1 \
    || { echo "FAIL: the postmaster's environment lacks RUST_BACKTRACE=1"; exit 1; }
  echo "postmaster $pm runs with $(tr '\0' '\n' < "/proc/$pm/environ" | grep '^RUST' | tr '\n' ' ')"
  pc_psql -q -d postgres -c "CREATE DATABASE bt"
  pc_psql -q -d bt -c "CREATE EXTENSION idem" -c "SELECT idem_maintain()" >/dev/null
}

# check WHAT SQLSTATE SQL: run SQL (its last statement must fail with
# SQLSTATE), and look at everything the client was sent.
check() {
  local what=$1 state=$2 sql=$3 out
  out=$(pc_psql -d bt -v ON_ERROR_STOP=0 -v VERBOSITY=verbose -v SHOW_CONTEXT=always -c '\set QUIET on' -c "$sql" 2>&1 || true)
  if ! grep -q "ERROR:  $state:" <<<"$out"; then
    fail "$what: expected SQLSTATE $state, got: $out"
  elif grep -Eq "$BACKTRACE" <<<"$out"; then
    fail "$what: a backtrace reached the client:"; echo "$out" | head -40
  else
    echo "ok: $what: $(grep -m1 "ERROR:" <<<"$out" | cut -c1-150)"
    grep -E "^(DETAIL|CONTEXT|LOCATION):" <<<"$out" | sed 's/^/      /' | head -4
  fi
}

errors() {
  pc_psql -q -d bt >/dev/null <<'SQL'
SELECT idem_claim('dmg', 'bt', lease => '1 second');
UPDATE idem.claims SET result = result - 'lease_until_us' WHERE state = 'l' AND key = 'dmg';
BEGIN; SELECT idem_claim('fp', 'bt', fingerprint => 'a'); SELECT idem_complete('fp', 'bt'); COMMIT;
SELECT idem_claim('ovf', 'bt', lease => '1 second');
UPDATE idem.claims SET result = jsonb_set(jsonb_set(result, '{attempt}', '9223372036854775807'),
         '{lease_until_us}', to_jsonb(((extract(epoch FROM now() - interval '1 hour') - 946684800) * 1000000)::bigint))
 WHERE key = 'ovf';
SQL
  check "XX000, a damaged lease document" XX000 "SELECT idem_claim('dmg', 'bt')"
  check "ID001, a fingerprint mismatch" ID001 "SELECT idem_claim('fp', 'bt', fingerprint => 'b')"
  check "ID003, finishing what one does not hold" ID003 "SELECT idem_complete('nobody', 'bt')"
  session_open holder bt
  session_run holder "BEGIN; SELECT claimed FROM idem_claim('held', 'bt');"
  check "55P03, lock_timeout while waiting (a PostgreSQL error inside Rust frames)" 55P03 \
    "SET lock_timeout = '50ms'; SELECT idem_claim('held', 'bt')"
  check "57014, statement_timeout while waiting" 57014 \
    "SET statement_timeout = '50ms'; SELECT idem_claim('held', 'bt')"
  session_run holder "ROLLBACK;"
  session_close holder
  local out
  out=$(pc_psql -d bt -v ON_ERROR_STOP=0 -v VERBOSITY=verbose -v SHOW_CONTEXT=always \
        -c "SELECT claimed, result->>'attempt' AS attempt FROM idem_claim('ovf', 'bt', lease => '1 minute')" 2>&1 || true)
  if grep -q "ERROR:" <<<"$out"; then
    check "a Rust panic (attempt counter overflow)" XX000 "SELECT idem_claim('ovf', 'bt', lease => '1 minute')"
  else
    echo "note: no Rust panic reachable in this build (overflow wraps without overflow checks): $(echo "$out" | tr '\n' ' ' | tr -s ' ')"
  fi
}

say "idem loaded on demand (not preloaded)"
start
errors
pc_stop
say "idem preloaded (shared_preload_libraries = 'idem': loaded by the postmaster)"
start "shared_preload_libraries = 'idem'"
errors
finish "backtrace"
