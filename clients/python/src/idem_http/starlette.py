"""FastAPI / Starlette: an ASGI middleware that runs the claim, the handler's
writes and the stored response in one transaction on one connection, and a
dependency that hands that connection to the handler.

    app = FastAPI()
    app.add_middleware(IdempotencyMiddleware,
                       connection=connect_each_time("dbname=shop", prepare_threshold=None),
                       routes={("POST", "/orders"): "orders.create"},
                       policy=Policy(tenant=lambda r: r.native.user.account_id))

    @app.post("/orders", status_code=201)
    async def create_order(order: Order, conn: AsyncConnection = Depends(idem_connection)):
        cur = await conn.execute("INSERT INTO orders ... RETURNING id", ...)
        return {"id": (await cur.fetchone())[0]}

The handler must be `async def` (the connection is an AsyncConnection) and
must not commit or roll back the connection itself (nested
`conn.transaction()` blocks are savepoints). The response is sent after
COMMIT, so a 201 is never sent for work that rolled back.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, Union

import psycopg
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .aio import AsyncClaim, claim_row
from .errors import FingerprintMismatch, InProgress, TransientFailure, classify, is_transient, sqlstate_of
from .policy import _log, Policy, RequestInfo, Response, Route, TenantMissing
from .routes import RouteResolver, RouteTable, resolver

ConnectionFactory = Callable[[], Any]  # () -> async context manager yielding an AsyncConnection


def connect_each_time(conninfo: str = "", **kwargs: Any) -> Callable[[], Any]:
    """A connection factory that opens a connection per request (pass
    prepare_threshold=None behind PgBouncer in transaction mode). With a
    pool, pass `pool.connection` instead (psycopg_pool.AsyncConnectionPool)."""

    @asynccontextmanager
    async def factory() -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True, **kwargs)
        try:
            yield conn
        finally:
            await conn.close()

    return factory


@dataclass
class IdemContext:
    """What the handler gets: the connection whose transaction holds the
    claim, and the claim (None for a route whose key is optional and absent)."""

    conn: psycopg.AsyncConnection[Any]
    claim: Optional[AsyncClaim]
    key: Optional[str] = None
    route: Optional[Route] = None

    @property
    def attempt(self) -> int:
        return self.claim.attempt if self.claim else 1

    @property
    def recovery_point(self) -> Optional[str]:
        return self.claim.recovery_point if self.claim else None

    @property
    def recovery_data(self) -> Any:
        return self.claim.recovery_data if self.claim else None

    async def checkpoint(self, point: str, data: Any = None) -> None:
        """Lease mode: record a recovery point (the middleware keeps the
        lease token). Inside `async with conn.transaction():` it commits
        with the writes made there."""
        if self.claim is None:
            raise ValueError("no claim: this request has no Idempotency-Key")
        await self.claim.checkpoint(point, data)


def idem_context(request: Request) -> IdemContext:
    """FastAPI dependency: the request's IdemContext."""
    ctx = request.scope.get("state", {}).get("idem")
    if not isinstance(ctx, IdemContext):
        raise RuntimeError(f"{request.method} {request.url.path} is not a route of IdempotencyMiddleware")
    return ctx


def idem_connection(request: Request) -> psycopg.AsyncConnection[Any]:
    """FastAPI dependency: the connection the handler must write on."""
    return idem_context(request).conn


async def _send_response(send: Send, resp: Response) -> None:
    headers = [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in resp.headers
               if n.lower() != "content-length"]
    headers.append((b"content-length", str(len(resp.body)).encode()))
    await send({"type": "http.response.start", "status": resp.status, "headers": headers})
    await send({"type": "http.response.body", "body": resp.body, "more_body": False})


@dataclass
class _Capture:
    """Holds the handler's response until the transaction has committed.
    A body larger than max_stored_body (or streamed beyond it) makes
    `overflow` run: it commits with status and headers only, and the rest of
    the response is passed through as it comes."""

    send: Send
    limit: int
    overflow: Callable[[Response], Awaitable[None]]
    start: Optional[Message] = None
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0
    done: bool = False
    passthrough: bool = False

    def response(self, body_stored: bool = True) -> Response:
        assert self.start is not None
        headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in self.start.get("headers", [])]
        return Response(int(self.start["status"]), headers, b"".join(self.chunks), body_stored)

    async def __call__(self, message: Message) -> None:
        if self.passthrough:
            await self.send(message)
            return
        if message["type"] == "http.response.start":
            self.start = message
            return
        if message["type"] != "http.response.body":
            await self.send(message)
            return
        self.chunks.append(message.get("body", b""))
        self.size += len(self.chunks[-1])
        more = message.get("more_body", False)
        if more and self.size > self.limit:
            resp = self.response(body_stored=False)
            await self.overflow(resp)
            self.passthrough = True
            assert self.start is not None
            await self.send(self.start)
            await self.send({"type": "http.response.body", "body": b"".join(self.chunks), "more_body": True})
            self.chunks = []
        elif not more:
            self.done = True


