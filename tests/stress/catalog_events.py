#!/usr/bin/env python3
"""Catalog events while sessions keep claiming.

Client threads, one long-lived connection each, claim and complete keys
without pause (about a third of the claims repeat an earlier key). The main
thread runs, one after the other, every catalog event that changes
something idem caches per session:

  REINDEX INDEX CONCURRENTLY of each partition's index (new index OIDs),
  REINDEX TABLE, VACUUM FULL and CLUSTER of a partition (new files),
  idem_maintain() with a new partition width (partitions created, dropped,
  claims moved out of the default partition), a partition detached and
  attached again by hand, ALTER EXTENSION idem UPDATE (from the previous
  version, installed at the start), and DROP EXTENSION + CREATE EXTENSION.

After each event the main thread waits until every client has finished at
least two further claims: a client whose next call fails permanently (0.2.0:
XX000 until reconnect after REINDEX CONCURRENTLY or a reinstall) never
does, and the run fails. Errors while an event holds its lock
(lock_timeout, a claim during the reinstall that finds the extension gone)
are counted, not failures; XX000 never is.

At the end: every acknowledged claim (committed, and not erased by the
reinstall) replays its stored result from a fresh session, and no key has
two live claims.

With --update-waits OLD (repeatable), first (before the events above):
ALTER EXTENSION idem UPDATE from OLD (0.2.0 or 0.3.0: the update to 0.4.0
changes the key digest and makes the registry of TTL classes; the one from
0.2.0 runs the update to 0.3.0 first, which alters idem.biz_types too) in
a transaction of its own, with claims on either side of its locks, each
step taken once the other session is seen waiting (pg_stat_activity),
never after a fixed time:
  1. a session has read a type's settings (idem.biz_types, which a claim
     reads before it locks idem.claims) in its open transaction; the update
     starts and waits for it; the session then claims and completes: no
     deadlock (40P01) on either side, the update completes;
  2. the update, done but not committed, holds its locks while two claims
     wait for them: a duplicate of a claim made before the update, and a
     new claim with a TTL in a class the type had no claim in. Once the
     update commits they go on in the new schema: the duplicate gets the
     stored result (no second row), the new claim completes, its row is
     indexed by the new digest (idem.key_hash), in a class the type is
     registered in, and a duplicate from a fresh session gets its result.
  3. then a reinstall (DROP + CREATE EXTENSION), uncommitted, while a
     claim waits for idem.claims (its session has the type's settings
     cached, so it waits nowhere else): once the reinstall commits, the
     claim goes on in the new tables (their registry of TTL classes too),
     completes, and a duplicate from a fresh session gets its result.
Each time the claims made before the update still replay. With
--no-events, only that.
"""
import argparse
import collections
import os
import random
import sys
import threading
import time

import psycopg
from psycopg import sql

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from sessions import checker, in_thread, pid, sqlstate_of, wait_until  # noqa: E402

BIZ = "catalog"
# An event's window: a claim may fail while the event holds its lock or
# while the extension is gone. Anything else is a failure.
TRANSIENT = {"55P03", "57014", "55000", "42P01", "42883", "3F000", "40P01", "25P02", "0A000"}


class Client(threading.Thread):
    def __init__(self, n, dsn, stop, state):
        super().__init__(daemon=True)
        self.n, self.dsn, self.stop, self.state = n, dsn, stop, state
        self.done = 0           # claims finished (ok or a duplicate)
        self.acked = {}         # key -> (result, epoch), committed by this client
        self.errors = collections.Counter()
        self.first_error = {}   # sqlstate -> its first message (diagnostics)
        self.fatal = []

    def run(self):
        rnd = random.Random(self.n)
        conn = psycopg.connect(self.dsn, autocommit=True)
        conn.execute("SET lock_timeout = '2s'")
        i = 0
        while not self.stop.is_set():
            i += 1
            if self.acked and rnd.random() < 0.33:
                key = rnd.choice(list(self.acked))
            else:
                key = f"c{self.n}-{i}"
            # The epoch counts reinstalls (which erase every claim); a call
            # that straddles one proves nothing about the keys it touched.
            epoch = self.state["epoch"]
            try:
                with conn.transaction():
                    claimed, state, result = conn.execute(
                        "SELECT claimed, state, result FROM idem_claim(%s, %s)", (key, BIZ)).fetchone()
                    if claimed:
                        conn.execute("SELECT idem_complete(%s, %s, jsonb_build_object('key', %s::text))", (key, BIZ, key))
                same_epoch = self.state["epoch"] == epoch
                if claimed:
                    self.acked[key] = ({"key": key}, epoch if same_epoch else None)
                elif same_epoch and key in self.acked and self.acked[key][1] == epoch:
                    if (state, result) != ("completed", self.acked[key][0]):
                        self.fatal.append(f"{key}: duplicate answered {state} {result}")
                self.done += 1
            except psycopg.Error as e:
                code = e.sqlstate or "?"
                self.errors[code] += 1
                self.first_error.setdefault(code, str(e).splitlines()[0])
                if code not in TRANSIENT:
                    self.fatal.append(f"{key}: {code} {e}".splitlines()[0])
                    if code == "XX000":
                        self.done = -10**9  # never again counts as alive
        conn.close()


