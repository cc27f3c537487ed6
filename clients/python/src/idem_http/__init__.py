"""idem-http: the application half of HTTP idempotency for the idem
PostgreSQL extension.

The core API (psycopg 3, sync and async) owns a transaction on a connection:

    with idem_http.claim(conn, key, "orders.create", fingerprint=fp) as c:
        ...

Integrations: idem_http.starlette (FastAPI / Starlette), idem_http.django,
idem_http.sqlalchemy. The HTTP mapping (400/409/422/503, replay with
Idempotent-Replayed: true) is idem_http.Policy.
"""

from .core import Claim, claim, handle_request
from .errors import (ClaimNotFinished, FingerprintMismatch, IdemError, TRANSIENT_SQLSTATES, TransientFailure,
                     is_transient)
from .policy import (REPLAYED_HEADER, Policy, RequestInfo, Response, Route, canonical_body, canonical_json,
                     default_store_status, request_fingerprint)

__version__ = "0.4.0"
__all__ = [
    "Claim", "claim", "handle_request",
    "ClaimNotFinished", "FingerprintMismatch", "IdemError", "TRANSIENT_SQLSTATES", "TransientFailure", "is_transient",
    "REPLAYED_HEADER", "Policy", "RequestInfo", "Response", "Route", "canonical_body", "canonical_json",
    "default_store_status", "request_fingerprint",
]
