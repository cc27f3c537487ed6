"""kills: what each dedup approach leaves behind when its client is killed
between the dedup step and COMMIT (bench/txn.c kill: a deterministic kill
point, no timing) and a fresh client retries the same key."""
import os
import signal
import subprocess
import time

from lib import BenchError, table

PARAMS = {"kills": (5, 200, 200, "kills per approach")}
DB = "bench_kills"
APPROACHES = {"redis": "Redis SET NX EX, then the PostgreSQL transaction",
              "idem": "idem_claim inside the transaction",
              "handwritten": "INSERT … ON CONFLICT DO NOTHING RETURNING inside the transaction"}


def estimate(p):
    return 10 + p["kills"] * len(APPROACHES) * 0.05


def kill_first(cmd):
    """The first client: run until it stops itself before COMMIT, then SIGKILL
    it. None, or the error when it did not get there."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status = os.waitpid(p.pid, os.WUNTRACED)
    if os.WIFSTOPPED(status):
        os.kill(p.pid, signal.SIGKILL)
        os.waitpid(p.pid, 0)
        p.returncode = -signal.SIGKILL   # reaped here, not by Popen
        p.stderr.close()
        return None
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    return f"exit {p.returncode}: {err.strip()[-300:]}"


def run(b):
    sock = b.a.redis_sock if b.a.redis_sock and not b.a.no_redis else ""
    raw = b.raw["kills"] = {"approaches": {}, "skipped": [] if sock else ["redis (no redis-server)"]}
    if not b.txn:
        raise BenchError("kills: bench/txn.c could not be compiled (cc, libpq-fe.h)")
    b.create_db(DB)
    conninfo = f"host={b.a.host} port={b.a.port} user=postgres dbname={DB}"
    nonce = str(int(time.time()))   # redis keeps its keys for the whole benchmark run
    retries = {a: {} for a in APPROACHES if a != "redis" or sock}
    for i in range(b.p["kills"]):
        for a in retries:
            key = f"kill-{nonce}-{a}-{i:05d}"
            err = kill_first([b.txn, "kill", a, "first", conninfo, sock or "-", key])
            if err:
                raise BenchError(f"kills: the first client of {a} ({key}) did not reach the kill point: {err}")
            r = subprocess.run([b.txn, "kill", a, "retry", conninfo, sock or "-", key], capture_output=True, text=True)
            if r.returncode != 0 or "outcome=" not in r.stdout:
                raise BenchError(f"kills: the retry of {a} ({key}) failed: {(r.stderr or r.stdout).strip()[-300:]}")
            retries[a][key] = r.stdout.split("outcome=", 1)[1].split()[0]
    rows = dict(l.split("|") for l in b.psql(DB, "SELECT key, count(*) FROM orders GROUP BY key").splitlines())
    for a, outcomes in retries.items():
        c = dict.fromkeys(("retry_refused", "retry_did_work", "lost", "twice", "once"), 0)
        c["kills"] = len(outcomes)
        for key, outcome in outcomes.items():
            n = int(rows.get(key, 0))
            c["retry_refused" if outcome == "duplicate" else "retry_did_work"] += 1
            c["lost"] += n == 0 and outcome == "duplicate"
            c["twice"] += n >= 2
            c["once"] += n == 1
        raw["approaches"][a] = c
        b.log(f"kills {a:11s}: {c['kills']} kills: retry refused {c['retry_refused']}, work lost {c['lost']}, "
              f"done twice {c['twice']}, done once {c['once']}")
    b.save()
    b.drop_db(DB)


def report(R):
    raw = R.raw.get("kills") or {}
    ap = raw.get("approaches") or {}
    if not ap:
        return
    R.md += ["## Client killed between the dedup step and COMMIT", "",
             "Lost = the retry was told \"duplicate\" and no business row exists; twice = two business rows.", ""] + \
        table(["approach", "kills", "retry refused", "retry did the work", "work lost", "done twice", "done once"],
              [[f"**{a}** ({APPROACHES[a]})", c["kills"], c["retry_refused"], c["retry_did_work"], c["lost"], c["twice"],
                c["once"]] for a, c in ap.items()]) + [f"skipped: {s}" for s in raw.get("skipped", [])]
    for a, c in ap.items():
        for k in ("lost", "twice", "once"):
            R.csv.append(("kills", a, "on", 1, 0, k, c[k], "keys"))
    R.summary["kills"] = ap
    c, red = ap.get("idem"), ap.get("redis")
    if c:
        R.target("kills: a client killed after idem_claim, before COMMIT: idem loses no work and does none twice",
                 f"idem {c['lost']} lost, {c['twice']} twice of {c['kills']}"
                 + (f"; Redis+PG {red['lost']} lost, {red['twice']} twice of {red['kills']}" if red else ""),
                 c["lost"] == 0 and c["twice"] == 0 and c["once"] == c["kills"])
