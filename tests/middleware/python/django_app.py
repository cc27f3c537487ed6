"""The Django test server: settings, URLs and views in one module, with
idem_http.django.IdempotencyMiddleware, ATOMIC_REQUESTS on, and the views
writing on Django's own connection.

    python -m django runserver --noreload --settings=django_app 127.0.0.1:PORT

IDEM_TEST_CONN_MAX_AGE: Django's CONN_MAX_AGE (default 0: a connection per
request; the round-trip count runs with --nothreading and a connection kept,
as a deployment with persistent connections does).
"""

from __future__ import annotations

import json
import os

from django.db import connection, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.urls import path

import testapp_common as common

_params = dict(p.split("=", 1) for p in common.CONNINFO.split())

DEBUG = False
SECRET_KEY = "test-only"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "django_app"
USE_TZ = True
INSTALLED_APPS: list[str] = []
MIDDLEWARE = ["idem_http.django.IdempotencyMiddleware"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _params.get("dbname", "postgres"),
        "USER": _params.get("user", "postgres"),
        "HOST": _params.get("host", ""),
        "PORT": _params.get("port", ""),
        "ATOMIC_REQUESTS": True,
        "CONN_MAX_AGE": int(os.environ.get("IDEM_TEST_CONN_MAX_AGE", "0")),
        # Behind PgBouncer in transaction mode: no named prepared statements.
        "OPTIONS": {"prepare_threshold": None},
    }
}
IDEM_HTTP = {"routes": common.ROUTES, "policy": common.POLICY}
LOGGING = {"version": 1, "disable_existing_loggers": False,
           "handlers": {"console": {"class": "logging.StreamHandler"}},
           "loggers": {"django.request": {"handlers": ["console"], "level": "ERROR"}}}


def health(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"status": "ok"})


def orders(request: HttpRequest) -> HttpResponse:
    body = json.loads(request.body)
    with connection.cursor() as cur:
        if request.headers.get("X-Test-Gate") == "1":
            cur.execute(common.GATE)
        failure = common.order_outcome(body)
        if failure:
            return JsonResponse(failure[1], status=failure[0])
        if request.headers.get("X-Test-Transient") == "1":
            cur.execute(common.TRANSIENT)
        if request.headers.get("X-Test-Lost") == "1":
            cur.execute(common.LOST)
        key = request.idem.key if request.idem else "-"  # type: ignore[attr-defined]
        cur.execute(common.INSERT, ("django", key, body["sku"], body["qty"]))
        (order_id,) = cur.fetchone()
    if request.headers.get("X-Test-Raise") == "1":
        raise RuntimeError("view failed after its write")
    resp = JsonResponse({"id": order_id, "sku": body["sku"], "qty": body["qty"]}, status=201)
    resp["Location"] = f"/orders/{order_id}"
    return resp


def report(request: HttpRequest) -> HttpResponse:
    body = json.loads(request.body)
    with connection.cursor() as cur:
        cur.execute(common.INSERT, ("django", request.idem.key, "report", body["lines"]))  # type: ignore[attr-defined]
        (rid,) = cur.fetchone()
    lines = (f"report {rid} line {i:06d}\n".encode() for i in range(body["lines"]))
    resp = StreamingHttpResponse(lines, content_type="text/plain")
    resp["Location"] = f"/report/{rid}"
    return resp


@transaction.non_atomic_requests
def charges(request: HttpRequest) -> HttpResponse:
    """Lease mode: the claim committed first; the external call and its
    recovery point commit together in the view's own transaction (the view
    is non-atomic so that they commit before the rest runs); a retry after a
    takeover resumes from request.idem.recovery_point."""
    body = json.loads(request.body)
    c = request.idem  # type: ignore[attr-defined]
    if c.recovery_point != "charged":
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("INSERT INTO orders (server, idem_key, sku, qty) VALUES ('django-external', %s, %s, %s)",
                        (c.key, body["sku"], body["qty"]))
            c.checkpoint("charged", {"charge": body["sku"]})
    common.kill_point("after_checkpoint", common.RequestInfo(
        "POST", request.path, "", {"x-test-pause": request.headers.get("X-Test-Pause", "")}, b""))
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(common.INSERT, ("django", c.key, body["sku"], body["qty"]))
        (order_id,) = cur.fetchone()
    return JsonResponse({"id": order_id, "attempt": c.attempt}, status=201)


def conformance(request: HttpRequest) -> HttpResponse:
    """The conformance handler of tests/middleware/README.md."""
    h = request.headers.get
    with transaction.atomic(), connection.cursor() as cur:
        if h("X-Conformance-Hold"):
            cur.execute(common.CONFORMANCE_HOLD, (h("X-Conformance-Hold"),))
        cur.execute(common.CONFORMANCE_INSERT, common.conformance_params(request.body, h))
        (row_id,) = cur.fetchone()
        if h("X-Conformance-Fail"):
            cur.execute(common.conformance_fail(h("X-Conformance-Fail", "")))
        if common.leased(request.path) and not common.keeps_writes(h):
            transaction.set_rollback(True)  # lease mode: the view's transaction is its own
    status, headers, body = common.conformance_answer(row_id, h, request.idem)  # type: ignore[attr-defined]
    resp = HttpResponse(body, status=status)
    for n, v in headers:
        resp[n] = v
    return resp


# Lease mode: the claim has committed; the view's atomic block is its own
# transaction (in the other routes, a savepoint of the request's).
conformance_leased = transaction.non_atomic_requests(conformance)

urlpatterns = [*(path(p.lstrip("/"), conformance_leased if common.leased(p) else conformance)
                 for p in common.CONFORMANCE_PATHS),
    path("charges", charges),
    path("charges-short", charges),
    path("health", health),
    path("orders", orders),
    path("orders-409", orders),
    path("orders-optional", orders),
    path("orders-short-wait", orders),
    path("report", report),
]
