"""The Python side of bench/middleware.sh: FastAPI on uvicorn (one worker), one
handler (insert a business row, answer 201) behind POST /mw (idem_http's
middleware: variants a and b), /hand (hand-written dedup in the handler's
transaction: c) and /plain (none: d), all on one psycopg_pool pool
(autocommit, as the middleware's README asks).

    uvicorn --app-dir bench/middleware app:app   (BENCH_CONNINFO, BENCH_POOL)
"""

from __future__ import annotations

import json
import os
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from idem_http import Policy
from idem_http.starlette import IdempotencyMiddleware, idem_connection

CONNINFO = os.environ["BENCH_CONNINFO"]
POOL_SIZE = int(os.environ.get("BENCH_POOL", "8"))
pool = AsyncConnectionPool(CONNINFO, min_size=POOL_SIZE, max_size=POOL_SIZE, open=False,
                           kwargs={"autocommit": True})

app = FastAPI()
app.add_middleware(IdempotencyMiddleware, connection=pool.connection,
                   routes={("POST", "/mw"): "bench.mw"}, policy=Policy(single_tenant=True))


@app.on_event("startup")
async def open_pool() -> None:
    await pool.open(wait=True)


@app.on_event("shutdown")
async def close_pool() -> None:
    await pool.close()


# The business work, the same in every variant.
INSERT_ORDER = "INSERT INTO orders (key, amount) VALUES (%s, %s) RETURNING id"


async def create_order(conn: AsyncConnection[Any], key: str | None, body: dict[str, Any]) -> dict[str, Any]:
    cur = await conn.execute(INSERT_ORDER, (key, body["amount"]))
    row = await cur.fetchone()
    assert row is not None
    return {"id": row[0], "amount": body["amount"]}


@app.post("/mw", status_code=201)
async def mw(request: Request, conn: AsyncConnection[Any] = Depends(idem_connection)) -> dict[str, Any]:
    return await create_order(conn, request.headers.get("idempotency-key"), await request.json())


@app.post("/hand")
async def hand(request: Request) -> JSONResponse:
    key = request.headers.get("idempotency-key")
    if not key:
        return JSONResponse({"error": "Idempotency-Key required"}, status_code=400)
    body = await request.json()
    async with pool.connection() as conn:
        async with conn.transaction():
            cur = await conn.execute(
                "INSERT INTO dedup (key) VALUES (%s) ON CONFLICT DO NOTHING RETURNING key", (key,))
            if await cur.fetchone() is None:
                # A duplicate: the stored answer (waits for a concurrent first
                # request's transaction through the primary key's lock).
                cur = await conn.execute("SELECT response::text FROM dedup WHERE key = %s", (key,))
                stored = await cur.fetchone()
                assert stored is not None and stored[0] is not None
                return JSONResponse(json.loads(stored[0]), status_code=201)
            result = await create_order(conn, key, body)
            await conn.execute("UPDATE dedup SET response = %s::jsonb WHERE key = %s",
                               (json.dumps(result), key))
    return JSONResponse(result, status_code=201)


@app.post("/plain", status_code=201)
async def plain(request: Request) -> dict[str, Any]:
    body = await request.json()
    async with pool.connection() as conn:
        async with conn.transaction():
            return await create_order(conn, request.headers.get("idempotency-key"), body)
