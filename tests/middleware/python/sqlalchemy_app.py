"""The SQLAlchemy test server: plain sync FastAPI routes (run in uvicorn's
thread pool) that use a SQLAlchemy Session and
idem_http.sqlalchemy.handle_request, the way an app without an ASGI
middleware wires the library in."""

from __future__ import annotations

import json
from typing import Any, Optional

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response as HTTPResponse
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

import idem_http.sqlalchemy as idem_sa
from idem_http.routes import resolver
from idem_http import Claim, RequestInfo, Response

import testapp_common as common

_params = dict(p.split("=", 1) for p in common.CONNINFO.split())
engine = create_engine(
    f"postgresql+psycopg://{_params.get('user', 'postgres')}@/{_params.get('dbname', 'postgres')}",
    connect_args={"host": _params.get("host", ""), "port": _params.get("port", "5432"), "prepare_threshold": None},
    pool_size=30, max_overflow=10)
app = FastAPI()


async def request_info(request: Request) -> RequestInfo:
    # Field lines of one name joined with ", ", as HTTP combines them (two
    # Idempotency-Key lines are then refused, not one of them taken).
    headers: dict[str, str] = {}
    for k, v in request.headers.items():
        headers[k.lower()] = f"{headers[k.lower()]}, {v}" if k.lower() in headers else v
    return RequestInfo(request.method, request.url.path, request.url.query, headers, await request.body(),
                       native=request)


def orders_handler(session: Session, info: RequestInfo, c: Optional[Claim]) -> Response:
    body = json.loads(info.body)
    if info.header("x-test-gate") == "1":
        session.execute(text(common.GATE))
    failure = common.order_outcome(body)
    if failure:
        return Response(failure[0], [("Content-Type", "application/json")], json.dumps(failure[1]).encode())
    if info.header("x-test-transient") == "1":
        session.execute(text(common.TRANSIENT))
    if info.header("x-test-lost") == "1":
        session.execute(text(common.LOST))
    order_id = session.execute(
        text("INSERT INTO orders (server, idem_key, sku, qty) VALUES ('sqlalchemy', :k, :s, :q) RETURNING id"),
        {"k": c.key if c else "-", "s": body["sku"], "q": body["qty"]}).scalar_one()
    if info.header("x-test-raise") == "1":
        raise RuntimeError("handler failed after its write")
    return Response(201, [("Content-Type", "application/json"), ("Location", f"/orders/{order_id}")],
                    json.dumps({"id": order_id, "sku": body["sku"], "qty": body["qty"]}).encode())


def conformance_handler(session: Session, info: RequestInfo, c: Optional[Claim]) -> Response:
    """The conformance handler of tests/middleware/README.md."""
    if common.leased(info.path):
        # Lease mode: the claim has committed; the handler's writes are a
        # transaction of its own.
        tx = session.begin()
        try:
            resp = conformance_work(session, info, c)
        except BaseException:
            tx.rollback()
            raise
        if common.keeps_writes(info.header):
            tx.commit()
        else:
            tx.rollback()
        return resp
    return conformance_work(session, info, c)


def conformance_work(session: Session, info: RequestInfo, c: Optional[Claim]) -> Response:
    conn = session.connection()
    if info.header("x-conformance-hold"):
        conn.exec_driver_sql(common.CONFORMANCE_HOLD, (info.header("x-conformance-hold"),))
    row_id = conn.exec_driver_sql(common.CONFORMANCE_INSERT,
                                  common.conformance_params(info.body, info.header)).scalar_one()
    if info.header("x-conformance-fail"):
        conn.exec_driver_sql(common.conformance_fail(info.header("x-conformance-fail") or ""))
    return Response(*common.conformance_answer(row_id, info.header, c))


def run(info: RequestInfo, handler: Any = orders_handler) -> HTTPResponse:
    route = resolver(common.ROUTES)(info.method, info.path)
    assert route is not None
    with Session(engine) as session:
        try:
            out = idem_sa.handle_request(session, common.POLICY, route, info,
                                         call=lambda c: handler(session, info, c), describe=lambda r: r)
        except RuntimeError:
            out = Response(500, [("Content-Type", "text/plain")], b"Internal Server Error")
    return HTTPResponse(out.body, status_code=out.status, headers=dict(out.headers))


@app.get("/health")
def health() -> dict[str, str]:
    return {"status": "ok"}


@app.post("/orders")
def orders(info: RequestInfo = Depends(request_info)) -> Any:
    return run(info)


@app.post("/orders-409")
def orders_409(info: RequestInfo = Depends(request_info)) -> Any:
    return run(info)


@app.post("/orders-short-wait")
def orders_short_wait(info: RequestInfo = Depends(request_info)) -> Any:
    return run(info)


@app.post("/orders-optional")
def orders_optional(info: RequestInfo = Depends(request_info)) -> Any:
    return run(info)


def conformance(info: RequestInfo = Depends(request_info)) -> Any:
    return run(info, conformance_handler)


for _path in common.CONFORMANCE_PATHS:
    app.post(_path)(conformance)
