"""The SQL the library sends: one statement per call, positional %s
parameters (psycopg's, also through Django's cursor and SQLAlchemy's
exec_driver_sql), jsonb passed as text and returned as text, so that it works
whatever JSON adapters the framework registered. No named prepared
statements are needed (behind PgBouncer in transaction mode, connect with
prepare_threshold=None)."""

from __future__ import annotations

import json
from typing import Any, Optional

CLAIM = ("SELECT claimed, state, result::text, expires_at FROM idem_claim(%s, %s, ttl => %s::interval, "
         "fingerprint => %s, wait => %s, lease => %s::interval)")
# The same, its wait bounded by lock_timeout, in one round trip: the setting
# is made transaction-local before the claim (the CTE is evaluated first: the
# claim's key comes from it) and restored after it (the select list is
# evaluated on the claim's row), so the handler's own lock waits keep the
# session's setting. Nothing outlives the transaction (PgBouncer-safe).
CLAIM_BOUNDED = ("WITH s AS MATERIALIZED (SELECT %s::text AS k, current_setting('lock_timeout') AS prev, "
                 "set_config('lock_timeout', %s, true) AS bound) "
                 "SELECT c.claimed, c.state, c.result::text, c.expires_at, set_config('lock_timeout', s.prev, true) "
                 "FROM s, LATERAL idem_claim(s.k, %s, ttl => %s::interval, fingerprint => %s, wait => %s, "
                 "lease => %s::interval) c")
COMPLETE = "SELECT idem_complete(%s, %s, %s::jsonb, %s)"
FAIL = "SELECT idem_fail(%s, %s, %s::jsonb, %s)"
CHECKPOINT = "SELECT idem_checkpoint(%s, %s, %s, %s::jsonb, %s)"
RELEASE = "SELECT idem_release(%s, %s, %s)"


def claim_statement(key: str, biz_type: str, ttl: Optional[str], fingerprint: Optional[str], wait: bool,
                    lease: Optional[str], lock_timeout: Optional[str]) -> tuple[str, tuple[Any, ...]]:
    """The claim's statement and parameters: one round trip either way."""
    if lock_timeout is None:
        return CLAIM, (key, biz_type, ttl, fingerprint, wait, lease)
    return CLAIM_BOUNDED, (key, lock_timeout, biz_type, ttl, fingerprint, wait, lease)


def begin_statement(conn: Any) -> str:
    """The BEGIN psycopg would send on `conn` (its isolation level, read-only
    and deferrable settings), for the middleware to send itself, with
    the claim."""
    parts = ["BEGIN"]
    if conn.isolation_level is not None:
        parts.append("ISOLATION LEVEL " + conn.isolation_level.name.replace("_", " "))
    if conn.read_only is not None:
        parts.append("READ ONLY" if conn.read_only else "READ WRITE")
    if conn.deferrable is not None:
        parts.append("DEFERRABLE" if conn.deferrable else "NOT DEFERRABLE")
    return " ".join(parts)


def to_json(value: Any) -> Optional[str]:
    return None if value is None else json.dumps(value)


def from_json(text: Any) -> Any:
    if text is None:
        return None
    if isinstance(text, (bytes, bytearray)):
        text = text.decode()
    if isinstance(text, str):
        return json.loads(text)
    return text  # already decoded by a driver adapter
