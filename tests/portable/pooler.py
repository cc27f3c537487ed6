"""The portable edition behind PgBouncer in transaction mode, with real
psycopg 3 clients (run by tests/portable/steps.sh pooler).

    pooler.py BOUNCER_PORT SOCKET_DIR PG_PORT DB APP_ROLE [--break WHAT]

PgBouncer listens on 127.0.0.1:BOUNCER_PORT and serves two aliases of the
database DB: pp1 (pool_size 1: its clients take turns on one server
session) and pp3 (pool_size 3). Clients log in as APP_ROLE, a role that is
not a superuser; SOCKET_DIR and PG_PORT reach the server itself, for the
observer (pg_locks, pg_stat_activity) and the final counts.

  1. concurrency: clients claim the same keys at the same moment through
     pool_size 3; the claimer writes a business row and completes (or now
     and then rolls back); every key has exactly as many business rows as
     committed claims (one), and every duplicate is answered with the
     committed outcome;
  2. duplicates: a duplicate that waits on the key lock (seen waiting on
     the first transaction in pg_stat_activity) is answered with the first
     outcome, completed or failed, once the first transaction commits;
  3. the key lock ends with the transaction: on pool_size 1, the next client
     on the same server session holds no lock for a key (pg_locks, from the
     session itself and from outside) and the key's gate is free (the
     edition's own attempt without waiting takes it) after a claim, a duplicate that
     wrote nothing, an autocommit call, a rollback, and a client that left
     in the middle of its transaction; and it may claim those keys at once;
  4. leases: a client on the same server session as the lease's holder,
     without the token, can neither finish nor take over the lease.

--break no_lock is the negative control: the key lock taken out (the
gates' key made the digest and the transaction, so that no two
transactions meet on a key); the checks must then fail. (A gate is a row
lock, which PostgreSQL releases with the transaction: there is no
session-level form to break it into.) Synchronization is by
observation (pg_stat_activity, pg_locks, SHOW POOLS), never by sleeping a
fixed time. Exit status: the number of failed checks (capped).
"""

import argparse
import os
import random
import sys
import threading
import uuid

import psycopg
from psycopg.types.json import Jsonb

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from sessions import checker, in_thread, pid, run_sections, wait_until  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("bouncer_port", type=int)
ap.add_argument("sockdir")
ap.add_argument("pg_port", type=int)
ap.add_argument("db")
ap.add_argument("app")
ap.add_argument("--break", dest="sabotage", choices=["no_lock"])
ap.add_argument("--clients", type=int, default=8)
ap.add_argument("--rounds", type=int, default=40)
args = ap.parse_args()
RUN = uuid.uuid4().hex[:8]
BIZ = "pooler.pay"
check, failures = checker()


def via(db="pp3", **kw):
    """A client through PgBouncer; no protocol-level prepared statements
    (docs/operations.md's setting for transaction pooling)."""
    kw.setdefault("autocommit", True)
    kw.setdefault("prepare_threshold", None)
    return psycopg.connect(host="127.0.0.1", port=args.bouncer_port, dbname=db, user=args.app,
                           application_name="portable-pooler", **kw)


def direct():
    return psycopg.connect(host=args.sockdir, port=args.pg_port, dbname=args.db, user="postgres", autocommit=True)






def key_locks(conn, backend):
    """Locks a server session holds that could keep a key: its transaction
    id (which a gate's waiters wait on), tuple and advisory locks."""
    return conn.execute("SELECT count(*) FROM pg_locks WHERE granted AND pid = %s"
                        " AND locktype IN ('transactionid', 'tuple', 'advisory')", (backend,)).fetchone()[0]


def gate_held(conn, key):
    """Whether another transaction holds the key's gate: the edition's own
    attempt without waiting (idem.take_gate with wait false), in a
    transaction rolled back."""
    with conn.transaction(force_rollback=True):
        return not conn.execute("SELECT idem.take_gate(idem.key_hash(%s, %s), false)", (BIZ, key)).fetchone()[0]


def sabotage(obs, what):
    """Take the edition's key lock out in this database (as the extension's
    owner would): the gates' key becomes (digest, transaction)."""
    owner = obs.execute("SELECT r.rolname FROM pg_extension e JOIN pg_roles r ON r.oid = e.extowner"
                        " WHERE e.extname = 'idem'").fetchone()[0]
    obs.execute(f"SET ROLE {owner}")
    obs.execute("ALTER TABLE idem.key_gates DROP CONSTRAINT key_gates_pkey, ADD CONSTRAINT key_gates_pkey PRIMARY KEY (h, writer)")
    print(f"     (broken on purpose: idem.key_gates keyed by digest and transaction: {what})")
    obs.execute("RESET ROLE")


# ---- 1. the same keys at the same moment --------------------------------------

