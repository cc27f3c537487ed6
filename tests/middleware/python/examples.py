"""Runs the README's example app (clients/python/examples/<name>_example.py)
as it is, on loopback, and checks what a newcomer relies on, with httpx and
the business rows:
  * without credentials: 401 from the authentication layer; the retry with a
    token runs the work (one row), the next is replayed;
  * tenants whose spellings collide under a bare separator (acme + "eu:K",
    "acme:eu" + "K") each get their own operation and row;
  * the rate limiter's 429 for a key: once the limit lets it through, the
    retry with that key runs the work (it was not stored);
  * Django: CSRF's 403 (inside the idempotency middleware) is not stored:
    the retry with the CSRF token runs the work.

    python examples.py fastapi|django PORT CONNINFO

Every wait is for an observed state (the app answering, an answer other
than 429), never a verdict by the clock. Exits 1 on a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from typing import Any, Optional

import httpx
import psycopg

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lib"))
from sessions import Checks  # noqa: E402  (tests/lib)

NAME, PORT, CONNINFO = sys.argv[1:4]
EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "clients", "python", "examples")
BASE = f"http://127.0.0.1:{PORT}"
TOKENS = {"token-acme": "acme", "token-acme-eu": "acme:eu", "token-rl": "limited"}
RUN = uuid.uuid4().hex
check = Checks(f"{NAME} example")


def rows(tenant: str, key: str) -> int:
    with psycopg.connect(CONNINFO, autocommit=True) as c:
        return int(c.execute("SELECT count(*) FROM example_orders WHERE idem_key = %s",
                             (f"{len(tenant.encode())}:{tenant}:{key}",)).fetchone()[0])  # type: ignore[index]


def post(client: httpx.Client, key: str, token: Optional[str], path: str = "/orders",
         **headers: str) -> httpx.Response:
    h = {"Content-Type": "application/json", "Idempotency-Key": f'"{key}"',
         **{n.replace("_", "-"): v for n, v in headers.items()}}
    if token:
        h["Authorization"] = f"Bearer {token}"
    return client.post(BASE + path, content=json.dumps({"sku": "sku-1", "qty": 1}), headers=h, timeout=120)


def replayed(r: httpx.Response) -> bool:
    return r.headers.get("idempotent-replayed") == "true"


def main() -> None:
    with psycopg.connect(CONNINFO, autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS example_orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
                  " tenant text NOT NULL, idem_key text NOT NULL, sku text NOT NULL, qty int NOT NULL)")
    env = dict(os.environ, IDEM_DSN=CONNINFO, API_TOKENS=json.dumps(TOKENS), RATE_LIMIT="5", RATE_WINDOW="2",
               PYTHONPATH=EXAMPLES)
    if NAME == "django":
        cmd = [sys.executable, "-m", "django", "runserver", "--noreload", f"127.0.0.1:{PORT}"]
        env["DJANGO_SETTINGS_MODULE"] = "django_example"
    else:
        cmd = [sys.executable, "-m", "uvicorn", "fastapi_example:app", "--host", "127.0.0.1", "--port", PORT,
               "--log-level", "warning"]
    server = subprocess.Popen(cmd, cwd=EXAMPLES, env=env)
    api = "/api/orders" if NAME == "django" else "/orders"
    try:
        with httpx.Client() as client:
            for _ in range(6000):  # a hang guard: until the app answers (401 without a token)
                if server.poll() is not None:
                    raise SystemExit(f"the {NAME} example exited with {server.returncode}")
                try:
                    client.post(BASE + api, timeout=60)
                    break
                except httpx.TransportError:
                    time.sleep(0.05)

            key = f"{RUN}-auth"
            denied, bad = post(client, key, None, api), post(client, key, "not-a-token", api)
            ok = post(client, key, "token-acme", api)
            again = post(client, key, "token-acme", api)
            check([denied.status_code, bad.status_code, ok.status_code, replayed(ok), again.status_code,
                   replayed(again), again.text == ok.text, rows("acme", key)] == [401, 401, 201, False, 201, True,
                                                                                 True, 1],
                  f"401 without credentials ({denied.status_code}), then the retry with a token runs "
                  f"({ok.status_code}), the next is replayed ({replayed(again)}), {rows('acme', key)} row")

            k = f"{RUN}-K"
            a, b, c = post(client, k, "token-acme", api), post(client, f"eu:{k}", "token-acme", api), \
                post(client, k, "token-acme-eu", api)
            check([a.status_code, b.status_code, c.status_code, replayed(b) or replayed(c), len({a.text, b.text, c.text}),
                   rows("acme", k), rows("acme", f"eu:{k}"), rows("acme:eu", k)] == [201, 201, 201, False, 3, 1, 1, 1],
                  'acme + "eu:K" and "acme:eu" + "K": each its own operation and row')

            limited: Optional[str] = None
            for i in range(50):  # spend the limit with fresh keys until the limiter says 429
                r = post(client, f"{RUN}-rl-{i}", "token-rl", api)
                if r.status_code == 429:
                    limited = f"{RUN}-rl-{i}"
                    break
            retry: Any = None
            if limited:
                for _ in range(600):  # until the limit lets it through (a hang guard, not a verdict)
                    retry = post(client, limited, "token-rl", api)
                    if retry.status_code != 429:
                        break
                    time.sleep(0.1)
            after = post(client, limited, "token-rl", api) if limited else None
            check(limited is not None and retry is not None and retry.status_code == 201 and not replayed(retry)
                  and after is not None and replayed(after) and rows("limited", limited) == 1,
                  f"a key refused 429 by the rate limiter ({limited is not None}): the retry the limit lets through "
                  f"runs the work ({retry.status_code if retry is not None else None}), then is replayed")

            if NAME == "django":
                key = f"{RUN}-csrf"
                forbidden = post(client, key, "token-acme")  # the CSRF-checked route, no token
                token = client.get(BASE + "/csrf", headers={"Authorization": "Bearer token-acme"}).json()["csrf_token"]
                ok = post(client, key, "token-acme", X_CSRFToken=token)
                again = post(client, key, "token-acme", X_CSRFToken=token)
                check([forbidden.status_code, ok.status_code, replayed(ok), replayed(again), rows("acme", key)]
                      == [403, 201, False, True, 1],
                      f"CSRF's 403 ({forbidden.status_code}) not stored: the retry with the CSRF token runs the work "
                      f"({ok.status_code}), then is replayed; {rows('acme', key)} row")
    finally:
        server.terminate()
        server.wait()
    check.finish()


if __name__ == "__main__":
    main()
