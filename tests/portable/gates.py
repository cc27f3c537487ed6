"""The portable edition's key locks (gate rows, docs/design.md §14) under
load and against a hostile role, with real sessions (run by
tests/portable/steps.sh gates, which makes the databases and roles).

    gates.py SOCKET_DIR PORT DB OTHER_DB OWNER APP INTRUDER [--batch N]

  1. batch: one transaction of APP claims N keys (default 100,000) in DB
     while other sessions keep connecting to OTHER_DB and claiming there;
     the batch holds a handful of lock-table entries however many keys it
     holds, no session fails (no 53200, no FATAL), every key is claimed
     once. Control: the same number of advisory locks in one transaction
     (the edition's former key lock) does exhaust this server's lock table
     (53200), so the batch is big enough to tell;
  2. eight sessions each claim 2,000 keys in one transaction (overlapping
     ranges, so that they wait for each other), writing a business row for
     each claim they win, then complete and commit; a second round claims
     them all again: exactly one business row per key;
  3. INTRUDER, a LOGIN role with nothing granted, holds pg_advisory_lock on
     every number it can derive from the owner's keys' digests, sets every
     setting the edition reads or once read (set_config and SET of idem.*),
     watches pg_locks, and tries to finish, take over and forge the owner's
     claims: the owner's claims (wait => false too), lookups, leases and
     maintenance answer exactly as without it, pg_locks shows no digest,
     and every forgery is refused with nothing changed;
  4. maintenance removes the gates no snapshot needs, and keeps the gate of
     a claim committed after a REPEATABLE READ snapshot that is still
     open, which then gets 40001 (not a second claim).
Synchronization is by observation (pg_stat_activity, pg_locks), never by
sleeping a fixed time. Exit status: the number of failed checks (capped).
"""

import argparse
import os
import sys
import threading
import time

import psycopg
from psycopg.types.json import Jsonb

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from sessions import checker, in_thread, pid, run_sections, sqlstate_of, wait_until  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("sockdir")
ap.add_argument("port", type=int)
ap.add_argument("db")
ap.add_argument("other_db")
ap.add_argument("owner")
ap.add_argument("app")
ap.add_argument("intruder")
ap.add_argument("--batch", type=int, default=100000)
args = ap.parse_args()
check, failures = checker()


def connect(user, db=None, **kw):
    kw.setdefault("autocommit", True)
    return psycopg.connect(host=args.sockdir, port=args.port, dbname=db or args.db, user=user, **kw)


# ---- 1. one transaction, many keys --------------------------------------------

