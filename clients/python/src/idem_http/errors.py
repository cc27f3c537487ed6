"""Errors the library raises, and how a database error is classified.

The SQLSTATEs are idem's (see the extension's README, "SQLSTATEs"):
ID001 is a fingerprint mismatch; 40001, 40P01, 55P03 and 57014 and a lost
connection are transient: the transaction rolled back, the claim with it,
and a retry with the same key runs the operation again.
"""

from __future__ import annotations

from typing import Optional

import psycopg

#: SQLSTATEs after which the transaction (and the claim) rolled back and a
#: retry may succeed: serialization failure, deadlock, lock_timeout,
#: statement_timeout.
TRANSIENT_SQLSTATES = frozenset({"40001", "40P01", "55P03", "57014"})
FINGERPRINT_MISMATCH = "ID001"
LOCK_NOT_AVAILABLE = "55P03"


class IdemError(Exception):
    """Base class of the errors raised by idem_http."""


class FingerprintMismatch(IdemError):
    """The key was first used for a different request (SQLSTATE ID001).
    Nothing was written; answer 422 and do not retry."""


class TransientFailure(IdemError):
    """A transient database failure (40001, 40P01, 55P03, 57014, a lost
    connection): everything rolled back, the claim too; answer 503 with
    Retry-After, and a retry with the same key runs the operation again."""

    def __init__(self, message: str, sqlstate: Optional[str] = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class InProgress(IdemError):
    """A duplicate's wait for the first request's transaction ran out
    (lock_timeout, 55P03, raised by the claim itself): the first is still
    in progress; answer 409 with Retry-After."""


class ClaimNotFinished(IdemError):
    """A claim's block ended without complete() or fail(): the transaction
    was rolled back, so that a response is never committed without being
    stored (a retry could not rebuild it)."""


def sqlstate_of(exc: BaseException) -> Optional[str]:
    """The SQLSTATE of a psycopg error, also when a framework wrapped it
    (Django's DatabaseError, SQLAlchemy's DBAPIError keep it as the cause or
    as .orig)."""
    seen = 0
    e: Optional[BaseException] = exc
    while e is not None and seen < 5:
        state = getattr(e, "sqlstate", None)
        if isinstance(state, str):
            return state
        orig = getattr(e, "orig", None)
        if isinstance(orig, BaseException) and orig is not e:
            e = orig
        else:
            e = e.__cause__
        seen += 1
    return None


def _psycopg_error(exc: BaseException) -> Optional[psycopg.Error]:
    e: Optional[BaseException] = exc
    for _ in range(5):
        if e is None:
            return None
        if isinstance(e, psycopg.Error):
            return e
        orig = getattr(e, "orig", None)
        e = orig if isinstance(orig, BaseException) else e.__cause__
    return None


def is_transient(exc: BaseException) -> bool:
    """True for the failures a retry may cure: the transient SQLSTATEs, and a
    connection lost or refused (psycopg's OperationalError without a
    SQLSTATE, which is what a dropped connection raises)."""
    if isinstance(exc, TransientFailure):
        return True
    state = sqlstate_of(exc)
    if state is not None:
        return state in TRANSIENT_SQLSTATES or state.startswith("08") or state in ("57P01", "57P02", "57P03")
    pg = _psycopg_error(exc)
    return isinstance(pg, psycopg.OperationalError)


def classify(exc: BaseException) -> Optional[IdemError]:
    """The library's error for a database error, or None if it is neither a
    fingerprint mismatch nor transient (then it is a bug or a mistake: let it
    propagate)."""
    if isinstance(exc, IdemError):
        return exc
    state = sqlstate_of(exc)
    if state == FINGERPRINT_MISMATCH:
        return FingerprintMismatch(str(exc))
    if is_transient(exc):
        return TransientFailure(str(exc), state)
    return None
