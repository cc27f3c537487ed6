"""Runs tests/middleware/conformance.json against a running server (the
format and the server it needs: tests/middleware/README.md), with httpx and
a direct database connection for the rows and the advisory lock of a held
request. Called by driver.py; `run(base, conninfo, check)` returns nothing,
each case's verdict goes through `check`."""

from __future__ import annotations

import datetime
import email.utils
import json
import os
import re
import threading
import time
import uuid
from typing import Any, Callable, Optional

import httpx
import psycopg

# One client for every request of the runner and driver.py: httpx.post
# builds a client per call, and with it a TLS context that loads the CA
# bundle (a quarter of a second per request on a loaded machine). No
# keep-alive: each request has a connection of its own, as with
# httpx.post (a killed and restarted server meets no stale connection).
HTTP = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))

TABLE = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "conformance.json")))
WAITING = ("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
           " AND objid::bigint = (hashtext(%s)::bigint & 4294967295)")


def expand(s: str, u: str) -> str:
    return re.sub(r"\{x\*(\d+)\}", lambda m: "x" * int(m.group(1)), s.replace("{u}", u))


def send(base: str, case: dict[str, Any], req: dict[str, Any], u: str) -> Optional[httpx.Response]:
    d = TABLE["defaults"]
    path = req.get("route") or case.get("route") or d["route"]
    if req.get("query"):
        path += "?" + req["query"]
    headers: list[tuple[str, str]] = [("Content-Type", req.get("content_type", "application/json"))]
    for line in req.get("key", []):
        headers.append(("Idempotency-Key", expand(line, u)))
    tenant = req["tenant"] if "tenant" in req else d["tenant"]
    if tenant is not None:
        headers.append(("X-Tenant", tenant))
    if "status" in req:
        headers.append(("X-Conformance-Status", str(req["status"])))
    if "fail" in req:
        headers.append(("X-Conformance-Fail", req["fail"]))
    if "pad" in req:
        headers.append(("X-Conformance-Pad", str(req["pad"])))
    if req.get("hold"):
        headers.append(("X-Conformance-Hold", u))
    try:
        return HTTP.post(base + path, content=expand(req.get("body", d["body"]), u).encode(), headers=headers,
                         timeout=120)
    except httpx.TransportError:
        return None


def expires_verdict(value: Optional[str], want: bool) -> list[str]:
    """Idempotent-Expires: absent, or an IMF-fixdate in the future."""
    if not want:
        return [] if value is None else [f"Idempotent-Expires {value!r}, expected none"]
    try:
        if value is None or not re.fullmatch(r"[A-Z][a-z]{2}, \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} GMT", value):
            raise ValueError
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return [f"Idempotent-Expires {value!r} is not an HTTP-date (IMF-fixdate)"]
    if when <= datetime.datetime.now(datetime.timezone.utc):
        return [f"Idempotent-Expires {value!r} is not in the future"]
    return []


def verdict(r: Optional[httpx.Response], exp: dict[str, Any], seen: list[Optional[httpx.Response]]) -> list[str]:
    """What differs from `exp` (empty: the response conforms)."""
    if r is None:
        return ["no response"]
    bad = []
    status = TABLE["problems"][exp["problem"]][0] if "problem" in exp else exp.get("status")
    if status is not None and r.status_code != status:
        bad.append(f"status {r.status_code}, expected {status}")
    replayed = r.headers.get("idempotent-replayed") == "true"
    want_replayed = False if "problem" in exp else exp.get("replayed")
    if want_replayed is not None and replayed != want_replayed:
        bad.append(f"replayed={replayed}")
    for name, value in exp.get("headers", {}).items():
        if r.headers.get(name) != value:
            bad.append(f"header {name}: {r.headers.get(name)!r}, expected {value!r}")
    if "problem" in exp:
        slug = exp["problem"]
        try:
            doc = r.json()
        except ValueError:
            doc = {}
        want = {"type": TABLE["problem_base"] + slug, "title": TABLE["problems"][slug][1],
                "status": TABLE["problems"][slug][0]}
        if not (r.headers.get("content-type") or "").startswith("application/problem+json"):
            bad.append(f"content-type {r.headers.get('content-type')}")
        for k, v in want.items():
            if not isinstance(doc, dict) or doc.get(k) != v:
                bad.append(f"problem {k}: {doc.get(k) if isinstance(doc, dict) else doc!r}, expected {v!r}")
        if not isinstance(doc, dict) or not isinstance(doc.get("detail"), str) or not doc["detail"]:
            bad.append("problem without a detail")
    if exp.get("ran"):
        ids = set()
        for s in seen:
            try:
                ids.add(s.json().get("id") if s is not None else None)
            except (ValueError, AttributeError):
                pass
        try:
            rid = r.json().get("id")
        except (ValueError, AttributeError):
            rid = None
        if rid is None or rid in ids or replayed:
            bad.append(f"the handler did not run for it (id {rid}, replayed={replayed})")
    if "expires" in exp:
        bad += expires_verdict(r.headers.get("idempotent-expires"), exp["expires"])
    if "same_as" in exp:
        first = seen[exp["same_as"]]
        if first is None or r.content != first.content:
            bad.append(f"body {r.content[:80]!r} differs from request {exp['same_as']}'s")
        for h in ("content-type", "location"):
            if first is not None and r.headers.get(h) != first.headers.get(h):
                bad.append(f"{h} {r.headers.get(h)!r}, the first had {first.headers.get(h)!r}")
    return bad


