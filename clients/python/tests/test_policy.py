"""The framework-independent parts: the canonical body, the fingerprint, the
key parser, the stored document. Runs with pytest or alone
(`python tests/test_policy.py`), against whichever idem_http is installed."""

from __future__ import annotations

import json
import os
from typing import Optional
from urllib.parse import unquote

from idem_http import (PROBLEMS, Policy, RequestInfo, Response, Route, TenantMissing, canonical_body, canonical_json,
                       canonical_target, default_store_status, parse_key_field, request_fingerprint)


def info(body: bytes, method: str = "POST", path: str = "/orders", query: str = "") -> RequestInfo:
    return RequestInfo(method, path, query, {}, body)


def test_canonical_body() -> None:
    assert canonical_body(b'{ "b": 1, "a": [true, null, "x"] }') == b'{"a":[true,null,"x"],"b":1}'
    # numbers are doubles written as ECMAScript writes them (RFC 8785): 1.0 is 1
    assert canonical_body(b'{"n": 1.0}') == canonical_body(b'{"n": 1}') == b'{"n":1}'
    assert canonical_body(b'{"n": 12345678901234567890.5}') == b'{"n":12345678901234567000}'
    assert canonical_body(b'{"a": {"t": 1, "u": 2}}', ["a.t"]) == b'{"a":{"u":2}}'
    assert canonical_body(b"not json \xff") == b"not json \xff"
    assert canonical_body(b"") == b""
    assert canonical_body('{"é": "ü"}'.encode()) == '{"é":"ü"}'.encode()


def test_canonical_json_vectors() -> None:
    """The pairs every idem client checks (tests/middleware/conformance.json)."""
    table = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests", "middleware",
                         "conformance.json")
    if not os.path.exists(table):
        table = os.environ["IDEM_CONFORMANCE_JSON"]
    pairs = json.load(open(table))["canonical_json"]
    for given, canonical in pairs:
        assert canonical_json(json.loads(given)) == canonical, given
    assert len(pairs) > 10


def test_canonical_body_and_target_vectors() -> None:
    """The table's body and target pairs; a target's path as Starlette and
    Django give it (percent-decoded once), its query as sent."""
    table = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests", "middleware",
                         "conformance.json")
    if not os.path.exists(table):
        table = os.environ["IDEM_CONFORMANCE_JSON"]
    t = json.load(open(table))
    for given, canonical in t["canonical_body"]:
        assert canonical_body(given.encode()) == canonical.encode(), given
    for given, canonical in t["canonical_target"]:
        path, _, query = given.partition("?")
        assert canonical_target(unquote(path), query) == canonical, given
    assert len(t["canonical_body"]) > 5 and len(t["canonical_target"]) > 5


def test_fingerprint() -> None:
    a = request_fingerprint(info(b'{"sku": "x", "qty": 1}'))
    assert a == request_fingerprint(info(b'{"qty":1.0,"sku":"x"}'))
    assert len(a) == 32
    assert a != request_fingerprint(info(b'{"sku": "x", "qty": 2}'))
    assert a != request_fingerprint(info(b'{"sku": "x", "qty": 1}', method="PUT"))
    assert a != request_fingerprint(info(b'{"sku": "x", "qty": 1}', path="/orders2"))
    assert a != request_fingerprint(info(b'{"sku": "x", "qty": 1}', query="dry_run=1"))
    # the tenant is part of it
    assert a != request_fingerprint(info(b'{"sku": "x", "qty": 1}'), (), "4:acme")
    p = Policy(single_tenant=True, exclude_fields=("sent_at",))
    r = Route("orders.create")
    assert p.fingerprint_of(info(b'{"sku":"x","sent_at":1}'), r) == p.fingerprint_of(info(b'{"sku":"x","sent_at":2}'), r)


def test_parse_key() -> None:
    p = Policy(single_tenant=True)
    k = "k" * 16
    assert p.parse_key(None) is None
    assert p.parse_key(f'"{k}"') == k
    assert p.parse_key(k) is None  # bare: only with bare_keys=True
    assert Policy(single_tenant=True, bare_keys=True).parse_key(k) == k
    assert p.parse_key(f'"{k}\\"b"') == k + '"b'
    assert p.parse_key(f'"{k}') is None
    assert p.parse_key('""') is None
    assert p.parse_key(f'"{k}", "{k}"') is None
    assert p.parse_key(f'"{k}";a=1') is None
    assert p.parse_key('"' + "k" * 256 + '"') is None
    assert p.parse_key('"' + "k" * 255 + '"') == "k" * 255
    assert p.parse_key('"' + "k" * 15 + '"') is None
    assert p.parse_key(f'"has space {k}"') is None
    assert parse_key_field(f'"{k}\\x"')[1].startswith("a backslash")


def test_store_status() -> None:
    for s in (200, 201, 204, 303, 400, 404, 409, 422):
        assert default_store_status(s), s
    for s in (401, 403, 407, 408, 425, 429, 500, 502, 503, 504):
        assert not default_store_status(s), s
    p = Policy(single_tenant=True)
    assert p.stores(Route("a"), 422) and not p.stores(Route("a", store_status=lambda s: s < 300), 422)


