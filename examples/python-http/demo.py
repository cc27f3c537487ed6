"""Start the payments API on 127.0.0.1 and send it the requests a real client
sends: a first request, its retry, a key reused for another request, a retry
that arrives while the first is still running, a declined card and its
retry, a second client reusing the first one's key, a missing and a malformed
key. One line per request; exits 1 if a response is not the expected one.

    PGHOST=... PGPORT=... PGUSER=... PGDATABASE=... python demo.py [--report FILE]

--report writes every request and response as JSON (for the test suite,
which checks them against the database).
"""

import http.client
import json
import sys
import threading
import time
import uuid

import psycopg

import payments_api as api

failures = []
exchanges = []


def post(server, label, client, key, body, expect_status, raw_key_header=None):
    conn = http.client.HTTPConnection(*server.server_address, timeout=30)
    headers = {"Content-Type": "application/json"}
    if client is not None:
        headers["X-Client-Id"] = client
    if raw_key_header is not None:
        headers["Idempotency-Key"] = raw_key_header
    elif key is not None:
        headers["Idempotency-Key"] = f'"{key}"'
    conn.request("POST", "/payments", json.dumps(body), headers)
    resp = conn.getresponse()
    text = resp.read().decode()
    conn.close()
    exchange = {"label": label, "client": client, "key": key, "request": body, "status": resp.status,
                "body": text, "replayed": resp.getheader("Idempotent-Replayed") == "true",
                "retry_after": resp.getheader("Retry-After"), "location": resp.getheader("Location")}
    exchanges.append(exchange)
    if resp.status != expect_status:
        failures.append(f"{label}: expected {expect_status}, got {resp.status} {text}")
    return exchange


def say(ex, what):
    print(f"{ex['label']}: {what}, {ex['status']}" + (" (Idempotent-Replayed)" if ex["replayed"] else ""))


def expect(cond, message):
    if not cond:
        failures.append(message)
        print(f"   UNEXPECTED: {message}")


def main():
    report = sys.argv[sys.argv.index("--report") + 1] if "--report" in sys.argv else None
    api.setup_schema()
    server = api.start_server()
    print(f"payments API listening on http://{server.server_address[0]}:{server.server_address[1]}")
    # Fresh keys per run, as a client makes them: one per payment intent.
    run = uuid.uuid4().hex[:8]
    k1, k2, k3 = f"{run}-payment-1", f"{run}-payment-2", f"{run}-payment-3"
    order1 = {"order": "A-1001", "amount": "42.00", "currency": "EUR", "card": "4242424242424242"}

    ex = post(server, "request 1", "shop-1", k1, order1, 201)
    charged = json.loads(ex["body"]) if ex["status"] == 201 else {}
    say(ex, f"claimed, charged {charged.get('amount')} (payment {charged.get('id')})")
    first_body, first_location = ex["body"], ex["location"]

    # The client timed out and sends the same request again; the body's keys
    # come in another order, which must not matter.
    retry_body = dict(reversed(list(order1.items())))
    ex = post(server, "request 2 (retry of 1)", "shop-1", k1, retry_body, 201)
    say(ex, "replayed" + (", same body" if ex["body"] == first_body else ", DIFFERENT body"))
    expect(ex["replayed"] and ex["body"] == first_body and ex["location"] == first_location,
           "the retry did not replay the first response")

    ex = post(server, "request 3 (key of 1, amount 43.00)", "shop-1", k1, dict(order1, amount="43.00"), 422)
    say(ex, "refused: the key was first used for a different request (ID001)")

    # A retry that arrives while the first request is still charging the card.
    order2 = {"order": "A-1002", "amount": "19.90", "currency": "EUR", "card": "5555555555554444"}
    api.card_network_ready.clear()
    first = {}
    t = threading.Thread(target=lambda: first.update(post(server, "request 4", "shop-1", k2, order2, 201)))
    t.start()
    # The same query up to 200 times on one connection: psycopg would prepare
    # it (a named statement) from the 6th time on, which a transaction-mode
    # pooler may route to another server session (docs/operations.md).
    with psycopg.connect(autocommit=True, prepare_threshold=None) as db:
        for _ in range(200):
            state = db.execute("SELECT state FROM idem_lookup(%s, %s)", (f"shop-1/{k2}", api.BIZ_TYPE)).fetchone()[0]
            if state == "in_progress":
                break
            time.sleep(0.05)
    print(f"request 4: claimed, now charging the card (slow card network; the key reads {state})")
    if state != "in_progress":
        # Request 5 would then claim first and wait for the card network itself.
        api.card_network_ready.set()
        expect(False, f"request 4's claim never showed up as in_progress ({state})")
    ex = post(server, "request 5 (retry of 4, while 4 runs)", "shop-1", k2, order2, 409)
    say(ex, f"in progress, Retry-After {ex['retry_after']}")
    api.card_network_ready.set()
    t.join()
    say(first, f"charged {json.loads(first['body']).get('amount') if first['status'] == 201 else '?'}")
    ex = post(server, "request 6 (retry of 4, after it finished)", "shop-1", k2, order2, 201)
    say(ex, "replayed" + (", same body" if ex["body"] == first["body"] else ", DIFFERENT body"))
    expect(ex["replayed"] and ex["body"] == first["body"], "the late retry did not replay request 4's response")

    declined = {"order": "A-1003", "amount": "5.00", "currency": "EUR", "card": "4000000000000002"}
    ex = post(server, "request 7", "shop-1", k3, declined, 402)
    say(ex, "claimed, card declined, failure stored")
    declined_body = ex["body"]
    ex = post(server, "request 8 (retry of 7)", "shop-1", k3, declined, 402)
    say(ex, "replayed the failure" + (", same body" if ex["body"] == declined_body else ", DIFFERENT body"))
    expect(ex["replayed"] and ex["body"] == declined_body, "the declined card's retry did not replay the failure")

    # Keys are scoped by client: another client may use the same key.
    order4 = {"order": "B-77", "amount": "42.00", "currency": "EUR", "card": "4242424242424242"}
    ex = post(server, "request 9 (client shop-2, key of 1)", "shop-2", k1, order4, 201)
    say(ex, "claimed in shop-2's scope, charged 42.00")
    expect(not ex["replayed"], "shop-2 got shop-1's response")

    ex = post(server, "request 10 (no Idempotency-Key)", "shop-1", None, order1, 400)
    say(ex, "refused: key missing")
    ex = post(server, "request 11 (Idempotency-Key: \"unterminated)", "shop-1", None, order1, 400,
              raw_key_header='"unterminated')
    say(ex, "refused: key malformed")
    ex = post(server, "request 12 (Idempotency-Key: \"\")", "shop-1", None, order1, 400, raw_key_header='""')
    say(ex, "refused: key empty")

    server.shutdown()
    if report:
        with open(report, "w") as f:
            json.dump({"keys": {"k1": k1, "k2": k2, "k3": k3}, "exchanges": exchanges}, f, indent=1)
    for f in failures:
        print("FAIL:", f)
    print("all responses as expected" if not failures else f"{len(failures)} unexpected response(s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