def batch(obs):
    n = args.batch
    with connect("postgres") as c:
        c.execute("BEGIN")
        state = sqlstate_of(c, "SELECT count(pg_advisory_xact_lock(i)) FROM generate_series(1, %s) i", (n,))
        c.execute("ROLLBACK")
    check(state == "53200", f"control: {n} advisory locks in one transaction exhaust this server's lock table ({state})")

    app = connect(args.app)
    app_pid = pid(app)
    app.execute("BEGIN")
    t, box = in_thread(lambda: app.execute(
        "SELECT count(*) FILTER (WHERE c.claimed) FROM generate_series(1, %s::int) i,"
        " LATERAL idem_claim('batch-' || i, 'gate.batch') c", (n,)).fetchone()[0])
    running = lambda: obs.execute("SELECT state = 'active' FROM pg_stat_activity WHERE pid = %s",
                                  (app_pid,)).fetchone()[0]
    wait_until("the batch runs", running)
    # Other roles keep connecting to another database and claiming there
    # while the batch holds its keys, from its start to its end: the next
    # session a twentieth of the time the batch has run so far after the
    # last (a tenth of a second at least: a batch of 20,000 keys may take
    # only a few seconds, and at least 10 sessions must meet it), so that
    # their number grows with the logarithm of the batch's length, which
    # the machine's load stretches, not with the length. (What could refuse them is the lock
    # table, whose entries the batch holds are counted below; back to back,
    # the sessions' start-ups cost more CPU than the batch itself and proved
    # nothing more.)
    others, errors, during = 0, [], 0
    began = time.monotonic()
    while t.is_alive():
        try:
            with connect(args.owner, args.other_db) as o:
                r = o.execute("SELECT claimed FROM idem_claim(%s, 'gate.other')", (f"other-{others}",)).fetchone()[0]
                others += 1 if r else 0
            if t.is_alive():
                during += 1
        except psycopg.Error as e:
            errors.append(f"{e.sqlstate}: {str(e).splitlines()[0]}")
            if len(errors) > 20:
                break
        t.join(max(0.1, (time.monotonic() - began) / 20))
    t.join()
    held = obs.execute("SELECT count(*) FROM pg_locks WHERE pid = %s", (app_pid,)).fetchone()[0]
    claimed = box.get("value")
    app.execute("COMMIT")
    app.close()
    check(claimed == n, f"one transaction claimed {claimed} of {n} keys ({box.get('error', 'no error')})")
    check(held < 50, f"holding them, it held {held} lock-table entries")
    check(not errors and during >= 10,
          f"meanwhile {during} new sessions connected to {args.other_db} and claimed there ({others} claims), errors: {errors[:3] or 'none'}")
    with connect(args.app) as c:
        rows = c.execute("SELECT count(*) FILTER (WHERE NOT c.claimed AND c.state = 'completed') FROM generate_series(1, %s, 997) i,"
                         " LATERAL idem_claim('batch-' || i, 'gate.batch') c", (n,)).fetchone()[0]
    live = obs.execute("SELECT count(*), count(DISTINCT key) FROM idem.claims WHERE biz_type = 'gate.batch'").fetchone()
    check(live == (n, n) and rows == len(range(1, n + 1, 997)),
          f"{live[0]} claim rows for {live[1]} keys; every sampled duplicate answered from its claim ({rows})")


# ---- 2. eight sessions, 2,000 keys each ---------------------------------------

