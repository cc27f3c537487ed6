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
import logging
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

#: The header a replay carries (a common convention, not part of the draft).
REPLAYED_HEADER = "Idempotent-Replayed"
#: On a replay: until when the key's stored response is kept (an HTTP-date);
#: a retry after it runs the operation again (docs/http.md, "What is stored").
EXPIRES_HEADER = "Idempotent-Expires"

#: Where the problem types are documented: a problem's "type" is this base
#: followed by its slug (an anchor of docs/http.md, "Problem types"). Set
#: Policy(problem_base=...) to your API's own documentation.
DEFAULT_PROBLEM_BASE = "https://github.com/idem-pg/idem/blob/main/docs/http.md#"

#: The problem types (docs/http.md, "Problem types"): slug -> (status,
#: title). The title is the type's, the same for every occurrence; what
#: differs from case to case goes into "detail".
PROBLEMS: dict[str, tuple[int, str]] = {
    "idempotency-key-missing": (400, "Idempotency-Key missing"),
    "idempotency-key-invalid": (400, "Idempotency-Key invalid"),
    "idempotency-key-reused": (422, "Idempotency-Key reused for a different request"),
    "request-in-progress": (409, "Request in progress"),
    "response-not-replayable": (422, "Stored response not replayable"),
    "transient-failure": (503, "Transient failure"),
    "tenant-missing": (500, "No tenant for this request"),
    "internal-error": (500, "Response not stored"),
}

#: A bare (unquoted) key, accepted only with Policy(bare_keys=True): visible
#: ASCII without the characters that delimit structured fields.
_BARE_KEY = re.compile(r'[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]+')
_KEY_CHARS = re.compile(r"[\x21-\x7e]*")


