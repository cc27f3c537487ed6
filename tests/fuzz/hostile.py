"""Property and fuzz tests over the arguments of every idem function.

Run by tests/scenarios/hardening.sh hostile_input (which makes the database and reads
the server log); by hand:

    .venv/bin/python tests/fuzz/hostile.py --dsn 'host=... port=5499 user=postgres dbname=hostile_fuzz'

What is checked, for every call:
  * the only SQLSTATEs that come out are those README.md's SQLSTATE table
    lists (read from the README at run time, so the table is the contract);
  * the connection survives (a dropped connection is a server crash);
  * an erroring call changes nothing: storage is identical before and after
    (the call runs in a savepoint that is rolled back).
And, per property, what the README promises: which arguments are accepted
(key 1..1024 bytes, biz_type rule, TTL 1 s..400 days), that a duplicate
replays the stored outcome, that distinct keys (look-alikes included) never
collide, that results round-trip exactly, that machine definitions are
accepted exactly when they are well formed, that guards and transitions
work on tables and columns with any name.

Hypothesis runs derandomized (fixed seed, no example database), with a
bounded number of examples per property, so a run is reproducible and takes
about a minute.
"""

import argparse
import datetime as dt
import json
import os
import re
import sys
import time
import traceback
import unicodedata
import warnings

import psycopg
from psycopg import sql
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

# Large generated values (10 kB+ strings) are intended; their repr is not.
warnings.filterwarnings("ignore", message="Generating overly large repr")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# ---------------------------------------------------------------- contract

def documented_sqlstates(readme_path):
    """Every SQLSTATE README.md's SQLSTATE table names, in any row."""
    text = open(readme_path, encoding="utf-8").read()
    m = re.search(r"^### SQLSTATEs\n(.*?)(?=^#)", text, re.S | re.M)
    if not m:
        raise SystemExit("README.md has no '### SQLSTATEs' section")
    codes = set()
    for line in m.group(1).splitlines():
        if line.startswith("|"):
            first = line.split("|")[1]
            codes.update(re.findall(r"`([0-9A-Z]{5})`", first))
    if len(codes) < 5:
        raise SystemExit(f"README.md's SQLSTATE table yielded only {sorted(codes)}")
    return codes


MIN_TTL_US = 1_000_000
MAX_TTL_US = 400 * 86_400_000_000
BIZ_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


def key_ok(k):
    return 1 <= len(k.encode()) <= 1024


def biz_ok(b):
    return bool(BIZ_RE.fullmatch(b))


# ---------------------------------------------------------------- harness

class Harness:
    def __init__(self, dsn, documented, max_examples):
        self.dsn = dsn
        self.documented = documented
        self.max_examples = max_examples
        self.c = psycopg.connect(dsn, autocommit=True)
        self.c2 = psycopg.connect(dsn, autocommit=True)  # "another session"
        for c in (self.c, self.c2):
            c.execute("SET client_min_messages = error")
            c.add_notice_handler(lambda d: None)
        self.calls = 0
        self.errors = {}          # sqlstate -> count (documented ones)
        self.undocumented = {}    # (function, sqlstate) -> [examples]
        self.partial = []         # erroring calls that changed storage
        self.property_failures = []
        self.results = {}

    # Storage digest, read as superuser: all configuration, every claim's
    # identity and state, and the claims' results by length and md5 (the
    # huge-result examples are in biz_type fz.big and left out).
    DIGEST = """
      SELECT (SELECT count(*) FROM idem.claims),
             (SELECT md5(coalesce(string_agg(biz_type || '/' || key || '/' || state::text || '/' ||
                     coalesce(fingerprint, '-') || '/' || coalesce(md5(result::text), '-'), ',' ORDER BY biz_type, key, claimed_at), ''))
                FROM idem.claims WHERE biz_type <> 'fz.big'),
             (SELECT md5(coalesce(string_agg(biz_type || '/' || coalesce(ttl::text, '-'), ',' ORDER BY biz_type), '')) FROM idem.biz_types),
             (SELECT md5(coalesce(string_agg(name || '/' || transitions::text, ',' ORDER BY name), '')) FROM idem.machines),
             (SELECT count(*) || '/' || count(spent_at) FROM idem.tokens)
    """

    def digest(self, conn=None):
        return (conn or self.c).execute(self.DIGEST).fetchone()

    def call(self, func, query, params=(), conn=None, check_partial=True):
        """Run query in a savepoint of the current transaction (one is
        opened if none is). Returns ('ok', rows) or ('err', sqlstate, msg).
        An undocumented SQLSTATE or a storage change on error is recorded."""
        conn = conn or self.c
        self.calls += 1
        own_tx = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        if own_tx:
            conn.execute("BEGIN")
        before = self.digest(conn) if check_partial else None
        conn.execute("SAVEPOINT fz")
        try:
            cur = conn.execute(query, params or None)
            rows = cur.fetchall() if cur.description else []
            conn.execute("RELEASE SAVEPOINT fz")
            out = ("ok", rows)
        except psycopg.Error as e:
            state = e.sqlstate
            if conn.closed or conn.broken:
                raise RuntimeError(f"connection lost during {func}: {e!r} (server crash?)")
            if state is None:  # refused by the driver, never sent: a bug in this test
                raise
            conn.execute("ROLLBACK TO SAVEPOINT fz")
            self.errors[state] = self.errors.get(state, 0) + 1
            if state not in self.documented:
                ex = self.undocumented.setdefault((func, state), [])
                if len(ex) < 3:
                    ex.append((short(params), str(e).splitlines()[0][:200]))
            if check_partial:
                after = self.digest(conn)
                if after != before:
                    self.partial.append((func, short(params), state))
            out = ("err", state, str(e).splitlines()[0])
        if own_tx:
            conn.execute("COMMIT")
        return out

    def prop(self, name, strategy_args, n=None, shrink=True):
        """Decorator: run a hypothesis property now, record pass/fail.
        shrink=False reports the first failing example as found (for
        properties whose examples are too slow to shrink within the budget)."""
        def deco(fn):
            phases = [p for p in Phase if shrink or p not in (Phase.shrink, Phase.explain)]
            cfg = settings(max_examples=n or self.max_examples, derandomize=True, database=None,
                           deadline=None, print_blob=False, phases=phases,
                           suppress_health_check=list(HealthCheck))
            test = cfg(given(**strategy_args)(fn))
            t0 = time.monotonic()
            calls0 = self.calls
            try:
                test()
                ok = True
            except Exception as e:  # hypothesis re-raises the shrunk failure(s)
                ok = False
                subs = e.exceptions if isinstance(e, BaseExceptionGroup) else [e]
                msg = "\n".join("".join(traceback.format_exception_only(type(x), x)).strip()[:1500] for x in subs)
                self.property_failures.append((name, msg))
            self.results[name] = (ok, self.calls - calls0, time.monotonic() - t0)
            # a failed example may leave a transaction open
            for c in (self.c, self.c2):
                if c.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    c.execute("ROLLBACK")
            return fn
        return deco


