"""idem through PgBouncer, with real psycopg 3 connections (run by
tests/scenarios/clients.sh pgbouncer, once per pool mode).

    pooler.py MODE BOUNCER_PORT SOCKET_DIR PG_PORT

MODE is the PgBouncer's pool_mode (transaction or session); BOUNCER_PORT its
port on 127.0.0.1. SOCKET_DIR and PG_PORT reach the cluster itself, for the
observer (who is waiting on what) and for the final comparison. The
PgBouncer serves these databases, all of them the real database "pgb":
pool1 (pool_size 1: every client shares one server session), pool2
(pool_size 2), prep1 / prep2 (pool_size 1 / 2, for prepared statements);
its users are postgres and app (NOINHERIT member of app_a).

Every check prints "ok   ..." or "FAIL ..."; the exit code is the number of
failures (capped). Synchronization is by observation: a waiting claim is
seen waiting in pg_stat_activity, a queued client in PgBouncer's SHOW POOLS,
a lease that ran out in idem_leases; never by sleeping a fixed time.
"""

import os
import random
import sys
import threading
import time
import uuid

import psycopg
from psycopg.types.json import Jsonb

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from sessions import in_thread, pid, sqlstate_of, wait_until  # noqa: E402

MODE, BPORT, SOCKDIR, PGPORT = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
TX = MODE == "transaction"
RUN = uuid.uuid4().hex[:8]  # keys of this run
failures = []


def check(cond, msg):
    print(("ok   " if cond else "FAIL ") + f"[{MODE}] {msg}", flush=True)
    if not cond:
        failures.append(msg)
    return cond


def via(db="pool2", **kw):
    """A client connection through PgBouncer. prepare_threshold=None: no
    protocol-level prepared statements (what docs/operations.md says)."""
    kw.setdefault("autocommit", True)
    kw.setdefault("prepare_threshold", None)
    kw.setdefault("user", "postgres")
    return psycopg.connect(host="127.0.0.1", port=BPORT, dbname=db, application_name=f"pooler-{MODE}", **kw)


def direct():
    """A connection to the cluster itself (observer, final comparison)."""
    return psycopg.connect(host=SOCKDIR, port=PGPORT, dbname="pgb", user="postgres", autocommit=True)


def admin():
    """PgBouncer's console (simple query protocol only: no parameters)."""
    return psycopg.connect(host="127.0.0.1", port=BPORT, dbname="pgbouncer", user="postgres", autocommit=True)








def waiting_on_claim(obs):
    """Backends waiting for another transaction inside an idem_claim (the
    checks run one at a time, so at most one is expected)."""
    return obs.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = 'pgb' AND wait_event_type = 'Lock'"
        " AND wait_event = 'transactionid' AND query LIKE '%idem_claim%'").fetchone()[0]


def cl_waiting(db):
    with admin() as a:
        cur = a.execute("SHOW POOLS")
        cols = [c.name for c in cur.description]
        for row in cur.fetchall():
            r = dict(zip(cols, row))
            if r["database"] == db:
                return int(r["cl_waiting"])
    return -1




class Clients:
    """Named clients of a pool_size-1 database. In transaction mode they may
    all be connected at once and take turns on the one server session
    statement by statement; in session mode the session is a client's until
    it leaves, so taking a client closes the others (PgBouncer then runs
    DISCARD ALL before the next one gets the session)."""

    def __init__(self, db, **kw):
        self.db, self.kw, self.open = db, kw, {}

    def __call__(self, name):
        if not TX:
            for other in [n for n in self.open if n != name]:
                self.open.pop(other).close()
        if name not in self.open:
            self.open[name] = via(self.db, **self.kw)
        return self.open[name]

    def close(self):
        for c in self.open.values():
            c.close()
        self.open.clear()


# ---- claim, duplicate, rollback, wait => false, waiting duplicates ----------

