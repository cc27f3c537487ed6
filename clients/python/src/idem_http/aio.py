"""The asynchronous API (psycopg's AsyncConnection): the same claim as
`idem_http.claim`, as an async context manager.

    async with idem_http.aio.claim(conn, key, "orders.create", fingerprint=fp) as c:
        if not c.claimed:
            ...                                   # c.replay, or 409 for in_progress
        await conn.execute("INSERT INTO orders ...")
        await c.complete({"status": 201, "body": ...})
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Optional

import psycopg

from . import _sql
from .claim import ClaimState
from .errors import LOCK_NOT_AVAILABLE, InProgress, classify, sqlstate_of
from .policy import _log


class AsyncClaim(ClaimState):
    """A claim made by `aio.claim()`; finish it with complete() or fail()."""

    _conn: psycopg.AsyncConnection[Any]

    async def _run(self, sql: str, params: tuple[Any, ...]) -> None:
        try:
            if self.lease:
                async with self._conn.transaction():
                    await self._conn.execute(sql, params)
            else:
                await self._conn.execute(sql, params)
        except Exception as e:
            err = classify(e)
            if err is not None and err is not e:
                raise err from e
            raise

    async def complete(self, result: Any = None) -> None:
        """Store the outcome; duplicates get it back."""
        self._require_claimed("complete")
        await self._run(_sql.COMPLETE, (self.key, self.biz_type, _sql.to_json(result), self.lease_token))
        self.finished = "completed"

    async def fail(self, error: Any) -> None:
        """Store a deterministic business failure; duplicates get it back."""
        self._require_claimed("fail")
        await self._run(_sql.FAIL, (self.key, self.biz_type, _sql.to_json(error), self.lease_token))
        self.finished = "failed"

    async def finish_and_commit(self, document: Any, failed: bool) -> None:
        """complete() (or fail() when `failed`), then COMMIT, in one round
        trip (see `joined`). Not for a leased claim. If storing fails,
        the COMMIT does not run: the caller rolls back."""
        self._require_claimed("fail" if failed else "complete")
        if self.lease:
            raise ValueError("finish_and_commit() is not for a leased claim")
        try:
            await joined(self._conn, _sql.FAIL if failed else _sql.COMPLETE,
                         (self.key, self.biz_type, _sql.to_json(document), self.lease_token), after="COMMIT")
        except Exception as e:
            err = classify(e)
            if err is not None and err is not e:
                raise err from e
            raise
        self.finished = "failed" if failed else "completed"

    async def checkpoint(self, point: str, data: Any = None) -> None:
        """Lease mode: record a recovery point and renew the lease (part of
        the caller's open transaction, if any; else committed at once)."""
        if not self.lease:
            raise ValueError("checkpoint() needs a claim made with a lease")
        self._require_claimed("checkpoint")
        await self._run(_sql.CHECKPOINT, (self.key, self.biz_type, point, _sql.to_json(data), self.lease_token))

    async def release(self) -> None:
        """Lease mode: hand an unfinished lease back (idem_release), so that
        a retry takes it over at once. Best effort: on failure (a lost
        connection, the lease taken over already) it runs out as before."""
        if not (self.lease and self.claimed) or self.finished:
            return
        try:
            if self._conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                await self._conn.rollback()
            async with self._conn.transaction():
                await self._conn.execute(_sql.RELEASE, (self.key, self.biz_type, self.lease_token))
            self.finished = "released"
        except Exception as e:
            _log.warning("idem_http: handing back the lease of (%s, %s) failed: %r", self.biz_type, self.key, e)

    def _require_claimed(self, what: str) -> None:
        if not self.claimed:
            raise ValueError(f"{what}() on a claim this request did not make (state {self.state})")
        if self.finished:
            raise ValueError(f"{what}() on a claim already {self.finished}")


async def claim_row(conn: psycopg.AsyncConnection[Any], key: str, biz_type: str, *,
                    fingerprint: Optional[str], wait: bool, ttl: Optional[str], lease: Optional[str],
                    lock_timeout: Optional[str], begin: bool = False) -> AsyncClaim:
    """Run idem_claim in the connection's current transaction; with
    `begin` (an autocommit connection), BEGIN and the claim in one round
    trip (see `joined`)."""
    query, params = _sql.claim_statement(key, biz_type, ttl, fingerprint, wait, lease, lock_timeout)
    try:
        if begin:
            cur = await joined(conn, query, params, before=_sql.begin_statement(conn))
        else:
            cur = await conn.execute(query, params)
    except Exception as e:
        if sqlstate_of(e) == LOCK_NOT_AVAILABLE:
            raise InProgress(f"({biz_type}, {key}) is in progress: the wait ran out") from e
        raise
    row = await cur.fetchone()
    if row is None:
        raise RuntimeError("idem_claim returned no row")
    c = AsyncClaim(key=key, biz_type=biz_type, claimed=bool(row[0]), state=str(row[1]),
                   result=_sql.from_json(row[2]), lease=lease, expires_at=row[3])
    c._conn = conn
    return c


async def joined(conn: psycopg.AsyncConnection[Any], query: str, params: tuple[Any, ...], *,
                 before: Optional[str] = None, after: Optional[str] = None) -> psycopg.AsyncCursor[Any]:
    """`query` between the statements `before` and `after` (BEGIN, COMMIT)
    as one simple query, its values bound client-side: one round trip. (In
    psycopg's pipeline mode `query` could stay a prepared statement, but
    that cost 2 to 3 ms more of this process's CPU per request:
    docs/performance.md.) An error in `query` skips `after`."""
    cur = psycopg.AsyncClientCursor(conn)
    await cur.execute("; ".join(q for q in (before, query, after) if q is not None), params)
    if before is not None:
        cur.nextset()
    return cur


@asynccontextmanager
async def claim(conn: psycopg.AsyncConnection[Any], key: str, biz_type: str, *,
                fingerprint: Optional[str] = None, wait: bool = True, ttl: Optional[str] = None,
                lease: Optional[str] = None, lock_timeout: Optional[str] = None) -> AsyncIterator[AsyncClaim]:
    """Claim (biz_type, key) in a transaction on `conn` that this block owns;
    see `idem_http.claim`."""
    try:
        if lease is None:
            async with conn.transaction():
                c = await claim_row(conn, key, biz_type, fingerprint=fingerprint, wait=wait, ttl=ttl, lease=None,
                                    lock_timeout=lock_timeout)
                yield c
                c.check_finished()
        else:
            async with conn.transaction():
                c = await claim_row(conn, key, biz_type, fingerprint=fingerprint, wait=wait, ttl=ttl, lease=lease,
                                    lock_timeout=lock_timeout)
            try:
                yield c
                c.check_finished()
            except BaseException:
                await c.release()
                raise
    except Exception as e:
        err = classify(e)
        if err is not None and err is not e:
            raise err from e
        raise
