"""A payments endpoint that honours the Idempotency-Key header, with the
idem-http package (clients/python) doing the HTTP half.

POST /payments with a JSON body {"order": ..., "amount": "42.00", "currency": ..., "card": ...}
and the headers X-Client-Id (who is calling; in a real service it comes from
authentication) and Idempotency-Key. Everything the request does happens in
one database transaction, owned by idem_http.claim():

    with idem_http.claim(db, key, 'payment-api', fingerprint=..., wait=False) as c:   # idem_claim
        INSERT INTO payments ...                          (only when claimed)
        c.complete(response) or c.fail(response) for a declined card
    COMMIT (end of the block), then the response is sent

Responses, as the IETF draft "The Idempotency-Key HTTP Header Field" maps them
(idem_http.Policy builds the non-stored ones):
    first request            201 Created (or 402 for a declined card), stored
    retry, same request      the stored status and body, byte for byte (Idempotent-Replayed: true)
    same key, still running  409 Conflict (Retry-After: 1)
    same key, other request  422 Unprocessable Content (idem SQLSTATE ID001)
    key missing or malformed 400 Bad Request
Keys are scoped by client: two clients may use the same key for different
payments.

This plain http.server handler uses the core API; FastAPI, Django and
SQLAlchemy applications get the same from idem_http's middleware (see
clients/python/README.md).

Connection: the libpq environment variables (PGHOST, PGPORT, PGUSER, PGDATABASE).
"""

import http.server
import json
import re
import threading
from decimal import Decimal, InvalidOperation

import psycopg

import idem_http
from idem_http import FingerprintMismatch, Policy, RequestInfo, Response, TransientFailure

BIZ_TYPE = "payment-api"
CLIENT_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
# Header parsing (one Structured Field String, 16 to 255 characters), problem
# details, replays: the draft's mapping (docs/http.md, "The rules"). The key's
# scope is this handler's own (the client id, below): single_tenant says the
# policy adds none.
POLICY = Policy(single_tenant=True, wait=False, retry_after=1)
# Stored with the status and body, and replayed as they were.
STORED_HEADERS = ("Content-Type", "Location")

SCHEMA = """
CREATE EXTENSION IF NOT EXISTS idem;
CREATE TABLE IF NOT EXISTS payments (
    id         bigserial PRIMARY KEY,
    client     text NOT NULL,
    idem_key   text NOT NULL,
    order_no   text NOT NULL,
    amount     numeric(12,2) NOT NULL,
    currency   text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
"""

# The card network's latency, for the demonstration of a concurrent retry:
# while this event is cleared, charging a card blocks (inside the request's
# transaction, as a slow synchronous charge would).
card_network_ready = threading.Event()
card_network_ready.set()


def setup_schema(conninfo=""):
    with psycopg.connect(conninfo, autocommit=True) as db:
        db.execute(SCHEMA)


class PaymentsHandler(http.server.BaseHTTPRequestHandler):
    server_version = "payments-example/1"
    conninfo = ""

    def log_message(self, *args):  # the demo prints its own lines
        pass

    def send(self, status, body, extra_headers=(), content_type="application/json"):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in extra_headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def problem(self, status, title, detail, extra_headers=()):
        """An error that is not stored (RFC 9457 problem details)."""
        self.send(status, json.dumps({"title": title, "status": status, "detail": detail}), extra_headers,
                  "application/problem+json")

    def answer(self, resp: Response):
        """Send one of idem_http's responses (stored, replayed, or a problem)."""
        self.send_response(resp.status)
        for name, value in resp.headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(resp.body)))
        self.end_headers()
        self.wfile.write(resp.body)

    def do_POST(self):
        if self.path != "/payments":
            return self.problem(404, "Not Found", self.path)
        client = self.headers.get("X-Client-Id")
        if client is None or not CLIENT_ID.fullmatch(client):
            return self.problem(401, "Unauthorized", "X-Client-Id missing or malformed")
        raw_key = self.headers.get("Idempotency-Key")
        key = POLICY.parse_key(raw_key)
        if key is None:
            return self.answer(POLICY.key_refused(raw_key))
        raw_body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        try:
            payload = json.loads(raw_body)
            order, currency, card = str(payload["order"]), str(payload["currency"]), str(payload["card"])
            amount = Decimal(payload["amount"]).quantize(Decimal("0.01"))
            if amount <= 0:
                raise ValueError("amount must be positive")
        except (ValueError, KeyError, TypeError, InvalidOperation) as e:
            return self.problem(400, "Bad Request", f"body: {e}")

        # The client id cannot contain "/", so the scoped key is unambiguous.
        scoped_key = f"{client}/{key}"
        # Method, path and the canonical JSON body: a retry that re-serialises
        # the body in another key order is still the same request.
        fp = idem_http.request_fingerprint(RequestInfo("POST", self.path, "", {}, raw_body))
        try:
            with psycopg.connect(self.conninfo) as db:
                with idem_http.claim(db, scoped_key, BIZ_TYPE, fingerprint=fp, wait=False) as c:
                    if not c.claimed:
                        # in_progress: 409; completed or failed: the first response, as it was sent.
                        answer = POLICY.in_progress() if c.state == "in_progress" else POLICY.replay(c.replay)
                    else:
                        card_network_ready.wait()
                        if card.endswith("0002"):  # the test card number that is always declined
                            body = json.dumps({"title": "Payment Required", "detail": "card declined", "order": order})
                            answer = Response(402, [("Content-Type", "application/json")], body.encode())
                            c.fail(answer.to_document(STORED_HEADERS))
                        else:
                            (payment_id,) = db.execute(
                                "INSERT INTO payments (client, idem_key, order_no, amount, currency)"
                                " VALUES (%s, %s, %s, %s, %s) RETURNING id",
                                (client, key, order, amount, currency)).fetchone()
                            body = json.dumps({"id": payment_id, "order": order, "amount": str(amount),
                                               "currency": currency, "status": "charged"})
                            answer = Response(201, [("Content-Type", "application/json"),
                                                    ("Location", f"/payments/{payment_id}")], body.encode())
                            # The body is stored as a string so that a replay is byte-identical.
                            c.complete(answer.to_document(STORED_HEADERS))
            # Sent only after COMMIT: a 201 is never sent for a charge that rolled back.
            return self.answer(answer)
        except FingerprintMismatch:
            return self.answer(POLICY.mismatch())
        except TransientFailure as e:
            return self.answer(POLICY.unavailable(e.sqlstate))


def start_server(conninfo=""):
    """A threaded HTTP server on 127.0.0.1 and a free port; returns it running."""
    handler = type("Handler", (PaymentsHandler,), {"conninfo": conninfo})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
