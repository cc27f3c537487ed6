"""The framework-independent parts: the canonical body, the fingerprint, the
key parser, the stored document. Runs with pytest or alone
(`python tests/test_policy.py`), against whichever idem_http is installed."""

from __future__ import annotations

from idem_http import Policy, RequestInfo, Response, Route, canonical_body, request_fingerprint


def info(body: bytes, method: str = "POST", path: str = "/orders", query: str = "") -> RequestInfo:
    return RequestInfo(method, path, query, {}, body)


def test_canonical_body() -> None:
    assert canonical_body(b'{ "b": 1, "a": [true, null, "x"] }') == b'{"a":[true,null,"x"],"b":1}'
    # numbers keep their written form, as jsonb's text does
    assert canonical_body(b'{"n": 1.0}') != canonical_body(b'{"n": 1}')
    assert canonical_body(b'{"n": 12345678901234567890.5}') == b'{"n":12345678901234567890.5}'
    assert canonical_body(b'{"a": {"t": 1, "u": 2}}', ["a.t"]) == b'{"a":{"u":2}}'
    assert canonical_body(b"not json \xff") == b"not json \xff"
    assert canonical_body(b"") == b""
    assert canonical_body('{"é": "ü"}'.encode()) == '{"é":"ü"}'.encode()


def test_fingerprint() -> None:
    a = request_fingerprint(info(b'{"sku": "x", "qty": 1}'))
    assert a == request_fingerprint(info(b'{"qty":1,"sku":"x"}'))
    assert len(a) == 32
    assert a != request_fingerprint(info(b'{"sku": "x", "qty": 2}'))
    assert a != request_fingerprint(info(b'{"sku": "x", "qty": 1}', method="PUT"))
    assert a != request_fingerprint(info(b'{"sku": "x", "qty": 1}', path="/orders2"))
    assert a != request_fingerprint(info(b'{"sku": "x", "qty": 1}', query="dry_run=1"))
    p = Policy(exclude_fields=("sent_at",))
    r = Route("orders.create")
    assert p.fingerprint_of(info(b'{"sku":"x","sent_at":1}'), r) == p.fingerprint_of(info(b'{"sku":"x","sent_at":2}'), r)


def test_parse_key() -> None:
    p = Policy()
    assert p.parse_key(None) is None
    assert p.parse_key('"abc-123"') == "abc-123"
    assert p.parse_key("abc-123") == "abc-123"
    assert p.parse_key('"a\\"b"') == 'a"b'
    assert p.parse_key('"unterminated') is None
    assert p.parse_key('""') is None
    assert p.parse_key('"' + "k" * 256 + '"') is None
    assert p.parse_key("has space") is None
    assert Policy(min_key_length=16).parse_key('"short"') is None


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
    replay = Policy().replay(Response.from_document(unstored))
    assert replay.body == b"" and ("Idempotent-Replayed", "true") in replay.headers


def test_scope() -> None:
    p = Policy(tenant=lambda i: i.header("x-tenant"))
    i = RequestInfo("POST", "/", "", {"x-tenant": "t1"}, b"")
    assert p.scoped_key("k", i) == "t1:k"
    assert Policy().scoped_key("k", i) == "k"


if __name__ == "__main__":
    for name, fn in list(globals().items()):
        if name.startswith("test_") and callable(fn):
            fn()
            print(f"ok   {name}")
    print("summary: test_policy passed")