def short(v, n=160):
    r = repr(v)
    return r if len(r) <= n else r[:n] + f"...({len(r)} chars)"


# ---------------------------------------------------------------- strategies

# Text PostgreSQL can store: no NUL, no lone surrogates.
chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
LOOKALIKES = [
    "caf\u00e9", unicodedata.normalize("NFD", "caf\u00e9"),     # NFC vs NFD
    "pay", "p\u0430y", "\u0440ay", "pa\u0443",                    # Cyrillic а, р, у
    "key", "key ", " key", "key\t", "key\n", "k\u200bey", "key\u200d", "\ufeffkey",
    "KEY", "Key", "\uff4b\uff45\uff59",                           # fullwidth
    "0", "O", "o", "l", "1", "I", "\u2160",                       # roman numeral one
    "\u00c5", "\u212b", "A\u030a",                                # Å three ways
    "ﬁ", "fi", "\u00df", "ss",
]


def sized_key(target_bytes):
    """Keys of exactly target_bytes UTF-8 bytes made of 1-4 byte characters."""
    def build(ch):
        b = len(ch.encode())
        n, rest = divmod(target_bytes, b)
        return ch * n + "a" * rest
    return st.sampled_from(["a", "\u00e9", "\u20ac", "\U0001F600", " ", "\u200b"]).map(build)


keys = st.one_of(
    st.text(chars, min_size=0, max_size=40),
    st.sampled_from(LOOKALIKES),
    st.sampled_from([1, 1023, 1024, 1025, 1026, 2048, 4096]).flatmap(sized_key),
    st.text(st.sampled_from(" \t\r\n\u00a0\u2003\u200b\u3000"), min_size=1, max_size=8),
)
biz_types = st.one_of(
    st.from_regex(r"\A[A-Za-z0-9_.:-]{1,64}\Z"),
    st.text(chars, min_size=0, max_size=70),
    st.sampled_from(["", "a" * 64, "a" * 65, "pay ment", "pay;--", "pay'", "p\u0430y", "Pay", "x/y", "é"]),
)
# Intervals as timedeltas (psycopg sends them as interval), and as interval
# text with months and years, whose length idem counts as extract(epoch) does.
timedeltas = st.one_of(
    st.timedeltas(min_value=dt.timedelta(days=-10**6), max_value=dt.timedelta(days=10**6)),
    st.sampled_from([dt.timedelta(0), dt.timedelta(seconds=1), dt.timedelta(microseconds=999_999),
                     dt.timedelta(seconds=1, microseconds=1), dt.timedelta(days=400),
                     dt.timedelta(days=400, microseconds=1), dt.timedelta(days=-1),
                     dt.timedelta(days=999_999_999), dt.timedelta(days=-999_999_999)]),
)
interval_texts = st.sampled_from([
    "1 month", "13 months", "1 year 34 days", "1 year 35 days", "1 year 39 days", "13 months 10 days",
    "-1 year", "178000000 years", "-178000000 years", "1 mon -29 days -23:59:59",
    "1 year -364 days", "2147483647 days", "-2147483648 days", "2147483647 months",
    "9223372036 seconds", "1 day -86399 seconds", "00:00:01", "00:00:00.999999",
])
ttls = st.one_of(st.none(), timedeltas, interval_texts)
fingerprints = st.one_of(st.none(), st.text(chars, max_size=50), st.sampled_from(["", "x" * 100_000]))


