"""A complete Django app with idem-http (settings, middleware, views and
URLs in one module), run as it is by tests/scenarios/clients.sh middleware_python
(tests/middleware/python/examples.py):

    IDEM_DSN="dbname=shop" API_TOKENS='{"secret-acme": "acme"}' \\
    DJANGO_SETTINGS_MODULE=django_example python -m django runserver

on a database with idem and

    CREATE TABLE example_orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        tenant text NOT NULL, idem_key text NOT NULL, sku text NOT NULL, qty int NOT NULL);

MIDDLEWARE runs top to bottom: authentication (401) and rate limiting (429)
before the idempotency middleware, so their refusals never claim the key.
CSRF is checked in process_view, which Django runs after every middleware's
__call__, so its 403 always comes from inside the idempotency middleware:
the middleware does not store a 403 (nor 401, 407, 408, 425, 429, 5xx), it
rolls back, and the retry with a token runs the work. API views
authenticated by a bearer token need no CSRF check: `csrf_exempt`.
"""

from __future__ import annotations

import json
import os
import time
from typing import Callable

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import get_token
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

import idem_http

_dsn = dict(p.split("=", 1) for p in os.environ.get("IDEM_DSN", "").split())
TOKENS: dict[str, str] = json.loads(os.environ.get("API_TOKENS", "{}"))  # bearer token -> tenant
RATE_LIMIT = int(os.environ.get("RATE_LIMIT", "100"))  # requests per tenant per window
RATE_WINDOW = float(os.environ.get("RATE_WINDOW", "60"))  # seconds

DEBUG = False
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only")
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "django_example"
USE_TZ = True
INSTALLED_APPS: list[str] = []
MIDDLEWARE = [
    "django_example.BearerAuth",                   # 401: outside, never claims
    "django_example.RateLimit",                    # 429: outside, never claims
    "django.middleware.csrf.CsrfViewMiddleware",   # 403 in process_view: inside, not stored
    "idem_http.django.IdempotencyMiddleware",
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",  # psycopg 3
        "NAME": _dsn.get("dbname", "postgres"),
        "USER": _dsn.get("user", ""),
        "HOST": _dsn.get("host", ""),
        "PORT": _dsn.get("port", ""),
        # Behind PgBouncer in transaction mode: "OPTIONS": {"prepare_threshold": None}.
    }
}
IDEM_HTTP = {
    "routes": {("POST", "/orders"): "orders.create", ("POST", "/api/orders"): "orders.create"},
    # The key's scope: the tenant BearerAuth found.
    "policy": idem_http.Policy(tenant=lambda info: getattr(info.native, "tenant", None)),
}


class BearerAuth:
    """Authentication: the tenant of the bearer token, as request.tenant; else 401."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        auth = request.headers.get("Authorization", "")
        tenant = TOKENS.get(auth[7:]) if auth.startswith("Bearer ") else None
        if tenant is None:
            resp = JsonResponse({"error": "unauthorized"}, status=401)
            resp["WWW-Authenticate"] = "Bearer"
            return resp
        request.tenant = tenant  # type: ignore[attr-defined]
        return self.get_response(request)


class RateLimit:
    """At most RATE_LIMIT requests per tenant per RATE_WINDOW seconds (fixed window); else 429."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.windows: dict[str, list[float]] = {}

    def __call__(self, request: HttpRequest) -> HttpResponse:
        tenant, now = request.tenant, time.monotonic()  # type: ignore[attr-defined]
        w = self.windows.get(tenant)
        if w is None or now >= w[0]:
            w = self.windows[tenant] = [now + RATE_WINDOW, 0]
        w[1] += 1
        if w[1] > RATE_LIMIT:
            resp = JsonResponse({"error": "rate limited"}, status=429)
            resp["Retry-After"] = str(int(w[0] - now) + 1)
            return resp
        return self.get_response(request)


def create_order(request: HttpRequest) -> HttpResponse:
    # Django's own connection: the middleware's transaction.atomic() holds
    # the claim; the write commits with it and the stored response.
    order = json.loads(request.body)
    with connection.cursor() as cur:
        cur.execute("INSERT INTO example_orders (tenant, idem_key, sku, qty) VALUES (%s, %s, %s, %s) RETURNING id",
                    (request.tenant, request.idem.key if request.idem else None,  # type: ignore[attr-defined]
                     order["sku"], order["qty"]))
        (order_id,) = cur.fetchone()
    resp = JsonResponse({"id": order_id, "sku": order["sku"], "qty": order["qty"]}, status=201)
    resp["Location"] = f"/orders/{order_id}"
    return resp


def csrf(request: HttpRequest) -> HttpResponse:
    """Pages of the app's own front end get the CSRF cookie here."""
    return JsonResponse({"csrf_token": get_token(request)})


urlpatterns = [
    path("orders", create_order),                    # the front end's form posts: CSRF-checked
    path("api/orders", csrf_exempt(create_order)),   # bearer-token API: no CSRF
    path("csrf", csrf),
]
