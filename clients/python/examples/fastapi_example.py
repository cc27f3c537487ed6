"""A complete FastAPI app with idem-http, run as it is by
tests/scenarios/clients.sh middleware_python (tests/middleware/python/examples.py):

    IDEM_DSN="dbname=shop" API_TOKENS='{"secret-acme": "acme"}' uvicorn fastapi_example:app

The layers, outermost first: authentication (401), rate limiting (429), the
idempotency middleware, the route. Starlette runs the middleware added
*last* first, so they are added in the reverse order. A 401 or 429 answered
outside never claims the key: the retry with credentials, or after the
limit, runs the work.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel
from starlette.types import ASGIApp, Receive, Scope, Send

from idem_http import Policy
from idem_http.starlette import IdemContext, IdempotencyMiddleware, idem_context

TOKENS: dict[str, str] = json.loads(os.environ.get("API_TOKENS", "{}"))  # bearer token -> tenant
RATE_LIMIT = int(os.environ.get("RATE_LIMIT", "100"))  # requests per tenant per window
RATE_WINDOW = float(os.environ.get("RATE_WINDOW", "60"))  # seconds

# The middleware sends BEGIN and COMMIT itself: connections in autocommit.
# One connection per request in flight, plus the duplicates that wait for
# the first request's transaction (up to lock_timeout, 5 s by default).
# Behind PgBouncer in transaction mode add "prepare_threshold": None.
pool = AsyncConnectionPool(os.environ.get("IDEM_DSN", ""), open=False, min_size=1,
                           max_size=int(os.environ.get("POOL_MAX", "20")), kwargs={"autocommit": True})


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    await pool.open()
    async with pool.connection() as conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS example_orders (id bigint GENERATED ALWAYS AS IDENTITY"
                           " PRIMARY KEY, tenant text NOT NULL, idem_key text NOT NULL, sku text NOT NULL,"
                           " qty int NOT NULL)")
    yield
    await pool.close()


class BearerAuth:
    """Authentication: the tenant of the bearer token, in request.state.tenant; else 401."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        auth = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        tenant = TOKENS.get(auth[7:]) if auth.startswith("Bearer ") else None
        if tenant is None:
            resp = JSONResponse({"error": "unauthorized"}, 401, headers={"WWW-Authenticate": "Bearer"})
            return await resp(scope, receive, send)
        scope.setdefault("state", {})["tenant"] = tenant
        await self.app(scope, receive, send)


class RateLimit:
    """At most RATE_LIMIT requests per tenant per RATE_WINDOW seconds (fixed window); else 429."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.windows: dict[str, list[float]] = {}  # tenant -> [window end, requests]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        tenant, now = scope["state"]["tenant"], time.monotonic()
        w = self.windows.get(tenant)
        if w is None or now >= w[0]:
            w = self.windows[tenant] = [now + RATE_WINDOW, 0]
        w[1] += 1
        if w[1] > RATE_LIMIT:
            resp = JSONResponse({"error": "rate limited"}, 429, headers={"Retry-After": str(int(w[0] - now) + 1)})
            return await resp(scope, receive, send)
        await self.app(scope, receive, send)


app = FastAPI(lifespan=lifespan)
# Added first: innermost. The tenant hook reads what BearerAuth found.
app.add_middleware(IdempotencyMiddleware, connection=pool.connection,
                   routes={("POST", "/orders"): "orders.create"},
                   policy=Policy(tenant=lambda info: getattr(info.native.state, "tenant", None)))
app.add_middleware(RateLimit)
app.add_middleware(BearerAuth)  # added last: runs first


class Order(BaseModel):
    sku: str
    qty: int


@app.post("/orders", status_code=201)
async def create_order(order: Order, request: Request, ctx: IdemContext = Depends(idem_context)) -> JSONResponse:
    # ctx.conn: the connection whose transaction holds the claim (do not
    # commit it; `async with ctx.conn.transaction()` is a savepoint).
    cur = await ctx.conn.execute(
        "INSERT INTO example_orders (tenant, idem_key, sku, qty) VALUES (%s, %s, %s, %s) RETURNING id",
        (request.state.tenant, ctx.claim.key if ctx.claim else None, order.sku, order.qty))
    (order_id,) = await cur.fetchone()  # type: ignore[misc]
    return JSONResponse({"id": order_id, "sku": order.sku, "qty": order.qty}, 201,
                        headers={"Location": f"/orders/{order_id}"})
