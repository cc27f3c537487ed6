"""SQLAlchemy (2.0) sessions on psycopg 3 ("postgresql+psycopg://"): the claim
in the session's transaction, so the session's ORM writes, the claim and the
stored outcome commit together.

    with Session(engine) as session:
        with idem_http.sqlalchemy.claim(session, key, "orders.create", fingerprint=fp) as c:
            if not c.claimed:
                return c.replay
            session.add(Order(...))
            session.flush()
            c.complete({"status": 201, "body": ...})
        # committed: the order, the claim and its stored response

`handle_request(session, policy, route, info, call, describe)` runs the whole
HTTP mapping (400/409/422/503, replay, store or roll back) for a web
framework of your own on a session.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, TypeVar, Union

import psycopg
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from . import _sql, core
from .core import Claim
from .policy import Policy, RequestInfo, Response, Route

T = TypeVar("T")


def _execute(session: Session) -> core.Execute:
    def execute(sql: str, params: tuple[Any, ...]) -> Optional[tuple[Any, ...]]:
        session.flush()  # the ORM's pending writes go first, in order
        row = session.connection().exec_driver_sql(sql, params).fetchone()
        return None if row is None else tuple(row)

    return execute


# A pooled connection the middleware switched to autocommit (see _begin_with)
# carries this mark in its pool entry's info until its check-in turns
# autocommit off again.
_AUTOCOMMIT = "idem_http.autocommit"


def _autocommit_off(dbapi_connection: Any, entry: Any) -> None:
    """The pool's check-in: after its reset (ROLLBACK of what is left) and
    before another checkout can take the connection."""
    if not entry.info.pop(_AUTOCOMMIT, False) or not isinstance(dbapi_connection, psycopg.Connection):
        return
    try:
        if dbapi_connection.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            dbapi_connection.rollback()
        dbapi_connection.autocommit = False
    except psycopg.Error:
        dbapi_connection.close()  # never back into the pool in autocommit


def _begin_with(session: Session) -> core.BeginWith:
    def begin_with(sql: str, params: tuple[Any, ...]) -> Optional[tuple[Any, ...]]:
        # As for _commit_with, a session bound to an engine over psycopg 3.
        # psycopg would send BEGIN alone before the first statement. Still
        # idle, the connection goes to autocommit (which sends nothing) and
        # BEGIN travels with the claim; the session's COMMIT or
        # ROLLBACK then ends the transaction as always (psycopg sends them
        # whatever the flag), and the pool's check-in turns autocommit off
        # before the connection can serve anyone else.
        bind = session.get_bind()
        if not isinstance(bind, Engine):
            return None
        session.flush()
        proxied = session.connection().connection
        raw = proxied.driver_connection
        if not isinstance(raw, psycopg.Connection) or raw.autocommit \
                or raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            return None
        if not event.contains(bind.pool, "checkin", _autocommit_off):
            event.listen(bind.pool, "checkin", _autocommit_off)
        begin = _sql.begin_statement(raw)
        proxied.info[_AUTOCOMMIT] = True
        raw.autocommit = True
        row = core.joined(raw, sql, params, before=begin).fetchone()
        return None if row is None else tuple(row)

    return begin_with


def _commit_with(session: Session) -> core.CommitWith:
    def commit_with(sql: str, params: tuple[Any, ...]) -> bool:
        # Only for a session bound to an engine (its transaction is the
        # block's own, see _transaction) over psycopg 3; the session's
        # COMMIT at the block's end then sends nothing.
        tx = session.get_transaction()
        if not isinstance(session.get_bind(), Engine) or tx is None or not tx.is_active:
            return False
        session.flush()
        raw = session.connection().connection.driver_connection
        if not isinstance(raw, psycopg.Connection):
            return False
        core.joined(raw, sql, params, after="COMMIT")
        return True

    return commit_with


def _transaction(session: Session) -> core.TransactionFactory:
    def begin() -> Any:
        # A transaction the block owns; a session already in one is a
        # mistake (its earlier writes would commit with the claim).
        if session.in_transaction():
            raise RuntimeError("the session is already in a transaction: claim first, in a fresh one")
        return session.begin()

    return begin


@contextmanager
def claim(session: Session, key: str, biz_type: str, *, fingerprint: Optional[str] = None, wait: bool = True,
          ttl: Optional[str] = None, lease: Optional[str] = None,
          lock_timeout: Optional[str] = None) -> Iterator[Claim]:
    """idem_http.claim() on a session: the block owns the session's transaction."""
    with core.claim_in(_transaction(session), _execute(session), key, biz_type, fingerprint=fingerprint,
                       wait=wait, ttl=ttl, lease=lease, lock_timeout=lock_timeout,
                       begin_with=_begin_with(session)) as c:
        yield c


def handle_request(session: Session, policy: Policy, route: Route, info: RequestInfo,
                   call: Callable[[Optional[Claim]], T], describe: Callable[[T], Response]) -> Union[Response, T]:
    """The HTTP mapping on a session (see idem_http.core.handle_request)."""
    out = core.handle_request(policy, route, info, transaction=_transaction(session), execute=_execute(session),
                              call=call, describe=describe, commit_with=_commit_with(session),
                              begin_with=_begin_with(session))
    return out