def concurrency(obs):
    n, rounds = args.clients, args.rounds
    barrier = threading.Barrier(n)
    lock = threading.Lock()
    committed = {}    # key -> [client] whose claim committed
    answers = []      # (key, client, state, result) of every duplicate
    errors = []
    rollbacks = []    # keys whose claimer rolled back (the next claimer takes over)

    def client(c):
        rnd = random.Random(c)
        try:
            with via("pp3") as conn:
                for i in range(rounds):
                    key = f"{RUN}-c{i}"
                    barrier.wait(60)
                    conn.execute("BEGIN")
                    # A key lock that is never released (a broken edition)
                    # must fail the run, not hang it.
                    conn.execute("SET LOCAL lock_timeout = '20s'")
                    claimed, state, result = conn.execute(
                        "SELECT claimed, state, result FROM idem_claim(%s, %s)", (key, BIZ)).fetchone()
                    if not claimed:
                        conn.execute("COMMIT")
                        with lock:
                            answers.append((key, c, state, result))
                        continue
                    conn.execute("INSERT INTO pooler_payments (key, paid_by) VALUES (%s, %s)", (key, c))
                    if rnd.random() < 0.25:
                        conn.execute("ROLLBACK")
                        with lock:
                            rollbacks.append(key)
                        continue
                    conn.execute("SELECT idem_complete(%s, %s, %s)", (key, BIZ, Jsonb({"paid_by": c})))
                    conn.execute("COMMIT")
                    with lock:
                        committed.setdefault(key, []).append(c)
        except Exception as e:
            with lock:
                errors.append(f"client {c}: {type(e).__name__}: {e}")
            barrier.abort()

    threads = [threading.Thread(target=client, args=(c,)) for c in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(not errors, f"{n} clients x {rounds} rounds through pool_size 3 ran without errors {errors[:3]}")
    rows = dict(obs.execute("SELECT key, count(*) FROM pooler_payments WHERE key LIKE %s GROUP BY key",
                            (f"{RUN}-c%",)).fetchall())
    total = sum(rows.values())
    twice = sorted(k for k, v in rows.items() if v > 1)
    check(not twice and all(len(committed.get(k, [])) == rows.get(k, 0) for k in set(rows) | set(committed)),
          f"business rows: {total} for {len(rows)} keys, one per committed claim"
          f" (keys paid twice: {twice[:5] or 'none'})")
    wrong = [(k, c, s, r) for (k, c, s, r) in answers
             if not (k in committed and s == "completed" and r == {"paid_by": committed[k][0]})]
    check(answers and not wrong,
          f"{len(answers)} duplicate answers, each the committed outcome of its key (wrong: {wrong[:3] or 'none'})")
    check(rollbacks, f"{len(rollbacks)} claims rolled back with their business row; {len(committed)} of {rounds} keys committed")


# ---- 2. duplicates answered with the first outcome ------------------------------

def waiting_duplicates(obs):
    for finish, outcome, state in (("idem_complete", {"first": True}, "completed"),
                                   ("idem_fail", {"error": "declined"}, "failed")):
        key = f"{RUN}-wait-{state}"
        a = via("pp3")
        a.execute("BEGIN")
        a.execute("SELECT idem_claim(%s, %s)", (key, BIZ))
        a_pid = pid(a)
        b = via("pp3")
        b.execute("SET lock_timeout = '20s'")  # a broken key lock fails the check, not the run
        t, box = in_thread(lambda: b.execute("SELECT pg_backend_pid(), claimed, state, result FROM idem_claim(%s, %s)",
                                             (key, BIZ)).fetchone())
        seen = wait_until("the duplicate waits on the key lock", timeout=30.0, cond=lambda: obs.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'"
            " AND wait_event IN ('transactionid', 'tuple') AND query LIKE '%%idem_claim%%' AND pid <> %s",
            (args.db, a_pid)).fetchone()[0] == 1)
        check(seen, f"a duplicate through the pooler waits on the key lock (pg_stat_activity: Lock/transactionid)")
        a.execute(f"SELECT {finish}(%s, %s, %s)", (key, BIZ, Jsonb(outcome)))
        a.execute("COMMIT")
        t.join(30)
        v = box.get("value")
        check(v is not None and v[0] != a_pid and v[1:] == (False, state, outcome),
              f"after the first transaction's {finish} commits, the waiting duplicate gets its outcome: {box}")
        with via("pp3") as c:
            later = c.execute("SELECT claimed, state, result FROM idem_claim(%s, %s)", (key, BIZ)).fetchone()
        check(later == (False, state, outcome), f"a later duplicate from another client: {later}")
        a.close()
        b.close()


# ---- 3. the key lock never outlives its transaction -----------------------------

