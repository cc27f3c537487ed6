"""A payments endpoint that honours the Idempotency-Key header.

POST /payments with a JSON body {"order": ..., "amount": "42.00", "currency": ..., "card": ...}
and the headers X-Client-Id (who is calling; in a real service it comes from
authentication) and Idempotency-Key. Everything the request does happens in
one database transaction:

    idem_claim(key, 'payment-api', fingerprint => hash of the request, wait => false)
    INSERT INTO payments ...                       (only when claimed)
    idem_complete(key, 'payment-api', {status, body})  or  idem_fail(...) for a declined card
    COMMIT

Responses, as the IETF draft "The Idempotency-Key HTTP Header Field" maps them:
    first request            201 Created (or 402 for a declined card), stored
    retry, same request      the stored status and body, byte for byte (Idempotent-Replayed: true)
    same key, still running  409 Conflict (Retry-After: 1)
    same key, other request  422 Unprocessable Content (idem SQLSTATE ID001)
    key missing or malformed 400 Bad Request
Keys are scoped by client: two clients may use the same key for different
payments.

Connection: the libpq environment variables (PGHOST, PGPORT, PGUSER, PGDATABASE).
"""

import hashlib
import http.server
import json
import re
import threading
from decimal import Decimal, InvalidOperation

import psycopg
from psycopg.types.json import Jsonb

BIZ_TYPE = "payment-api"
CLIENT_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
# The draft defines the header as a Structured Field String ("...", RFC 8941);
# a bare token is accepted too, since many clients send one.
SF_STRING = re.compile(r'"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"')
BARE_KEY = re.compile(r"[A-Za-z0-9._:+/=-]+")
MAX_KEY_LEN = 255

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


def parse_idempotency_key(raw):
    """The key's value, or None if missing or malformed."""
    if raw is None:
        return None
    raw = raw.strip()
    m = SF_STRING.fullmatch(raw)
    if m:
        key = re.sub(r'\\(["\\])', r"\1", m.group(1))
    elif BARE_KEY.fullmatch(raw):
        key = raw
    else:
        return None
    if not key or len(key) > MAX_KEY_LEN:
        return None
    return key


def fingerprint(method, path, payload):
    """Same request <=> same fingerprint: canonical JSON, not the raw bytes,
    so that a retry that re-serializes the body in another key order is still
    the same request."""
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{method} {path}\n{canonical}".encode()).hexdigest()


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

    def do_POST(self):
        if self.path != "/payments":
            return self.problem(404, "Not Found", self.path)
        client = self.headers.get("X-Client-Id")
        if client is None or not CLIENT_ID.fullmatch(client):
            return self.problem(401, "Unauthorized", "X-Client-Id missing or malformed")
        raw_key = self.headers.get("Idempotency-Key")
        key = parse_idempotency_key(raw_key)
        if key is None:
            return self.problem(400, "Bad Request",
                                "Idempotency-Key header is " + ("missing" if raw_key is None else "malformed"))
        try:
            payload = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            order, currency, card = str(payload["order"]), str(payload["currency"]), str(payload["card"])
            amount = Decimal(payload["amount"]).quantize(Decimal("0.01"))
            if amount <= 0:
                raise ValueError("amount must be positive")
        except (ValueError, KeyError, TypeError, InvalidOperation) as e:
            return self.problem(400, "Bad Request", f"body: {e}")

        # The client id cannot contain "/", so the scoped key is unambiguous.
        scoped_key = f"{client}/{key}"
        fp = fingerprint("POST", self.path, payload)
        try:
            with psycopg.connect(self.conninfo) as db, db.transaction():
                claimed, state, result = db.execute(
                    "SELECT claimed, state, result FROM idem_claim(%s, %s, fingerprint => %s, wait => false)",
                    (scoped_key, BIZ_TYPE, fp)).fetchone()
                if not claimed:
                    if state == "in_progress":
                        return self.problem(409, "Conflict",
                                            "a request with this Idempotency-Key is still being processed",
                                            [("Retry-After", "1")])
                    # completed or failed: the first response, as it was sent.
                    return self.send(result["status"], result["body"],
                                     [*map(tuple, result["headers"]), ("Idempotent-Replayed", "true")])

                card_network_ready.wait()
                if card.endswith("0002"):  # the test card number that is always declined
                    status, headers = 402, []
                    body = json.dumps({"title": "Payment Required", "detail": "card declined", "order": order})
                    db.execute("SELECT idem_fail(%s, %s, %s)",
                               (scoped_key, BIZ_TYPE, Jsonb({"status": status, "body": body, "headers": headers})))
                else:
                    (payment_id,) = db.execute(
                        "INSERT INTO payments (client, idem_key, order_no, amount, currency)"
                        " VALUES (%s, %s, %s, %s, %s) RETURNING id",
                        (client, key, order, amount, currency)).fetchone()
                    status, headers = 201, [["Location", f"/payments/{payment_id}"]]
                    body = json.dumps({"id": payment_id, "order": order, "amount": str(amount),
                                       "currency": currency, "status": "charged"})
                    # The body is stored as a string so that a replay is byte-identical.
                    db.execute("SELECT idem_complete(%s, %s, %s)",
                               (scoped_key, BIZ_TYPE, Jsonb({"status": status, "body": body, "headers": headers})))
            # Sent only after COMMIT: a 201 is never sent for a charge that rolled back.
            return self.send(status, body, map(tuple, headers))
        except psycopg.Error as e:
            if e.sqlstate == "ID001":
                return self.problem(422, "Unprocessable Content",
                                    "this Idempotency-Key was used for a different request")
            return self.problem(503, "Service Unavailable", f"database error {e.sqlstate}",
                                [("Retry-After", "1")])


def start_server(conninfo=""):
    """A threaded HTTP server on 127.0.0.1 and a free port; returns it running."""
    handler = type("Handler", (PaymentsHandler,), {"conninfo": conninfo})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
