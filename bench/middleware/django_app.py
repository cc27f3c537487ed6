"""bench/middleware.sh's Django server (settings, URLs, views): app.py's handler on
Django's connection behind /mw (idem_http.django: a, b), /hand (c) and /plain (d)."""

import json
import os

from django.db import connection, transaction
from django.http import JsonResponse
from django.urls import path

from idem_http import Policy

_db = dict(p.split("=", 1) for p in os.environ["BENCH_CONNINFO"].split())
DEBUG, SECRET_KEY, ROOT_URLCONF, USE_TZ, INSTALLED_APPS, ALLOWED_HOSTS = False, "bench-only", "django_app", True, [], ["127.0.0.1"]
MIDDLEWARE = ["idem_http.django.IdempotencyMiddleware"]
DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql", "NAME": _db["dbname"], "USER": _db["user"],
                         "HOST": _db["host"], "PORT": _db["port"],
                         # Django 5.1's psycopg pool, as FastAPI's: runserver's threads come and go
                         "OPTIONS": {"pool": {"min_size": int(os.environ.get("BENCH_POOL", "8")),
                                              "max_size": int(os.environ.get("BENCH_POOL", "8"))}}}}
IDEM_HTTP = {"routes": {("POST", "/mw"): "bench.mw"}, "policy": Policy(single_tenant=True)}


def create_order(cur, key, body):
    cur.execute("INSERT INTO orders (key, amount) VALUES (%s, %s) RETURNING id", (key, body["amount"]))
    return {"id": cur.fetchone()[0], "amount": body["amount"]}


def mw(request):
    with connection.cursor() as cur:
        return JsonResponse(create_order(cur, request.headers.get("Idempotency-Key"), json.loads(request.body)), status=201)


def hand(request):
    key = request.headers.get("Idempotency-Key")
    if not key:
        return JsonResponse({"error": "Idempotency-Key required"}, status=400)
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("INSERT INTO dedup (key) VALUES (%s) ON CONFLICT DO NOTHING RETURNING key", (key,))
        if cur.fetchone() is None:  # a duplicate: the stored answer
            cur.execute("SELECT response::text FROM dedup WHERE key = %s", (key,))
            return JsonResponse(json.loads(cur.fetchone()[0]), status=201)
        result = create_order(cur, key, json.loads(request.body))
        cur.execute("UPDATE dedup SET response = %s::jsonb WHERE key = %s", (json.dumps(result), key))
    return JsonResponse(result, status=201)


def plain(request):
    with transaction.atomic(), connection.cursor() as cur:
        return JsonResponse(create_order(cur, request.headers.get("Idempotency-Key"), json.loads(request.body)), status=201)


urlpatterns = [path("mw", mw), path("hand", hand), path("plain", plain)]
