"""The core claim API (sync and async) against a real PostgreSQL with idem
(directly, or through PgBouncer in transaction mode: no prepared statements):

    python tests/test_claim_db.py "host=... port=... dbname=... user=..."

Each check prints ok/FAIL; exits 1 on a failure. Uses whichever idem_http
is installed."""

from __future__ import annotations

import asyncio
import sys
import uuid
from typing import Any

import psycopg

import idem_http
import idem_http.aio
from idem_http import ClaimNotFinished, FingerprintMismatch

CONNINFO = sys.argv[1] if len(sys.argv) > 1 else ""
RUN = uuid.uuid4().hex[:8]
failures: list[str] = []


def check(cond: bool, msg: str) -> None:
    print(("ok   " if cond else "FAIL ") + msg, flush=True)
    if not cond:
        failures.append(msg)


def count(conn: psycopg.Connection[Any], key: str) -> int:
    row = conn.execute("SELECT count(*) FROM claim_api_rows WHERE k = %s", (key,)).fetchone()
    assert row is not None
    return int(row[0])


def sync_checks() -> None:
    with psycopg.connect(CONNINFO, autocommit=True, prepare_threshold=None) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS claim_api_rows (k text)")
        key = f"{RUN}-sync"
        with idem_http.claim(conn, key, "api.sync", fingerprint="fp1") as c:
            first = c.claimed
            conn.execute("INSERT INTO claim_api_rows VALUES (%s)", (key,))
            c.complete({"status": 201, "body": "made"})
        with idem_http.claim(conn, key, "api.sync", fingerprint="fp1") as d:
            pass
        check(first and not d.claimed and d.state == "completed" and d.replay is not None
              and d.replay.body == b"made" and count(conn, key) == 1,
              "sync: claim, write, complete; the duplicate reads the stored response")
        try:
            with idem_http.claim(conn, key, "api.sync", fingerprint="fp2"):
                pass
            check(False, "sync: another fingerprint raised nothing")
        except FingerprintMismatch:
            check(conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE,
                  "sync: another fingerprint raises FingerprintMismatch, the transaction rolled back")
        key2 = f"{RUN}-unfinished"
        try:
            with idem_http.claim(conn, key2, "api.sync"):
                conn.execute("INSERT INTO claim_api_rows VALUES (%s)", (key2,))
            check(False, "sync: a block without complete() raised nothing")
        except ClaimNotFinished:
            state = conn.execute("SELECT state FROM idem_lookup(%s, 'api.sync')", (key2,)).fetchone()
            check(state == ("absent",) and count(conn, key2) == 0,
                  "sync: a block without complete() raises ClaimNotFinished and rolls back its writes and claim")
        key3 = f"{RUN}-raise"
        try:
            with idem_http.claim(conn, key3, "api.sync") as c:
                conn.execute("INSERT INTO claim_api_rows VALUES (%s)", (key3,))
                raise KeyError("boom")
        except KeyError:
            pass
        state = conn.execute("SELECT state FROM idem_lookup(%s, 'api.sync')", (key3,)).fetchone()
        check(state == ("absent",) and count(conn, key3) == 0, "sync: an exception rolls back the writes and the claim")
        key4 = f"{RUN}-lease"
        with idem_http.claim(conn, key4, "api.lease", lease="1 minute") as c:
            token_ok = c.lease_token is not None and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            c.checkpoint("step", {"n": 1})
            c.complete({"status": 200, "body": "leased"})
        with psycopg.connect(CONNINFO, autocommit=True, prepare_threshold=None) as other:
            st = other.execute("SELECT state, result->>'body' FROM idem_lookup(%s, 'api.lease')", (key4,)).fetchone()
        check(token_ok and st == ("completed", "leased"),
              "sync lease: committed at once, checkpoint and complete with the kept token")
        key5 = f"{RUN}-lease-raise"
        try:
            with idem_http.claim(conn, key5, "api.lease", lease="1 minute") as c:
                c.checkpoint("called", {"charge": "ch_1"})
                raise RuntimeError("the external call failed")
        except RuntimeError:
            pass
        # Handed back: the next claim takes the lease over at once (not 409
        # for a minute), attempt 2, the recovery point kept.
        with idem_http.claim(conn, key5, "api.lease", lease="1 minute") as d:
            again = (d.claimed, d.attempt, d.recovery_point, d.recovery_data)
            d.complete({"status": 200})
        check(again == (True, 2, "called", {"charge": "ch_1"}),
              f"sync lease: an exception in the block hands the lease back; the next claim takes over: {again}")
        # A type that retries stored failures: the next claim after fail()
        # runs again (attempt 2, the error told); once completed, never.
        conn.execute("SELECT idem_configure('api.retry', NULL, 'retry')")
        key6 = f"{RUN}-retry"
        seen, told = [], None
        for _ in range(3):
            with idem_http.claim(conn, key6, "api.retry") as c:
                seen.append((c.claimed, c.state, c.attempt))
                if c.claimed:
                    conn.execute("INSERT INTO claim_api_rows VALUES (%s)", (key6,))
                    if c.attempt == 1:
                        c.fail({"status": 422, "body": "declined"})
                    else:
                        told = c.result.get("previous_error") if isinstance(c.result, dict) else None
                        c.complete({"status": 201, "body": "made"})
        check(seen == [(True, "new", 1), (True, "new", 2), (False, "completed", 1)]
              and told == {"status": 422, "body": "declined"} and count(conn, key6) == 2,
              f"sync: under on_failure 'retry' the claim after fail() runs again, then the completion is kept: {seen}")


