"""The SQL the library sends: one statement per call, positional %s
parameters (psycopg's, also through Django's cursor and SQLAlchemy's
exec_driver_sql), jsonb passed as text and returned as text, so that it works
whatever JSON adapters the framework registered. No named prepared
statements are needed (behind PgBouncer in transaction mode, connect with
prepare_threshold=None)."""

from __future__ import annotations

import json
from typing import Any, Optional

# The claim's wait is bounded by lock_timeout; the handler's own lock waits
# after it keep the session's setting, restored right after the claim.
LOCK_TIMEOUT = "SELECT current_setting('lock_timeout'), set_config('lock_timeout', %s, true)"
RESTORE_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', %s, true)"
CLAIM = ("SELECT claimed, state, result::text FROM idem_claim(%s, %s, ttl => %s::interval, "
         "fingerprint => %s, wait => %s, lease => %s::interval)")
COMPLETE = "SELECT idem_complete(%s, %s, %s::jsonb, %s)"
FAIL = "SELECT idem_fail(%s, %s, %s::jsonb, %s)"
CHECKPOINT = "SELECT idem_checkpoint(%s, %s, %s, %s::jsonb, %s)"


def claim_params(key: str, biz_type: str, ttl: Optional[str], fingerprint: Optional[str], wait: bool,
                 lease: Optional[str]) -> tuple[Any, ...]:
    return (key, biz_type, ttl, fingerprint, wait, lease)


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
