"""What the middleware does, independent of the web framework: reading the
Idempotency-Key header, the request's fingerprint, the key's scope, which
responses are stored, and the HTTP answers for idem's states and SQLSTATEs
(the mapping of the extension's docs/http.md and of the IETF draft "The
Idempotency-Key HTTP Header Field").
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

#: The header a replay carries (a common convention, not part of the draft).
REPLAYED_HEADER = "Idempotent-Replayed"

# The draft defines the header as a Structured Field String ("...", RFC 8941);
# a bare token is accepted too, since many clients send one.
_SF_STRING = re.compile(r'"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"')
_BARE_KEY = re.compile(r"[\x21-\x7e]+")


@dataclass(frozen=True)
class RequestInfo:
    """The parts of a request the policy looks at. `native` is the
    framework's own request object (Starlette's Request, Django's
    HttpRequest), handed to the tenant and fingerprint hooks."""

    method: str
    path: str
    query: str
    headers: Mapping[str, str]  # names in lower case
    body: bytes
    native: Any = None

    def header(self, name: str) -> Optional[str]:
        return self.headers.get(name.lower())


@dataclass
class Response:
    """A response as the middleware stores and replays it: status, headers,
    body. `body_stored` is False for a response whose body was too large or
    streamed: its replay has the status and headers and an empty body."""

    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    body_stored: bool = True

    def to_document(self, stored_headers: Iterable[str]) -> dict[str, Any]:
        """The JSON document given to idem_complete / idem_fail: the status,
        the headers named in `stored_headers` (case-insensitive), and the body
        as text (UTF-8) or base64 when it is not text."""
        keep = {h.lower() for h in stored_headers}
        doc: dict[str, Any] = {
            "status": self.status,
            "headers": [[n, v] for n, v in self.headers if n.lower() in keep],
        }
        if not self.body_stored:
            doc["body_stored"] = False
        else:
            try:
                doc["body"] = self.body.decode("utf-8")
            except UnicodeDecodeError:
                doc["body_b64"] = base64.b64encode(self.body).decode("ascii")
        return doc

    @classmethod
    def from_document(cls, doc: Any) -> Optional["Response"]:
        """The stored response, or None if the document is not one (a claim
        committed without a result, or one made by other code)."""
        if not isinstance(doc, dict) or not isinstance(doc.get("status"), int):
            return None
        headers = [(str(h[0]), str(h[1])) for h in doc.get("headers") or [] if isinstance(h, (list, tuple)) and len(h) == 2]
        if "body_b64" in doc:
            return cls(doc["status"], headers, base64.b64decode(doc["body_b64"]))
        body = doc.get("body")
        if isinstance(body, str):
            return cls(doc["status"], headers, body.encode("utf-8"))
        if body is None:
            return cls(doc["status"], headers, b"", body_stored=bool(doc.get("body_stored", True)))
        return cls(doc["status"], headers, json.dumps(body).encode("utf-8"))

    def header(self, name: str) -> Optional[str]:
        for n, v in self.headers:
            if n.lower() == name.lower():
                return v
        return None


def default_store_status(status: int) -> bool:
    """2xx and 4xx are stored (4xx as a business failure, with idem_fail);
    anything else (5xx) rolls back, so that a retry runs the operation again."""
    return 200 <= status < 300 or 400 <= status < 500


@dataclass(frozen=True)
class Route:
    """One idempotent operation: its business type (idem's `biz_type`, one per
    endpoint or operation, `^[A-Za-z0-9_.:-]{1,64}$`) and what differs from
    the policy for it."""

    biz_type: str
    #: False: a request without the header runs without idempotency.
    key_required: bool = True
    #: None: the policy's. True: a duplicate waits for the first request's
    #: transaction (bounded by lock_timeout); False: it gets 409 at once.
    wait: Optional[bool] = None
    #: The claim's TTL (a PostgreSQL interval), None: idem_configure's or the default.
    ttl: Optional[str] = None
    #: Lease mode, for handlers that call external services: the claim is
    #: committed first with this lease (a PostgreSQL interval); the handler
    #: records recovery points; the response is stored with the lease token.
    lease: Optional[str] = None
    #: Top-level JSON fields (or dotted paths) left out of the fingerprint.
    exclude_fields: tuple[str, ...] = ()
    #: None: the policy's lock_timeout (the bound of a duplicate's wait).
    lock_timeout: Optional[str] = None


RouteLike = Union[Route, str]


def as_route(r: RouteLike) -> Route:
    return r if isinstance(r, Route) else Route(biz_type=r)


@dataclass
class Policy:
    """How requests are made idempotent; defaults from docs/http.md and the draft."""

    header: str = "Idempotency-Key"
    min_key_length: int = 1
    max_key_length: int = 255
    #: Duplicates wait for the first transaction (True) or get 409 (False).
    wait: bool = True
    #: Bounds the wait (SET LOCAL lock_timeout); 55P03 then answers 503.
    #: None leaves the session's setting.
    lock_timeout: Optional[str] = "5s"
    #: Seconds, for 409 and 503.
    retry_after: int = 1
    #: Response headers stored with the status and body, replayed as they were.
    stored_headers: tuple[str, ...] = ("content-type", "location", "content-language")
    store_status: Callable[[int], bool] = default_store_status
    #: Larger (or streamed) bodies are passed through and not stored: the
    #: claim stores status and headers only (see the README).
    max_stored_body: int = 256 * 1024
    #: The tenant of a request, from the authenticated principal (never from
    #: a header the client chooses); the key is scoped as "tenant:key".
    tenant: Optional[Callable[[RequestInfo], Optional[str]]] = None
    #: Replaces the fingerprint: any string identifying the request.
    fingerprint: Optional[Callable[[RequestInfo, Route], str]] = None
    #: Top-level JSON fields (or dotted paths) left out of every fingerprint.
    exclude_fields: tuple[str, ...] = ()
    #: Problem details' "type" base URI; None: about:blank.
    problem_type_base: Optional[str] = None
    #: Called at "before_commit" and "after_commit" of a request's transaction
    #: (metrics, tracing; the project's tests use it as a kill point).
    phase_hook: Optional[Callable[[str, RequestInfo], None]] = None

    def lock_timeout_for(self, route: Route) -> Optional[str]:
        return route.lock_timeout if route.lock_timeout is not None else self.lock_timeout

    def phase(self, name: str, info: RequestInfo) -> None:
        if self.phase_hook is not None:
            self.phase_hook(name, info)

    # --- the key -----------------------------------------------------------

    def parse_key(self, raw: Optional[str]) -> Optional[str]:
        """The key's value, or None if missing or malformed."""
        if raw is None:
            return None
        raw = raw.strip()
        m = _SF_STRING.fullmatch(raw)
        if m:
            key = re.sub(r'\\(["\\])', r"\1", m.group(1))
        elif _BARE_KEY.fullmatch(raw) and not raw.startswith('"'):
            key = raw
        else:
            return None
        if not (self.min_key_length <= len(key) <= self.max_key_length):
            return None
        return key

    def scoped_key(self, key: str, info: RequestInfo) -> str:
        tenant = self.tenant(info) if self.tenant is not None else None
        return key if tenant is None else f"{tenant}:{key}"

    # --- the fingerprint ---------------------------------------------------

    def fingerprint_of(self, info: RequestInfo, route: Route) -> str:
        if self.fingerprint is not None:
            return self.fingerprint(info, route)
        return request_fingerprint(info, (*self.exclude_fields, *route.exclude_fields))

    # --- answers -----------------------------------------------------------

    def problem(self, status: int, slug: str, title: str, detail: Optional[str] = None,
                headers: Sequence[tuple[str, str]] = ()) -> Response:
        """An answer that is never stored, as RFC 9457 problem details."""
        doc: dict[str, Any] = {
            "type": f"{self.problem_type_base.rstrip('/')}/{slug}" if self.problem_type_base else "about:blank",
            "title": title,
            "status": status,
        }
        if detail:
            doc["detail"] = detail
        body = json.dumps(doc).encode()
        return Response(status, [("Content-Type", "application/problem+json"), *headers], body)

    def missing_key(self, raw: Optional[str]) -> Response:
        what = "missing" if raw is None else "malformed"
        return self.problem(400, "idempotency-key-missing" if raw is None else "idempotency-key-malformed",
                            f"The {self.header} header is {what}",
                            f"Send {self.header}: \"<key>\", {self.min_key_length} to {self.max_key_length} "
                            "visible ASCII characters, made once per intent.")

    def in_progress(self) -> Response:
        return self.problem(409, "request-in-progress", "A request with this Idempotency-Key is being processed",
                            "Retry later with the same key.", [("Retry-After", str(self.retry_after))])

    def mismatch(self) -> Response:
        return self.problem(422, "idempotency-key-reused",
                            "This Idempotency-Key was used for a different request",
                            "Do not retry this request; a new request needs a new key.")

    def unavailable(self, sqlstate: Optional[str]) -> Response:
        return self.problem(503, "transient-failure", "Service Unavailable",
                            f"A transient database failure ({sqlstate or 'connection lost'}); "
                            "nothing was done, retry with the same key.",
                            [("Retry-After", str(self.retry_after))])

    def replay(self, stored: Optional[Response]) -> Response:
        if stored is None:
            # A claim committed by other code without a stored response.
            return self.problem(409, "no-stored-response",
                                "This Idempotency-Key was used, and its response cannot be replayed")
        return Response(stored.status, [*stored.headers, (REPLAYED_HEADER, "true")], stored.body,
                        stored.body_stored)


