"""Counts the round trips between an HTTP middleware's server and PostgreSQL
per request, through a protocol proxy, and checks them against the numbers
the scenario expects (tests/scenarios/clients.sh middleware_go, _node,
_python).

    python roundtrips.py --upstream SOCKET --check CONNINFO --label LABEL \
        --new N --replay N -- COMMAND [ARG...]

The proxy listens on a free loopback port and forwards each connection to
the cluster's Unix socket SOCKET (no SSL: an SSLRequest or GSSENCRequest is
answered 'N'). COMMAND starts the server under test; in its arguments
{pgport} is the proxy's port and {httpport} a free port for the server's
HTTP (a server that prints "listening PORT" on stdout names its own). The
server is ready when its HTTP port accepts a connection.

A round trip is one frontend message that makes the server answer with
ReadyForQuery: a Sync (extended protocol) or a simple Query; the messages
before it travel with it. A pool's liveness check (an empty or
comment-only statement, such as pgxpool's "-- ping" after a second idle)
is counted apart: the clock decides it, not the request.

The requests: POST /conformance/orders (tests/middleware/README.md, "The
server a runner needs"), one at a time: warm-up keys first (prepared
statements, the pool's connection), then --requests new keys and a replay
of each. After each answer the checker waits until every connection of the
proxy has its transaction ended (ReadyForQuery 'I', nothing unanswered), so
a ROLLBACK sent after the answer is counted with its request. Each request
must take exactly --new (a new key) or --replay (a replay) round trips; a
new key must answer 201 and write its one business row, a replay must be
replayed. Prints ok/FAIL lines; exits 1 on a failure.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from typing import Callable

import psycopg

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from sessions import Checks  # noqa: E402  (tests/lib)

SYNC, QUERY, PARSE, BIND, READY = ord("S"), ord("Q"), ord("P"), ord("B"), ord("Z")
SPECIAL_CODES = {80877103, 80877104}  # SSLRequest, GSSENCRequest: answered 'N'
PING = re.compile(r"\s*(--[^\n]*)?\s*;?\s*$")


class Conn:
    """One proxied connection: what the client sent, what came back."""

    def __init__(self) -> None:
        self.round_trips = 0
        self.pings = 0
        self.unanswered = 0
        self.status = b""  # the last ReadyForQuery's status: I, T, E ("" before the first)
        self.closed = False
        self.statements: dict[bytes, str] = {}  # prepared statement name -> its text
        self.pending: list[str] = []  # the statements of the round trip being sent
        self.log: list[str] = []  # one line per round trip

    def idle(self) -> bool:
        return self.closed or (self.status == b"I" and self.unanswered == 0)


class Proxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.conns: list[Conn] = []
        self.changed = threading.Condition()
        self.port = 0

    # ---- counts, read by the checker's thread ----
    def snapshot(self) -> tuple[int, int, int]:
        with self.changed:
            return (sum(c.round_trips for c in self.conns), sum(c.pings for c in self.conns), len(self.conns))

    def log_since(self, marks: dict[int, int]) -> list[str]:
        with self.changed:
            return [f"connection {i}: {line}" for i, c in enumerate(self.conns) for line in c.log[marks.get(i, 0):]]

    def log_marks(self) -> dict[int, int]:
        with self.changed:
            return {i: len(c.log) for i, c in enumerate(self.conns)}

    def wait_idle(self, guard: float = 120.0) -> bool:
        """Every connection's transaction ended and answered (a hang guard, not a verdict)."""
        with self.changed:
            return self.changed.wait_for(lambda: all(c.idle() for c in self.conns), timeout=guard)

    # ---- the protocol ----
    def frontend(self, conn: Conn, typ: int, body: bytes) -> None:
        if typ == PARSE:
            name, _, rest = body.partition(b"\0")
            text = rest.partition(b"\0")[0].decode(errors="replace")
            conn.statements[name] = text
            conn.pending.append(text)
        elif typ == BIND:
            name = body.partition(b"\0")[2].partition(b"\0")[0]
            if name:  # a named statement, parsed earlier: its text
                conn.pending.append(conn.statements.get(name, f"<statement {name!r}>"))
        elif typ in (SYNC, QUERY):
            if typ == QUERY:
                conn.pending.append(body.rstrip(b"\0").decode(errors="replace"))
            texts, conn.pending = conn.pending, []
            conn.unanswered += 1
            if texts and all(PING.match(t) for t in texts):
                conn.pings += 1
            else:
                conn.round_trips += 1
                conn.log.append(" | ".join(" ".join(t.split())[:90] for t in texts) or "(Sync)")

    def backend(self, conn: Conn, typ: int, body: bytes) -> None:
        if typ == READY:
            conn.status = body[:1]
            conn.unanswered = max(conn.unanswered - 1, 0)
            self.changed.notify_all()

    async def startup(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      up: asyncio.StreamWriter) -> None:
        """The startup packet, and SSL / GSSAPI requests before it (no type byte)."""
        while True:
            head = await reader.readexactly(8)
            length, code = struct.unpack("!ii", head)
            rest = await reader.readexactly(length - 8)
            if code not in SPECIAL_CODES:
                up.write(head + rest)
                await up.drain()
                return
            writer.write(b"N")
            await writer.drain()

    async def pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   seen: Callable[[int, bytes], None]) -> None:
        """Forwards what comes as it comes; seen(type, body) of each whole
        message first, under the lock."""
        buf = b""
        while chunk := await reader.read(65536):
            buf += chunk
            with self.changed:
                while len(buf) >= 5 and len(buf) >= 1 + (length := struct.unpack("!i", buf[1:5])[0]):
                    seen(buf[0], buf[5:1 + length])
                    buf = buf[1 + length:]
            writer.write(chunk)
            await writer.drain()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Conn()
        with self.changed:
            self.conns.append(conn)
        up_writer = None
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(self.upstream)
            await self.startup(reader, writer, up_writer)
            tasks = [asyncio.ensure_future(self.pump(reader, up_writer, lambda t, b: self.frontend(conn, t, b))),
                     asyncio.ensure_future(self.pump(up_reader, writer, lambda t, b: self.backend(conn, t, b)))]
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in tasks:
                t.cancel()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for w in (writer, up_writer):
                if w is not None:
                    w.close()
            with self.changed:
                conn.closed = True
                self.changed.notify_all()

    def start(self) -> None:
        ready = threading.Event()

        async def main() -> None:
            server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            ready.set()
            await server.serve_forever()

        threading.Thread(target=lambda: asyncio.run(main()), daemon=True).start()
        ready.wait()


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--upstream", required=True, help="the cluster's Unix socket (DIR/.s.PGSQL.PORT)")
    ap.add_argument("--check", required=True, help="conninfo of the checks' own connection (the cluster directly)")
    ap.add_argument("--label", required=True)
    ap.add_argument("--new", type=int, required=True, help="round trips a new key must take")
    ap.add_argument("--replay", type=int, required=True, help="round trips a replay must take")
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--regression", default="", help="what a count other than the expected one means")
    ap.add_argument("command", nargs="+")
    a = ap.parse_args()

    check = Checks(a.label)

    with psycopg.connect(a.check, autocommit=True) as db:
        db.execute("CREATE TABLE IF NOT EXISTS conformance_rows (id bigserial PRIMARY KEY, run text NOT NULL,"
                   " tenant text, status int NOT NULL)")
    proxy = Proxy(a.upstream)
    proxy.start()
    http_port = free_port()
    cmd = [arg.replace("{pgport}", str(proxy.port)).replace("{httpport}", str(http_port)) for arg in a.command]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    named: list[int] = []

    def read_stdout() -> None:
        assert server.stdout is not None
        for line in server.stdout:
            m = re.match(r"listening (\d+)", line)
            if m and not named:
                named.append(int(m.group(1)))

    threading.Thread(target=read_stdout, daemon=True).start()
    try:
        port = 0
        for _ in range(6000):  # a hang guard of 6000 polls, not a verdict
            if server.poll() is not None:
                raise SystemExit(f"FAIL [{a.label}] the server exited with {server.returncode}")
            port = named[0] if named else http_port
            try:
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
                break
            except OSError:
                time.sleep(0.01)
        else:
            raise SystemExit(f"FAIL [{a.label}] the server never answered on port {port}")

        http_conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        run = uuid.uuid4().hex[:12]
        body = json.dumps({"run": run})

        def post(key: str) -> tuple[int, dict[str, str], bytes]:
            http_conn.request("POST", "/conformance/orders", body=body, headers={
                "Content-Type": "application/json", "X-Tenant": "roundtrips", "Idempotency-Key": f'"{key}"'})
            r = http_conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()

        def measured(key: str) -> tuple[int, int, dict[str, str], bytes, list[str]]:
            if not proxy.wait_idle():
                raise SystemExit(f"FAIL [{a.label}] a connection never ended its transaction")
            before, marks = proxy.snapshot()[0], proxy.log_marks()
            status, headers, content = post(key)
            if not proxy.wait_idle():
                raise SystemExit(f"FAIL [{a.label}] a connection never ended its transaction after {key}")
            return proxy.snapshot()[0] - before, status, headers, content, proxy.log_since(marks)

        keys = [f"rt-{run}-{i:04d}" for i in range(a.warmup + a.requests)]
        for key in keys[:a.warmup]:
            post(key)
            post(key)
        connections_before, pings_before = proxy.snapshot()[2], proxy.snapshot()[1]
        news, replays = [], []
        for key in keys[a.warmup:]:
            news.append(measured(key))
            replays.append(measured(key))
        connections, pings = proxy.snapshot()[2] - connections_before, proxy.snapshot()[1] - pings_before

        for kind, results, want, want_status in (("new key", news, a.new, 201), ("replay", replays, a.replay, 201)):
            counts = [r[0] for r in results]
            ok_answers = all(r[1] == want_status and (r[2].get("idempotent-replayed") == "true") == (kind == "replay")
                             for r in results)
            check(ok_answers, f"each {kind} answered {want_status}, " + ("replayed" if kind == "replay" else "not replayed"))
            if all(c == want for c in counts):
                check(True, f"each {kind} took {want} round trips to PostgreSQL ({len(counts)} requests)")
            else:
                worst = next(r for r in results if r[0] != want)
                check(False, f"a {kind} took {worst[0]} round trips to PostgreSQL, not {want} "
                             f"(per request: {counts}). {a.regression}\n  its round trips:\n    "
                             + "\n    ".join(worst[4]))
        same = all(n[3] == r[3] for n, r in zip(news, replays))
        check(same, "each replay's body is its new key's")
        with psycopg.connect(a.check, autocommit=True) as db:
            rows = db.execute("SELECT count(*) FROM conformance_rows WHERE run = %s", (run,)).fetchone()[0]  # type: ignore[index]
        check(rows == a.warmup + a.requests, f"one business row per key ({rows} for {a.warmup + a.requests} keys)")
        print(f"[{a.label}] measured: {len(news)} new keys and {len(replays)} replays on "
              f"{connections} new connections; {pings} pool liveness checks counted apart", flush=True)
    finally:
        server.kill()
        server.wait()
    check.finish("round trips, ")


if __name__ == "__main__":
    main()