async def async_checks() -> None:
    async with await psycopg.AsyncConnection.connect(CONNINFO, autocommit=True, prepare_threshold=None) as conn:
        key = f"{RUN}-async"
        async with idem_http.aio.claim(conn, key, "api.async", fingerprint="fp1", lock_timeout="2s") as c:
            first = c.claimed
            # The bound is for the claim's wait; the handler's own waits keep the session's setting.
            cur = await conn.execute("SELECT current_setting('lock_timeout')")
            lt = await cur.fetchone()
            await conn.execute("INSERT INTO claim_api_rows VALUES (%s)", (key,))
            await c.fail({"status": 422, "body": "refused"})
        async with idem_http.aio.claim(conn, key, "api.async", fingerprint="fp1") as d:
            pass
        cur = await conn.execute("SELECT count(*) FROM claim_api_rows WHERE k = %s", (key,))
        n = await cur.fetchone()
        check(first and d.state == "failed" and d.replay is not None and d.replay.status == 422
              and n == (1,) and lt == ("0",),
              "async: claim, write, fail; the duplicate reads the stored failure; after the claim, lock_timeout is the session's again")
        try:
            async with idem_http.aio.claim(conn, key, "api.async", fingerprint="other"):
                pass
            check(False, "async: another fingerprint raised nothing")
        except FingerprintMismatch:
            check(True, "async: another fingerprint raises FingerprintMismatch")
        key2 = f"{RUN}-async-lease-raise"
        try:
            async with idem_http.aio.claim(conn, key2, "api.lease", lease="1 minute"):
                raise RuntimeError("the external call failed")
        except RuntimeError:
            pass
        async with idem_http.aio.claim(conn, key2, "api.lease", lease="1 minute") as e:
            again = (e.claimed, e.attempt)
            await e.complete({"status": 200})
        check(again == (True, 2), f"async lease: an exception hands the lease back; the next claim takes over: {again}")


def sqlalchemy_checks() -> None:
    """idem_http.sqlalchemy.handle_request switches the pooled psycopg
    connection to autocommit to send BEGIN with the claim: after every kind
    of request the pool holds it out of autocommit again, so the next
    session's statements are one transaction, and each request's outcome
    is its own (one pooled connection serves them all)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.orm import Session

    import idem_http.sqlalchemy as idem_sa
    from idem_http import Policy, RequestInfo, Response, Route

    params = dict(p.split("=", 1) for p in CONNINFO.split())
    engine = create_engine(f"postgresql+psycopg://{params.get('user', 'postgres')}@/{params.get('dbname', '')}",
                           connect_args={"host": params.get("host", ""), "port": params.get("port", "5432"),
                                         "prepare_threshold": None}, pool_size=1, max_overflow=0)
    policy, route = Policy(single_tenant=True), Route("api.sa")

    def request(key: str, body: bytes, status: int = 201, raise_: bool = False) -> int:
        info = RequestInfo("POST", "/sa", "", {"idempotency-key": f'"{key}"'}, body)

        def handler(session: Session) -> Response:
            session.execute(text("INSERT INTO claim_api_rows VALUES (:k)"), {"k": key})
            if raise_:
                raise KeyError("boom")
            return Response(status, [], b"{}")

        with Session(engine) as session:
            try:
                out = idem_sa.handle_request(session, policy, route, info, call=lambda c: handler(session),
                                             describe=lambda r: r)
            except KeyError:
                return -1
        return out.status

    def pooled_state() -> tuple[bool, Any, int]:
        with engine.connect() as sa_conn:
            raw = sa_conn.connection.driver_connection
            assert isinstance(raw, psycopg.Connection)
            autocommit, status = raw.autocommit, raw.info.transaction_status
            # Two statements of a session: one transaction, not two (an
            # autocommit connection would answer two different xids).
            xids = {sa_conn.execute(text("SELECT txid_current()")).scalar() for _ in range(2)}
            sa_conn.rollback()
        return autocommit, status, len(xids)

    idle = psycopg.pq.TransactionStatus.IDLE
    key = f"{RUN}-sa-new-key-0001"
    steps = [("a new key", lambda: request(key, b"1"), 201),
             ("its replay", lambda: request(key, b"1"), 201),
             ("another body (ID001)", lambda: request(key, b"2"), 422),
             ("a 500, rolled back", lambda: request(f"{RUN}-sa-answer-500", b"1", status=500), 500),
             ("a handler that raised", lambda: request(f"{RUN}-sa-raised-key", b"1", raise_=True), -1)]
    for what, step, expected in steps:
        got = step()
        check(got == expected and pooled_state() == (False, idle, 1),
              f"sqlalchemy: after {what} ({got}), the pooled connection is out of autocommit, idle, "
              f"and a session's statements are one transaction")
    with psycopg.connect(CONNINFO, autocommit=True, prepare_threshold=None) as conn:
        rows = [count(conn, k) for k in (key, f"{RUN}-sa-answer-500", f"{RUN}-sa-raised-key")]
    check(rows == [1, 0, 0], f"sqlalchemy: one row for the new key, none for the rolled-back ones: {rows}")
    engine.dispose()


def main() -> None:
    sync_checks()
    asyncio.run(async_checks())
    sqlalchemy_checks()
    print(f"summary: test_claim_db: {len(failures)} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
