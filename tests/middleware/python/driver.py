"""Runs one test server (fastapi, django or sqlalchemy) on loopback and
sends it real HTTP requests with httpx; checks the answers and the database.

    python driver.py SERVER PORT APP_CONNINFO CHECK_CONNINFO LABEL FIFO

APP_CONNINFO is what the server connects to (the cluster, or PgBouncer);
CHECK_CONNINFO reaches the cluster directly (pg_stat_activity, advisory
locks, the business table). Every wait is for an observed state (a lock
wait in pg_stat_activity, a line on the FIFO, a server answering), never a
verdict by the clock. Prints ok/FAIL lines and a summary; exits 1 on a
failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Callable, Optional

import httpx
import psycopg

import conformance

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lib"))
from sessions import Checks  # noqa: E402  (tests/lib)

SERVER, PORT, APP_CONNINFO, CHECK_CONNINFO, LABEL, FIFO = sys.argv[1:7]
N = 20
HERE = os.path.dirname(os.path.abspath(__file__))
BASE = f"http://127.0.0.1:{PORT}"
RUN = uuid.uuid4().hex[:8]
check = Checks(f"{SERVER}, {LABEL}")


def db() -> psycopg.Connection[Any]:
    return psycopg.connect(CHECK_CONNINFO, autocommit=True)


def one(sql: str, params: tuple = ()) -> Any:
    with db() as c:
        row = c.execute(sql, params).fetchone()  # type: ignore[arg-type]
        return row if row is None or len(row) > 1 else row[0]


def rows(scoped_key: str) -> int:
    return one("SELECT count(*) FROM orders WHERE server = %s AND idem_key = %s",
               ("sqlalchemy" if SERVER == "sqlalchemy" else SERVER, scoped_key))


def lookup(scoped_key: str, biz: str) -> tuple[str, Any]:
    return one("SELECT state, result FROM idem_lookup(%s, %s)", (scoped_key, biz))


def wait_for(what: str, cond: Callable[[], bool], tries: int = 6000) -> bool:
    """Polls an observed state (a hang guard of 6000 polls, not a verdict)."""
    for _ in range(tries):
        if cond():
            return True
        time.sleep(0.01)
    check(False, f"never observed: {what}")
    return False


# ---- the server --------------------------------------------------------------

server: Optional[subprocess.Popen[bytes]] = None


def server_command(scope: str = "tenant") -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ, IDEM_TEST_CONNINFO=APP_CONNINFO, IDEM_TEST_SIGNAL=FIFO, PYTHONPATH=HERE,
               IDEM_TEST_SCOPE=scope)
    if SERVER == "django":
        cmd = [sys.executable, "-m", "django", "runserver", "--noreload", f"127.0.0.1:{PORT}"]
        env["DJANGO_SETTINGS_MODULE"] = "django_app"
    else:
        cmd = [sys.executable, "-m", "uvicorn", f"{SERVER}_app:app", "--host", "127.0.0.1", "--port", PORT,
               "--log-level", "warning"]
    return cmd, env


def start_server() -> None:
    global server
    cmd, env = server_command()
    server = subprocess.Popen(cmd, cwd=HERE, env=env)
    wait_for(f"{SERVER} answering on {BASE}", up)


def up() -> bool:
    """The server answers /health (it exited: the driver stops)."""
    assert server is not None
    if server.poll() is not None:
        raise SystemExit(f"the {SERVER} server exited with {server.returncode}")
    try:
        return conformance.HTTP.get(f"{BASE}/health", timeout=60).status_code == 200
    except httpx.TransportError:
        return False


def kill_server() -> None:
    assert server is not None
    server.kill()
    server.wait()


# ---- requests ----------------------------------------------------------------

def post(path: str, key: Optional[str], body: Any, tenant: str = "tenant-a", raw: Optional[str] = None,
         **extra: str) -> Optional[httpx.Response]:
    headers = {"Content-Type": "application/json", "X-Tenant": tenant}
    if raw is not None:
        headers["Idempotency-Key"] = raw
    elif key is not None:
        headers["Idempotency-Key"] = f'"{key}"'
    headers.update({k.replace("_", "-"): v for k, v in extra.items()})
    try:
        return conformance.HTTP.post(BASE + path, content=body if isinstance(body, (str, bytes)) else json.dumps(body),
                                     headers=headers, timeout=300)
    except httpx.TransportError:
        return None


def replayed(r: Optional[httpx.Response]) -> bool:
    return r is not None and r.headers.get("idempotent-replayed") == "true"


def status(r: Optional[httpx.Response]) -> Any:
    return None if r is None else r.status_code


def new_key(name: str) -> str:
    return f"{RUN}-{SERVER}-{LABEL}-{name}"


def scoped(key: str, tenant: str = "tenant-a") -> str:
    """The key idem claims: "<UTF-8 length of tenant>:<tenant>:<key>"."""
    return f"{len(tenant.encode())}:{tenant}:{key}"


WAITING = ("SELECT count(*) FILTER (WHERE wait_event = 'advisory'),"
           " count(*) FILTER (WHERE wait_event_type = 'Lock' AND wait_event = 'transactionid'"
           "                  AND query LIKE '%%idem_claim%%')"
           " FROM pg_stat_activity WHERE pid <> pg_backend_pid()")


# ---- the checks ----------------------------------------------------------------

def concurrent_wait() -> None:
    key = new_key("concurrent")
    body = {"sku": "sku-1", "qty": 2}
    results: list[Optional[httpx.Response]] = [None] * N
    with db() as lock:
        lock.execute("SELECT pg_advisory_lock(4242)")

        def send(i: int) -> None:
            results[i] = post("/orders", key, body, X_Test_Gate="1")

        threads = [threading.Thread(target=send, args=(i,)) for i in range(N)]
        for t in threads:
            t.start()
        seen = wait_for(f"1 handler at the gate and {N - 1} duplicates waiting in idem_claim",
                        lambda: tuple(one(WAITING)) == (1, N - 1))
        lock.execute("SELECT pg_advisory_unlock(4242)")
        for t in threads:
            t.join()
    statuses = sorted(str(status(r)) for r in results)
    bodies = {r.text for r in results if r is not None}
    check(seen and statuses == ["201"] * N and len(bodies) == 1,
          f"{N} concurrent identical requests (wait mode): statuses {set(statuses)}, {len(bodies)} distinct body(ies)")
    check(sum(replayed(r) for r in results) == N - 1, f"{N - 1} of them replayed the first one's response")
    check(rows(scoped(key)) == 1, f"one business row for {N} requests: {rows(scoped(key))}")
    # Another tenant's same key string is another claim.
    r = post("/orders", key, body, tenant="tenant-b")
    check(status(r) == 201 and not replayed(r) and rows(scoped(key, "tenant-b")) == 1,
          f"tenant-b with tenant-a's key: its own operation ({status(r)}, replayed={replayed(r)})")


def concurrent_409() -> None:
    key = new_key("conc409")
    body = {"sku": "sku-409", "qty": 1}
    results: list[Optional[httpx.Response]] = [None] * N
    done = threading.Semaphore(0)
    with db() as lock:
        lock.execute("SELECT pg_advisory_lock(4242)")

        def send(i: int) -> None:
            results[i] = post("/orders-409", key, body, X_Test_Gate="1")
            done.release()

        threads = [threading.Thread(target=send, args=(i,)) for i in range(N)]
        for t in threads:
            t.start()
        for _ in range(N - 1):  # N - 1 answers come while the first is held at the gate
            done.acquire()
        at_gate = one(WAITING)[0]
        lock.execute("SELECT pg_advisory_unlock(4242)")
        for t in threads:
            t.join()
    statuses = sorted(str(status(r)) for r in results)
    retry_after = {r.headers.get("retry-after") for r in results if r is not None and r.status_code == 409}
    check(at_gate == 1 and statuses == ["201"] + ["409"] * (N - 1) and retry_after == {"1"},
          f"{N} concurrent requests (409 mode): {statuses.count('201')} x 201, {statuses.count('409')} x 409 "
          f"with Retry-After {retry_after}, while the first was at the gate ({at_gate})")
    check(rows(scoped(key)) == 1, f"one business row: {rows(scoped(key))}")
    first = next(r for r in results if r is not None and r.status_code == 201)
    r = post("/orders-409", key, body)
    check(status(r) == 201 and replayed(r) and r.text == first.text, "a later retry replays the 201")


def bounded_wait() -> None:
    """A duplicate waits at most lock_timeout (200ms on this route): while
    the first request is held at the gate, the duplicate's wait ends with
    55P03 and 409 + Retry-After (the first is still in progress), whatever
    the time it takes."""
    key = new_key("shortwait")
    body = {"sku": "sku-shortwait", "qty": 1}
    box: list[Optional[httpx.Response]] = []
    with db() as lock:
        lock.execute("SELECT pg_advisory_lock(4242)")
        t = threading.Thread(target=lambda: box.append(post("/orders-short-wait", key, body, X_Test_Gate="1")))
        t.start()
        wait_for("the first request at the gate", lambda: one(WAITING)[0] == 1)
        r = post("/orders-short-wait", key, body)
        lock.execute("SELECT pg_advisory_unlock(4242)")
        t.join()
    check(status(r) == 409 and r is not None and r.headers.get("retry-after") == "1",
          f"a duplicate whose wait exceeds lock_timeout: {status(r)} with Retry-After")
    r2 = post("/orders-short-wait", key, body)
    check(status(box[0]) == 201 and status(r2) == 201 and replayed(r2) and rows(scoped(key)) == 1,
          f"the first one answers {status(box[0])}; the duplicate's retry replays it; one row")


def killed(phase: str) -> None:
    key = new_key(f"kill-{phase}")
    body = {"sku": "sku-kill", "qty": 3}
    box: list[Optional[httpx.Response]] = []
    t = threading.Thread(target=lambda: box.append(post("/orders", key, body, X_Test_Pause=phase)))
    t.start()
    with open(FIFO) as fifo:  # blocks until the server reaches the kill point
        line = fifo.readline().strip()
    kill_server()
    t.join()
    check(line == phase and box == [None], f"server killed at {phase}: the client got no answer")
    state, result = lookup(scoped(key), "orders.create")
    if phase == "before_commit":
        check(rows(scoped(key)) == 0, f"killed before COMMIT: nothing committed (claim {state})")
    else:
        check(rows(scoped(key)) == 1 and state == "completed" and result["status"] == 201,
              f"killed after COMMIT: the order and its response committed ({state})")
    start_server()
    r = post("/orders", key, body)
    if phase == "before_commit":
        check(status(r) == 201 and not replayed(r), f"the retry runs the operation: {status(r)}, replayed={replayed(r)}")
    else:
        stored = lookup(scoped(key), "orders.create")[1]
        check(status(r) == 201 and replayed(r) and r is not None and r.text == stored["body"]
              and r.headers.get("location") == {n.lower(): v for n, v in stored["headers"]}.get("location"),
              f"the retry gets the stored answer: {status(r)}, replayed={replayed(r)}")
    check(rows(scoped(key)) == 1, f"the operation ran exactly once: {rows(scoped(key))} row(s)")


def fingerprint_and_keys() -> None:
    key = new_key("fp")
    r1 = post("/orders", key, {"sku": "sku-fp", "qty": 1, "client_sent_at": "t1"})
    same = '{ "qty": 1,\n  "client_sent_at": "t2", "sku": "sku-fp" }'
    r2 = post("/orders", key, same)
    check(status(r1) == 201 and status(r2) == 201 and replayed(r2) and r1 is not None and r2 is not None
          and r2.text == r1.text,
          "the same body re-serialised (key order, whitespace, an excluded field changed): replayed")
    r3 = post("/orders", key, {"sku": "sku-fp-changed", "qty": 1})
    check(status(r3) == 422 and r3 is not None and r3.headers.get("content-type") == "application/problem+json",
          f"the key with a changed body: {status(r3)} problem+json")
    check(rows(scoped(key)) == 1 and one("SELECT count(*) FROM orders WHERE sku = 'sku-fp-changed'") == 0,
          "the changed body wrote nothing")
    marker = f"sku-nokey-{RUN}-{SERVER}-{LABEL}"
    r = post("/orders", None, {"sku": marker, "qty": 1})
    r_bad = post("/orders", None, {"sku": marker, "qty": 1}, raw='"unterminated')
    r_empty = post("/orders", None, {"sku": marker, "qty": 1}, raw='""')
    check([status(r), status(r_bad), status(r_empty)] == [400, 400, 400]
          and one("SELECT count(*) FROM orders WHERE sku = %s", (marker,)) == 0,
          f"missing / malformed / empty key: {[status(r), status(r_bad), status(r_empty)]}, nothing written")
    r = post("/orders-optional", None, {"sku": marker, "qty": 1})
    check(status(r) == 201 and one("SELECT count(*) FROM orders WHERE sku = %s", (marker,)) == 1,
          f"a route whose key is optional, without one: runs ({status(r)})")
    marker2 = marker + "-raise"
    r = post("/orders-optional", None, {"sku": marker2, "qty": 1}, X_Test_Raise="1")
    check(status(r) == 500 and one("SELECT count(*) FROM orders WHERE sku = %s", (marker2,)) == 0,
          f"... and when its handler raises after its write: {status(r)}, the write rolled back")


def failures_stored_or_not() -> None:
    key = new_key("raise")
    body = {"sku": "sku-raise", "qty": 1}
    r = post("/orders", key, body, X_Test_Raise="1")
    state, _ = lookup(scoped(key), "orders.create")
    check(status(r) == 500 and state == "absent" and rows(scoped(key)) == 0,
          f"a handler exception after its write: {status(r)}, claim {state}, nothing stored")
    r = post("/orders", key, body)
    check(status(r) == 201 and not replayed(r) and rows(scoped(key)) == 1,
          f"its retry runs: {status(r)}, replayed={replayed(r)}, {rows(scoped(key))} row")

    key = new_key("transient")
    body = {"sku": "sku-transient", "qty": 1}
    r = post("/orders", key, body, X_Test_Transient="1")
    state, _ = lookup(scoped(key), "orders.create")
    check(status(r) == 503 and r is not None and r.headers.get("retry-after") == "1" and state == "absent"
          and rows(scoped(key)) == 0, f"SQLSTATE 40001 in the handler: {status(r)} with Retry-After, claim {state}")
    r = post("/orders", key, body)
    check(status(r) == 201 and not replayed(r) and rows(scoped(key)) == 1, f"its retry runs: {status(r)}")

    key = new_key("lost")
    body = {"sku": "sku-lost", "qty": 1}
    r = post("/orders", key, body, X_Test_Lost="1")
    state, _ = lookup(scoped(key), "orders.create")
    check(status(r) == 503 and r is not None and r.headers.get("retry-after") == "1" and state == "absent"
          and rows(scoped(key)) == 0, f"the connection lost under the handler: {status(r)}, claim {state}")
    r = post("/orders", key, body)
    check(status(r) == 201 and not replayed(r) and rows(scoped(key)) == 1, f"its retry runs: {status(r)}")

    key = new_key("stock")
    body = {"sku": "out-of-stock", "qty": 1}
    r1 = post("/orders", key, body)
    state, result = lookup(scoped(key), "orders.create")
    r2 = post("/orders", key, body)
    check(status(r1) == 422 and state == "failed" and result["status"] == 422,
          f"a business failure: {status(r1)}, stored as {state}")
    check(status(r2) == 422 and replayed(r2) and r1 is not None and r2 is not None and r2.text == r1.text
          and rows(scoped(key)) == 0, "its retry gets the stored failure, replayed")


def streamed() -> None:
    key = new_key("report")
    r1 = post("/report", key, {"lines": 3000})
    state, result = lookup(scoped(key), "report.create")
    lines = r1.text.count("\n") if r1 is not None else 0
    check(status(r1) == 200 and lines == 3000 and state == "completed" and result.get("body_stored") is False,
          f"a streamed response of {len(r1.content) if r1 else 0} bytes: passed through ({lines} lines), "
          f"stored without its body ({state})")
    r2 = post("/report", key, {"lines": 3000})
    check(status(r2) == 200 and replayed(r2) and r2 is not None and r2.content == b""
          and r2.headers.get("location") == (r1.headers.get("location") if r1 else None)
          and rows(scoped(key)) == 1, "its retry: status and headers replayed, no body, ran once")


def leased() -> None:
    key = new_key("lease")
    body = {"sku": "sku-lease", "qty": 1}
    r1 = post("/charges", key, body)
    state, result = lookup(scoped(key), "charges.create")
    ext = one("SELECT count(*) FROM orders WHERE server = %s AND idem_key = %s", (f"{SERVER}-external", scoped(key)))
    check(status(r1) == 201 and state == "completed" and ext == 1 and rows(scoped(key)) == 1,
          f"lease mode: {status(r1)}, stored {state} with the lease token kept by the middleware")
    r2 = post("/charges", key, body)
    check(status(r2) == 201 and replayed(r2) and r1 is not None and r2 is not None and r2.text == r1.text,
          "lease mode: the retry replays")


def lease_takeover() -> None:
    """Lease mode, the server killed after the external call and its recovery
    point: once idem_leases shows the lease ran out, the retry takes over
    (attempt 2), resumes after the recovery point, and the external call is
    not made again."""
    key = new_key("lease-takeover")
    body = {"sku": "sku-lease-takeover", "qty": 1}
    box: list[Optional[httpx.Response]] = []
    t = threading.Thread(target=lambda: box.append(post("/charges-short", key, body, X_Test_Pause="after_checkpoint")))
    t.start()
    with open(FIFO) as fifo:
        line = fifo.readline().strip()
    kill_server()
    t.join()
    ext = f"SELECT count(*) FROM orders WHERE server = '{SERVER}-external' AND idem_key = %s"
    state, _ = lookup(scoped(key), "charges.short")
    check(line == "after_checkpoint" and box == [None] and state == "in_progress"
          and one(ext, (scoped(key),)) == 1 and rows(scoped(key)) == 0,
          f"lease mode, killed after the external call and its checkpoint: lease {state}, the call recorded once")
    start_server()
    wait_for("the lease ran out (idem_leases.ran_out)", lambda: one(
        "SELECT coalesce(bool_or(ran_out), false) FROM idem_leases WHERE biz_type = 'charges.short' AND key = %s",
        (scoped(key),)) is True)
    r = post("/charges-short", key, body)
    attempt = r.json().get("attempt") if r is not None and r.status_code == 201 else None
    check(status(r) == 201 and attempt == 2 and one(ext, (scoped(key),)) == 1 and rows(scoped(key)) == 1,
          f"the retry took the lease over (attempt {attempt}), resumed after the checkpoint: "
          f"{one(ext, (scoped(key),))} external call, {rows(scoped(key))} row")
    r2 = post("/charges-short", key, body)
    check(status(r2) == 201 and replayed(r2) and r is not None and r2 is not None and r2.text == r.text,
          "and its answer is replayed")


def unscoped_refused() -> None:
    """A configuration that chooses no key scope does not start: the server
    exits before it listens, saying why (no verdict by the clock: we wait
    for the process to end)."""
    cmd, env = server_command("none")
    p = subprocess.run(cmd, cwd=HERE, env=env, capture_output=True, text=True, timeout=300)
    check(p.returncode != 0 and "choose the key scope" in p.stderr,
          f"a Policy without tenant= or single_tenant=True: refused at start-up (exit {p.returncode})")


def single_tenant() -> None:
    """Declared single-tenant: it starts, and a caller without a tenant is
    claimed in the shared scope "-"."""
    global server
    cmd, env = server_command("single")
    server = subprocess.Popen(cmd, cwd=HERE, env=env)
    try:
        wait_for(f"{SERVER} (single tenant) answering", up)
        key = new_key("single-tenant")
        body = {"sku": "sku-single", "qty": 1}
        r1 = post("/orders", key, body, tenant="ignored-1")
        r2 = post("/orders", key, body, tenant="ignored-2")
        check(status(r1) == 201 and replayed(r2) and rows(f"-:{key}") == 1,
              f"single_tenant=True: one key space for every caller ({status(r1)}, replayed={replayed(r2)})")
    finally:
        kill_server()


def conformance_table() -> None:
    conformance.run(BASE, CHECK_CONNINFO, check)


def main() -> None:
    with db() as c:
        c.execute("CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, server text NOT NULL,"
                  " idem_key text NOT NULL, sku text NOT NULL, qty int NOT NULL)")
    unscoped_refused()
    single_tenant()
    start_server()
    try:
        conformance_table()
        concurrent_wait()
        concurrent_409()
        bounded_wait()
        killed("before_commit")
        killed("after_commit")
        fingerprint_and_keys()
        failures_stored_or_not()
        if SERVER in ("fastapi", "django"):
            streamed()
        if SERVER in ("fastapi", "django"):
            leased()
            lease_takeover()
    finally:
        if server is not None and server.poll() is None:
            server.terminate()
            server.wait()
    check.finish()


if __name__ == "__main__":
    main()
