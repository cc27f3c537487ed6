"""What the three test servers share: the business table, the policy, and
the test-only kill points.

Environment: IDEM_TEST_CONNINFO (libpq conninfo the server uses: the
cluster's socket, or PgBouncer), IDEM_TEST_SIGNAL (a FIFO: a request with
header X-Test-Pause: before_commit / after_commit writes "<phase>\\n" to it
when it reaches that point, then blocks until the server is killed),
IDEM_TEST_KILL_POINTS=0 (no kill points: no phase hook keeps the stored
response and COMMIT apart; the round-trip count, tests/middleware/roundtrips.py).
"""

from __future__ import annotations

import json
import os
import re
import threading
from typing import Any, Callable, Optional
from urllib.parse import parse_qs

from idem_http import Policy, RequestInfo, Route
from idem_http.policy import default_store_status

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


CONFORMANCE = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "conformance.json")))

# IDEM_TEST_SCOPE: "tenant" (the default: the X-Tenant hook), "single"
# (single_tenant=True), "none" (neither: refused at start-up, which the
# driver checks).
_SCOPE = {"tenant": {"tenant": tenant_of}, "single": {"single_tenant": True},
          "none": {}}[os.environ.get("IDEM_TEST_SCOPE", "tenant")]
POLICY = Policy(**_SCOPE, phase_hook=None if os.environ.get("IDEM_TEST_KILL_POINTS") == "0" else kill_point, lock_timeout="60s", max_stored_body=4096,  # type: ignore[arg-type]
                exclude_fields=("client_sent_at",), problem_base=CONFORMANCE["problem_base"])

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

# The routes tests/middleware/README.md asks of a conformance server.
CONFORMANCE_ROUTES = {
    ("POST", "/conformance/orders"): Route("conformance.orders"),
    ("POST", "/conformance/orders-nowait"): Route("conformance.nowait", wait=False),
    ("POST", "/conformance/orders-short-wait"): Route("conformance.shortwait", lock_timeout="200ms"),
    ("POST", "/conformance/orders-anonymous"): Route("conformance.anonymous", anonymous=True),
    ("POST", "/conformance/orders-2xx-only"): Route("conformance.only2xx", store_status=lambda s: 200 <= s < 300),
    ("POST", "/conformance/orders-lease"): Route("conformance.lease", lease="60 seconds"),
    # The runner configures conformance.retry with on_failure => 'retry'.
    ("POST", "/conformance/orders-retry"): Route("conformance.retry"),
}
ROUTES.update(CONFORMANCE_ROUTES)
CONFORMANCE_PATHS = [p for (_, p) in CONFORMANCE_ROUTES]


def leased(path: str) -> bool:
    """The conformance route in lease mode: its handler opens its own transaction."""
    return CONFORMANCE_ROUTES[("POST", path)].lease is not None

CONFORMANCE_HOLD = "SELECT pg_advisory_xact_lock(hashtext(%s))"
CONFORMANCE_INSERT = "INSERT INTO conformance_rows (run, tenant, status) VALUES (%s, %s, %s) RETURNING id"


def conformance_fail(sqlstate: str) -> str:
    code = re.sub(r"[^0-9A-Z]", "", sqlstate)
    return f"DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '{code}'; END $$"


def conformance_answer(row_id: int, headers: Callable[[str], Optional[str]],
                       claim: Any = None) -> tuple[int, list[tuple[str, str]], bytes]:
    """The conformance handler's answer (tests/middleware/README.md); claim:
    the request's (its attempt, and the previous attempt's stored error
    that idem_claim told it: result's previous_error), None without one."""
    told = [("X-Conformance-Attempt", str(claim.attempt))] if claim is not None and claim.claimed else []
    previous = claim.result.get("previous_error") if told and isinstance(claim.result, dict) else None
    if isinstance(previous, dict) and isinstance(previous.get("status"), int):
        told.append(("X-Conformance-Previous-Status", str(previous["status"])))
    return (int(headers("x-conformance-status") or 201),
            [("Content-Type", "application/json"), ("Location", f"/conformance/rows/{row_id}"),
             ("X-Conformance-Row", str(row_id)), *told],
            json.dumps(conformance_body(row_id, headers)).encode())


def conformance_body(row_id: int, headers: Callable[[str], Optional[str]]) -> dict:
    """{"id": ...}, and with X-Conformance-Pad: N a member "pad" of N letters x."""
    pad = int(headers("x-conformance-pad") or 0)
    return {"id": row_id, "pad": "x" * pad} if pad else {"id": row_id}


def keeps_writes(headers: Callable[[str], Optional[str]]) -> bool:
    """Lease mode: the handler's transaction is its own, so it commits only
    an answer the route stores (tests/middleware/README.md): not a 5xx, nor
    a 401, 403, 407, 408, 425 or 429 (the policy's default rule)."""
    return default_store_status(int(headers("x-conformance-status") or 201))


def conformance_params(body: bytes, headers: Callable[[str], Optional[str]]) -> tuple[Any, ...]:
    if (headers("content-type") or "").startswith("application/x-www-form-urlencoded"):
        run = parse_qs(body.decode())["run"][0]
    else:
        run = json.loads(body)["run"]
    return (run, headers("x-tenant"), int(headers("x-conformance-status") or 201))


def order_outcome(body: dict) -> tuple[int, dict] | None:
    """A deterministic business failure, decided before anything is written."""
    if body.get("sku") == "out-of-stock":
        return 422, {"title": "Not enough stock", "sku": body["sku"]}
    return None