# --- canonical form and fingerprint ------------------------------------------


def canonical_json(value: Any) -> str:
    """JSON in one canonical form: object keys sorted, no insignificant
    whitespace, numbers in their written form (1.0 is not 1), as PostgreSQL's
    jsonb text is canonical."""
    if isinstance(value, dict):
        items = sorted(value.items())
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + canonical_json(v) for k, v in items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(canonical_json(v) for v in value) + "]"
    if isinstance(value, Decimal):
        return str(value)
    return json.dumps(value, ensure_ascii=False)


def _drop(value: Any, path: list[str]) -> None:
    if not isinstance(value, dict) or not path:
        return
    if len(path) == 1:
        value.pop(path[0], None)
    else:
        _drop(value.get(path[0]), path[1:])


def canonical_body(body: bytes, exclude_fields: Iterable[str] = ()) -> bytes:
    """The body's canonical form: parsed and re-serialised if it is JSON
    (less the excluded fields), else the bytes as they are."""
    try:
        value = json.loads(body, parse_float=Decimal, parse_int=Decimal) if body.strip() else None
    except (ValueError, UnicodeDecodeError):
        return body
    if value is None and not body.strip():
        return b""
    for f in exclude_fields:
        _drop(value, f.split("."))
    return canonical_json(value).encode("utf-8")


def request_fingerprint(info: RequestInfo, exclude_fields: Iterable[str] = ()) -> str:
    """128 bits of SHA-256 (32 hex digits) over the method, the path, the
    query string and the canonical body; never the headers (tokens rotate,
    trace ids change between retries)."""
    h = hashlib.sha256()
    h.update(f"{info.method.upper()} {info.path}?{info.query}\n".encode("utf-8"))
    h.update(canonical_body(info.body, exclude_fields))
    return h.hexdigest()[:32]
