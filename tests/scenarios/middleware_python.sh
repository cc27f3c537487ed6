#!/usr/bin/env bash
# The Python middleware package (clients/python, "idem-http") as users get it:
# its wheel is built and installed into a fresh venv with FastAPI, uvicorn,
# Django, SQLAlchemy and httpx (from the wheelhouse that `bash scripts/setup.sh
# --tool middleware_python` downloaded from PyPI), then three real servers on
# loopback (uvicorn + FastAPI with the ASGI middleware, Django's runserver with
# its middleware and ATOMIC_REQUESTS, uvicorn + SQLAlchemy sessions) are sent
# real HTTP requests (httpx) against this scenario's own PostgreSQL cluster
# with idem, first directly and then through PgBouncer in transaction mode.
# tests/middleware/python/driver.py checks, per server:
#   * 20 concurrent identical requests -> one business row and 20 identical
#     201s (wait mode), or one 201 and 19 x 409 + Retry-After (409 mode);
#     held at a gate (an advisory lock) until pg_stat_activity shows the 19
#     duplicates waiting in idem_claim;
#   * the server killed (SIGKILL) before COMMIT and after COMMIT, at a
#     test-only hook that signals on a FIFO and blocks: the retry runs the
#     operation, or gets the stored answer; one row either way;
#   * a changed body -> 422, nothing written; a missing / malformed key -> 400;
#     a handler exception -> 500, nothing stored, the retry runs; SQLSTATE 40001
#     -> 503 + Retry-After; a stored business failure (422) replayed; another
#     tenant's same key is its own claim; a streamed response passed through
#     unstored; lease mode (FastAPI, Django), with a server killed after an
#     external call's recovery point: the retry takes the lease over once
#     idem_leases shows it ran out, and does not call again.
# Before the servers: the package's own tests (clients/python/tests) and
# mypy --strict on the installed package (its py.typed hints).
# No verdict by the clock: every wait is for an observed state. Exits 1 on
# any failure.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$ROOT/tests/lib/cluster.sh"
source "$ROOT/tests/lib/middleware.sh"
WHEELHOUSE="$ROOT/.venv-wheels$IDEM_OS_SUFFIX/middleware-python"
mw_begin middleware-python
# A test server left behind by a driver that died: this run's own, by the
# path of this run's venv.
MW_KILL+=("^$work/venv/bin/python -m \(uvicorn\|django\) ")
HTTP_PORT=$(free_port)

bash "$ROOT/scripts/setup.sh" --tool middleware_python   # a no-op once the wheelhouse is complete

# ---- the package, built and installed as a user would ------------------------
say "building idem-http's wheel and installing it into a fresh venv"
cp -r "$ROOT/clients/python" "$work/src"
venv="$work/venv"
python3 -m venv "$venv"
export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELHOUSE" PIP_DISABLE_PIP_VERSION_CHECK=1
"$venv/bin/pip" install -q build
"$venv/bin/python" -m build --wheel --outdir "$work/dist" "$work/src" > "$out/build.log" 2>&1 || { cat "$out/build.log"; exit 1; }
wheel=$(ls "$work"/dist/idem_http-*.whl)
echo "built $(basename "$wheel")"
"$venv/bin/pip" install -q "$wheel[fastapi,django,sqlalchemy]" "psycopg[binary]" psycopg-pool uvicorn httpx
installed=$(cd "$work" && "$venv/bin/python" -c "import idem_http, os; print(os.path.dirname(idem_http.__file__))")
case "$installed" in
  "$venv"/lib/python3*/site-packages/idem_http) echo "idem_http imported from $installed" ;;
  *) echo "FAIL idem_http imported from $installed, not the installed wheel"; exit 1 ;;
esac
[ -f "$installed/py.typed" ] || { echo "FAIL the wheel has no py.typed"; exit 1; }
(cd "$work" && "$venv/bin/python" "$ROOT/clients/python/tests/test_policy.py")
# The installed package's type hints, as a user's type checker reads them.
"$venv/bin/pip" install -q mypy
printf '[mypy]\nstrict = True\n[mypy-django.*]\nignore_missing_imports = True\n' > "$work/mypy.ini"
(cd "$work" && "$venv/bin/mypy" --config-file mypy.ini -p idem_http) || { echo "FAIL mypy --strict on the installed idem_http"; exit 1; }

# ---- the cluster and PgBouncer (transaction mode) ---------------------------
PG_PORT=5570
mw_cluster $PG_PORT mw "max_connections = 120"
mw_bouncer 40

# ---- the servers, directly and through PgBouncer ----------------------------
direct="host=$dir port=$PG_PORT dbname=mw user=postgres"
bouncer="host=127.0.0.1 port=$PGB_PORT dbname=mw user=postgres"
failed=()
# The core claim API (sync and async), on both paths.
for conninfo in "$direct" "$bouncer"; do
  say "the claim API: $conninfo"
  (cd "$work" && "$venv/bin/python" "$ROOT/clients/python/tests/test_claim_db.py" "$conninfo") \
    || failed+=("the claim API ($conninfo)")
done
fifo="$work/signal"
mkfifo "$fifo"
for target in direct pgbouncer; do
  conninfo=$([ $target = direct ] && echo "$direct" || echo "$bouncer")
  for server in fastapi django sqlalchemy; do
    say "$server, $target"
    if (cd "$work" && "$venv/bin/python" "$ROOT/tests/middleware/python/driver.py" \
          $server $HTTP_PORT "$conninfo" "$direct" $target "$fifo") 2>&1 | tee "$out/$server-$target.log"; then
      :
    fi
    grep -q "^summary \[$server, $target\]: [0-9]* checks, 0 failed" "$out/$server-$target.log" \
      || failed+=("$server through $target")
  done
done
# The README's example apps, as they are (clients/python/examples): auth,
# rate limit (and Django's CSRF) placed as the README says.
for example in fastapi django; do
  say "the README's $example example"
  (cd "$work" && "$venv/bin/python" "$ROOT/tests/middleware/python/examples.py" $example $HTTP_PORT "$direct") \
    2>&1 | tee "$out/example-$example.log"
  grep -q "^summary \[$example example\]: [0-9]* checks, 0 failed" "$out/example-$example.log" \
    || failed+=("the $example example")
done
xacts=$(mw_bouncer_xacts mw)
echo "transactions through PgBouncer: ${xacts:-0}"
[ "${xacts:-0}" -gt 0 ] || failed+=("no transaction went through PgBouncer")

echo
if [ ${#failed[@]} -gt 0 ]; then
  printf 'failed: %s\n' "${failed[@]}"
  exit 1
fi
echo "summary: the middleware passed for fastapi, django and sqlalchemy, directly and through PgBouncer"