def basics(obs):
    k = f"{RUN}-basic"
    with via() as a:
        with a.transaction():
            r = a.execute("SELECT claimed, state FROM idem_claim(%s, 'pool')", (k,)).fetchone()
            a.execute("SELECT idem_complete(%s, 'pool', '{\"n\": 1}')", (k,))
    check(r == (True, "new"), f"claim through the pooler: {r}")
    with via() as b:
        r = b.execute("SELECT claimed, state, result FROM idem_claim(%s, 'pool')", (k,)).fetchone()
    check(r == (False, "completed", {"n": 1}), f"duplicate from another client gets the stored result: {r}")

    k = f"{RUN}-rollback"
    with via() as a:
        with a.transaction(force_rollback=True):
            r1 = a.execute("SELECT claimed FROM idem_claim(%s, 'pool')", (k,)).fetchone()[0]
    with via() as b:
        r2 = b.execute("SELECT claimed, state FROM idem_claim(%s, 'pool')", (k,)).fetchone()
    check(r1 is True and r2 == (True, "new"), f"a rolled-back claim leaves nothing: the retry claims ({r2})")

    # wait => false, and a duplicate that waits for the first outcome.
    k = f"{RUN}-wait"
    a = via()
    a.execute("BEGIN")
    a.execute("SELECT claimed FROM idem_claim(%s, 'pool')", (k,))
    with via() as b:
        t0 = time.monotonic()
        r = b.execute("SELECT claimed, state FROM idem_claim(%s, 'pool', wait => false)", (k,)).fetchone()
        ms = (time.monotonic() - t0) * 1000
    check(r == (False, "in_progress"), f"wait => false while the first transaction runs: {r}, {ms:.1f} ms")
    b = via()
    t, box = in_thread(lambda: b.execute("SELECT claimed, state, result FROM idem_claim(%s, 'pool')", (k,)).fetchone())
    check(wait_until("the duplicate waits", lambda: waiting_on_claim(obs) == 1),
          "the duplicate is seen waiting for the first transaction (pg_stat_activity: Lock/transactionid)")
    # pool2 has two server sessions: the open claim holds one, the waiting
    # duplicate the other; a third client queues in PgBouncer.
    def third():
        with via() as c:
            return c.execute("SELECT 'third client'").fetchone()[0]
    t3, box3 = in_thread(third)
    check(wait_until("a third client queued", lambda: cl_waiting("pool2") == 1),
          "pool_size 2, one open claim + one waiting duplicate: a third client is queued in PgBouncer (cl_waiting = 1)")
    a.execute("SELECT idem_complete(%s, 'pool', '{\"first\": true}')", (k,))
    a.execute("COMMIT")
    t.join(15)
    check(box.get("value") == (False, "completed", {"first": True}),
          f"the waiting duplicate gets the first outcome once it commits: {box}")
    if not TX:  # in session mode a server session is freed only when a client leaves
        a.close()
    t3.join(15)
    check(box3.get("value") == "third client", "the queued client runs once a server session is free")
    a.close()
    b.close()

    k = f"{RUN}-wait-rollback"
    a = via()
    a.execute("BEGIN")
    a.execute("SELECT claimed FROM idem_claim(%s, 'pool')", (k,))
    b = via()
    t, box = in_thread(lambda: b.execute("SELECT claimed, state FROM idem_claim(%s, 'pool')", (k,)).fetchone())
    wait_until("the retry waits", lambda: waiting_on_claim(obs) == 1)
    a.execute("ROLLBACK")
    t.join(15)
    check(box.get("value") == (True, "new"), f"a retry waiting on a claim that rolls back claims it: {box}")
    a.close()
    b.close()

    # The wait can be bounded for one transaction.
    k = f"{RUN}-lock-timeout"
    a = via()
    a.execute("BEGIN")
    a.execute("SELECT claimed FROM idem_claim(%s, 'pool')", (k,))
    with via() as b:
        b.execute("BEGIN")
        b.execute("SET LOCAL lock_timeout = '100ms'")
        st = sqlstate_of(b, "SELECT claimed FROM idem_claim(%s, 'pool')", (k,))
        b.execute("ROLLBACK")
        after = b.execute("SHOW lock_timeout").fetchone()[0]
    a.execute("ROLLBACK")
    a.close()
    check((st, after) == ("55P03", "0"),
          f"SET LOCAL lock_timeout = '100ms' bounds a duplicate's wait: {st}; afterwards lock_timeout = {after}")


