"""What the three test servers share: the business table, the policy, and
the test-only kill points.

Environment: IDEM_TEST_CONNINFO (libpq conninfo the server uses: the
cluster's socket, or PgBouncer), IDEM_TEST_SIGNAL (a FIFO: a request with
header X-Test-Pause: before_commit / after_commit writes "<phase>\\n" to it
when it reaches that point, then blocks until the server is killed).
"""

from __future__ import annotations

import os
import threading

from idem_http import Policy, RequestInfo, Route

__all__ = ["Policy", "RequestInfo", "Route"]

CONNINFO = os.environ.get("IDEM_TEST_CONNINFO", "")

SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (
    id       bigserial PRIMARY KEY,
    server   text NOT NULL,
    idem_key text NOT NULL,
    sku      text NOT NULL,
    qty      int  NOT NULL
);
"""

# The business write every handler makes: one row per executed operation.
INSERT = "INSERT INTO orders (server, idem_key, sku, qty) VALUES (%s, %s, %s, %s) RETURNING id"
# A handler stops here while the test holds this advisory lock (header
# X-Test-Gate: 1): the test then sees every concurrent duplicate waiting.
GATE = "SELECT pg_advisory_xact_lock(4242)"
# A real transient failure raised by the server (header X-Test-Transient: 1).
TRANSIENT = "DO $$ BEGIN RAISE EXCEPTION 'simulated serialization failure' USING ERRCODE = '40001'; END $$"

# The server session is ended under the handler (header X-Test-Lost: 1): a
# lost connection.
LOST = "SELECT pg_terminate_backend(pg_backend_pid())"

_blocked = threading.Event()


def kill_point(phase: str, info: RequestInfo) -> None:
    """The test-only hook: signal, then block forever (the test kills us)."""
    if info.header("x-test-pause") != phase:
        return
    with open(os.environ["IDEM_TEST_SIGNAL"], "w") as fifo:
        fifo.write(f"{phase}\n")
    _blocked.wait()


def tenant_of(info: RequestInfo) -> str | None:
    # Stands in for the authenticated principal.
    return info.header("x-tenant")


POLICY = Policy(tenant=tenant_of, phase_hook=kill_point, lock_timeout="60s", max_stored_body=4096,
                exclude_fields=("client_sent_at",))

ROUTES = {
    ("POST", "/orders"): Route("orders.create"),
    ("POST", "/orders-409"): Route("orders.create409", wait=False),
    ("POST", "/orders-optional"): Route("orders.optional", key_required=False),
    ("POST", "/orders-short-wait"): Route("orders.shortwait", lock_timeout="200ms"),
    ("POST", "/report"): Route("report.create"),
    ("POST", "/charges"): Route("charges.create", lease="1 minute"),
    # A lease that runs out soon after a killed server: the retry takes over.
    ("POST", "/charges-short"): Route("charges.short", lease="1 second"),
}


def order_outcome(body: dict) -> tuple[int, dict] | None:
    """A deterministic business failure, decided before anything is written."""
    if body.get("sku") == "out-of-stock":
        return 422, {"title": "Not enough stock", "sku": body["sku"]}
    return None