def seed(db: psycopg.Connection[Any], s: dict[str, Any], u: str) -> None:
    """A claim finished by other code (a SQL handler, a consumer), before the requests."""
    claim, biz = expand(s["claim"], u), s["biz_type"]
    with db.transaction():
        db.execute("SELECT idem_claim(%s, %s)", (claim, biz))
        db.execute(f"SELECT {'idem_complete' if s['state'] == 'completed' else 'idem_fail'}(%s, %s, %s::jsonb)",
                   (claim, biz, None if s["result"] is None else json.dumps(s["result"])))


def configure(db: psycopg.Connection[Any], c: dict[str, Any]) -> None:
    """The business type's failure policy (its TTL the default), before the requests."""
    db.execute("SELECT idem_configure(%s, NULL, %s)", (c["biz_type"], c["on_failure"]))


def run_case(base: str, conninfo: str, case: dict[str, Any]) -> list[str]:
    u = uuid.uuid4().hex[:12]
    reqs = case["requests"]
    responses: list[Optional[httpx.Response]] = [None] * len(reqs)
    problems: list[str] = []
    held: list[tuple[int, threading.Thread]] = []
    with psycopg.connect(conninfo, autocommit=True) as db:
        if "configure" in case:
            configure(db, case["configure"])
        if "seed" in case:
            seed(db, case["seed"], u)
        holding = any(r.get("hold") for r in reqs)
        if holding:
            db.execute("SELECT pg_advisory_lock(hashtext(%s))", (u,))

        def check(i: int) -> None:
            bad = verdict(responses[i], reqs[i]["expect"], responses[:i])
            problems.extend(f"request {i}: {b}" for b in bad)

        for i, req in enumerate(reqs):
            if req.get("after_release"):
                continue
            if req.get("hold"):
                def bg(i: int = i, req: dict[str, Any] = req) -> None:
                    responses[i] = send(base, case, req, u)
                t = threading.Thread(target=bg)
                t.start()
                held.append((i, t))
                # A hang guard, not a verdict: the held request waits for our lock.
                for _ in range(12000):
                    if db.execute(WAITING, (u,)).fetchone()[0] > 0:  # type: ignore[index]
                        break
                    time.sleep(0.005)
                else:
                    problems.append(f"request {i} never waited for the hold")
                continue
            responses[i] = send(base, case, req, u)
            check(i)
        if holding:
            db.execute("SELECT pg_advisory_unlock(hashtext(%s))", (u,))
        for i, t in held:
            t.join()
            check(i)
        for i, req in enumerate(reqs):
            if req.get("after_release"):
                responses[i] = send(base, case, req, u)
                check(i)
        rows = db.execute("SELECT count(*) FROM conformance_rows WHERE run = %s", (u,)).fetchone()[0]  # type: ignore[index]
        if rows != case["rows"]:
            problems.append(f"{rows} business row(s), expected {case['rows']}")
    return problems


def run(base: str, conninfo: str, check: Callable[[bool, str], None]) -> None:
    with psycopg.connect(conninfo, autocommit=True) as db:
        db.execute("CREATE TABLE IF NOT EXISTS conformance_rows (id bigserial PRIMARY KEY, run text NOT NULL,"
                   " tenant text, status int NOT NULL)")
    for case in TABLE["cases"]:
        problems = run_case(base, conninfo, case)
        check(not problems, f"conformance: {case['name']}" + (f": {'; '.join(problems)}" if problems else ""))
