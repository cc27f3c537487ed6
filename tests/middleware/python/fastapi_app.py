"""The FastAPI test server: IdempotencyMiddleware with the connection handed
to async handlers by a dependency. uvicorn fastapi_app:app"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import psycopg
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from idem_http import RequestInfo
from idem_http.starlette import IdemContext, IdempotencyMiddleware, connect_each_time, idem_context

import testapp_common as common

app = FastAPI()
app.add_middleware(IdempotencyMiddleware, connection=connect_each_time(common.CONNINFO, prepare_threshold=None),
                   routes={k: r for k, r in common.ROUTES.items() if k not in common.CONFORMANCE_ROUTES},
                   policy=common.POLICY)
# The conformance routes without the kill points' phase hook, the way most
# apps run: the response is stored and committed in one round trip.
app.add_middleware(IdempotencyMiddleware, connection=connect_each_time(common.CONNINFO, prepare_threshold=None),
                   routes=common.CONFORMANCE_ROUTES, policy=dataclasses.replace(common.POLICY, phase_hook=None))


@app.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


async def create_order(request: Request, ctx: IdemContext) -> Any:
    body = json.loads(await request.body())
    conn = ctx.conn
    if request.headers.get("x-test-gate") == "1":
        await conn.execute(common.GATE)
    failure = common.order_outcome(body)
    if failure:
        return JSONResponse(failure[1], status_code=failure[0])
    if request.headers.get("x-test-transient") == "1":
        await conn.execute(common.TRANSIENT)
    if request.headers.get("x-test-lost") == "1":
        await conn.execute(common.LOST)
    key = ctx.claim.key if ctx.claim else "-"
    cur = await conn.execute(common.INSERT, ("fastapi", key, body["sku"], body["qty"]))
    (order_id,) = await cur.fetchone()  # type: ignore[misc]
    if request.headers.get("x-test-raise") == "1":
        raise RuntimeError("handler failed after its write")
    return JSONResponse({"id": order_id, "sku": body["sku"], "qty": body["qty"]}, status_code=201,
                        headers={"Location": f"/orders/{order_id}"})


@app.post("/orders")
async def orders(request: Request, ctx: IdemContext = Depends(idem_context)) -> Any:
    return await create_order(request, ctx)


@app.post("/orders-409")
async def orders_409(request: Request, ctx: IdemContext = Depends(idem_context)) -> Any:
    return await create_order(request, ctx)


@app.post("/orders-optional")
async def orders_optional(request: Request, ctx: IdemContext = Depends(idem_context)) -> Any:
    return await create_order(request, ctx)


@app.post("/orders-short-wait")
async def orders_short_wait(request: Request, ctx: IdemContext = Depends(idem_context)) -> Any:
    return await create_order(request, ctx)


@app.post("/report")
async def report(request: Request, ctx: IdemContext = Depends(idem_context)) -> Any:
    """A streamed response larger than max_stored_body: passed through, not stored."""
    body = json.loads(await request.body())
    cur = await ctx.conn.execute(common.INSERT, ("fastapi", ctx.claim.key, "report", body["lines"]))  # type: ignore[union-attr]
    (rid,) = await cur.fetchone()  # type: ignore[misc]

    async def lines():
        for i in range(body["lines"]):
            yield f"report {rid} line {i:06d}\n".encode()

    return StreamingResponse(lines(), media_type="text/plain", headers={"Location": f"/report/{rid}"})


@app.post("/charges")
@app.post("/charges-short")
async def charges(request: Request, ctx: IdemContext = Depends(idem_context)) -> Any:
    """Lease mode: the claim committed first; an external call (here: a row
    with server 'fastapi-external', committed on its own, with the recovery
    point in the same transaction); a retry after a takeover resumes from
    ctx.recovery_point and does not call again."""
    body = json.loads(await request.body())
    conn = ctx.conn
    if ctx.recovery_point != "charged":
        async with conn.transaction():
            await conn.execute("INSERT INTO orders (server, idem_key, sku, qty) VALUES ('fastapi-external', %s, %s, %s)",
                               (ctx.claim.key, body["sku"], body["qty"]))  # type: ignore[union-attr]
            await ctx.checkpoint("charged", {"charge": body["sku"]})
    common.kill_point("after_checkpoint", RequestInfo(request.method, request.url.path, "",
                                                      {"x-test-pause": request.headers.get("x-test-pause", "")}, b""))
    async with conn.transaction():
        cur = await conn.execute(common.INSERT, ("fastapi", ctx.claim.key, body["sku"], body["qty"]))  # type: ignore[union-attr]
        (order_id,) = await cur.fetchone()  # type: ignore[misc]
    return JSONResponse({"id": order_id, "attempt": ctx.attempt}, status_code=201)


async def conformance_work(request: Request, ctx: IdemContext) -> int:
    h = request.headers.get
    if h("x-conformance-hold"):
        await ctx.conn.execute(common.CONFORMANCE_HOLD, (h("x-conformance-hold"),))
    cur = await ctx.conn.execute(common.CONFORMANCE_INSERT, common.conformance_params(await request.body(), h))
    (row_id,) = await cur.fetchone()  # type: ignore[misc]
    if h("x-conformance-fail"):
        await ctx.conn.execute(common.conformance_fail(h("x-conformance-fail", "")))
    return int(row_id)


async def conformance(request: Request, ctx: IdemContext = Depends(idem_context)) -> Any:
    """The conformance handler of tests/middleware/README.md."""
    h = request.headers.get
    if common.leased(request.url.path):
        # Lease mode: the claim has committed; the handler's writes are a
        # transaction of its own.
        async with ctx.conn.transaction():
            row_id = await conformance_work(request, ctx)
            if not common.keeps_writes(h):
                raise psycopg.Rollback()
    else:
        row_id = await conformance_work(request, ctx)
    status, headers, body = common.conformance_answer(row_id, h, ctx.claim)
    return Response(body, status_code=status, headers=dict(headers))


for _path in common.CONFORMANCE_PATHS:
    app.post(_path)(conformance)