def overlapping(obs):
    sessions, per = 8, 2000
    obs.execute("CREATE TABLE IF NOT EXISTS gate_orders (key text NOT NULL, session int NOT NULL)")
    obs.execute(f"GRANT INSERT, SELECT ON gate_orders TO {args.app}")
    errors = []
    won = [0] * sessions

    def session(s, rnd):
        # Ascending order, so that overlapping ranges wait and never deadlock.
        lo = s * per // 2
        with connect(args.app) as c:
            try:
                with c.transaction():
                    # Each key won gets its business row and is completed
                    # in the claiming transaction.
                    won[s] += c.execute(
                        "WITH w AS (INSERT INTO gate_orders SELECT 'o-' || i, %s FROM generate_series(%s::int, %s::int) i,"
                        " LATERAL idem_claim('o-' || i, 'gate.orders') x WHERE x.claimed RETURNING key)"
                        " SELECT count(*) FROM w, LATERAL idem_complete(w.key, 'gate.orders', jsonb_build_object('by', %s::int)) f",
                        (s, lo, lo + per - 1, s)).fetchone()[0]
            except psycopg.Error as e:
                errors.append(f"round {rnd} session {s}: {e.sqlstate}: {str(e).splitlines()[0]}")

    for rnd in (1, 2):
        threads = [threading.Thread(target=session, args=(s, rnd)) for s in range(sessions)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    keys = per + (sessions - 1) * per // 2
    rows = obs.execute("SELECT count(*), count(DISTINCT key) FROM gate_orders").fetchone()
    done = obs.execute("SELECT count(*) FROM idem.claims WHERE biz_type = 'gate.orders' AND state = 'c'").fetchone()[0]
    check(not errors, f"{sessions} sessions x {per} keys per transaction, twice, without errors {errors[:3]}")
    check(rows == (keys, keys) and done == keys and sum(won) == keys,
          f"exactly one business row per key: {rows[0]} rows for {rows[1]} of {keys} keys, {done} claims completed")


# ---- 3. a hostile role --------------------------------------------------------

def hostile(obs):
    owner = connect(args.app)
    intruder = connect(args.intruder)
    keys = ["h-new", "h-lease", "h-done", "h-absent"]
    lease = owner.execute("SELECT result->>'lease_token' FROM idem_claim('h-lease', 'gate.hostile', lease => '1 hour')").fetchone()[0]
    owner.execute("BEGIN")
    owner.execute("SELECT idem_claim('h-done', 'gate.hostile')")
    owner.execute("SELECT idem_complete('h-done', 'gate.hostile', '{\"by\": \"owner\"}')")
    owner.execute("COMMIT")
    stored = ("SELECT string_agg(key || ' ' || state::text || ' ' || coalesce(result::text, ''), ',' ORDER BY key)"
              " FROM idem.claims WHERE biz_type = 'gate.hostile'")
    before = obs.execute(stored).fetchone()[0]
    # Every number the intruder can derive from the digests (the digest
    # has no secret): the 64-bit digest, its halves as a pair and alone;
    # also of the type's digest (key ''), which 0.4.0's first portable
    # builds locked to add a TTL class to the type.
    numbers = []
    for k in keys + [""]:
        h = obs.execute("SELECT idem.key_hash('gate.hostile', %s)", (k,)).fetchone()[0]
        hi, lo = (h >> 32) & 0xFFFFFFFF, h & 0xFFFFFFFF
        s32 = lambda x: x - (1 << 32) if x >= (1 << 31) else x
        numbers.append((h, s32(hi), s32(lo)))
    for h, hi, lo in numbers:
        intruder.execute("SELECT pg_advisory_lock(%s), pg_advisory_lock(%s, %s), pg_advisory_lock(%s),"
                         " pg_advisory_lock(%s), pg_advisory_lock_shared(%s)", (h, hi, lo, hi, lo, h))
    # Every setting the edition reads, and those its first builds read.
    hostile_settings = {"idem.xact_claimed_since_us": "0",
                        "idem.xact_rewritten": " ".join(r[0] for r in obs.execute(
                            "SELECT tableoid::oid || ':' || ctid FROM idem.claims WHERE biz_type = 'gate.hostile'")),
                        "idem.default_ttl": "1 second", "idem.partition_width": "1 second",
                        "idem.storage_access": "direct", "idem.maintenance_lock_timeout": "1 ms"}
    for name, value in hostile_settings.items():
        intruder.execute("SELECT set_config(%s, %s, false)", (name, value))
    states = [sqlstate_of(intruder, f"ALTER ROLE {args.app} SET idem.xact_claimed_since_us = '0'"),
              sqlstate_of(intruder, f"ALTER DATABASE {args.db} SET idem.xact_claimed_since_us = '0'"),
              sqlstate_of(intruder, "INSERT INTO idem.key_gates VALUES (1, '1', NULL, NULL)"),
              sqlstate_of(intruder, "SELECT count(*) FROM idem.key_gates"),
              sqlstate_of(intruder, "SELECT 1 FROM idem.type_gates FOR UPDATE")]
    check(states == ["42501"] * 5,
          f"the intruder may not store settings for the owner's role or database, nor reach the gates: {states}")
    # The intruder's own calls, with its settings: forging fails.
    forged = [sqlstate_of(intruder, "SELECT idem_complete('h-lease', 'gate.hostile', '{\"forged\": 1}')"),
              sqlstate_of(intruder, "SELECT idem_fail('h-done', 'gate.hostile', '{\"forged\": 1}')"),
              sqlstate_of(intruder, "SELECT idem_checkpoint('h-lease', 'gate.hostile', 'forged')"),
              sqlstate_of(intruder, "SELECT idem_complete('h-lease', 'gate.hostile', '{}', %s)", ("0" * 32,))]
    check(forged == ["ID003"] * 4, f"the intruder finishes nothing without the token: {forged}")
    took = intruder.execute("SELECT claimed, state FROM idem_claim('h-lease', 'gate.hostile', ttl => '2 hours', lease => '1 hour', wait => false)").fetchone()
    check(took == (False, "in_progress"), f"nor takes the running lease over: {took}")
    after = obs.execute(stored).fetchone()[0]
    check(after == before, "no stored claim changed")
    # The owner, meanwhile: everything answers as without the intruder.
    owner.execute("BEGIN")
    r_new = owner.execute("SELECT claimed, state FROM idem_claim('h-new', 'gate.hostile', wait => false)").fetchone()
    r_look = owner.execute("SELECT state FROM idem_lookup('h-absent', 'gate.hostile')").fetchone()[0]
    r_dup = owner.execute("SELECT claimed, state, result FROM idem_claim('h-done', 'gate.hostile', wait => false)").fetchone()
    r_run = owner.execute("SELECT claimed, state FROM idem_claim('h-lease', 'gate.hostile', wait => false)").fetchone()
    # A second TTL class for the type (checked below, once committed).
    r_class = owner.execute("SELECT claimed FROM idem_claim('h-class', 'gate.hostile', ttl => '2 days')").fetchone()[0]
    seen = intruder.execute("SELECT count(*) FROM pg_locks l WHERE l.pid = %s AND (l.locktype = 'advisory'"
                            " OR l.objid IS NOT NULL AND l.objid::text::bigint = ANY (%s))",
                            (pid(owner), [x & 0xFFFFFFFF for t in numbers for x in t])).fetchone()[0]
    check(r_new == (True, "new") and r_look == "absent" and r_dup == (False, "completed", {"by": "owner"})
          and r_run == (False, "in_progress") and r_class is True,
          f"the owner's claim (wait => false), lookup, duplicate, running lease, new class: {r_new} {r_look} {r_dup} {r_run} {r_class}")
    check(seen == 0, f"pg_locks, as the intruder sees it, shows none of the owner's digests ({seen})")
    owner.execute("SELECT idem_complete('h-new', 'gate.hostile', '{\"by\": \"owner\"}')")
    owner.execute("COMMIT")
    own = obs.execute("SELECT ttl_class = idem.ttl_class('2 days') FROM idem.claims WHERE biz_type = 'gate.hostile' AND key = 'h-class'").fetchone()[0]
    check(own is True, f"the type's second TTL class is its claim's own, not the widest: {own}")
    done = sqlstate_of(owner, "SELECT idem_complete('h-lease', 'gate.hostile', '{\"by\": \"owner\"}', %s)", (lease,))
    with connect(args.owner) as adm:
        report = adm.execute("SELECT idem_maintain()").fetchone()[0]
    final = owner.execute("SELECT string_agg(k || ':' || (SELECT state FROM idem_lookup(k, 'gate.hostile')), ' ' ORDER BY k)"
                          " FROM unnest(%s::text[]) k", (keys,)).fetchone()[0]
    check(done == "00000" and report.get("skipped") is None,
          f"the lease holder completes with its token ({done}); maintenance runs (report: {sorted(report)})")
    check(final == "h-absent:absent h-done:completed h-lease:completed h-new:completed", f"the owner's keys at the end: {final}")
    intruder.execute("SELECT pg_advisory_unlock_all()")
    intruder.close()
    owner.close()


# ---- 4. a gate that names a transaction this cluster has not run yet ----------

def foreign_gate(obs):
    # A plain-script dump carries idem.key_gates' rows, and restored into a
    # younger cluster a gate's writer is an xid this cluster hands out
    # later. The transaction given that xid must still take the key lock:
    # a gate is its own only if it also wrote that gate version.
    app, other = connect(args.app), connect(args.app)
    app.execute("SELECT idem_claim('f-key', 'gate.foreign')")
    with connect(args.owner) as o:  # idem_forget is the owner's (docs/design.md §8)
        o.execute("SELECT idem_forget('f-key', 'gate.foreign')")
    writer = mine = None
    for _ in range(20):
        # The gate as a restore leaves it: written by another transaction,
        # naming an xid a little ahead of the counter.
        writer = obs.execute("UPDATE idem.key_gates SET writer = (pg_current_xact_id()::text::bigint + 5)::text::xid8"
                             " WHERE h = idem.key_hash('gate.foreign', 'f-key') RETURNING writer::text::bigint").fetchone()[0]
        while True:
            app.execute("BEGIN")
            mine = app.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()[0]
            if mine >= writer:
                break
            app.execute("ROLLBACK")
        if mine == writer:
            break
        app.execute("ROLLBACK")  # another transaction took that xid: again
    check(mine == writer, f"a transaction was given the xid the foreign gate names ({mine} / {writer})")
    other.execute("BEGIN")
    first = other.execute("SELECT claimed FROM idem_claim('f-key', 'gate.foreign')").fetchone()[0]
    app_pid = pid(app)
    t, box = in_thread(lambda: app.execute("SELECT claimed FROM idem_claim('f-key', 'gate.foreign')").fetchone()[0])
    waited = wait_until("the gate's namesake waits for the first claimer", lambda: obs.execute(
        "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (app_pid,)).fetchone()[0])
    other.execute("COMMIT")
    t.join()
    app.execute("COMMIT")
    rows = obs.execute("SELECT count(*) FROM idem.claims WHERE biz_type = 'gate.foreign' AND key = 'f-key'").fetchone()[0]
    check(first is True and waited and box.get("value") is False and rows == 1,
          f"the transaction a foreign gate names waited for the first claimer and did not claim again"
          f" (first {first}, second {box.get('value', box.get('error'))}, {rows} claim rows)")
    app.close()
    other.close()
    # Maintenance removes such a gate (a committed writer its snapshot has
    # not reached: no transaction of this cluster wrote it), whatever
    # snapshots other sessions hold, so it cannot outlive the next run.
    held = connect(args.app)
    held.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    held.execute("SELECT 'snapshot taken'")
    obs.execute("UPDATE idem.key_gates SET writer = (pg_current_xact_id()::text::bigint + 1000000)::text::xid8"
                " WHERE h = idem.key_hash('gate.foreign', 'f-key')")
    with connect(args.owner) as o:
        o.execute("SELECT idem_maintain()")
    left = obs.execute("SELECT count(*) FROM idem.key_gates WHERE h = idem.key_hash('gate.foreign', 'f-key')").fetchone()[0]
    held.execute("ROLLBACK")
    held.close()
    check(left == 0, f"maintenance removed the gate that names an xid this cluster has not reached ({left} left)")


# ---- 5. what maintenance removes, and what it keeps ---------------------------

def sweep(obs):
    adm = connect(args.owner)
    old = connect(args.app)
    other = connect(args.app)
    old.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    old.execute("SELECT 'snapshot taken'")
    other.execute("SELECT idem_claim('s-late', 'gate.sweep')")
    adm.execute("SELECT idem_maintain()")
    kept = obs.execute("SELECT count(*) FROM idem.key_gates WHERE h = idem.key_hash('gate.sweep', 's-late')").fetchone()[0]
    late = sqlstate_of(old, "SELECT idem_claim('s-late', 'gate.sweep')")
    old.execute("ROLLBACK")
    check(kept == 1 and late == "40001",
          f"the gate of a claim committed after an open REPEATABLE READ snapshot is kept ({kept}), and that snapshot's claim gets {late}")

    # With no other session of this database holding a snapshot, every gate
    # of a finished transaction goes (autovacuum's snapshots are waited out).
    def alone():
        return obs.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
                           " AND pid <> %s AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)",
                           (args.db, pid(adm))).fetchone()[0] == 0
    left = None
    for _ in range(50):
        if wait_until("no other snapshot in the database", alone):
            adm.execute("SELECT idem_maintain()")
            left = obs.execute("SELECT count(*) FROM idem.key_gates").fetchone()[0]
            if left == 0:
                break
    check(left == 0, f"maintenance removed every gate no snapshot needs ({left} left)")
    r = other.execute("SELECT claimed, state FROM idem_claim('s-late', 'gate.sweep')").fetchone()
    check(r == (False, "completed"), f"after the sweep the key still answers from its claim: {r}")
    for c in (adm, old, other):
        c.close()


def main():
    with connect("postgres") as obs:
        return run_sections(obs, (batch, overlapping, hostile, foreign_gate, sweep), check, failures)


if __name__ == "__main__":
    sys.exit(main())