# ---- leases: ownership is the token, never the server session ----------------

def leases(obs):
    k = f"{RUN}-lease"
    c = Clients("pool1")
    pa = pid(c("A"))
    claimed, token = c("A").execute(
        "SELECT claimed, result->>'lease_token' FROM idem_claim(%s, 'job', lease => '1 minute')", (k,)).fetchone()
    check(claimed and token, "client A takes a lease (committed at once) and keeps its token")
    pb = pid(c("B"))
    check(pa == pb, f"client B is on the same server session as A (pg_backend_pid {pa} / {pb})"
          + (", both connected at once" if TX else ", after A left (DISCARD ALL in between)"))
    b = c("B")
    states = [sqlstate_of(b, "SELECT idem_checkpoint(%s, 'job', 'forged', '{}')", (k,)),
              sqlstate_of(b, "SELECT idem_complete(%s, 'job', '{\"by\": \"B\"}')", (k,)),
              sqlstate_of(b, "SELECT idem_fail(%s, 'job', '{\"by\": \"B\"}')", (k,)),
              sqlstate_of(b, "SELECT idem_complete(%s, 'job', '{\"by\": \"B\"}', %s)", (k, "0" * 32))]
    check(states == ["ID003"] * 4,
          f"B without the token: checkpoint, complete, fail, and complete with a wrong token: {states}")
    r = b.execute("SELECT claimed, state FROM idem_claim(%s, 'job', lease => '1 minute')", (k,)).fetchone()
    check(r == (False, "in_progress"), f"B cannot take the running lease over: {r}")
    s1 = sqlstate_of(c("A"), "SELECT idem_checkpoint(%s, 'job', 'charged', '{\"charge\": 7}', %s)", (k, token))
    s2 = sqlstate_of(c("A"), "SELECT idem_complete(%s, 'job', '{\"by\": \"A\"}', %s)", (k, token))
    check((s1, s2) == ("00000", "00000"), f"A, with its token, checkpoints ({s1}) and completes ({s2})")
    r = c("B").execute("SELECT claimed, state, result FROM idem_claim(%s, 'job')", (k,)).fetchone()
    check(r == (False, "completed", {"by": "A"}), f"later duplicates replay A's result, not B's: {r}")
    c.close()

    # The very transaction that took the lease may use it without the token;
    # after its commit, no session can.
    k = f"{RUN}-lease-own"
    with via("pool1") as a:
        a.execute("BEGIN")
        a.execute("SELECT idem_claim(%s, 'job', lease => '1 minute')", (k,))
        s1 = sqlstate_of(a, "SELECT idem_checkpoint(%s, 'job', 'step', '{}')", (k,))
        a.execute("COMMIT")
        s2 = sqlstate_of(a, "SELECT idem_checkpoint(%s, 'job', 'step', '{}')", (k,))
    check((s1, s2) == ("00000", "ID003"),
          f"without the token: the leasing transaction itself may checkpoint ({s1}), the same client after COMMIT may not ({s2})")

    # A lease that ran out: the next claim with a lease takes over with a
    # new token; the old token is worthless. (Without a lease it would be
    # a plain claim of its own transaction, finished in it.)
    k = f"{RUN}-lease-out"
    with via("pool1") as a:
        old = a.execute("SELECT result->>'lease_token' FROM idem_claim(%s, 'job', lease => '1 second')",
                        (k,)).fetchone()[0]
    check(wait_until("the lease runs out", lambda: obs.execute(
        "SELECT ran_out FROM idem_leases WHERE key = %s AND biz_type = 'job'", (k,)).fetchone()[0]),
        "idem_leases shows the 1-second lease ran out")
    with via("pool1") as b:
        claimed, attempt, new = b.execute(
            "SELECT claimed, (result->>'attempt')::int, result->>'lease_token' FROM idem_claim(%s, 'job', lease => '1 minute')",
            (k,)).fetchone()
        s_old = sqlstate_of(b, "SELECT idem_complete(%s, 'job', '{\"by\": \"old\"}', %s)", (k, old))
        b.execute("SELECT idem_complete(%s, 'job', '{\"by\": \"new\"}', %s)", (k, new))
        r = b.execute("SELECT state, result FROM idem_lookup(%s, 'job')", (k,)).fetchone()
    check(claimed and attempt == 2 and s_old == "ID003" and r == ("completed", {"by": "new"}),
          f"takeover after the lease ran out: attempt {attempt}; old token {s_old}; outcome {r}")


