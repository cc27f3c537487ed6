#!/usr/bin/env python3
"""Random sequences of idem calls through several sessions, each with its
own random session settings, interleaved with catalog events; after every
step the database must agree with a model of the promise.

A hypothesis state machine (derandomized: the same sequences every run)
drives three sessions and an operator session. Sessions open transactions
at a random isolation level, claim (never waiting: one thread drives them
all), complete, fail, forget, look up, commit or roll back; between
transactions a session changes its DateStyle, TimeZone, abbreviation set or
IntervalStyle. When no transaction is open the operator runs catalog
events: REINDEX INDEX CONCURRENTLY, VACUUM FULL, idem_maintain with a new
partition width, DROP + CREATE EXTENSION.

The model: the committed outcome of every key, and the uncommitted claims
of each open transaction. Expected answers follow the README: a first
arrival claims; a duplicate gets the committed outcome; a key another open
transaction claimed reads in_progress; finishing a claim this transaction
does not hold is ID003; under REPEATABLE READ a key committed after the
snapshot is 40001; SERIALIZABLE may abort a transaction with 40001 at any
call or at commit (it must never let a write skew commit — see the
isolation spec claim_serializable_ssi), and the model then drops it.

Invariant after every step: no key has two live claims, and every key's
lookup from the operator session equals the model.
"""
import argparse
import json
import sys

import psycopg
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

BIZ = "ps"
KEYS = [f"k{i}" for i in range(6)]
SETTINGS = {
    "DateStyle": ["ISO, MDY", "SQL, DMY", "Postgres, MDY", "German"],
    "TimeZone": ["UTC", "Asia/Kolkata", "America/New_York", "Pacific/Chatham", "IST-1", "Asia/Jakarta"],
    "timezone_abbreviations": ["Default", "Australia", "India"],
    "IntervalStyle": ["postgres", "sql_standard", "iso_8601", "postgres_verbose"],
}
LEVELS = ["read committed", "repeatable read", "serializable"]
DSN = None
# direct, sql (the native library's two storage paths; the SQL path works
# under READ COMMITTED only, 0A000 otherwise) or portable (the portable
# edition's PL/pgSQL, installed from PORTABLE_DIST: the same protocol
# written a second time, checked against the same model)
PATH = "direct"
PORTABLE_DIST = None
STEPS = 0


def install(op):
    """Make the edition under test anew in the operator's database."""
    if PATH != "portable":
        op.execute("DROP EXTENSION IF EXISTS idem CASCADE")
        op.execute("CREATE EXTENSION idem")
        return
    if op.execute("SELECT to_regnamespace('idem') IS NOT NULL").fetchone()[0]:
        op.execute(open(f"{PORTABLE_DIST}/idem_portable_uninstall.sql").read())
    op.execute(open(f"{PORTABLE_DIST}/idem_portable.sql").read())


class Session:
    def __init__(self):
        self.conn = psycopg.connect(DSN, autocommit=True)
        # Finishing a key another open transaction claimed waits for that
        # transaction (no other thread will end it here): the wait ends
        # with 55P03, the state the model expects.
        self.conn.execute("SET lock_timeout = '100ms'")
        self.level = None          # open transaction's level, or None
        self.pending = {}          # key -> (state, result) claimed in the open transaction
        self.forgotten = set()     # committed keys this transaction forgot
        # Keys this transaction claimed and then forgot: deleted by the
        # transaction that inserted them, which other sessions still see as
        # a claim in progress until it ends (as a unique index would make
        # them wait for it).
        self.ghosts = set()
        self.snapshot = None       # key -> row version at the snapshot (REPEATABLE READ)

    def call(self, q, args=()):
        try:
            cur = self.conn.execute(q, args)
            return "ok", cur.fetchall() if cur.description else []
        except psycopg.Error as e:
            return e.sqlstate, str(e).splitlines()[0]


