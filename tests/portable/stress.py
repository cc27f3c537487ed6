#!/usr/bin/env python3
"""Fault stress for the portable edition: many sessions claim the same few
keys at the same moment (round by round), and a killer terminates sessions (pg_terminate_backend) while
they are inside a claiming transaction. Each transaction claims, applies a
business row when it won the claim, completes the claim and commits.

Afterwards, from the server's rows and the clients' records:
  * no key has two business rows (a claim applied twice);
  * no key was acknowledged as claimed (claimed = true, COMMIT returned) by
    two transactions;
  * every business row has a completed claim, every completed claim its
    business row (the claim and the work commit or vanish together);
  * at most one live claim row per key;
  * sessions were really killed mid-transaction, and duplicates really met
    (else the run proved nothing).
Exit status 0 when every invariant holds.

--sabotage is the negative control: it first takes the key lock out in
this database (the gates' key made the digest and the transaction, so
that no two transactions meet on a key), and the run must then fail.
"""
import argparse
import logging
import random
import sys
import threading
import time

import psycopg

BIZ = "portable.stress"


def main():
    # psycopg logs the failed rollback of every terminated transaction.
    logging.getLogger("psycopg").disabled = True
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--keys", type=int, default=3, help="keys per round, which every client claims at once")
    ap.add_argument("--kills", type=int, default=2, help="sessions terminated per round, at most")
    ap.add_argument("--sabotage", action="store_true")
    args = ap.parse_args()

    with psycopg.connect(args.dsn, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS stress_orders")
        c.execute("CREATE TABLE stress_orders (key text NOT NULL, applied_by int NOT NULL)")
        c.execute("DELETE FROM idem.claims WHERE biz_type = %s", (BIZ,))
        if args.sabotage:
            c.execute("ALTER TABLE idem.key_gates DROP CONSTRAINT key_gates_pkey,"
                      " ADD CONSTRAINT key_gates_pkey PRIMARY KEY (h, writer)")

    lock = threading.Lock()
    acked_claims = {}        # key -> number of acknowledged claimed = true
    stats = {"killed": 0, "duplicates": 0, "claimed": 0, "errors": 0, "terminations": 0}
    done = threading.Event()
    # Rounds begun (counted by the last client to reach the barrier).
    begun = [0]
    barrier = threading.Barrier(args.clients, action=lambda: begun.__setitem__(0, begun[0] + 1))

    def client(n):
        rnd = random.Random(n)
        conn = None
        for i in range(args.rounds):
            # Every client starts round i together, on the same few keys.
            key = f"r{i}-{rnd.randrange(args.keys)}"
            barrier.wait()
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(args.dsn, application_name="portable_stress")
                with conn.transaction():
                    claimed, state = conn.execute(
                        "SELECT claimed, state FROM idem_claim(%s, %s, ttl => '1 hour')", (key, BIZ)).fetchone()
                    if claimed:
                        conn.execute("INSERT INTO stress_orders VALUES (%s, %s)", (key, n))
                        # A window in which the killer finds this session
                        # inside the transaction, holding the key.
                        conn.execute("SELECT pg_sleep(0.005)")
                        conn.execute("SELECT idem_complete(%s, %s, '{\"ok\": true}')", (key, BIZ))
                    else:
                        with lock:
                            stats["duplicates"] += 1
                if claimed:
                    with lock:
                        acked_claims[key] = acked_claims.get(key, 0) + 1
                        stats["claimed"] += 1
            except psycopg.Error as e:
                # Terminated (57P01), or the connection is gone (no
                # SQLSTATE): the transaction did not commit, or its COMMIT
                # got no answer.
                if e.sqlstate not in (None, "57P01") and not e.sqlstate.startswith("08"):
                    with lock:
                        stats["errors"] += 1
                    print(f"client {n}: unexpected {e.sqlstate}: {e}", file=sys.stderr)
                else:
                    with lock:
                        stats["killed"] += 1
                try:
                    conn.close()
                except Exception:
                    pass
                conn = None
        if conn is not None:
            conn.close()

    # The killer's pace is the clock's, and a round lasts as long as the
    # machine's load makes it: at most --kills terminations per round, so
    # that a loaded machine (the suite runs the majors side by side) does
    # not multiply the terminations, each of which costs a new session that
    # compiles the edition's functions again.
    def killer():
        rnd = random.Random(99)
        this_round, killed = 0, 0
        with psycopg.connect(args.dsn, autocommit=True) as c:
            while not done.is_set():
                if begun[0] != this_round:
                    this_round, killed = begun[0], 0
                if killed >= args.kills:
                    time.sleep(0.002)
                    continue
                # A session inside a claiming transaction: it has written
                # (and holds a key lock), or it waits for a key lock.
                row = c.execute(
                    """SELECT pid FROM pg_stat_activity
                        WHERE application_name = 'portable_stress'
                          AND (backend_xid IS NOT NULL OR wait_event_type = 'Lock')
                          AND state IN ('active', 'idle in transaction')
                        ORDER BY random() LIMIT 1""").fetchone()
                if row:
                    if c.execute("SELECT pg_terminate_backend(%s)", (row[0],)).fetchone()[0]:
                        killed += 1
                        with lock:
                            stats["terminations"] += 1
                c.execute("SELECT pg_sleep(%s)", (rnd.choice([0.01, 0.03, 0.06]),))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(args.clients)]
    k = threading.Thread(target=killer)
    k.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    k.join()

    problems = []
    with psycopg.connect(args.dsn, autocommit=True) as c:
        twice = c.execute("SELECT key, count(*) FROM stress_orders GROUP BY key HAVING count(*) > 1").fetchall()
        if twice:
            problems.append(f"business rows applied twice: {twice}")
        acked_twice = {k: v for k, v in acked_claims.items() if v > 1}
        if acked_twice:
            problems.append(f"keys acknowledged as claimed twice: {acked_twice}")
        orphans = c.execute(
            """SELECT o.key FROM stress_orders o
                WHERE NOT EXISTS (SELECT 1 FROM idem.claims c
                                   WHERE c.biz_type = %s AND c.key = o.key AND c.state = 'c')""", (BIZ,)).fetchall()
        if orphans:
            problems.append(f"business rows without a completed claim: {orphans}")
        unapplied = c.execute(
            """SELECT c.key FROM idem.claims c
                WHERE c.biz_type = %s AND NOT EXISTS (SELECT 1 FROM stress_orders o WHERE o.key = c.key)""",
            (BIZ,)).fetchall()
        if unapplied:
            problems.append(f"claims without their business row: {unapplied}")
        multi = c.execute(
            """SELECT key, count(*) FROM idem.claims WHERE biz_type = %s AND expires_at > now()
                GROUP BY key HAVING count(*) > 1""", (BIZ,)).fetchall()
        if multi:
            problems.append(f"more than one live claim row: {multi}")
        applied = c.execute("SELECT count(*) FROM stress_orders").fetchone()[0]
        keys_acked = len(acked_claims)
        if applied < keys_acked:
            problems.append(f"{keys_acked} keys acknowledged as claimed but {applied} business rows")
    if stats["terminations"] == 0 or stats["killed"] == 0:
        problems.append(f"no session was killed mid-transaction: the run proved nothing ({stats})")
    if stats["duplicates"] == 0:
        problems.append("no duplicate claim met a first one: the run proved nothing")
    if stats["errors"]:
        problems.append(f"{stats['errors']} unexpected errors")
    print(f"stress: {stats}, business rows {applied}, keys acknowledged {keys_acked}")
    for p in problems:
        print("FAILED:", p)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