# ---- session state: what one client leaves on a server session ---------------

def session_state():
    def ttl_of(conn, k, arg=""):
        """The TTL a claim got, in hours."""
        return conn.execute("SELECT (extract(epoch FROM expires_at - first_claimed_at) / 3600)::int"
                            f" FROM idem_claim(%s, 'ttl'{arg})", (k,)).fetchone()[0]
    c = Clients("pool1")
    c("A").execute("SET idem.default_ttl = '1 hour'")
    pa = pid(c("A"))
    pb = pid(c("B"))
    seen = ttl_of(c("B"), f"{RUN}-ttl-1")
    if TX:
        check(pa == pb and seen == 1,
              f"session-level SET idem.default_ttl by A applies to B's claim on the same server session: {seen} h")
        c("B").execute("RESET idem.default_ttl")
    else:
        check(pa == pb and seen == 24,
              f"session-level SET idem.default_ttl by A is gone when B gets the session (DISCARD ALL): {seen} h")
    a = c("A")
    a.execute("BEGIN")
    a.execute("SET LOCAL idem.default_ttl = '2 hours'")
    own = ttl_of(a, f"{RUN}-ttl-2")
    a.execute("COMMIT")
    after = ttl_of(c("B"), f"{RUN}-ttl-3")
    arg = ttl_of(c("B"), f"{RUN}-ttl-4", ", ttl => '3 hours'")
    check((own, after, arg) == (2, 24, 3),
          f"SET LOCAL applies to its own transaction only ({own} h; the next client: {after} h); the ttl argument: {arg} h")
    c.close()

    # Whether the library is loaded in a server session depends on the
    # clients before: only then is the idem. prefix reserved, and a misspelt
    # idem.* name refused (42602) rather than kept as a placeholder.
    # session_preload_libraries makes every session alike.
    def typo(conn):
        conn.execute("BEGIN")
        st = sqlstate_of(conn, "SET LOCAL idem.defualt_ttl = '1 hour'")
        conn.execute("ROLLBACK")
        return st
    results = []
    for preload in (False, True):
        with direct() as d:
            d.execute("ALTER DATABASE pgb SET session_preload_libraries = 'idem'" if preload
                      else "ALTER DATABASE pgb RESET session_preload_libraries")
        with admin() as adm:
            adm.execute("RECONNECT pool1")  # the next client gets a new server session
        c = Clients("pool1")
        first = typo(c("A"))
        c("A").execute("SELECT idem_lookup('any', 'ttl')")
        results.append((first, typo(c("B"))))
        c.close()
    with direct() as d:
        d.execute("ALTER DATABASE pgb RESET session_preload_libraries")
    with admin() as adm:
        adm.execute("RECONNECT pool1")
    check(results == [("00000", "42602"), ("42602", "42602")],
          f"SET LOCAL idem.defualt_ttl (a typo) on a new server session, then after an idem call: {results[0]};"
          f" with session_preload_libraries = 'idem': {results[1]}")

    # A role set for the session outlives the client, and with it the right
    # to use the business types reserved for that role (idem_set_owner).
    k = f"{RUN}-role"
    with direct() as d:
        d.execute("SELECT idem_set_owner('tenant-a', 'app_a')")
    c = Clients("pool1", user="app")
    c("A").execute("SET ROLE app_a")
    c("A").execute("SELECT idem_claim(%s, 'tenant-a')", (k,))
    who = c("B").execute("SELECT current_user").fetchone()[0]
    st = sqlstate_of(c("B"), "SELECT idem_lookup(%s, 'tenant-a')", (k,))
    if TX:
        check(who == "app_a" and st == "00000",
              f"session-level SET ROLE by A: B, logged in as app, runs as {who} and may read tenant-a's keys ({st})")
        c("B").execute("RESET ROLE")
    else:
        check(who == "app" and st == "42501", f"session-level SET ROLE by A is gone for B: {who}, {st}")
    a = c("A")
    a.execute("BEGIN")
    a.execute("SET LOCAL ROLE app_a")
    st_a = sqlstate_of(a, "SELECT idem_lookup(%s, 'tenant-a')", (k,))
    a.execute("COMMIT")
    who = c("B").execute("SELECT current_user").fetchone()[0]
    st = sqlstate_of(c("B"), "SELECT idem_lookup(%s, 'tenant-a')", (k,))
    check(st_a == "00000" and who == "app" and st == "42501",
          f"SET LOCAL ROLE app_a ({st_a}) ends with its transaction: the next client runs as {who} ({st})")
    c.close()