class IdempotencyMiddleware:
    """Pure ASGI middleware; see the module's docstring."""

    def __init__(self, app: ASGIApp, *, connection: ConnectionFactory,
                 routes: Union[RouteTable, RouteResolver], policy: Policy) -> None:
        self.app = app
        self.connection = connection
        self.resolve = resolver(routes)
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = self.resolve(scope["method"], scope["path"])
        if route is None:
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        delivered = False

        async def replay_receive() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        headers: dict[str, str] = {}
        for n, v in scope.get("headers", []):
            name = n.decode("latin-1").lower()
            headers[name] = f"{headers[name]}, {v.decode('latin-1')}" if name in headers else v.decode("latin-1")
        info = RequestInfo(scope["method"], scope["path"], scope.get("query_string", b"").decode("latin-1"),
                           headers, body, native=Request(scope))
        policy = self.policy
        raw = info.header(policy.header)
        key = policy.parse_key(raw)
        if key is None and not (raw is None and not route.key_required):
            await _send_response(send, policy.key_refused(raw))
            return
        scope_name = None
        if key is not None:
            try:
                scope_name = policy.scope_of(info, route)
            except TenantMissing:
                await _send_response(send, policy.tenant_missing())
                return

        async with self.connection() as conn:
            if not conn.autocommit:
                await conn.set_autocommit(True)
            await self._claimed_request(conn, scope, replay_receive, send, info, route, key, scope_name)

    async def _claimed_request(self, conn: psycopg.AsyncConnection[Any], scope: Scope, receive: Receive,
                               send: Send, info: RequestInfo, route: Route, key: Optional[str],
                               scope_name: Optional[str]) -> None:
        """Claim, run the handler in the claim's transaction, store and
        COMMIT, then answer. Without a key (a route whose key is optional)
        the same, minus the claim and the stored response."""
        policy = self.policy
        leased = route.lease is not None and key is not None
        c: Optional[AsyncClaim] = None
        try:
            if key is not None and scope_name is not None:
                c = await claim_row(conn, policy.scoped_key(key, scope_name), route.biz_type,
                                    fingerprint=policy.fingerprint_of(info, route, scope_name),
                                    wait=policy.wait if route.wait is None else route.wait, ttl=route.ttl,
                                    lease=route.lease, lock_timeout=policy.lock_timeout_for(route), begin=True)
                if not c.claimed or leased:
                    await conn.execute("COMMIT")
            else:
                await conn.execute("BEGIN")
        except Exception as e:
            await _rollback(conn)
            await _send_response(send, self._error_answer(e, route))
            return
        if c is not None and not c.claimed:
            replay = (policy.in_progress(route) if c.state == "in_progress"
                      else policy.replay(c.replay, c.state, c.expires))
            await _send_response(send, replay)
            return

        async def store(resp: Response) -> None:
            if c is not None and not leased and policy.phase_hook is None:
                # Nothing runs between storing and COMMIT: one round trip.
                await c.finish_and_commit(resp.to_document(policy.stored_headers), resp.status >= 400)
                return
            if c is not None:
                doc = resp.to_document(policy.stored_headers)
                if resp.status < 400:
                    await c.complete(doc)
                else:
                    await c.fail(doc)
            if not leased:
                policy.phase("before_commit", info)
                await conn.execute("COMMIT")
                policy.phase("after_commit", info)

        async def overflow(resp: Response) -> None:
            if policy.stores(route, resp.status):
                await store(resp)
            else:
                # Not stored, and streaming has begun: the writes must not
                # outlive an answer that says they failed.
                await _undo(conn, c, leased)

        capture = _Capture(send, policy.max_stored_body, overflow)
        scope.setdefault("state", {})["idem"] = IdemContext(conn, c, key, route)
        try:
            await self.app(scope, receive, capture)
        except Exception as e:
            if capture.passthrough:
                raise  # committed and streaming: nothing left to undo
            await _undo(conn, c, leased)
            if is_transient(e):
                await _send_response(send, policy.unavailable(sqlstate_of(e), route))
                return
            raise
        if capture.passthrough:
            return
        if capture.start is None:
            await _undo(conn, c, leased)
            raise RuntimeError("the handler sent no response")
        resp = capture.response()
        if not policy.stores(route, resp.status):
            await _undo(conn, c, leased)
            await _send_response(send, resp)
            return
        if len(resp.body) > policy.max_stored_body:
            resp.body_stored = False
        try:
            await store(resp)
        except Exception as e:
            await _undo(conn, c, leased)
            if classify(e) is None:
                _log.error("idem_http: %s %s (%s): storing the response failed: %r", info.method, info.path,
                           route.biz_type, e)
                await _send_response(send, policy.internal_error())
                return
            await _send_response(send, self._error_answer(e, route))
            return
        resp.body_stored = True
        await _send_response(send, resp)

    def _error_answer(self, e: BaseException, route: Route) -> Response:
        err = classify(e)
        if isinstance(err, InProgress):
            return self.policy.in_progress(route)
        if isinstance(err, FingerprintMismatch):
            return self.policy.mismatch()
        if isinstance(err, TransientFailure):
            return self.policy.unavailable(err.sqlstate, route)
        raise e


async def _undo(conn: psycopg.AsyncConnection[Any], c: Optional[AsyncClaim], leased: bool) -> None:
    """An answer that is not stored: roll the request's transaction back,
    or in lease mode (the claim committed, the handler's transactions are
    its own) hand the lease back, so that the retry runs at once."""
    if not leased:
        await _rollback(conn)
    elif c is not None:
        await c.release()


async def _rollback(conn: psycopg.AsyncConnection[Any]) -> None:
    if conn.closed:
        return
    try:
        await conn.execute("ROLLBACK")
    except psycopg.Error:
        pass  # a lost connection: the server rolled back already


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.request":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                return b"".join(chunks)
        elif message["type"] == "http.disconnect":
            return b"".join(chunks)