def test_problems() -> None:
    p = Policy(single_tenant=True, problem_base="https://docs.example/errors#")
    r = p.key_refused('"short"')
    doc = json.loads(r.body)
    assert r.status == 400 and doc["type"] == "https://docs.example/errors#idempotency-key-invalid"
    assert doc["title"] == PROBLEMS["idempotency-key-invalid"][1] and doc["status"] == 400 and "5 characters" in doc["detail"]
    assert p.in_progress().status == 409 and p.in_progress().header("Retry-After") == "1"
    assert json.loads(p.key_refused(None).body)["type"].endswith("#idempotency-key-missing")


def test_document_round_trip() -> None:
    r = Response(201, [("Location", "/orders/1"), ("Set-Cookie", "s=1"), ("content-type", "application/json")],
                 b'{"id":1}')
    doc = r.to_document(("location", "Content-Type"))
    assert doc == {"status": 201, "headers": [["Location", "/orders/1"], ["content-type", "application/json"]],
                   "body": '{"id":1}'}
    back = Response.from_document(doc)
    assert back is not None and back.body == b'{"id":1}' and back.header("LOCATION") == "/orders/1"
    binary = Response(200, [], b"\x00\xff")
    assert Response.from_document(binary.to_document(())).body == b"\x00\xff"  # type: ignore[union-attr]
    assert Response.from_document(None) is None
    unstored = Response(200, [], b"x" * 10, body_stored=False).to_document(())
    assert unstored == {"status": 200, "headers": [], "body_stored": False}
    replay = Policy(single_tenant=True).replay(Response.from_document(unstored))
    assert replay.body == b"" and ("Idempotent-Replayed", "true") in replay.headers
    # the Node and Go clients' document and docs/http.md's SQL handler's: headers as an object, a JSON body
    sql = Response.from_document({"status": 201, "headers": {"Location": "/orders/7"}, "body": {"order_id": 7}})
    assert sql is not None and sql.header("location") == "/orders/7" and sql.body == b'{"order_id":7}'
    assert sql.header("content-type") == "application/json"


def test_finished_by_other_code() -> None:
    """No response stored (no integer status): completed, 204 replayed
    without other code's result; failed, 422 response-not-replayable."""
    p = Policy(single_tenant=True)
    for result in (None, {"order_id": 7}, {"status": "201"}, {"status": True}, [1]):
        assert Response.from_document(result) is None, result
        done = p.replay(Response.from_document(result), "completed")
        assert (done.status, done.headers, done.body) == (204, [("Idempotent-Replayed", "true")], b"")
        failed = p.replay(Response.from_document(result), "failed")
        assert failed.status == 422 and json.loads(failed.body)["type"].endswith("#response-not-replayable")
        assert failed.header("Idempotent-Replayed") is None


def test_retry_after_is_the_routes() -> None:
    p = Policy(single_tenant=True, retry_after=3)
    assert p.in_progress().header("Retry-After") == "3"
    leased = Route("charges.create", lease="30 seconds", retry_after=30)
    assert p.in_progress(leased).header("Retry-After") == "30"
    assert p.unavailable("40001", leased).header("Retry-After") == "30"
    assert p.in_progress(Route("charges.create", lease="30 seconds")).header("Retry-After") == "3"


def test_scope() -> None:
    p = Policy(tenant=lambda i: i.header("x-tenant"))
    r = Route("orders.create")

    def scope(tenant: Optional[str], policy: Policy = p, route: Route = r) -> str:
        return policy.scope_of(RequestInfo("POST", "/", "", {"x-tenant": tenant} if tenant else {}, b""), route)

    assert Policy.scoped_key("K", scope("acme")) == "4:acme:K"
    # the spellings that used to collide
    keys = {Policy.scoped_key("K", scope("acme")), Policy.scoped_key("eu:K", scope("acme")),
            Policy.scoped_key("K", scope("acme:eu")), Policy.scoped_key("acme:K", scope(None, route=Route("a", anonymous=True)))}
    assert len(keys) == 4
    assert Policy.scoped_key("K", scope("é")) == "2:é:K"  # UTF-8 bytes
    try:
        scope(None)
        raise AssertionError("no tenant, no anonymous scope: refused")
    except TenantMissing:
        pass
    assert scope(None, Policy(tenant=lambda i: None, anonymous=True)) == "-"
    assert Policy(single_tenant=True).scope_of(RequestInfo("POST", "/", "", {}, b""), r) == "-"
    for bad in ({}, {"tenant": lambda i: "t", "single_tenant": True}, {"single_tenant": True, "anonymous": True}):
        try:
            Policy(**bad)  # type: ignore[arg-type]
            raise AssertionError(f"Policy({bad}) accepted")
        except ValueError as e:
            assert "idem_http.Policy" in str(e)


if __name__ == "__main__":
    for name, fn in list(globals().items()):
        if name.startswith("test_") and callable(fn):
            fn()
            print(f"ok   {name}")
    print("summary: test_policy passed")