def parse_key_field(raw: str, min_length: int = 16, max_length: int = 255,
                    bare_keys: bool = False) -> tuple[Optional[str], str]:
    """The key in an Idempotency-Key field value (all its field lines joined
    with commas, as HTTP combines them), or (None, why not). The value must
    be exactly one RFC 8941 sf-string without parameters; its content 
    min_length to max_length visible ASCII characters."""
    s = raw.strip(" \t")
    if s.startswith('"'):
        out: list[str] = []
        i = 1
        while True:
            if i >= len(s):
                return None, "the quoted string is not terminated"
            ch = s[i]
            if ch == "\\":
                if i + 1 >= len(s) or s[i + 1] not in '"\\':
                    return None, "a backslash in a quoted string may only escape \" or \\"
                out.append(s[i + 1])
                i += 2
                continue
            if ch == '"':
                break
            if not 0x20 <= ord(ch) <= 0x7E:
                return None, "the quoted string holds a character outside printable ASCII"
            out.append(ch)
            i += 1
        rest = s[i + 1:].lstrip(" \t")
        if rest:
            return None, ("the field holds more than one value" if rest.startswith(",")
                          else "text follows the quoted string (parameters are not allowed)")
        key = "".join(out)
    elif bare_keys and _BARE_KEY.fullmatch(s):
        key = s
    else:
        return None, 'the value must be one quoted string (RFC 8941 sf-string), e.g. "8e03978e-40d5-43e8-bc93-6894a57f9324"'
    if not min_length <= len(key) <= max_length:
        return None, f"the key has {len(key)} characters; it must have {min_length} to {max_length}"
    if not _KEY_CHARS.fullmatch(key):
        return None, "the key must be visible ASCII characters (no spaces)"
    return key, ""


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
        """The stored response, or None if the document is not one (no
        integer status: a claim committed without a result, or other code's
        own result). Reads this library's document, the Node and Go clients'
        (headers as an object) and docs/http.md's SQL handler's (a JSON body)."""
        status = doc.get("status") if isinstance(doc, dict) else None
        if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
            return None
        raw = doc.get("headers") or []
        pairs = raw.items() if isinstance(raw, dict) else [h for h in raw if isinstance(h, (list, tuple)) and len(h) == 2]
        headers: list[tuple[str, str]] = []
        for n, v in pairs:
            headers.extend((str(n), str(x)) for x in (v if isinstance(v, list) else [v]))
        if "body_b64" in doc:
            return cls(status, headers, base64.b64decode(doc["body_b64"]))
        body = doc.get("body")
        if isinstance(body, str):
            data = base64.b64decode(body) if doc.get("encoding") == "base64" else body.encode("utf-8")
            return cls(status, headers, data)
        if body is None:
            stored = bool(doc.get("body_stored", True)) and not doc.get("body_omitted")
            return cls(status, headers, b"", body_stored=stored)
        r = cls(status, headers, json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
        if r.header("Content-Type") is None:
            r.headers.append(("Content-Type", "application/json"))
        return r

    def header(self, name: str) -> Optional[str]:
        for n, v in self.headers:
            if n.lower() == name.lower():
                return v
        return None


#: Refusals that say nothing about the operation, only about this attempt:
#: authentication (401, 407), authorization or CSRF (403), a timeout (408),
#: too early (425), rate limiting (429). Never stored, whatever the class.
TRANSIENT_REFUSALS = frozenset({401, 403, 407, 408, 425, 429})


def default_store_status(status: int) -> bool:
    """2xx and 3xx are stored (idem_complete), and the deterministic 4xx
    (400, 404, 409, 422, ...) as a business failure (idem_fail); never
    TRANSIENT_REFUSALS or 5xx: those roll back, claim included, so that a
    retry runs the operation."""
    if status in TRANSIENT_REFUSALS:
        return False
    return 200 <= status < 500


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
    #: None: the policy's store_status. Which statuses of this route are
    #: stored (and committed); the others roll back.
    store_status: Optional[Callable[[int], bool]] = None
    #: None: the policy's anonymous. True: a request whose tenant hook
    #: returns None is claimed in the anonymous scope instead of refused.
    anonymous: Optional[bool] = None
    #: None: the policy's retry_after. Seconds in Retry-After of this
    #: route's 409 and 503 (a leased route whose work takes long: its lease).
    retry_after: Optional[int] = None


RouteLike = Union[Route, str]


def as_route(r: RouteLike) -> Route:
    return r if isinstance(r, Route) else Route(biz_type=r)


def tenant_scope(tenant: Optional[str]) -> str:
    """A tenant's scope, "<UTF-8 length of tenant>:<tenant>"; None: the shared scope "-"."""
    return SHARED_SCOPE if tenant is None else f"{len(tenant.encode('utf-8'))}:{tenant}"


class TenantMissing(Exception):
    """The tenant hook returned no tenant for a request of a route that has
    no anonymous scope: a server configuration mistake, answered 500."""


#: The scope of a request without a tenant (single_tenant, or anonymous):
#: "-", which no tenant's scope ("<length>:<tenant>") can equal.
SHARED_SCOPE = "-"

_log = logging.getLogger("idem_http")


@dataclass
class Policy:
    """How requests are made idempotent (docs/http.md, "The rules"). The
    key's scope must be chosen: `tenant` (a hook returning the tenant of the
    authenticated caller) or `single_tenant=True` (every caller shares one
    key space: an API with one client, or one account); neither raises
    ValueError here, at start-up."""

    header: str = "Idempotency-Key"
    min_key_length: int = 16
    max_key_length: int = 255
    #: Accept an unquoted key (Idempotency-Key: abc...) as well as the
    #: draft's quoted sf-string, for clients that send Stripe-style keys.
    bare_keys: bool = False
    #: Duplicates wait for the first transaction (True) or get 409 (False).
    wait: bool = True
    #: Bounds a duplicate's wait (set_config('lock_timeout', ..., true) in the
    #: claim's statement); when it ends: 409 + Retry-After. None leaves the
    #: session's setting.
    lock_timeout: Optional[str] = "5s"
    #: Seconds, for 409 and 503.
    retry_after: int = 1
    #: Response headers stored with the status and body, replayed as they were.
    stored_headers: tuple[str, ...] = ("content-type", "location")
    #: Which statuses are stored; the others roll back (see default_store_status).
    store_status: Callable[[int], bool] = default_store_status
    #: Larger (or streamed) bodies are passed through and not stored: the
    #: claim stores status and headers only (see the README).
    max_stored_body: int = 256 * 1024
    #: The tenant of a request, from the authenticated principal (never from
    #: a header the client chooses). The claimed key is
    #: "<UTF-8 length of tenant>:<tenant>:<key>", and the tenant is part of
    #: the fingerprint.
    tenant: Optional[Callable[[RequestInfo], Optional[str]]] = None
    #: No tenant hook: every caller shares one key space (claimed key "-:<key>").
    single_tenant: bool = False
    #: With a tenant hook: a request whose hook returns None is claimed in
    #: the anonymous scope "-:<key>" (shared by every anonymous caller)
    #: instead of refused with 500.
    anonymous: bool = False
    #: Replaces the fingerprint: any string identifying the request.
    fingerprint: Optional[Callable[[RequestInfo, Route], str]] = None
    #: Top-level JSON fields (or dotted paths) left out of every fingerprint.
    exclude_fields: tuple[str, ...] = ()
    #: Problem details' "type" is this base followed by the problem's slug.
    problem_base: str = DEFAULT_PROBLEM_BASE
    #: Called at "before_commit" and "after_commit" of a request's transaction
    #: (metrics, tracing; the project's tests use it as a kill point).
    phase_hook: Optional[Callable[[str, RequestInfo], None]] = None

    def __post_init__(self) -> None:
        if self.tenant is None and not self.single_tenant:
            raise ValueError(
                "idem_http.Policy: choose the key scope: tenant=<function returning the authenticated "
                "caller's tenant> (keys of different tenants never meet), or single_tenant=True (every caller "
                "shares one key space). Without either, one caller could be replayed another's response.")
        if self.tenant is not None and self.single_tenant:
            raise ValueError("idem_http.Policy: tenant= and single_tenant=True exclude each other")
        if self.anonymous and self.tenant is None:
            raise ValueError("idem_http.Policy: anonymous=True needs a tenant= hook")
        if not 1 <= self.min_key_length <= self.max_key_length <= 255:
            raise ValueError("idem_http.Policy: need 1 <= min_key_length <= max_key_length <= 255")

    def lock_timeout_for(self, route: Route) -> Optional[str]:
        return route.lock_timeout if route.lock_timeout is not None else self.lock_timeout

    def stores(self, route: Route, status: int) -> bool:
        return (route.store_status or self.store_status)(status)

    def phase(self, name: str, info: RequestInfo) -> None:
        if self.phase_hook is not None:
            self.phase_hook(name, info)

    # --- the key -----------------------------------------------------------

    def parse_key(self, raw: Optional[str]) -> Optional[str]:
        """The key's value, or None if missing or invalid."""
        if raw is None:
            return None
        return parse_key_field(raw, self.min_key_length, self.max_key_length, self.bare_keys)[0]

    def scope_of(self, info: RequestInfo, route: Route) -> str:
        """The request's scope: "<length>:<tenant>", or SHARED_SCOPE. Raises
        TenantMissing when the hook finds no tenant and the route has no
        anonymous scope."""
        if self.tenant is None:
            return SHARED_SCOPE
        tenant = self.tenant(info)
        if tenant is None or tenant == "":
            if route.anonymous if route.anonymous is not None else self.anonymous:
                return SHARED_SCOPE
            _log.error("idem_http: the tenant hook returned no tenant for %s %s (route %s); answered 500. "
                       "Authenticate before this middleware, or allow anonymous callers (anonymous=True).",
                       info.method, info.path, route.biz_type)
            raise TenantMissing(f"no tenant for {info.method} {info.path}")
        if not isinstance(tenant, str):
            raise TypeError(f"idem_http: the tenant hook must return a str or None, not {type(tenant).__name__}")
        return tenant_scope(tenant)

    @staticmethod
    def scoped_key(key: str, scope: str) -> str:
        """The key idem claims: the scope, ":", the client's key. Injective:
        a tenant's scope says its own length, and "-" is no tenant's."""
        return f"{scope}:{key}"

    # --- the fingerprint ---------------------------------------------------

    def fingerprint_of(self, info: RequestInfo, route: Route, scope: str = SHARED_SCOPE) -> str:
        if self.fingerprint is not None:
            return self.fingerprint(info, route)
        return request_fingerprint(info, (*self.exclude_fields, *route.exclude_fields), scope)

    # --- answers -----------------------------------------------------------

    def problem(self, slug: str, detail: str, headers: Sequence[tuple[str, str]] = ()) -> Response:
        """An answer that is never stored: RFC 9457 problem details of one of
        the PROBLEMS types."""
        status, title = PROBLEMS[slug]
        doc = {"type": self.problem_base + slug, "title": title, "status": status, "detail": detail}
        return Response(status, [("Content-Type", "application/problem+json"), *headers], json.dumps(doc).encode())

    def key_refused(self, raw: Optional[str]) -> Response:
        if raw is None:
            return self.problem("idempotency-key-missing",
                                f'Send {self.header}: "<key>", {self.min_key_length} to {self.max_key_length} '
                                "visible ASCII characters, made once per intent.")
        why = parse_key_field(raw, self.min_key_length, self.max_key_length, self.bare_keys)[1]
        return self.problem("idempotency-key-invalid", f"{self.header}: {why}.")

    def retry_after_for(self, route: Optional[Route]) -> int:
        return route.retry_after if route is not None and route.retry_after is not None else self.retry_after

    def in_progress(self, route: Optional[Route] = None) -> Response:
        return self.problem("request-in-progress",
                            "A request with this Idempotency-Key is being processed; retry later with the same key.",
                            [("Retry-After", str(self.retry_after_for(route)))])

    def mismatch(self) -> Response:
        return self.problem("idempotency-key-reused",
                            "This Idempotency-Key was first used for a different request; do not retry this "
                            "request, a new request needs a new key.")

    def unavailable(self, sqlstate: Optional[str], route: Optional[Route] = None) -> Response:
        return self.problem("transient-failure",
                            f"A transient database failure ({sqlstate or 'connection lost'}); nothing was done, "
                            "retry with the same Idempotency-Key.",
                            [("Retry-After", str(self.retry_after_for(route)))])

    def internal_error(self) -> Response:
        return self.problem("internal-error",
                            "The response could not be stored; nothing was committed, or the outcome is unknown.")

    def tenant_missing(self) -> Response:
        return self.problem("tenant-missing", "The server found no tenant for this request; nothing was done.")

    def replay(self, stored: Optional[Response], state: str = "completed",
               expires: Optional[str] = None) -> Response:
        """A duplicate's answer, with `expires` (an HTTP-date) as
        Idempotent-Expires. A claim finished by other code without a
        response (docs/http.md, "Finished by other code"): completed, 204
        (done; other code's result is not the client's to see); failed, 422
        response-not-replayable."""
        marks = [(REPLAYED_HEADER, "true")] + ([(EXPIRES_HEADER, expires)] if expires else [])
        if stored is None:
            if state == "completed":
                return Response(204, marks)
            return self.problem("response-not-replayable",
                                "The request with this Idempotency-Key failed, and no response was stored for it; "
                                "a new request needs a new key.")
        return Response(stored.status, [*stored.headers, *marks], stored.body, stored.body_stored)


# --- canonical form and fingerprint ------------------------------------------


def _es_number(x: float) -> str:
    """A number as ECMAScript's Number::toString writes it (RFC 8785 3.2.2.3):
    the shortest digits that round-trip, in plain notation from 1e-6 to 1e21."""
    if x != x or x in (float("inf"), float("-inf")):
        return "null"  # as JSON.stringify writes a number out of the double range
    if x == 0:
        return "0"
    if x < 0:
        return "-" + _es_number(-x)
    sign, digits_t, exp = Decimal(repr(x)).as_tuple()
    digits = "".join(map(str, digits_t)).rstrip("0")
    exp = int(exp) + (len(digits_t) - len(digits))
    k = len(digits)
    n = exp + k
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return "0." + "0" * (-n) + digits
    e = n - 1
    mantissa = digits if k == 1 else digits[0] + "." + digits[1:]
    return f"{mantissa}e{'+' if e >= 0 else '-'}{abs(e)}"


def canonical_json(value: Any) -> str:
    """JSON in one canonical form, RFC 8785 (JCS): object members sorted by
    their names' UTF-16 code units, no insignificant whitespace, numbers as
    IEEE 754 doubles written as ECMAScript writes them (1.0, 1 and 1e0 are
    one number; digits beyond a double's precision do not count), strings
    as JSON.stringify escapes them. The same in every idem client."""
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: kv[0].encode("utf-16-be", "surrogatepass"))
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + canonical_json(v) for k, v in items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(canonical_json(v) for v in value) + "]"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float, Decimal)):
        try:
            return _es_number(float(value))
        except OverflowError:
            return "null"
    return json.dumps(value, ensure_ascii=False)