def wait_alive(clients, before, what, timeout=60):
    """Until every client finished two more claims than at `before` (the
    bound only stops a hang: a client that never does fails the run)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if all(c.done >= b + 2 for c, b in zip(clients, before)):
            return True
        time.sleep(0.02)
    stuck = [c.n for c, b in zip(clients, before) if c.done < b + 2]
    print(f"FAIL: after {what}, clients {stuck} made no progress", flush=True)
    return False


def update_waits(dsn, old):
    """The update from OLD with claims waiting on either side of its locks
    (the module's docstring); returns the failed checks."""
    check, failures = checker()
    admin = psycopg.connect(dsn, autocommit=True)

    def waiting(backend):
        return lambda: admin.execute(
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (backend,)).fetchone()[0]

    def fresh_install():
        admin.execute("SET client_min_messages = warning")
        admin.execute("DROP EXTENSION IF EXISTS idem CASCADE")
        admin.execute(f"CREATE EXTENSION idem VERSION '{old}'")
        admin.execute("SELECT idem_configure('upd', '3 days')")
        with admin.transaction():
            admin.execute("SELECT idem_claim('before', 'upd')")
            admin.execute("""SELECT idem_complete('before', 'upd', '{"n": 0}')""")

    def replays(key, result, what):
        with psycopg.connect(dsn, autocommit=True) as c:
            try:
                row = c.execute("SELECT claimed, state, result FROM idem_claim(%s, 'upd')", (key,)).fetchone()
            except psycopg.Error as e:
                row = f"{e.sqlstate} {e}".splitlines()[0]
        check(row == (False, "completed", result), f"{what}: a duplicate of {key!r} from a fresh session gets its result ({row})")

    # 1. The session's read of the settings first, then the update.
    fresh_install()
    x = psycopg.connect(dsn, autocommit=True)
    u = psycopg.connect(dsn, autocommit=True)
    x.execute("BEGIN")
    x.execute("SELECT ttl FROM idem.biz_types WHERE biz_type = 'upd'")
    u_pid = pid(u)
    t, box = in_thread(lambda: sqlstate_of(u, "ALTER EXTENSION idem UPDATE"))
    check(wait_until("the update waiting for the session", waiting(u_pid)), "1: the update waits for a session that read the settings")
    claim = sqlstate_of(x, "SELECT idem_claim('during', 'upd')")
    done = sqlstate_of(x, """SELECT idem_complete('during', 'upd', '{"n": 1}')""") if claim == "00000" else "-"
    commit = sqlstate_of(x, "COMMIT")
    t.join(60)
    check((claim, done, commit) == ("00000",) * 3, f"1: the session claims and completes while the update waits (no 40P01): {claim} {done} {commit}")
    check(box.get("value") == "00000", f"1: the update completes after the session: {box}")
    version = admin.execute("SELECT extversion FROM pg_extension WHERE extname = 'idem'").fetchone()[0]
    check(version != old, f"1: updated from {old} to {version}")
    replays("during", {"n": 1}, "1")
    replays("before", {"n": 0}, "1")
    x.close()
    u.close()

    # 2. The update first, uncommitted; two claims wait for it: a duplicate
    # of a claim made before, and a new claim in a class new to its type.
    fresh_install()
    xd = psycopg.connect(dsn, autocommit=True)
    xn = psycopg.connect(dsn, autocommit=True)
    u = psycopg.connect(dsn, autocommit=True)
    u.execute("BEGIN")
    u.execute("ALTER EXTENSION idem UPDATE")

    def duplicate():
        with xd.transaction():
            return xd.execute("SELECT claimed, state, result FROM idem_claim('before', 'upd')").fetchone()

    def new_claim():
        with xn.transaction():
            claimed = xn.execute("SELECT claimed FROM idem_claim('waited', 'upd', ttl => '1 minute')").fetchone()[0]
            xn.execute("""SELECT idem_complete('waited', 'upd', '{"n": 2}')""")
        return claimed
    waiters = [(pid(xd), *in_thread(duplicate)), (pid(xn), *in_thread(new_claim))]
    check(all(wait_until("the claims waiting for the update", waiting(p)) for p, _, _ in waiters),
          "2: two claims wait for the uncommitted update")
    u.execute("COMMIT")
    for _, t, _ in waiters:
        t.join(60)

    def outcome(box):
        err = box.get("error")
        return box.get("value") if err is None else f"{err.sqlstate} {err}".strip()
    got = outcome(waiters[0][2])
    check(got == (False, "completed", {"n": 0}), f"2: the duplicate that waited gets the result of the claim made before the update: {got}")
    got = outcome(waiters[1][2])
    check(got is True, f"2: the new claim that waited claims and completes in the new schema: {got}")
    rows = admin.execute("SELECT count(*) FROM idem.claims WHERE biz_type = 'upd' AND key = 'before'").fetchone()[0]
    check(rows == 1, f"2: one row for the key the duplicate claimed: {rows}")
    # Found through the partitions' indexes by the new digest (no sequential
    # scan: an index entry made with the old digest would not be found).
    with admin.transaction():
        admin.execute("SET LOCAL enable_seqscan = off")
        row = admin.execute("""
            SELECT EXISTS (SELECT 1 FROM idem.type_classes t
                            WHERE t.biz_type = c.biz_type AND t.ttl_class = c.ttl_class AND t.until >= c.expires_at),
                   count(*) OVER ()
              FROM idem.claims c
             WHERE idem.key_hash(c.biz_type, c.key) = idem.key_hash('upd', 'waited') AND c.biz_type = 'upd' AND c.key = 'waited'
            """).fetchall()
    check(row == [(True, 1)], f"2: one row, indexed by the new digest, in a class its type is registered in: {row}")
    replays("waited", {"n": 2}, "2")
    replays("before", {"n": 0}, "2")
    for c in (xd, xn, u):
        c.close()

    # 3. A reinstall, uncommitted, while a claim waits for idem.claims: its
    # session has the type's settings cached (from a claim before), so it
    # reads nothing of the new install until it holds that lock.
    x = psycopg.connect(dsn, autocommit=True)
    u = psycopg.connect(dsn, autocommit=True)
    x.execute("SELECT idem_claim('warm', 'upd')")
    u.execute("BEGIN")
    u.execute("DROP EXTENSION idem")
    u.execute("CREATE EXTENSION idem")

    def after_reinstall():
        # (The claim's row is not read: its type went with the old install,
        # and PostgreSQL's executor would look it up to read it, 42704.)
        with x.transaction():
            n = x.execute("SELECT count(*) FROM (SELECT idem_claim('again', 'upd', ttl => '1 minute') OFFSET 0) c").fetchone()[0]
            x.execute("""SELECT idem_complete('again', 'upd', '{"n": 3}')""")
        return n == 1
    x_pid = pid(x)
    t, box = in_thread(after_reinstall)
    check(wait_until("the claim waiting for the reinstall", waiting(x_pid)), "3: a claim waits for the uncommitted reinstall")
    u.execute("COMMIT")
    t.join(60)
    got = outcome(box)
    check(got is True, f"3: the claim that waited claims and completes in the new install's tables: {got}")
    replays("again", {"n": 3}, "3")
    for c in (x, u, admin):
        c.close()
    return len(failures)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--old-version", default=None, help="installed at the start, for ALTER EXTENSION UPDATE")
    ap.add_argument("--update-waits", action="append", default=[], metavar="OLD",
                    help="first, the update from OLD with claims waiting on it (repeatable)")
    ap.add_argument("--no-events", action="store_true", help="only --update-waits")
    a = ap.parse_args()

    waits_failed = 0
    for old in a.update_waits:
        failed = update_waits(a.dsn, old)
        print(f"update with waiting claims (from {old}): {'PASS' if not failed else 'FAIL'}", flush=True)
        waits_failed += failed
    if a.no_events:
        sys.exit(min(waits_failed, 100))

    admin = psycopg.connect(a.dsn, autocommit=True)
    admin.execute("SET client_min_messages = warning")
    admin.execute("DROP EXTENSION IF EXISTS idem CASCADE")
    if a.old_version:
        admin.execute(f"CREATE EXTENSION idem VERSION '{a.old_version}'")
    else:
        admin.execute("CREATE EXTENSION idem")
    admin.execute("SET idem.partition_width = '1 hour'")
    admin.execute("SELECT idem_maintain()")

    stop = threading.Event()
    state = {"epoch": 0}
    clients = [Client(n, a.dsn, stop, state) for n in range(a.clients)]
    for c in clients:
        c.start()
    ok = wait_alive(clients, [0] * len(clients), "the start")

    def partitions():
        return [r[0] for r in admin.execute(
            "SELECT b.partition::text FROM idem.partition_bounds b ORDER BY b.is_default, b.range_from").fetchall()]

    def indexes():
        return [r[0] for r in admin.execute(
            "SELECT i.indexrelid::regclass::text FROM pg_index i JOIN idem.partition_bounds b ON i.indrelid = b.partition").fetchall()]

    events = []
    events.append(("REINDEX INDEX CONCURRENTLY (every partition)",
                   lambda: [admin.execute(f"REINDEX INDEX CONCURRENTLY {ix}") for ix in indexes()]))
    events.append(("REINDEX TABLE (a partition)", lambda: admin.execute(f"REINDEX TABLE {partitions()[1]}")))
    events.append(("VACUUM FULL (a partition)", lambda: admin.execute(f"VACUUM FULL {partitions()[1]}")))
    events.append(("CLUSTER (the default partition)",
                   lambda: admin.execute("CLUSTER idem.claims_default USING claims_default_key_hash")))
    events.append(("idem_maintain with another width",
                   lambda: (admin.execute("SET idem.partition_width = '30 minutes'"), admin.execute("SELECT idem_maintain()"))))

    def detach_attach():
        # The oldest range: its claims expire first, so no new claim goes there.
        p = partitions()[0]
        lo, hi = admin.execute(
            "SELECT range_from, range_to FROM idem.partition_bounds WHERE partition = %s::regclass", (p,)).fetchone()
        admin.execute(f"ALTER TABLE idem.claims DETACH PARTITION {p}")
        admin.execute(sql.SQL("ALTER TABLE idem.claims ATTACH PARTITION {} FOR VALUES FROM ({}) TO ({})").format(
            sql.SQL(p), sql.Literal(lo), sql.Literal(hi)))
    events.append(("DETACH and ATTACH PARTITION by hand", detach_attach))
    if a.old_version:
        events.append(("ALTER EXTENSION idem UPDATE", lambda: admin.execute("ALTER EXTENSION idem UPDATE")))

    def reinstall():
        # DROP EXTENSION locks idem's objects in dependency order, a claim
        # the parent before its partitions: under load the two can
        # deadlock, and PostgreSQL may pick the DROP as the victim (40P01).
        # An operator retries; so does this.
        for attempt in range(5):
            try:
                admin.execute("DROP EXTENSION idem")
                break
            except psycopg.errors.DeadlockDetected:
                print(f"  (DROP EXTENSION was the deadlock victim, attempt {attempt + 1}; retrying)", flush=True)
        else:
            raise RuntimeError("DROP EXTENSION lost five deadlocks in a row")
        state["epoch"] += 1  # every claim made so far is gone
        admin.execute("CREATE EXTENSION idem")
    events.append(("DROP EXTENSION + CREATE EXTENSION", reinstall))

    for what, run in events:
        t0 = time.time()
        try:
            run()
        except psycopg.Error as e:
            print(f"FAIL: the event itself failed: {what}: {e}", flush=True)
            ok = False
        # Counted from the end of the event: a claim that finished while a
        # DROP EXTENSION still waited for its locks proves nothing about the
        # sessions after it (and the last event's epoch must get claims).
        before = [c.done for c in clients]
        alive = wait_alive(clients, before, what)
        ok = ok and alive
        print(f"{'ok' if alive else 'FAIL'}: {what} ({(time.time() - t0) * 1000:.0f} ms); every session claimed on", flush=True)

    stop.set()
    for c in clients:
        c.join()

    # Every acknowledged claim made since the reinstall replays; no key has
    # two live claims.
    fresh = psycopg.connect(a.dsn, autocommit=True)
    lost = 0
    checked = 0
    for c in clients:
        for key, (result, epoch) in c.acked.items():
            if epoch != state["epoch"]:
                continue
            checked += 1
            row = fresh.execute("SELECT state, result FROM idem_lookup(%s, %s)", (key, BIZ)).fetchone()
            if row != ("completed", result):
                lost += 1
                if lost <= 5:
                    print(f"FAIL: {key} acknowledged, now reads {row}", flush=True)
    doubles = fresh.execute(
        "SELECT count(*) FROM (SELECT key FROM idem.claims WHERE biz_type = %s AND expires_at > now() "
        "GROUP BY key HAVING count(*) > 1) d", (BIZ,)).fetchone()[0]
    errors = sum((c.errors for c in clients), collections.Counter())
    fatal = [f for c in clients for f in c.fatal]
    claims = sum(max(c.done, 0) for c in clients)
    print(f"{claims} claims by {len(clients)} sessions across {len(events)} events; "
          f"transient errors during events: {dict(errors) or 'none'}; acknowledged and checked: {checked}, "
          f"lost: {lost}; keys with two live claims: {doubles}", flush=True)
    for f in fatal[:10]:
        print(f"FAIL: {f}", flush=True)
    first = {}
    for c in clients:
        for code, msg in c.first_error.items():
            first.setdefault(code, msg)
    for code, msg in sorted(first.items()):
        print(f"  first {code}: {msg}", flush=True)
    ok = ok and not fatal and lost == 0 and doubles == 0 and checked > 0 and not waits_failed
    print("catalog events:", "PASS" if ok else "FAIL", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
