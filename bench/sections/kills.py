"""kills section: what each approach leaves behind when the client process
is killed between the dedup step and COMMIT (bench/kill_txn.c), and a retry
of the same key follows. The method is bench/README.md's ("kills")."""
import os
import shutil
import signal
import subprocess
import time

from . import common

DB = "bench_kills"
APPROACHES = ["redis", "idem", "handwritten"]
DESC = {"redis": "Redis SET NX EX, then the PostgreSQL transaction",
        "idem": "idem_claim inside the transaction",
        "handwritten": "INSERT … ON CONFLICT DO NOTHING RETURNING inside the transaction"}

PROFILES = {"smoke": dict(kills=20), "default": dict(kills=200), "full": dict(kills=200)}
OPTIONS = [("--kills", "kills", int, "kills section: kills per approach (200; smoke 20)")]


def estimate(p, rates, redis):
    return 10 + p["kills"] * len(APPROACHES) * 0.05


def build_driver(b):
    exe = os.path.join(b.out, "kill_txn")
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise common.BenchError("kills: no C compiler (cc) for bench/kill_txn.c")
    cfg = os.path.join(b.pg_bin, "pg_config")
    inc = subprocess.run([cfg, "--includedir"], capture_output=True, text=True).stdout.strip()
    lib = subprocess.run([cfg, "--libdir"], capture_output=True, text=True).stdout.strip()
    p = subprocess.run([cc, "-O2", "-o", exe, os.path.join(common.BENCH, "kill_txn.c"), f"-I{inc}",
                        f"-L{lib}", "-lpq"], capture_output=True, text=True)
    if p.returncode != 0:
        raise common.BenchError(f"kills: cannot compile bench/kill_txn.c: {p.stderr[-800:]}")
    return exe


def kill_first(drv, approach, conninfo, sock, key):
    """The first client: run until it stops itself before COMMIT, then
    SIGKILL it. Returns None, or the error when it did not get there."""
    p = subprocess.Popen([drv, approach, "first", conninfo, sock, key], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
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
    p = b.p
    raw = b.raw["kills"] = {"kills": p["kills"], "approaches": {}, "skipped": []}
    sock = b.a.redis_sock if (b.a.redis_sock and not b.a.no_redis) else ""
    approaches = [a for a in APPROACHES if a != "redis" or sock]
    if not sock:
        raw["skipped"].append("redis (no redis-server)")
    drv = build_driver(b)
    common.create_db(b, DB)
    conninfo = f"host={b.a.host} port={b.a.port} user=postgres dbname={DB}"
    nonce = str(int(time.time()))   # redis keeps its keys for the whole benchmark run
    retries = {a: {} for a in approaches}
    t0 = time.time()
    for i in range(p["kills"]):
        for a in approaches:
            key = f"kill-{nonce}-{a}-{i:05d}"
            err = kill_first(drv, a, conninfo, sock or "-", key)
            if err:
                raise common.BenchError(f"kills: the first client of {a} ({key}) did not reach the "
                                        f"kill point: {err}")
            r = subprocess.run([drv, a, "retry", conninfo, sock or "-", key], capture_output=True,
                               text=True)
            if r.returncode != 0 or "outcome=" not in r.stdout:
                raise common.BenchError(f"kills: the retry of {a} ({key}) failed: "
                                        f"{(r.stderr or r.stdout).strip()[-300:]}")
            retries[a][key] = r.stdout.split("outcome=", 1)[1].split()[0]
    rows = {}
    for line in b.psql(DB, "SELECT key, count(*) FROM orders GROUP BY key").splitlines():
        k, n = line.split("|")
        rows[k] = int(n)
    for a in approaches:
        c = {"kills": len(retries[a]), "retry_refused": 0, "retry_did_work": 0, "lost": 0, "twice": 0,
             "once": 0, "other": 0}
        for key, outcome in retries[a].items():
            n = rows.get(key, 0)
            c["retry_refused" if outcome == "duplicate" else "retry_did_work"] += 1
            if n == 0 and outcome == "duplicate":
                c["lost"] += 1
            elif n >= 2:
                c["twice"] += 1
            elif n == 1:
                c["once"] += 1
            else:
                c["other"] += 1
        raw["approaches"][a] = c
        b.log(f"kills {a:11s}: {c['kills']} kills: retry refused {c['retry_refused']}, work lost "
              f"{c['lost']}, done twice {c['twice']}, done once {c['once']}")
    raw["seconds"] = round(time.time() - t0, 1)
    b.save()
    b.psql("postgres", f"DROP DATABASE {DB} WITH (FORCE)")


# ---- report ------------------------------------------------------------------
def report(R):
    raw = R.raw.get("kills") or {}
    ap = raw.get("approaches") or {}
    if not ap:
        return
    lines = ["## Client killed between the dedup step and COMMIT (kills section)", "",
             "Lost = the retry was told \"duplicate\" and no business row exists; twice = two business "
             "rows (method: bench/README.md, kills).", "",
             "| approach | kills | retry refused | retry did the work | work lost | done twice | done once |",
             "|---|---|---|---|---|---|---|"]
    for a in APPROACHES:
        c = ap.get(a)
        if not c:
            continue
        lines.append(f"| **{a}** ({DESC[a]}) | {c['kills']} | {c['retry_refused']} | {c['retry_did_work']} "
                     f"| {c['lost']} | {c['twice']} | {c['once']} |")
        for k in ("kills", "retry_refused", "lost", "twice", "once"):
            R.csv.append(("kills", a, "on", 1, 0, k, c[k], "keys"))
    for s in raw.get("skipped") or []:
        lines.append(f"\nskipped: {s}")
    lines.append("")
    R.md += lines
    R.summary["kills"] = ap
    if "idem" in ap:
        c = ap["idem"]
        red = ap.get("redis")
        R.target("kills", "kills: a client killed after idem_claim, before COMMIT: idem loses no work "
                 "and does none twice",
                 f"idem {c['lost']} lost, {c['twice']} twice of {c['kills']}"
                 + (f"; Redis+PG {red['lost']} lost, {red['twice']} twice of {red['kills']}" if red else ""),
                 c["lost"] == 0 and c["twice"] == 0 and c["once"] == c["kills"])
