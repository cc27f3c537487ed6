"""The synchronous API: a claim as a context manager that owns a transaction
on a connection, and the request engine the sync integrations (Django,
SQLAlchemy) share.

    with idem_http.claim(conn, Policy.scoped_key(key, tenant_scope(tenant)), "orders.create", fingerprint=fp) as c:
        if not c.claimed:
            return c.replay            # or 409 for c.state == "in_progress"
        conn.execute("INSERT INTO orders ...")
        c.complete({"status": 201, "body": ...})
    # committed here: the order and its stored response, or neither
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, ContextManager, Iterator, Optional, TypeVar, Union, cast

import psycopg

from . import _sql
from .claim import ClaimState
from .errors import (LOCK_NOT_AVAILABLE, FingerprintMismatch, InProgress, TransientFailure,
                     classify, sqlstate_of)
from .policy import _log, Policy, RequestInfo, Response, Route, TenantMissing

#: Runs one statement with positional parameters, returns its first row.
Execute = Callable[[str, tuple[Any, ...]], Optional[tuple[Any, ...]]]
#: Opens a transaction (or joins none): a context manager that commits on a
#: normal exit and rolls back on an exception.
TransactionFactory = Callable[[], ContextManager[Any]]
#: Runs one statement followed by COMMIT as one simple query (one round
#: trip) on the transaction's connection and returns True, or returns False
#: having run nothing where it cannot: the block's transaction is not the
#: outermost, or the driver is not psycopg 3. The framework's own COMMIT at
#: the block's end then finds no transaction and sends nothing.
CommitWith = Callable[[str, tuple[Any, ...]], bool]
#: Sends BEGIN and the claim's statement in one round trip on the psycopg 3
#: connection under the framework's transaction and returns the claim's row;
#: or returns None having sent nothing where it cannot (the block is not the
#: framework's outermost transaction, the driver is not psycopg 3): then
#: the claim runs through Execute, after the BEGIN psycopg sends alone.
BeginWith = Callable[[str, tuple[Any, ...]], Optional[tuple[Any, ...]]]
T = TypeVar("T")


class Claim(ClaimState):
    """A claim made by `claim()`; finish it with complete() or fail() before
    the block ends."""

    _execute: Execute
    _transaction: Optional[TransactionFactory]

    def _run(self, sql: str, params: tuple[Any, ...]) -> None:
        if self.lease and self._transaction is not None:
            # Lease mode: the claim committed already; each call is its own
            # transaction, or part of the caller's open one.
            with self._transaction():
                self._execute(sql, params)
        else:
            self._execute(sql, params)

    def complete(self, result: Any = None) -> None:
        """Store the outcome (a JSON-serialisable value); duplicates get it back."""
        self._require_claimed("complete")
        self._run(_sql.COMPLETE, (self.key, self.biz_type, _sql.to_json(result), self.lease_token))
        self.finished = "completed"

    def fail(self, error: Any) -> None:
        """Store a deterministic business failure; duplicates get it back."""
        self._require_claimed("fail")
        self._run(_sql.FAIL, (self.key, self.biz_type, _sql.to_json(error), self.lease_token))
        self.finished = "failed"

    def finish_and_commit(self, result: Any, failed: bool, commit_with: CommitWith) -> bool:
        """complete() (or fail() when `failed`) and COMMIT in one round trip,
        if `commit_with` can (not for a leased claim); False: nothing done."""
        self._require_claimed("fail" if failed else "complete")
        if self.lease or not commit_with(_sql.FAIL if failed else _sql.COMPLETE,
                                         (self.key, self.biz_type, _sql.to_json(result), None)):
            return False
        self.finished = "failed" if failed else "completed"
        return True

    def checkpoint(self, point: str, data: Any = None) -> None:
        """Lease mode: record a recovery point (and renew the lease). Inside
        a transaction the handler opened, it commits with that transaction's
        business writes; else at once."""
        if not self.lease:
            raise ValueError("checkpoint() needs a claim made with a lease")
        self._require_claimed("checkpoint")
        self._run(_sql.CHECKPOINT, (self.key, self.biz_type, point, _sql.to_json(data), self.lease_token))

    def _require_claimed(self, what: str) -> None:
        if not self.claimed:
            raise ValueError(f"{what}() on a claim this request did not make (state {self.state})")
        if self.finished:
            raise ValueError(f"{what}() on a claim already {self.finished}")


def _make_claim(execute: Execute, transaction: Optional[TransactionFactory], key: str, biz_type: str,
                row: Optional[tuple[Any, ...]], lease: Optional[str]) -> Claim:
    if row is None:
        raise RuntimeError("idem_claim returned no row")
    c = Claim(key=key, biz_type=biz_type, claimed=bool(row[0]), state=str(row[1]),
              result=_sql.from_json(row[2]), lease=lease, expires_at=row[3])
    c._execute = execute
    c._transaction = transaction
    return c


def _claim_row(execute: Execute, key: str, biz_type: str, ttl: Optional[str], fingerprint: Optional[str],
               wait: bool, lease: Optional[str], lock_timeout: Optional[str],
               begin_with: Optional[BeginWith] = None) -> Optional[tuple[Any, ...]]:
    statement = _sql.claim_statement(key, biz_type, ttl, fingerprint, wait, lease, lock_timeout)
    try:
        row = begin_with(*statement) if begin_with is not None else None
        return row if row is not None else execute(*statement)
    except Exception as e:
        if sqlstate_of(e) == LOCK_NOT_AVAILABLE:
            raise InProgress(f"({biz_type}, {key}) is in progress: the wait ran out") from e
        raise


def _release(transaction: TransactionFactory, execute: Execute, c: Claim) -> None:
    """Hand a leased claim that was not finished back (idem_release), so
    that the client's retry takes it over at once instead of waiting for the
    lease to run out. Best effort: if it fails (a lost connection, the lease
    already taken over), the lease runs out as before."""
    try:
        with transaction():
            execute(_sql.RELEASE, (c.key, c.biz_type, c.lease_token))
    except Exception as e:
        _log.warning("idem_http: handing back the lease of (%s, %s) failed: %r", c.biz_type, c.key, e)


def _reraise(e: BaseException) -> None:
    err = classify(e)
    if err is not None and err is not e:
        raise err from e


@contextmanager
def claim_in(transaction: TransactionFactory, execute: Execute, key: str, biz_type: str, *,
             fingerprint: Optional[str] = None, wait: bool = True, ttl: Optional[str] = None,
             lease: Optional[str] = None, lock_timeout: Optional[str] = None,
             begin_with: Optional[BeginWith] = None) -> Iterator[Claim]:
    """claim() for any transaction and statement runner (Django's atomic and
    cursor, SQLAlchemy's session): the building block of the integrations."""
    try:
        if lease is None:
            with transaction():
                row = _claim_row(execute, key, biz_type, ttl, fingerprint, wait, None, lock_timeout, begin_with)
                c = _make_claim(execute, None, key, biz_type, row, None)
                yield c
                c.check_finished()
        else:
            # Lease mode: the claim commits first; the work runs outside
            # this transaction (external calls), finished with the token.
            with transaction():
                row = _claim_row(execute, key, biz_type, ttl, fingerprint, wait, lease, lock_timeout, begin_with)
            c = _make_claim(execute, transaction, key, biz_type, row, lease)
            try:
                yield c
                c.check_finished()
            except BaseException:
                if c.claimed and c.finished is None:
                    _release(transaction, execute, c)
                raise
    except Exception as e:
        _reraise(e)
        raise


@contextmanager
def claim(conn: psycopg.Connection[Any], key: str, biz_type: str, *, fingerprint: Optional[str] = None,
          wait: bool = True, ttl: Optional[str] = None, lease: Optional[str] = None,
          lock_timeout: Optional[str] = None) -> Iterator[Claim]:
    """Claim (biz_type, key) in a transaction on `conn` that this block owns.

    The block's writes on `conn`, the claim and the stored outcome commit
    together at its end, or roll back together on an exception (then a retry
    runs again). Raises FingerprintMismatch (ID001) and TransientFailure
    (40001, 40P01, 55P03, 57014, a lost connection). With `lease`, the claim
    commits at once and complete()/fail()/checkpoint() pass its token."""

    def execute(sql: str, params: tuple[Any, ...]) -> Optional[tuple[Any, ...]]:
        return conn.execute(sql, params).fetchone()

    with claim_in(conn.transaction, execute, key, biz_type, fingerprint=fingerprint, wait=wait, ttl=ttl,
                  lease=lease, lock_timeout=lock_timeout) as c:
        yield c


def joined(conn: psycopg.Connection[Any], query: str, params: tuple[Any, ...], *, before: Optional[str] = None,
              after: Optional[str] = None) -> psycopg.Cursor[Any]:
    """The sync counterpart of `idem_http.aio.joined`: `query` between
    `before` and `after` as one simple query."""
    cur = psycopg.ClientCursor(conn)
    cur.execute("; ".join(q for q in (before, query, after) if q is not None), params)
    if before is not None:
        cur.nextset()
    return cur


class _Rollback(Exception):
    def __init__(self, native: Any) -> None:
        super().__init__("not stored: rolled back")
        self.native = native


def handle_request(policy: Policy, route: Route, info: RequestInfo, *, transaction: TransactionFactory,
                   execute: Execute, call: Callable[[Optional[Claim]], T],
                   describe: Callable[[T], Response], commit_with: Optional[CommitWith] = None,
                   begin_with: Optional[BeginWith] = None) -> Union[Response, T]:
    """One request, the whole mapping (docs/http.md, "The rules"): 400 for a
    missing or invalid key, 500 without a tenant, claim, replay or 409, run
    `call` in the claim's transaction, store what `describe` says it
    answered (policy.stores: 2xx/3xx with idem_complete, deterministic 4xx
    with idem_fail) or roll back, 422 for ID001, 503 for transient failures.
    Returns our own Response, or what `call` returned; storing or committing
    the response failed (not transiently): 500 internal-error."""
    storing = False
    raw = info.header(policy.header)
    key = policy.parse_key(raw)
    if key is None and not (raw is None and not route.key_required):
        return policy.key_refused(raw)
    try:
        if key is None:
            # An optional key, absent: the handler runs without a claim, in
            # a transaction all the same (committed if its answer would be stored).
            with transaction():
                native = call(None)
                if not policy.stores(route, describe(native).status):
                    raise _Rollback(native)
            return native
        scope = policy.scope_of(info, route)
        wait = policy.wait if route.wait is None else route.wait
        with claim_in(transaction, execute, policy.scoped_key(key, scope), route.biz_type,
                      fingerprint=policy.fingerprint_of(info, route, scope), wait=wait, ttl=route.ttl,
                      lease=route.lease, lock_timeout=policy.lock_timeout_for(route), begin_with=begin_with) as c:
            if not c.claimed:
                answer = (policy.in_progress(route) if c.state == "in_progress"
                          else policy.replay(c.replay, c.state, c.expires))
            else:
                native = call(c)
                resp = describe(native)
                if not policy.stores(route, resp.status):
                    raise _Rollback(native)
                if len(resp.body) > policy.max_stored_body:
                    resp.body_stored = False
                storing = True  # from here to COMMIT, a failure is ours: internal-error
                doc = resp.to_document(policy.stored_headers)
                if not (c.lease is None and policy.phase_hook is None and commit_with is not None
                        and c.finish_and_commit(doc, resp.status >= 400, commit_with)):
                    if resp.status < 400:
                        c.complete(doc)
                    else:
                        c.fail(doc)
                    policy.phase("before_commit", info)
        if c.claimed:
            policy.phase("after_commit", info)
            return native
        return answer
    except _Rollback as r:
        return cast(T, r.native)
    except TenantMissing:
        return policy.tenant_missing()
    except InProgress:
        return policy.in_progress(route)
    except FingerprintMismatch:
        return policy.mismatch()
    except TransientFailure as e:
        return policy.unavailable(e.sqlstate, route)
    except Exception as e:
        err = classify(e)  # the no-key path's errors come unclassified
        if isinstance(err, TransientFailure):
            return policy.unavailable(err.sqlstate, route)
        if storing:
            _log.error("idem_http: %s %s (%s): storing the response failed: %r", info.method, info.path,
                       route.biz_type, e)
            return policy.internal_error()
        raise