class Promise(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.op = psycopg.connect(DSN, autocommit=True)
        self.op.execute("SET client_min_messages = warning")
        install(self.op)
        self.sessions = [Session() for _ in range(3)]
        self.committed = {}  # key -> (state, result)
        self.version = {}    # key -> which committed row it is (a new claim, a new row)
        self.rows = 0

    def teardown(self):
        for s in self.sessions:
            s.conn.close()
        self.op.close()

    def others_inserting(self, me, key):
        """Another open transaction claimed the key (a row it inserted)."""
        return any(key in s.pending or key in s.ghosts for s in self.sessions if s is not me)

    def others_deleting(self, me, key):
        """Another open transaction forgot the key's committed claim."""
        return any(key in s.forgotten for s in self.sessions if s is not me)

    def others_pending(self, me, key):
        """Another open transaction is writing the key's row: a claim
        reads in_progress. (The SQL path and the portable edition cannot
        see an uncommitted deletion: they read the committed outcome until
        the forget commits.)"""
        return self.others_inserting(me, key) or (PATH == "direct" and self.others_deleting(me, key))

    def lookup_pending(self, me, key):
        """What idem_lookup reads as in_progress: as a claim, except on the
        portable edition, whose lookup takes no lock and so cannot see a
        claim in flight (absent until it commits; docs/portable.md)."""
        return PATH != "portable" and self.others_pending(me, key)

    def others_writing(self, me, key):
        """A writer of the key waits for another open transaction."""
        return self.others_inserting(me, key) or self.others_deleting(me, key)

    def abort(self, s):
        """The transaction failed (40001 or an expected error): roll back."""
        s.conn.execute("ROLLBACK")
        s.level, s.pending, s.forgotten, s.snapshot, s.ghosts = None, {}, set(), None, set()

    def first_statement(self, s):
        if s.snapshot is None and s.level == "repeatable read":
            s.snapshot = {k: self.version[k] for k in self.committed}

    def invisible(self, s, key):
        """A committed row this REPEATABLE READ snapshot cannot see."""
        return s.level == "repeatable read" and s.snapshot.get(key) != self.version.get(key)

    def commit_rows(self, s):
        for k in s.forgotten:
            self.committed.pop(k, None)
        for k, v in s.pending.items():
            # A row finished in the transaction that claimed it stays the
            # row it was claimed as; only a new claim is a new row.
            self.rows += 1
            self.version[k] = self.rows
            self.committed[k] = ("completed", None) if v[0] == "p" else v

    # ---- transactions -------------------------------------------------
    @rule(i=st.integers(0, 2), level=st.sampled_from(LEVELS))
    def begin(self, i, level):
        s = self.sessions[i]
        if PATH == "sql":
            level = "read committed"
        if s.level is None:
            s.conn.execute(f"BEGIN ISOLATION LEVEL {level}")
            s.level = level

    @rule(i=st.integers(0, 2))
    def commit(self, i):
        s = self.sessions[i]
        if s.level is None:
            return
        code, _ = s.call("COMMIT")
        if code == "ok":
            self.commit_rows(s)
            s.level, s.pending, s.forgotten, s.snapshot, s.ghosts = None, {}, set(), None, set()
        else:
            assert code == "40001" and s.level == "serializable", f"COMMIT: {code}"
            s.level, s.pending, s.forgotten, s.snapshot, s.ghosts = None, {}, set(), None, set()

    @rule(i=st.integers(0, 2))
    def rollback(self, i):
        s = self.sessions[i]
        if s.level is not None:
            self.abort(s)

    # ---- the API --------------------------------------------------------
    @rule(i=st.integers(0, 2), key=st.sampled_from(KEYS))
    def claim(self, i, key):
        s = self.sessions[i]
        self.first_statement(s)
        code, rows = s.call("SELECT claimed, state, result FROM idem_claim(%s, %s, wait => false)", (key, BIZ))
        if s.level == "serializable" and code == "40001":
            return self.abort(s)
        if key in s.pending:
            st_, res = s.pending[key]
            want = (False, "in_progress" if st_ == "p" else st_, res)
        elif self.others_pending(s, key):
            want = (False, "in_progress", None)
        elif key in self.committed and key not in s.forgotten:
            if self.invisible(s, key):
                assert code == "40001", f"claim {key} committed after the snapshot: {code} {rows}"
                return self.abort(s)
            want = (False,) + self.committed[key]
        else:
            want = (True, "new", None)
        assert code == "ok", f"claim {key} in {s.level}: {code} {rows}"
        assert rows[0] == want, f"claim {key} in {s.level}: got {rows[0]}, want {want}"
        if want[0]:
            s.pending[key] = ("p", None)
            if s.level is None:
                self.commit_rows(s)
                s.pending.clear()

    @rule(i=st.integers(0, 2), key=st.sampled_from(KEYS), fail=st.booleans(), n=st.integers(0, 9))
    def finish(self, i, key, fail, n):
        s = self.sessions[i]
        self.first_statement(s)
        fn = "idem_fail" if fail else "idem_complete"
        code, rows = s.call(f"SELECT {fn}(%s, %s, jsonb_build_object('n', %s::int))", (key, BIZ, n))
        if s.level == "serializable" and code == "40001":
            return self.abort(s)
        if key in s.pending:
            assert code == "ok", f"{fn} of an own claim: {code} {rows}"
            s.pending[key] = ("failed" if fail else "completed", {"n": n})
        elif self.others_writing(s, key):
            assert code == "55P03", f"{fn} of a key another transaction is writing: {code} {rows}"
            if s.level is not None:
                self.abort(s)
        else:
            assert code == "ID003", f"{fn} of {key}, not held: {code} {rows}"
            if s.level is not None:
                self.abort(s)

    @rule(i=st.integers(0, 2), key=st.sampled_from(KEYS))
    def forget(self, i, key):
        s = self.sessions[i]
        self.first_statement(s)
        code, rows = s.call("SELECT idem_forget(%s, %s)", (key, BIZ))
        if s.level == "serializable" and code == "40001":
            return self.abort(s)
        if key in s.pending:
            assert (code, rows) == ("ok", [(True,)]), f"forget of an own claim: {code} {rows}"
            del s.pending[key]
            if s.level is not None:
                s.ghosts.add(key)
        elif self.others_inserting(s, key) and (
                PATH == "direct" or (PATH == "portable" and s.level in (None, "read committed"))):
            assert (code, rows) == ("ok", [(False,)]), f"forget of another transaction's claim: {code} {rows}"
        elif self.others_inserting(s, key):
            # The SQL path cannot see the claim, only its key lock: it
            # waits; so does the portable edition under a transaction
            # snapshot, which tries the key's gate (a claim committed after
            # the snapshot is 40001).
            assert code == "55P03", f"forget of another transaction's claim ({PATH}): {code} {rows}"
            if s.level is not None:
                self.abort(s)
        elif self.others_deleting(s, key):
            assert code == "55P03", f"forget of a key another transaction is forgetting: {code} {rows}"
            if s.level is not None:
                self.abort(s)
        elif key in self.committed and key not in s.forgotten:
            if self.invisible(s, key):
                assert code == "40001", f"forget {key} committed after the snapshot: {code} {rows}"
                return self.abort(s)
            assert (code, rows) == ("ok", [(True,)]), f"forget of a committed claim: {code} {rows}"
            if s.level is None:
                del self.committed[key]
            else:
                s.forgotten.add(key)
        else:
            assert (code, rows) == ("ok", [(False,)]), f"forget of an absent key: {code} {rows}"

    @rule(i=st.integers(0, 2), key=st.sampled_from(KEYS))
    def lookup(self, i, key):
        s = self.sessions[i]
        self.first_statement(s)
        code, rows = s.call("SELECT state, result FROM idem_lookup(%s, %s)", (key, BIZ))
        if s.level == "serializable" and code == "40001":
            return self.abort(s)
        assert code == "ok", f"lookup: {code} {rows}"
        if key in s.pending:
            st_, res = s.pending[key]
            want = ("in_progress", None) if st_ == "p" else (st_, res)
        elif self.lookup_pending(s, key):
            want = ("in_progress", None)
        elif key in self.committed and key not in s.forgotten:
            want = self.committed[key]
        else:
            want = ("absent", None)
        assert rows[0] == want, f"lookup {key} in {s.level}: got {rows[0]}, want {want}"

    # ---- session settings and catalog events -----------------------------
    @rule(i=st.integers(0, 2), name=st.sampled_from(sorted(SETTINGS)), data=st.data())
    def setting(self, i, name, data):
        s = self.sessions[i]
        if s.level is None:
            value = data.draw(st.sampled_from(SETTINGS[name]))
            s.conn.execute(psycopg.sql.SQL("SELECT set_config({}, {}, false)").format(
                psycopg.sql.Literal(name), psycopg.sql.Literal(value)))

    def quiet(self):
        return all(s.level is None for s in self.sessions)

    @precondition(lambda self: self.quiet())
    @rule(event=st.sampled_from(["reindex", "vacuum_full", "maintain_hour", "maintain_day", "reinstall"]))
    def catalog_event(self, event):
        op = self.op
        if event == "reindex":
            for (ix,) in op.execute("SELECT i.indexrelid::regclass::text FROM pg_index i "
                                    "JOIN idem.partition_bounds b ON i.indrelid = b.partition").fetchall():
                op.execute(f"REINDEX INDEX CONCURRENTLY {ix}")
        elif event == "vacuum_full":
            op.execute("VACUUM FULL idem.claims_default")
        elif event in ("maintain_hour", "maintain_day"):
            op.execute("SET idem.partition_width = %s" % ("'1 hour'" if event == "maintain_hour" else "'1 day'"))
            op.execute("SELECT idem_maintain()")
        else:
            install(op)
            self.committed.clear()

    @invariant()
    def promise_holds(self):
        global STEPS
        STEPS += 1
        doubles = self.op.execute(
            "SELECT count(*) FROM (SELECT key FROM idem.claims WHERE biz_type = %s AND expires_at > now() "
            "GROUP BY key HAVING count(*) > 1) d", (BIZ,)).fetchone()[0]
        assert doubles == 0, f"{doubles} keys with two live claims"
        for key in KEYS:
            if any(key in s.pending or key in s.forgotten or key in s.ghosts for s in self.sessions):
                continue
            row = self.op.execute("SELECT state, result FROM idem_lookup(%s, %s)", (key, BIZ)).fetchone()
            want = self.committed.get(key, ("absent", None))
            assert row == want, f"operator lookup of {key}: got {row}, model {want}"


def main():
    global DSN, PATH, PORTABLE_DIST
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--examples", type=int, default=40)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--path", choices=["direct", "sql", "portable"], default="direct",
                    help="the server's idem.storage_access (sql: READ COMMITTED transactions only), "
                         "or the portable edition (a database without the extension)")
    ap.add_argument("--portable-dist", help="with --path portable: scripts/portable.py's output")
    a = ap.parse_args()
    DSN, PATH, PORTABLE_DIST = a.dsn, a.path, a.portable_dist
    if PATH == "portable" and not PORTABLE_DIST:
        ap.error("--path portable needs --portable-dist")
    Promise.TestCase.settings = settings(
        max_examples=a.examples, stateful_step_count=a.steps, derandomize=True, deadline=None,
        suppress_health_check=list(HealthCheck), database=None, print_blob=False)
    try:
        Promise.TestCase().runTest()
    except AssertionError as e:
        print(f"FAIL: {e}")
        sys.exit(1)
    print(f"sessions property ({PATH} path): PASS ({a.examples} sequences, {STEPS} checked steps)")


if __name__ == "__main__":
    main()