# ---- protocol-level prepared statements (psycopg's prepare_threshold) --------

def prepared():
    q_a = "SELECT 'statement of client A: ' || %s"
    q_b = "SELECT 'statement of client B: ' || %s"
    if not TX:
        with via("prep1", prepare_threshold=5) as a:
            for i in range(7):
                a.execute(q_a, (str(i),))
            pa = pid(a)
            named_a = a.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0]
        with via("prep1", prepare_threshold=5) as b:
            pb = pid(b)
            st = [sqlstate_of(b, q_b, (str(i),)) for i in range(7)]
        check(pa == pb and named_a == 1 and st == ["00000"] * 7,
              "psycopg's default prepare_threshold=5 in session mode: A's prepared statement is deallocated"
              f" (DISCARD ALL) before B gets the session: {st[-1]}")
        return
    # pool_size 1: A's named statement _pg3_0 stays on the server session,
    # and B's own first named statement collides with it.
    with via("prep1", prepare_threshold=5) as a, via("prep1", prepare_threshold=5) as b:
        for i in range(7):
            a.execute(q_a, (str(i),))
        st = [sqlstate_of(b, q_b, (str(i),)) for i in range(7)]
        check("42P05" in st, f"psycopg default (prepare_threshold=5), two clients on one server session: {st}"
              " (42P05: prepared statement \"_pg3_0\" already exists)")
        # The server session goes away under A (RECONNECT here; PgBouncer's
        # server_lifetime does the same): A's next use of "_pg3_0" meets a
        # session that never saw it.
        with admin() as adm:
            adm.execute("RECONNECT prep1")
        st = sqlstate_of(a, q_a, ("again",))
        check(st == "26000", f"psycopg default, after the server session was replaced: {st}"
              " (26000: prepared statement \"_pg3_0\" does not exist)")
    with via("prep1") as a, via("prep1") as b:
        st = [sqlstate_of(b, q_b, (str(i),)) for i in range(7)] + [sqlstate_of(a, q_a, (str(i),)) for i in range(7)]
        check(st == ["00000"] * 14, "prepare_threshold=None: the same 14 statements run (no named statements)")

    # pool_size 2, steered by two holders that keep a server session busy
    # in an open transaction: B prepares "_pg3_0" on one session and runs
    # it on the other, where A's "_pg3_0" lives. B gets A's statement.
    h1, h2 = via("prep2"), via("prep2")
    a, b = via("prep2", prepare_threshold=5), via("prep2", prepare_threshold=5)
    h1.execute("BEGIN")
    x = pid(h1)                          # h1 holds session X
    for i in range(7):
        a.execute(q_a, (str(i),))        # A: only Y free; prepares _pg3_0 = A's query on Y
    h2.execute("BEGIN")
    y = pid(h2)                          # h2 holds Y (the only free one)
    h1.execute("COMMIT")                 # X free
    for i in range(7):
        b.execute(q_b, (str(i),))        # B: on X; prepares _pg3_0 = B's query on X
    h1.execute("BEGIN")
    pid(h1)                              # h1 holds X again
    h2.execute("COMMIT")                 # Y free
    got = b.execute(q_b, ("hello",)).fetchone()[0]  # B runs "its" _pg3_0 on Y
    h1.execute("COMMIT")
    check(x != y and got == "statement of client A: hello",
          f"psycopg default, pool_size 2: B's call {q_b!r} ran on the other session and answered {got!r}")
    for c in (h1, h2, a, b):
        c.close()