def _drop(value: Any, path: list[str]) -> None:
    if not isinstance(value, dict) or not path:
        return
    if len(path) == 1:
        value.pop(path[0], None)
    else:
        _drop(value.get(path[0]), path[1:])


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def canonical_body(body: bytes, exclude_fields: Iterable[str] = ()) -> bytes:
    """The body's canonical form: parsed and re-serialised if it is JSON
    (less the excluded fields), else the bytes as they are (NaN and
    Infinity, which Python's json accepts, are not JSON)."""
    try:
        value = json.loads(body.decode("utf-8"), parse_constant=_not_json) if body.strip() else None
    except (ValueError, UnicodeDecodeError):
        return body
    if value is None and not body.strip():
        return b""
    for f in exclude_fields:
        _drop(value, f.split("."))
    return canonical_json(value).encode("utf-8")


_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")


def canonical_target(path: str, query: str = "") -> str:
    """The request target as every idem client counts it (docs/http.md, "The
    fingerprint"): the decoded path (as Starlette and Django give it) with
    every byte but the unreserved characters and "/" percent-encoded in
    upper-case hex; the query as sent, its escapes normalised (upper-case
    hex, unreserved characters decoded: RFC 3986, 6.2.2); "?" only before a
    query."""
    out = "".join(chr(b) if b in _UNRESERVED or b == 0x2F else f"%{b:02X}"
                  for b in path.encode("utf-8", "surrogateescape"))
    if not query:
        return out

    def norm(m: "re.Match[str]") -> str:
        b = int(m.group(1), 16)
        return chr(b) if b in _UNRESERVED else f"%{b:02X}"

    return f"{out}?{_ESCAPE.sub(norm, query)}"


def request_fingerprint(info: RequestInfo, exclude_fields: Iterable[str] = (), scope: str = SHARED_SCOPE) -> str:
    """128 bits of SHA-256 (32 hex digits) over "METHOD target\\nscope\\n"
    and the canonical body, where target is canonical_target(path, query);
    never the headers (tokens rotate, trace ids change between retries)."""
    h = hashlib.sha256()
    target = canonical_target(info.path, info.query)
    h.update(f"{info.method.upper()} {target}\n{scope}\n".encode("utf-8"))
    h.update(canonical_body(info.body, exclude_fields))
    return h.hexdigest()[:32]
