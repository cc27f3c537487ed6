"""Django: a middleware that claims in a transaction on Django's own
connection (transaction.atomic), so the view's ORM writes, the claim and the
stored response commit together. With ATOMIC_REQUESTS the view's own atomic
block nests inside it (a savepoint).

settings.py:

    MIDDLEWARE = [..., "idem_http.django.IdempotencyMiddleware"]
    IDEM_HTTP = {
        "routes": {("POST", "/orders"): "orders.create"},
        "policy": idem_http.Policy(tenant=lambda info: str(info.native.user.pk)),  # optional
        "database": "default",                                                   # optional
    }

In a view, `request.idem` is the claim (lease mode: request.idem.checkpoint()).
A lease-mode route's view should be `@transaction.non_atomic_requests`, so
that an external call's recovery point, written in its own
`transaction.atomic()` block, commits before the view goes on.
Django needs psycopg 3 as its PostgreSQL driver (Django 4.2 or newer).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import psycopg
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, transaction
from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse

from . import _sql
from .core import Claim, handle_request, joined
from .errors import is_transient, sqlstate_of
from .policy import Policy, RequestInfo, Response
from .routes import resolver


def _to_django(resp: Response) -> HttpResponse:
    out = HttpResponse(resp.body, status=resp.status)
    if resp.header("Content-Type") is None:
        del out["Content-Type"]  # Django's default (text/html) is not what was stored, or a 204's
    for n, v in resp.headers:
        out[n] = v
    return out


def _describe(response: HttpResponseBase) -> Response:
    headers = [(str(n), str(v)) for n, v in response.items()]
    if isinstance(response, StreamingHttpResponse) or getattr(response, "streaming", False):
        # Passed through as it streams, not stored: a replay has the status
        # and headers only.
        return Response(response.status_code, headers, b"", body_stored=False)
    return Response(response.status_code, headers, bytes(response.content))


class IdempotencyMiddleware:
    """Configured by settings.IDEM_HTTP (see the module's docstring), or by
    subclassing and setting `routes` / `policy` / `database`."""

    routes: Any = None
    policy: Optional[Policy] = None
    database: str = "default"

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response
        conf = getattr(settings, "IDEM_HTTP", {})
        self.resolve = resolver(self.routes if self.routes is not None else conf.get("routes", {}))
        policy = self.policy or conf.get("policy")
        if not isinstance(policy, Policy):
            raise ImproperlyConfigured(
                "idem_http.django: settings.IDEM_HTTP['policy'] must be an idem_http.Policy that chooses the key "
                "scope: Policy(tenant=...) or Policy(single_tenant=True)")
        self.policy = policy
        self.database = conf.get("database", self.database)

    def __call__(self, request: HttpRequest) -> Union[HttpResponseBase, HttpResponse]:
        route = self.resolve(request.method or "GET", request.path_info)
        if route is None:
            return self.get_response(request)
        headers = {k.lower(): v for k, v in request.headers.items()}
        info = RequestInfo(request.method or "GET", request.path_info, request.META.get("QUERY_STRING", ""),
                           headers, request.body, native=request)
        conn = connections[self.database]

        def execute(sql: str, params: tuple[Any, ...]) -> Optional[tuple[Any, ...]]:
            with conn.cursor() as cur:
                cur.execute(sql, params)
                row = cur.fetchone()
                return None if row is None else tuple(row)

        def outermost() -> Optional[psycopg.Connection[Any]]:
            # The psycopg 3 connection, when the middleware's atomic block
            # is the outermost (no transaction of the caller's around it:
            # Django commits it and turns autocommit back on at its end) and
            # not marked for rollback.
            raw = conn.connection
            if len(conn.atomic_blocks) != 1 or not conn.commit_on_exit or conn.needs_rollback \
                    or not isinstance(raw, psycopg.Connection):
                return None
            return raw

        def begin_with(sql: str, params: tuple[Any, ...]) -> Optional[tuple[Any, ...]]:
            # atomic() turned autocommit off, and psycopg would send BEGIN
            # alone before the first statement. Still idle, the connection
            # goes back to autocommit (which sends nothing) and BEGIN
            # travels with the claim. The block's end is Django's as
            # always: psycopg sends COMMIT or ROLLBACK whatever the flag,
            # and Django then turns autocommit on, as after any outermost block.
            raw = outermost()
            if raw is None or raw.autocommit or raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                return None
            begin = _sql.begin_statement(raw)
            raw.autocommit = True
            row = joined(raw, sql, params, before=begin).fetchone()
            return None if row is None else tuple(row)

        def commit_with(sql: str, params: tuple[Any, ...]) -> bool:
            # Django's COMMIT at the block's end then finds no transaction
            # and sends nothing.
            raw = outermost()
            if raw is None:
                return False
            joined(raw, sql, params, after="COMMIT")
            return True

        def call(c: Optional[Claim]) -> HttpResponseBase:
            request.idem = c
            return self.get_response(request)

        assert self.policy is not None
        out = handle_request(self.policy, route, info, transaction=lambda: transaction.atomic(using=self.database),
                             execute=execute, call=call, describe=_describe, commit_with=commit_with,
                             begin_with=begin_with)
        return _to_django(out) if isinstance(out, Response) else out

    def process_exception(self, request: HttpRequest, exception: Exception) -> Optional[HttpResponse]:
        """A transient database failure in a view answers 503 (rolled back,
        not stored) rather than 500."""
        if getattr(request, "idem", None) is not None and is_transient(exception):
            assert self.policy is not None
            return _to_django(self.policy.unavailable(sqlstate_of(exception),
                                                      self.resolve(request.method or "GET", request.path_info)))
        return None