# ---- many clients through a small pool ------------------------------------

def concurrency(obs):
    threads, ops_total, dups = 8, 400, 120
    rng = random.Random(18)
    firsts = [f"{RUN}-c{i}" for i in range(ops_total - dups)]
    ops = firsts + [rng.choice(firsts) for _ in range(dups)]
    rng.shuffle(ops)
    todo = list(enumerate(ops))
    lock = threading.Lock()
    seen = []
    errors = []
    obs.execute("CREATE TABLE IF NOT EXISTS conc_work (key text NOT NULL, op int NOT NULL, thread int NOT NULL)")

    def one(conn, th, op, key):
        with conn.transaction():
            claimed, state, result, spid = conn.execute(
                "SELECT claimed, state, result, pg_backend_pid() FROM idem_claim(%s, 'conc')", (key,)).fetchone()
            if claimed:
                conn.execute("INSERT INTO conc_work VALUES (%s, %s, %s)", (key, op, th))
                result = {"op": op, "thread": th}
                conn.execute("SELECT idem_complete(%s, 'conc', %s)", (key, Jsonb(result)))
        return claimed, state, result, spid

    def worker(th):
        conn = via("pool2") if TX else None
        try:
            while True:
                with lock:
                    if not todo:
                        return
                    op, key = todo.pop()
                try:
                    if TX:
                        r = one(conn, th, op, key)
                    else:  # session mode: a client per request, sharing the pool's sessions in turn
                        with via("pool2") as c:
                            r = one(c, th, op, key)
                except psycopg.Error as e:
                    with lock:
                        errors.append(f"op {op}: {e.sqlstate} {e}")
                    continue
                with lock:
                    seen.append((op, key, th) + r)
        finally:
            if conn is not None:
                conn.close()

    t0 = time.monotonic()
    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(90)
    secs = time.monotonic() - t0
    stored = {k: (s, r) for k, s, r in obs.execute(
        "SELECT key, state, result FROM idem.claims WHERE biz_type = 'conc' AND key LIKE %s", (f"{RUN}-c%",))}
    work = obs.execute("SELECT key, op, thread FROM conc_work WHERE key LIKE %s", (f"{RUN}-c%",)).fetchall()
    claimed = [s for s in seen if s[3]]
    replays = [s for s in seen if not s[3]]
    by_key = {}
    for s in claimed:
        by_key.setdefault(s[1], []).append(s)
    bad_replays = [s for s in replays if s[4] != "completed" or stored.get(s[1]) != ("c", s[5])]
    work_ok = (len(work) == len(firsts) and len({w[0] for w in work}) == len(firsts)
               and all(stored.get(w[0]) == ("c", {"op": w[1], "thread": w[2]}) for w in work))
    pids = {s[6] for s in seen}
    check(not errors, f"concurrency: no errors ({errors[:3]})")
    check(len(seen) == ops_total and len(claimed) == len(firsts) and all(len(v) == 1 for v in by_key.values())
          and set(by_key) == set(firsts),
          f"{threads} clients, {ops_total} claims ({dups} duplicates) through pool_size 2 in {secs:.2f} s:"
          f" {len(claimed)} claimed, each of the {len(firsts)} keys once; {len(pids)} server sessions used")
    check(len(replays) == dups and not bad_replays,
          f"every duplicate ({len(replays)}) got the stored result of its key ({len(bad_replays)} did not)")
    check(work_ok and len(stored) == len(firsts),
          f"the database: {len(work)} business rows, one per key, each matching its stored result; {len(stored)} claims")


def main():
    t0 = time.monotonic()
    with direct() as obs:
        basics(obs)
        leases(obs)
        session_state()
        prepared()
        concurrency(obs)
    print(f"summary [{MODE}]: {len(failures)} failed check(s), {time.monotonic() - t0:.1f} s", flush=True)
    sys.exit(min(len(failures), 100))


main()
