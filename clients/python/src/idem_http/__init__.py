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
from .errors import (ClaimNotFinished, FingerprintMismatch, IdemError, InProgress, TRANSIENT_SQLSTATES,
                     TransientFailure, is_transient)
from .policy import (DEFAULT_PROBLEM_BASE, EXPIRES_HEADER, PROBLEMS, REPLAYED_HEADER, SHARED_SCOPE,
                     TRANSIENT_REFUSALS, Policy, RequestInfo, Response, Route, TenantMissing, canonical_body, canonical_json,
                     canonical_target,
                     default_store_status, parse_key_field, request_fingerprint, tenant_scope)

__version__ = "0.4.0"
__all__ = [
    "Claim", "claim", "handle_request",
    "ClaimNotFinished", "FingerprintMismatch", "IdemError", "InProgress", "TRANSIENT_SQLSTATES", "TransientFailure",
    "is_transient",
    "DEFAULT_PROBLEM_BASE", "EXPIRES_HEADER", "PROBLEMS", "REPLAYED_HEADER", "SHARED_SCOPE", "TRANSIENT_REFUSALS",
    "Policy", "RequestInfo",
    "Response", "Route", "TenantMissing", "canonical_body", "canonical_json", "canonical_target",
    "default_store_status", "parse_key_field", "request_fingerprint", "tenant_scope",
]