def json_values(max_leaves=20):
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                        st.floats(allow_nan=False, allow_infinity=False),
                        st.text(chars, max_size=20),
                        st.sampled_from(["1e400", "-1e-400", "12345678901234567890.123456789012345678",
                                         "0.1000000000000000055511151231257827"]).map(lambda s: RawNum(s)))
    return st.recursive(scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(chars, max_size=8), inner, max_size=4)),
        max_leaves=max_leaves)


class RawNum(str):
    """A JSON number written out verbatim (beyond float precision/range)."""


def to_json(v):
    if isinstance(v, RawNum):
        return str(v)
    if isinstance(v, list):
        return "[" + ",".join(to_json(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(json.dumps(k) + ":" + to_json(x) for k, x in v.items()) + "}"
    return json.dumps(v)


def nested(depth, kind):
    if kind == "array":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


deep_json = st.one_of(
    json_values(),
    st.tuples(st.sampled_from([1, 64, 126, 127, 128, 129, 500, 2000]), st.sampled_from(["array", "object"]))
      .map(lambda t: RawNum(nested(*t))),
)


# ---------------------------------------------------------------- properties

def run(h):
    c, c2 = h.c, h.c2
    counter = iter(range(10**9))

    def ttl_param(v):
        """(sql fragment, param, length in us or None for NULL)."""
        if v is None:
            return sql.SQL("NULL::interval"), None
        if isinstance(v, dt.timedelta):
            return sql.SQL("%s::interval"), v
        return sql.SQL("%s::interval"), v

    def ttl_us(v):
        if v is None:
            return None
        if isinstance(v, dt.timedelta):
            return (v.days * 86_400 + v.seconds) * 1_000_000 + v.microseconds
        try:
            return int(c.execute("SELECT (extract(epoch FROM %s::interval) * 1000000)::numeric", (v,)).fetchone()[0])
        except psycopg.Error:
            return None

    def ttl_in_range(v):
        us = ttl_us(v)
        return us is not None and MIN_TTL_US <= us <= MAX_TTL_US

    # 1. idem_claim over every argument: accepted exactly when the README's
    # rules say so; a first claim replays to a duplicate from another
    # session; an error writes nothing.
    @h.prop("claim: arguments accepted per README, duplicate replays", dict(
        key=keys, biz=biz_types, ttl=ttls, fp=fingerprints, wait=st.one_of(st.none(), st.booleans()),
        lease=st.one_of(st.none(), st.none(), timedeltas, interval_texts)))
    def _(key, biz, ttl, fp, wait, lease):
        n = next(counter)
        if biz_ok(biz):
            biz = f"fz.c{n}.{biz}"[:64]  # fresh per example: the first call is a first arrival
        tfrag, tval = ttl_param(ttl)
        lfrag, lval = ttl_param(lease)
        q = sql.SQL("SELECT claimed, state, result FROM idem_claim(%s, %s, {}, %s, %s, {})").format(tfrag, lfrag)
        params = [key, biz] + ([tval] if tval is not None else []) + [fp, wait] + ([lval] if lval is not None else [])
        # README: a lease is at most the claim's TTL (the ttl argument, else
        # the type's, else idem.default_ttl: 24 hours here).
        lease_fits = lease is None or not ttl_in_range(lease) or ttl_us(lease) <= ttl_us(ttl if ttl is not None else "24 hours")
        valid = (key_ok(key) and biz_ok(biz) and (ttl is None or ttl_in_range(ttl))
                 and (lease is None or ttl_in_range(lease)) and lease_fits)
        c.execute("BEGIN")
        out = h.call("idem_claim", q, params)
        if not valid:
            c.execute("ROLLBACK")
            assert out[0] == "err" and out[1] in ("22023", "22004"), f"invalid arguments accepted or wrong code: {out}"
            return
        assert out[0] == "ok", f"valid arguments refused: {out}"
        claimed, state, _res = out[1][0]
        assert claimed and state == "new", out
        # own uncommitted claim, same transaction: in_progress, nothing written
        again = h.call("idem_claim", sql.SQL("SELECT claimed, state FROM idem_claim(%s, %s, fingerprint => %s)"), [key, biz, fp])
        assert again == ("ok", [(False, "in_progress")]), again
        if lease is None:
            res = h.call("idem_complete", sql.SQL("SELECT idem_complete(%s, %s, %s::jsonb)"), [key, biz, json.dumps({"n": n})])
            assert res[0] == "ok", res
        c.execute("COMMIT")
        dup = h.call("idem_claim", sql.SQL("SELECT claimed, state, result FROM idem_claim(%s, %s, fingerprint => %s, wait => false)"),
                     [key, biz, fp], conn=c2)
        if lease is None:
            assert dup == ("ok", [(False, "completed", {"n": n})]), dup
        elif ttl_us(lease) >= 5_000_000:
            assert dup[0] == "ok" and dup[1][0][:2] == (False, "in_progress"), dup
        if fp is not None:
            other = h.call("idem_claim", sql.SQL("SELECT claimed FROM idem_claim(%s, %s, fingerprint => %s)"), [key, biz, fp + "x"], conn=c2)
            assert other[0] == "err" and other[1] == "ID001", other
        look = h.call("idem_lookup", sql.SQL("SELECT claimed, state FROM idem_lookup(%s, %s)"), [key, biz], conn=c2)
        assert look[0] == "ok" and look[1][0][0] is False and look[1][0][1] in ("completed", "in_progress"), look

    # 2. Distinct keys never collide, look-alikes included; the same key in
    # two business types is two claims.
    @h.prop("distinct keys never collide (look-alikes, whitespace, normal forms)", dict(
        ks=st.lists(st.one_of(st.sampled_from(LOOKALIKES), st.text(chars, min_size=1, max_size=6)),
                    min_size=2, max_size=12, unique=True)), n=max(20, h.max_examples // 4))
    def _(ks):
        ks = [k for k in ks if key_ok(k)]
        n = next(counter)
        bizes = [f"fz.col{n}", f"FZ.COL{n}"]
        c.execute("BEGIN")
        for b in bizes:
            for i, k in enumerate(ks):
                r = h.call("idem_claim", sql.SQL("SELECT claimed FROM idem_claim(%s, %s)"), [k, b], check_partial=False)
                assert r == ("ok", [(True,)]), f"{k!r} in {b}: {r} (collided with an earlier key)"
                r = h.call("idem_complete", sql.SQL("SELECT idem_complete(%s, %s, %s::jsonb)"), [k, b, json.dumps([b, i])], check_partial=False)
                assert r[0] == "ok", r
        c.execute("COMMIT")
        for b in bizes:
            for i, k in enumerate(ks):
                r = h.call("idem_claim", sql.SQL("SELECT claimed, state, result FROM idem_claim(%s, %s)"), [k, b], conn=c2, check_partial=False)
                assert r == ("ok", [(False, "completed", [b, i])]), f"{k!r} in {b}: {r}"

    # 2b. Errors and savepoint rollbacks leave no trace, in storage or in the
    # backend's memory (idem_complete remembers where the claim it just made
    # lives): random sequences of claim / complete / fail / erroring calls /
    # SAVEPOINT / ROLLBACK TO / RELEASE in one transaction, checked step by
    # step and after COMMIT against a model of what must be stored.
    op = st.one_of(
        st.tuples(st.just("claim"), st.integers(0, 3)),
        st.tuples(st.just("complete"), st.integers(0, 3)),
        st.tuples(st.just("fail"), st.integers(0, 3)),
        st.tuples(st.just("error"), st.sampled_from(["key", "biz", "ttl", "fp"]), st.integers(0, 3)),
        st.tuples(st.just("savepoint")), st.tuples(st.just("rollback")), st.tuples(st.just("release")),
    )

    @h.prop("errors and savepoint rollbacks leave no trace (model check)", dict(ops=st.lists(op, max_size=25)),
            n=max(30, h.max_examples // 2))
    def _(ops):
        n = next(counter)
        biz = f"fz.sp{n}"
        # key -> (p: claimed here, c: completed, f: failed; stored value);
        # a claim of a key this transaction holds reads in_progress until
        # it is finished here, then completed / failed
        state, stack = {}, []
        OWN = {"p": "in_progress", "c": "completed", "f": "failed"}
        c.execute("BEGIN")
        for i, o in enumerate(ops):
            if o[0] == "claim":
                k = f"k{o[1]}"
                r = h.call("idem_claim", sql.SQL("SELECT claimed, state FROM idem_claim(%s, %s)"), [k, biz], check_partial=False)
                want = (False, OWN[state[k][0]]) if k in state else (True, "new")
                assert r == ("ok", [want]), f"step {i} {o}: {r}, model {state}"
                state.setdefault(k, ("p", None))
            elif o[0] in ("complete", "fail"):
                k = f"k{o[1]}"
                fn = "idem_complete" if o[0] == "complete" else "idem_fail"
                r = h.call(fn, sql.SQL("SELECT {}(%s, %s, %s::jsonb)").format(sql.Identifier(fn)), [k, biz, str(i)], check_partial=False)
                if k in state:
                    assert r[0] == "ok", f"step {i} {o}: {r}, model {state}"
                    state[k] = ("c" if o[0] == "complete" else "f", i)
                else:
                    assert r[0] == "err" and r[1] == "ID003", f"step {i} {o}: {r}, model {state}"
            elif o[0] == "error":
                k = f"k{o[2]}"
                bad = {"key": ("x" * 1025, biz, None, None), "biz": (k, biz + " ", None, None),
                       "ttl": (k, biz, dt.timedelta(0), None), "fp": (k, biz, None, "other-fingerprint")}[o[1]]
                r = h.call("idem_claim", sql.SQL("SELECT claimed, state FROM idem_claim(%s, %s, %s::interval, %s)"), list(bad))
                if o[1] == "fp":  # no fingerprint was given first: a duplicate with one is still a duplicate
                    want = ("ok", [(False, OWN[state[k][0]])]) if k in state else ("ok", [(True, "new")])
                    assert r == want, f"step {i} {o}: {r}, model {state}"
                    state.setdefault(k, ("p", None))
                else:
                    assert r[0] == "err" and r[1] == "22023", f"step {i} {o}: {r}"
            elif o[0] == "savepoint":
                c.execute(f"SAVEPOINT s{i}")
                stack.append((f"s{i}", dict(state)))
            elif o[0] == "rollback" and stack:
                c.execute(f"ROLLBACK TO SAVEPOINT {stack[-1][0]}")
                state = dict(stack[-1][1])
            elif o[0] == "release" and stack:
                c.execute(f"RELEASE SAVEPOINT {stack.pop()[0]}")
        c.execute("COMMIT")
        for j in range(4):
            k = f"k{j}"
            r = h.call("idem_lookup", sql.SQL("SELECT state, result FROM idem_lookup(%s, %s)"), [k, biz], conn=c2, check_partial=False)
            code, val = state.get(k, (None, None))
            want = {None: ("absent", None), "p": ("completed", None), "c": ("completed", val), "f": ("failed", val)}[code]
            assert r == ("ok", [want]), f"after COMMIT, {k}: {r}, model {state}"

    # 3. Results (idem_complete / idem_fail) round-trip exactly: any JSON,
    # deep nesting, numbers beyond float precision.
    @h.prop("complete/fail: any jsonb result round-trips exactly", dict(
        v=deep_json, fail=st.booleans()), n=max(30, h.max_examples // 3))
    def _(v, fail):
        n = next(counter)
        key, biz = f"r{n}", "fz.result"
        text = to_json(v)
        want = c.execute("SELECT %s::jsonb::text", (text,)).fetchone()[0]
        c.execute("BEGIN")
        assert h.call("idem_claim", sql.SQL("SELECT claimed FROM idem_claim(%s, %s)"), [key, biz]) == ("ok", [(True,)])
        fn = "idem_fail" if fail else "idem_complete"
        r = h.call(fn, sql.SQL("SELECT {}(%s, %s, %s::jsonb)").format(sql.Identifier(fn)), [key, biz, text])
        c.execute("COMMIT")
        assert r[0] == "ok", f"{fn} refused {short(text)}: {r}"
        dup = h.call("idem_claim", sql.SQL("SELECT claimed, state, result::text FROM idem_claim(%s, %s)"), [key, biz], conn=c2)
        assert dup == ("ok", [(False, "failed" if fail else "completed", want)]), f"stored {short(text)}, got back {short(dup)}"

    # 4. Recovery data of a leased claim (idem_checkpoint) round-trips to the
    # next owner. The lease has to run out (1 s minimum), so few examples,
    # all taken over at once after one sleep.
    leased = []

    @h.prop("checkpoint: recovery data accepted", dict(v=deep_json, point=st.one_of(
        st.text(chars, min_size=0, max_size=10), st.sampled_from(["x" * 256, "x" * 257, "\u00e9" * 128, "\u00e9" * 129]))),
        n=max(20, h.max_examples // 5))
    def _(v, point):
        n = next(counter)
        key, biz = f"cp{n}", "fz.lease"
        text = to_json(v)
        want = c.execute("SELECT %s::jsonb::text", (text,)).fetchone()[0]
        c.execute("BEGIN")
        r = h.call("idem_claim", sql.SQL("SELECT claimed, result->>'lease_token' FROM idem_claim(%s, %s, lease => '1 second')"), [key, biz])
        c.execute("COMMIT")
        assert r[0] == "ok" and r[1][0][0], r
        token = r[1][0][1]
        r = h.call("idem_checkpoint", sql.SQL("SELECT idem_checkpoint(%s, %s, %s, %s::jsonb, %s)"), [key, biz, point, text, token])
        point_ok = 1 <= len(point.encode()) <= 256
        if not point_ok:
            assert r[0] == "err" and r[1] == "22023", f"point of {len(point.encode())} bytes: {r}"
            return
        assert r[0] == "ok", f"checkpoint refused recovery data {short(text)}: {r}"
        leased.append((key, biz, point, want))

    time.sleep(1.1)
    lost = []
    for key, biz, point, want in leased:
        r = h.call("idem_claim", sql.SQL("SELECT claimed, result->>'recovery_point', (result->'recovery_data')::text FROM idem_claim(%s, %s, lease => '1 minute')"),
                   [key, biz], conn=c2)
        if not (r[0] == "ok" and r[1][0] == (True, point, want)):
            got = r[1][0][2] if r[0] == "ok" else r
            lost.append(f"stored {short(want, 100)} -> next owner got {short(got, 100)}")
    h.results["checkpoint: recovery data round-trips to the next owner"] = (not lost, len(leased), 0.0)
    if lost:
        h.property_failures.append(("checkpoint: recovery data round-trips to the next owner",
                                    f"{len(lost)} of {len(leased)} differ:\n" + "\n".join(lost[:6])))

    # 5. Lease tokens: only the issued one finishes a lease from another session.
    @h.prop("lease tokens: only the issued token finishes a lease", dict(
        tok=st.one_of(st.text(chars, max_size=70), st.sampled_from(["", "0" * 64, "x" * 100_000]))), n=max(20, h.max_examples // 4))
    def _(tok):
        n = next(counter)
        key, biz = f"lt{n}", "fz.tok"
        r = h.call("idem_claim", sql.SQL("SELECT result->>'lease_token' FROM idem_claim(%s, %s, lease => '1 minute')"), [key, biz])
        real = r[1][0][0]
        for fn, q in (("idem_complete", "SELECT idem_complete(%s, %s, NULL, %s)"),
                      ("idem_fail", "SELECT idem_fail(%s, %s, '{}', %s)"),
                      ("idem_checkpoint", "SELECT idem_checkpoint(%s, %s, 'p', NULL, %s)"),
                      ("idem_release", "SELECT idem_release(%s, %s, %s)")):
            if tok == real:
                continue
            r = h.call(fn, sql.SQL(q), [key, biz, tok], conn=c2)
            assert r[0] == "err" and r[1] == "ID003", f"{fn} with token {short(tok)}: {r}"
        r = h.call("idem_complete", sql.SQL("SELECT idem_complete(%s, %s, '1', %s)"), [key, biz, real], conn=c2)
        assert r[0] == "ok", r

    # 6. idem_configure: accepted per the README's rules; an error changes nothing.
    @h.prop("configure: biz_type and ttl accepted per README", dict(biz=biz_types, ttl=ttls))
    def _(biz, ttl):
        tfrag, tval = ttl_param(ttl)
        r = h.call("idem_configure", sql.SQL("SELECT idem_configure(%s, {})").format(tfrag), [biz] + ([tval] if tval is not None else []))
        valid = biz_ok(biz) and (ttl is None or ttl_in_range(ttl))
        assert (r[0] == "ok") == valid, f"valid={valid}: {r}"
        if r[0] == "err":
            assert r[1] in ("22023", "22004"), r

    # 7. One-time tokens: issue accepted per the README's TTL rule; a token
    # is spent exactly once, only for its biz_type; junk never spends.
    @h.prop("tokens: issue per README, spent once, junk never", dict(biz=biz_types, ttl=ttls, junk=st.text(chars, max_size=80)))
    def _(biz, ttl, junk):
        tfrag, tval = ttl_param(ttl)
        if ttl is None:
            tfrag = sql.SQL("'10 minutes'::interval")
        r = h.call("idem_issue_token", sql.SQL("SELECT idem_issue_token(%s, {})").format(tfrag), [biz] + ([tval] if tval is not None else []))
        valid = biz_ok(biz) and (ttl is None or ttl_in_range(ttl))
        assert (r[0] == "ok") == valid, f"idem_issue_token({short(biz)}, {ttl!r}): valid={valid}, got {r}"
        if r[0] == "err":
            assert r[1] in ("22023", "22004"), r
            return
        tok = r[1][0][0]
        assert re.fullmatch(r"[0-9a-f]{64}", tok), tok
        assert h.call("idem_consume_token", sql.SQL("SELECT idem_consume_token(%s, %s)"), [junk, biz]) == ("ok", [(False,)])
        assert h.call("idem_consume_token", sql.SQL("SELECT idem_consume_token(%s, %s)"), [tok, biz + "x"]) == ("ok", [(False,)])
        assert h.call("idem_consume_token", sql.SQL("SELECT idem_consume_token(%s, %s)"), [tok, biz], conn=c2) == ("ok", [(True,)])
        assert h.call("idem_consume_token", sql.SQL("SELECT idem_consume_token(%s, %s)"), [tok, biz]) == ("ok", [(False,)])

    # 8. Machine definitions: accepted exactly when well formed; stored as
    # given; an error leaves the previous definition in place;
    # classification agrees with the definition.
    state_names = st.one_of(st.sampled_from(["A", "B", "C", "D", "PAID", "it's", 'q"uote', "semi;colon", "a b", "\u00e9", "\u200b"]),
                            st.text(chars, min_size=0, max_size=6))
    well_formed = st.dictionaries(state_names, st.lists(state_names, max_size=4), min_size=0, max_size=6)
    any_json = json_values(10)

    @h.prop("define_machine: accepted iff well formed, error keeps the old one", dict(
        name=st.one_of(biz_types), tr=st.one_of(well_formed, any_json), probe=st.tuples(state_names, state_names)))
    def _(name, tr, probe):
        n = next(counter)
        if biz_ok(name):
            name = f"fzm{n}.{name}"[:64]
            base = h.call("idem_define_machine", sql.SQL("SELECT idem_define_machine(%s, %s::jsonb)"), [name, '{"OLD":["NEW"]}'])
            assert base[0] == "ok", base
        text = to_json(tr)
        r = h.call("idem_define_machine", sql.SQL("SELECT idem_define_machine(%s, %s::jsonb)"), [name, text])
        valid = (biz_ok(name) and isinstance(tr, dict) and len(tr) > 0 and "" not in tr
                 and all(isinstance(ts, list) and all(isinstance(t, str) and t != "" and t != f for t in ts) for f, ts in tr.items()))
        assert (r[0] == "ok") == valid, f"valid={valid}: {short(text)} -> {r}"
        if not valid:
            assert r[1] in ("22023", "22004"), r
            if biz_ok(name):
                m = h.call("idem_machine", sql.SQL("SELECT idem_machine(%s)->'transitions'"), [name])
                assert m == ("ok", [({"OLD": ["NEW"]},)]), f"failed redefinition changed the machine: {m}"
            return
        m = h.call("idem_machine", sql.SQL("SELECT idem_machine(%s)->'transitions'"), [name])
        assert m == ("ok", [(c.execute("SELECT %s::jsonb", (text,)).fetchone()[0],)]), m
        f, t = probe
        r = h.call("idem_classify_transition", sql.SQL("SELECT idem_classify_transition(%s, %s, %s)"), [name, f, t])
        states = set(tr) | {x for ts in tr.values() for x in ts}
        if t not in states:
            assert r[0] == "err" and r[1] == "22023", r
            return
        assert r[0] == "ok", r
        verdict = r[1][0][0]
        expect_allowed = f != t and t in tr.get(f, [])
        assert (verdict == "allowed") == expect_allowed, f"{f!r}->{t!r} in {tr}: {verdict}"
        if f == t:
            assert verdict == "already"
        if f not in states:
            assert verdict == "illegal"

    # 9. Table and column names with quotes, semicolons, spaces, unicode and
    # up to the 63-byte limit: transition and guard work, inject nothing,
    # and guard/unguard can be repeated.
    c.execute("CREATE TABLE IF NOT EXISTS public.fz_sentinel (x int)")
    h.call("idem_define_machine", sql.SQL("SELECT idem_define_machine('fz.guard', %s::jsonb)"),
           ['{"A":["B"],"B":["C"],"C":["D"]}'])
    ident = st.one_of(
        st.text(chars, min_size=1, max_size=20),
        st.sampled_from(['x"; DROP TABLE public.fz_sentinel; --', "x'); DROP TABLE public.fz_sentinel; --",
                         "a b", "Mixed", "select", "$1", "%s", "%I", "\\", "\u00e9t\u00e4t", "\U0001F600"]),
        st.integers(40, 63).map(lambda n: "s" * n),            # long names, up to NAMEDATALEN - 1
        st.integers(15, 31).map(lambda n: "\u00e9" * n),       # long, multibyte
    ).filter(lambda s: len(s.encode()) <= 63 and s.strip() != "" or s == " ")

    @h.prop("transition/guard: any table and column name", dict(tbl=ident, idc=ident, stc=ident, idv=st.text(chars, max_size=12)),
            n=max(15, h.max_examples // 6), shrink=False)
    def _(tbl, idc, stc, idv):
        if idc == stc:
            stc = stc[:-1] + ("y" if stc[-1:] != "y" else "z") if len(stc) > 1 else stc + "2"
        n = next(counter)
        tname = f"{tbl}{n}"
        if len(tname.encode()) > 63:
            tname = tname.encode()[-63:].decode("utf-8", "ignore")
        c.execute(sql.SQL("CREATE TABLE public.{} ({} text PRIMARY KEY, {} text)").format(
            sql.Identifier(tname), sql.Identifier(idc), sql.Identifier(stc)))
        # values as literals: a '%' in an identifier would read as a placeholder
        c.execute(sql.SQL("INSERT INTO public.{} VALUES ({}, 'A')").format(sql.Identifier(tname), sql.Literal(idv)))
        oid = c.execute("SELECT %s::regclass::oid", [sql.Identifier("public", tname).as_string(c)]).fetchone()[0]
        T = "SELECT idem_transition(%s::oid::regclass, %s, %s, %s, %s, 'fz.guard')"
        seq = [("B", "applied"), ("B", "already"), ("A", "stale"), ("D", "premature"), ("C", "applied")]
        for to, want in seq:
            r = h.call("idem_transition", sql.SQL(T), [oid, idc, idv, stc, to])
            assert r == ("ok", [(want,)]), f"to {to}: {r}"
        r = h.call("idem_transition", sql.SQL(T), [oid, idc, idv + "?", stc, "D"])
        assert r[0] == "err" and r[1] == "P0002", r
        upd = sql.SQL("UPDATE public.{} SET {} = 'A'").format(sql.Identifier(tname), sql.Identifier(stc))
        for attempt in (1, 2):  # guarding twice replaces the guard
            r = h.call("idem_guard", sql.SQL("SELECT idem_guard(%s::oid::regclass, %s, 'fz.guard')"), [oid, stc])
            assert r[0] == "ok", f"idem_guard #{attempt}: {r}"
        r = h.call("UPDATE guarded", upd)
        assert r[0] == "err" and r[1] == "ID002", f"guarded illegal UPDATE: {r}"
        r = h.call("idem_unguard", sql.SQL("SELECT idem_unguard(%s::oid::regclass, %s)"), [oid, stc])
        assert r[0] == "ok", r
        r = h.call("UPDATE unguarded", upd)
        assert r[0] == "ok", f"after idem_unguard the UPDATE is still refused: {r}"
        left = c.execute("SELECT count(*) FROM pg_trigger WHERE tgrelid = %s AND NOT tgisinternal", [oid]).fetchone()[0]
        assert left == 0, f"{left} trigger(s) left after idem_unguard"
        c.execute(sql.SQL("DROP TABLE public.{}").format(sql.Identifier(tname)))
        assert c.execute("SELECT to_regclass('public.fz_sentinel') IS NOT NULL").fetchone()[0], "sentinel table dropped: injection"

    # 10. NULL in every argument position of every function (and all NULL):
    # 22004, or accepted where the argument is optional (and for the few
    # functions whose NULL is documented: idem_claim_id is IMMUTABLE STRICT,
    # NULL in, NULL out, as md5(NULL)).
    c.execute("CREATE TABLE IF NOT EXISTS public.fz_null (id text PRIMARY KEY, st text, v bigint)")
    c.execute("INSERT INTO public.fz_null VALUES ('1', 'A', 0) ON CONFLICT DO NOTHING")
    sigs = c.execute("""
        SELECT p.proname, p.oid::regprocedure::text, pg_get_function_identity_arguments(p.oid),
               array(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) t), p.pronargdefaults, p.pronargs
          FROM pg_proc p JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
          JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idem'
         WHERE p.pronamespace <> 'idem'::regnamespace AND p.prorettype <> 'trigger'::regtype
           AND p.proname NOT IN ('idem_maintain', 'idem_schedule_maintenance')
         ORDER BY 1""").fetchall()
    sample = {"text": "'fz.null'", "interval": "'1 hour'::interval", "jsonb": "'{}'::jsonb", "boolean": "true",
              "regclass": "'public.fz_null'::regclass", "name": "'st'::name", "bigint": "NULL::bigint"}
    per_fn = {"idem_transition": ["'public.fz_null'::regclass", "'id'::name", "'1'", "'st'::name", "'B'", "'fz.guard'", "NULL::name", "NULL::bigint"],
              "idem_guard": ["'public.fz_null'::regclass", "'st'::name", "'fz.guard'"],
              "idem_unguard": ["'public.fz_null'::regclass", "'st'::name"],
              "idem_classify_transition": ["'fz.guard'", "'A'", "'B'"],
              "idem_machine": ["'fz.guard'", "'A'"],
              "idem_define_machine": ["'fz.null'", "'{\"A\":[\"B\"]}'::jsonb"]}
    null_calls = 0
    null_bad = []
    for proname, regproc, _args, types, ndefaults, nargs in sigs:
        vals = per_fn.get(proname) or [sample.get(t, f"NULL::{t}") for t in types]
        optional = set(range(nargs - ndefaults, nargs))
        for pos in list(range(nargs)) + ["all"]:
            args = [f"NULL::{types[i]}" if pos == "all" or i == pos else vals[i] for i in range(nargs)]
            q = f"SELECT {proname}({', '.join(args)})"
            c.execute("BEGIN")
            r = h.call(proname, sql.SQL(q.replace("%", "%%")))
            c.execute("ROLLBACK")
            null_calls += 1
            if r[0] == "err" and r[1] != "22004" and not (r[1] in h.documented and r[1] != "XX000"):
                null_bad.append((q, r))
            if r[0] == "ok" and pos != "all" and pos not in optional and proname not in ("idem_consume_token", "idem_classify_transition", "idem_configure", "idem_set_owner", "idem_unguard", "idem_claim_id"):
                null_bad.append((q, "accepted a NULL required argument", r))
    h.results["NULL in every argument of every function"] = (not null_bad, null_calls, 0.0)
    if null_bad:
        h.property_failures.append(("NULL in every argument of every function", short(null_bad, 1500)))

    # 11. A big result: 10 MB of jsonb stored and replayed.
    big = json.dumps({"blob": "x" * 10_000_000})
    c.execute("BEGIN")
    h.call("idem_claim", sql.SQL("SELECT idem_claim('big', 'fz.big')"), check_partial=False)
    r = h.call("idem_complete", sql.SQL("SELECT idem_complete('big', 'fz.big', %s::jsonb)"), [big], check_partial=False)
    c.execute("COMMIT")
    dup = h.call("idem_claim", sql.SQL("SELECT claimed, length(result->>'blob') FROM idem_claim('big', 'fz.big')"), conn=c2, check_partial=False)
    ok = r[0] == "ok" and dup == ("ok", [(False, 10_000_000)])
    h.results["10 MB result stored and replayed"] = (ok, 3, 0.0)
    if not ok:
        h.property_failures.append(("10 MB result stored and replayed", f"{r} / {dup}"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--examples", type=int, default=int(os.environ.get("HOSTILE_EXAMPLES", "150")))
    ap.add_argument("--readme", default=os.path.join(ROOT, "README.md"))
    a = ap.parse_args()
    documented = documented_sqlstates(a.readme)
    print(f"documented SQLSTATEs (README.md): {' '.join(sorted(documented))}")
    h = Harness(a.dsn, documented, a.examples)
    t0 = time.monotonic()
    try:
        run(h)
    except RuntimeError as e:
        print(f"FATAL: {e}")
        return 2
    took = time.monotonic() - t0
    print(f"\n{'property':<72} {'calls':>7} {'secs':>6}  result")
    for name, (ok, calls, secs) in h.results.items():
        print(f"{name:<72} {calls:>7} {secs:>6.1f}  {'pass' if ok else 'FAIL'}")
    print(f"\n{h.calls} calls in {took:.1f} s; SQLSTATEs seen: " +
          ", ".join(f"{k}×{v}" for k, v in sorted(h.errors.items())))
    failed = False
    if h.undocumented:
        failed = True
        print("\nUNDOCUMENTED SQLSTATEs (not in README.md's table):")
        for (fn, state), ex in sorted(h.undocumented.items()):
            print(f"  {state} from {fn}, {h.errors.get(state)} time(s) in all; e.g.")
            for params, msg in ex:
                print(f"      {params}\n        -> {msg}")
    if h.partial:
        failed = True
        print("\nERRORS THAT CHANGED STORAGE:")
        for p in h.partial[:10]:
            print("  ", p)
    if h.property_failures:
        failed = True
        print("\nPROPERTY FAILURES:")
        for name, msg in h.property_failures:
            print(f"  * {name}:\n      " + msg.replace("\n", "\n      "))
    ok_props = sum(1 for ok, _, _ in h.results.values() if ok)
    print(f"\nhostile input: {ok_props} passed, {len(h.results) - ok_props} failed"
          f" (properties); undocumented SQLSTATEs: {len(h.undocumented)}; partial writes: {len(h.partial)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