def lock_release(obs):
    a = via("pp1")
    b = via("pp1")
    session = pid(a)
    check(pid(b) == session, f"pool_size 1: clients A and B share one server session ({session})")

    def after(what, key):
        """B, on the same server session once A's transaction ended: no
        lock for a key, seen from B and from outside, and the key free."""
        own = b.execute("SELECT pg_backend_pid(), count(*) FROM pg_locks WHERE granted"
                        " AND locktype IN ('transactionid', 'tuple', 'advisory') AND pid = pg_backend_pid() GROUP BY 1"
                        " UNION ALL SELECT pg_backend_pid(), 0 LIMIT 1").fetchone()
        outside = key_locks(obs, session)
        free = not gate_held(obs, key)
        check(own == (session, 0) and outside == 0 and free,
              f"after {what}: client B on server session {own[0]} holds {own[1]} locks"
              f" (pg_locks from outside: {outside}); the key's gate is free: {free}")

    key = f"{RUN}-lock-1"
    a.execute("BEGIN")
    a.execute("SELECT idem_claim(%s, %s)", (key, BIZ))
    inside = gate_held(obs, key) and key_locks(obs, session) == 1
    check(inside, f"inside A's transaction the key lock is held: its gate by A's transaction, on server session {session}")
    a.execute("SELECT idem_complete(%s, %s, '{}')", (key, BIZ))
    a.execute("COMMIT")
    after("A's claim and complete committed", key)

    a.execute("BEGIN")
    r = a.execute("SELECT claimed, state FROM idem_claim(%s, %s)", (key, BIZ)).fetchone()
    inside = key_locks(obs, session)
    a.execute("COMMIT")
    check(r == (False, "completed"), f"A's duplicate claim in a transaction: {r} ({inside} key lock held in it)")
    after("A's duplicate claim (wrote nothing) committed", key)

    key = f"{RUN}-lock-2"
    r = a.execute("SELECT claimed FROM idem_claim(%s, %s, lease => '1 minute')", (key, BIZ)).fetchone()
    after(f"A's autocommit lease claim ({r[0]})", key)

    key = f"{RUN}-lock-3"
    a.execute("BEGIN")
    a.execute("SELECT idem_claim(%s, %s)", (key, BIZ))
    a.execute("ROLLBACK")
    after("A's claim rolled back", key)
    r = b.execute("SELECT claimed, state FROM idem_claim(%s, %s, wait => false)", (key, BIZ)).fetchone()
    check(r == (True, "new"), f"B claims the rolled-back key at once (wait => false): {r}")
    a.close()

    # A client that leaves in the middle of its transaction: PgBouncer
    # rolls the server session back (or drops it) before another client
    # gets it.
    key = f"{RUN}-lock-4"
    c = via("pp1")
    c.execute("BEGIN")
    c.execute("SELECT idem_claim(%s, %s)", (key, BIZ))
    left = pid(c)
    c.close()
    d = via("pp1")
    r = d.execute("SELECT claimed, state FROM idem_claim(%s, %s, wait => false)", (key, BIZ)).fetchone()
    d_pid = pid(d)
    check(r == (True, "new") and key_locks(obs, d_pid) == 0 and not gate_held(obs, key),
          f"a client left mid-transaction holding the key lock (server session {left}): the next client"
          f" (server session {d_pid}) claims the key at once: {r}, and holds no lock after")
    d.close()
    b.close()


# ---- leases: ownership is the token, never the server session ----------------

def leases(obs):
    key = f"{RUN}-lease"
    a = via("pp1")
    b = via("pp1")
    claimed, token = a.execute("SELECT claimed, result->>'lease_token' FROM idem_claim(%s, 'pooler.job', lease => '1 minute')",
                               (key,)).fetchone()
    check(claimed and token and pid(a) == pid(b), "client A takes a lease; client B shares A's server session")

    def sqlstate_of(conn, sql, params):
        try:
            conn.execute(sql, params)
            return "00000"
        except psycopg.Error as e:
            return e.sqlstate
    states = [sqlstate_of(b, "SELECT idem_checkpoint(%s, 'pooler.job', 'forged', '{}')", (key,)),
              sqlstate_of(b, "SELECT idem_complete(%s, 'pooler.job', '{\"by\": \"B\"}')", (key,)),
              sqlstate_of(b, "SELECT idem_fail(%s, 'pooler.job', '{\"by\": \"B\"}')", (key,)),
              sqlstate_of(b, "SELECT idem_complete(%s, 'pooler.job', '{\"by\": \"B\"}', %s)", (key, "0" * 32))]
    check(states == ["ID003"] * 4,
          f"B on the same server session without the token: checkpoint, complete, fail, a wrong token: {states}")
    r = b.execute("SELECT claimed, state FROM idem_claim(%s, 'pooler.job', lease => '1 minute')", (key,)).fetchone()
    check(r == (False, "in_progress"), f"B cannot take the running lease over: {r}")
    s1 = sqlstate_of(a, "SELECT idem_checkpoint(%s, 'pooler.job', 'charged', '{\"charge\": 7}', %s)", (key, token))
    s2 = sqlstate_of(a, "SELECT idem_complete(%s, 'pooler.job', '{\"by\": \"A\"}', %s)", (key, token))
    r = b.execute("SELECT claimed, state, result FROM idem_claim(%s, 'pooler.job')", (key,)).fetchone()
    check((s1, s2) == ("00000", "00000") and r == (False, "completed", {"by": "A"}),
          f"A, with its token, checkpoints ({s1}) and completes ({s2}); B's duplicate replays A's result: {r}")
    a.close()
    b.close()


def main():
    with direct() as obs:
        obs.execute("DELETE FROM pooler_payments")
        if args.sabotage:
            sabotage(obs, args.sabotage)
        return run_sections(obs, (concurrency, waiting_duplicates, lock_release, leases), check, failures)


if __name__ == "__main__":
    sys.exit(main())
