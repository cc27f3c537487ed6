"""The checks of tests/scenarios/scaling.sh citus against a Citus cluster set up by
docs/scaling.md's steps (coordinator 127.0.0.1:5530, workers :5531 and
:5532, database idem_citus). Each check prints "ok - ..." or "FAIL - ...";
the exit status is the number of failures (capped). Synchronization is by
observable state only (a session found waiting on a lock, a thread found
finished); the few sleeps are pacing of a load, never an ordering.

  python tests/citus/scenario.py CHECK...   (all when none is named)
"""
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import sessions  # noqa: E402

import psycopg

HOST = "127.0.0.1"
# The Citus cluster's ports (tests/lib/cluster.sh citus; CITUS_PORTS: coordinator, worker 1, worker 2).
PORTS = dict(zip(("coord", "w1", "w2"), map(int, os.environ.get("CITUS_PORTS", "5530 5531 5532").split())))
DB = os.environ.get("CITUS_DB", "idem_citus")
# Maintenance runs in a database of its own: the docs' steps leave 30-day
# partitions in DB, which short widths would only continue after.
MAINT_DB = os.environ.get("CITUS_MAINT_DB", "idem_m")
PG_BIN = os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin")
RUN = str(int(time.time() * 1000) % 10**9)
failures = []
summary = {}


def conn(node, autocommit=True, db=None, **kw):
    return psycopg.connect(host=HOST, port=PORTS[node], dbname=db or DB, user="postgres", autocommit=autocommit, **kw)


def q(c, sql, *args):
    cur = c.execute(sql, args)
    return cur.fetchall() if cur.description else None


def one(c, sql, *args):
    return q(c, sql, *args)[0]


def ok(cond, what):
    print(("ok - " if cond else "FAIL - ") + what, flush=True)
    if not cond:
        failures.append(what)
    return cond


def sqlstate_of(fn, c=None):
    """The SQLSTATE fn() raised (None if none); a transaction block it left
    open on c is rolled back."""
    try:
        fn()
        return None
    except psycopg.Error as e:
        return e.sqlstate
    finally:
        if c is not None and c.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            c.execute("ROLLBACK")


def wait_until(what, fn, timeout=60):
    """sessions.wait_until, polling at most every 100 ms (many of these ask
    all three nodes); a wait that never ends fails the check and stops it."""
    if sessions.wait_until(what, fn, timeout, slowest=0.1):
        return True
    ok(False, f"timed out waiting for: {what}")
    raise TimeoutError(what)


COORD = None


def node_of_key(key, c=None):
    """The worker ('w1'/'w2') holding key's shard of idem.claims (in c's
    database; COORD's by default)."""
    port = one(c or COORD, """SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
                         WHERE p.shardid = get_shard_id_for_distribution_column('idem.claims', %s::text)""", key)[0]
    return {v: k for k, v in PORTS.items()}[port]


def shard_of_key(key):
    return one(COORD, "SELECT get_shard_id_for_distribution_column('idem.claims', %s::text)", key)[0]


def keys_on(node, prefix, n=1):
    out, i = [], 0
    while len(out) < n:
        k = f"{prefix}-{RUN}-{i}"
        i += 1
        if node_of_key(k) == node:
            out.append(k)
    return out


def waiting_on(node, needle):
    """Some backend of `node` whose query contains needle waits for a lock."""
    with conn(node) as c:
        return one(c, """SELECT count(*) > 0 FROM pg_stat_activity
                          WHERE wait_event_type = 'Lock' AND query LIKE %s""", f"%{needle}%")[0]


def live_rows(key, biz_type):
    return one(COORD, "SELECT count(*) FROM idem.claims WHERE key = %s AND biz_type = %s AND expires_at > now()",
               key, biz_type)[0]


# ---------------------------------------------------------------- semantics
def check_semantics():
    """claim / duplicate / rollback / fingerprint / waiting duplicate / lease /
    checkpoint / complete with token, all through the coordinator."""
    c = COORD
    k = f"sem-{RUN}"
    ok(one(c, "SELECT claimed, state FROM idem_claim(%s, 'sem')", k + "-1") == (True, "new"), "claim through the coordinator: (t, new)")
    ok(one(c, "SELECT claimed, state FROM idem_claim(%s, 'sem')", k + "-1") == (False, "completed"),
       "its duplicate: (f, completed)")
    with conn("coord", autocommit=False) as t:
        ok(one(t, "SELECT claimed FROM idem_claim(%s, 'sem')", k + "-2")[0], "claim in a transaction")
        q(t, "SELECT idem_complete(%s, 'sem', '{\"n\": 2}')", k + "-2")
        t.commit()
    ok(one(c, "SELECT claimed, state, result FROM idem_claim(%s, 'sem')", k + "-2") == (False, "completed", {"n": 2}),
       "completed claim replays its result")
    with conn("coord", autocommit=False) as t:
        q(t, "SELECT claimed FROM idem_claim(%s, 'sem')", k + "-3")
        t.rollback()
    ok(one(c, "SELECT claimed, state FROM idem_claim(%s, 'sem')", k + "-3") == (True, "new"),
       "a rolled-back claim leaves nothing: the retry claims")
    q(c, "SELECT claimed FROM idem_claim(%s, 'sem', fingerprint => 'a')", k + "-4")
    ok(sqlstate_of(lambda: q(c, "SELECT claimed FROM idem_claim(%s, 'sem', fingerprint => 'b')", k + "-4")) == "ID001",
       "another fingerprint: ID001")
    # a concurrent duplicate waits on the worker, then gets the outcome
    first = conn("coord", autocommit=False)
    ok(one(first, "SELECT claimed FROM idem_claim(%s, 'sem')", k + "-5")[0], "first claim, not committed")
    ok(one(c, "SELECT claimed, state FROM idem_claim(%s, 'sem', wait => false)", k + "-5") == (False, "in_progress"),
       "wait => false: in_progress at once")
    res = {}
    t = threading.Thread(daemon=True, target=lambda: res.setdefault("r", one(conn("coord"), "SELECT claimed, state, result FROM idem_claim(%s, 'sem')", k + "-5")))
    t.start()
    wait_until("the duplicate waits on the worker", lambda: waiting_on(node_of_key(k + "-5"), k + "-5"))
    q(first, "SELECT idem_complete(%s, 'sem', '{\"first\": true}')", k + "-5")
    first.commit()
    t.join(30)
    ok(res.get("r") == (False, "completed", {"first": True}), f"the waiting duplicate got the first outcome: {res.get('r')}")
    # lease: claim, commit, others see in_progress; checkpoint and complete with the token
    r = one(c, "SELECT claimed, result FROM idem_claim(%s, 'sem', lease => '1 minute')", k + "-6")
    token = r[1]["lease_token"]
    ok(r[0] and token, "leased claim returns a lease token")
    ok(one(c, "SELECT claimed, state FROM idem_claim(%s, 'sem')", k + "-6") == (False, "in_progress"),
       "a leased claim reads in_progress to others")
    ok(sqlstate_of(lambda: q(c, "SELECT idem_complete(%s, 'sem', '{}')", k + "-6")) == "ID003",
       "completing a lease without its token: ID003")
    q(c, "SELECT idem_checkpoint(%s, 'sem', 'charged', '{\"id\": 7}', %s)", k + "-6", token)
    q(c, "SELECT idem_complete(%s, 'sem', '{\"done\": 1}', %s)", k + "-6", token)
    ok(one(c, "SELECT state, result FROM idem_lookup(%s, 'sem')", k + "-6") == ("completed", {"done": 1}),
       "checkpoint and complete with the token, from other sessions: completed")
    ok(one(c, "SELECT idem_forget(%s, 'sem')", k + "-6")[0] and
       one(c, "SELECT state FROM idem_lookup(%s, 'sem')", k + "-6")[0] == "absent",
       "idem_forget (delegated) removes the claim")


# ---------------------------------------------------------------- call forms
FORMS = [
    # (name, sql with K, delegated?)
    ("SELECT idem_claim(...)", "SELECT idem_claim('K', 'forms')", True),
    ("SELECT * FROM idem_claim(...)", "SELECT * FROM idem_claim('K', 'forms')", True),
    ("SELECT claimed FROM idem_claim(...)", "SELECT claimed FROM idem_claim('K', 'forms')", True),
    ("BEGIN; SELECT claimed, state FROM idem_claim(...); COMMIT", "BEGIN; SELECT claimed, state FROM idem_claim('K', 'forms'); COMMIT", True),
    ("PL/pgSQL SELECT * INTO c FROM idem_claim(...)", "SELECT forms_select_into('K')", True),
    ("PREPARE / EXECUTE", "PREPARE fp(text) AS SELECT claimed FROM idem_claim($1, 'forms'); EXECUTE fp('K'); DEALLOCATE fp", True),
    ("SELECT (idem_claim(...)).claimed", "SELECT (idem_claim('K', 'forms')).claimed", False),
    ("SELECT (idem_claim(...)).*", "SELECT (idem_claim('K', 'forms')).*", False),
    ("... FROM idem_claim(...) WHERE claimed", "SELECT claimed FROM idem_claim('K', 'forms') WHERE claimed", False),
    ("SELECT idem_claim(...), 1", "SELECT idem_claim('K', 'forms'), 1", False),
    ("WITH c AS (SELECT * FROM idem_claim(...))", "WITH c AS (SELECT * FROM idem_claim('K', 'forms')) SELECT claimed FROM c", False),
    ("PL/pgSQL c := idem_claim(...)", "SELECT forms_assign('K')", False),
    ("BEGIN; SELECT (idem_claim(...)).claimed", "BEGIN; SELECT (idem_claim('K', 'forms')).claimed; COMMIT", False),
    ("SELECT (idem_lookup(...)).state", "SELECT (idem_lookup('K', 'forms')).state", False),
]


def check_forms():
    """Every call form through the coordinator: delegated ones work, the
    others are refused with 0A000 and write nothing; on a worker, any form
    works for a local key and a non-delegated one is refused for a remote
    key. A non-delegated form never double-claims a key that a delegated
    claim holds."""
    c = COORD
    q(c, """CREATE OR REPLACE FUNCTION forms_assign(k text) RETURNS boolean LANGUAGE plpgsql AS $$
            DECLARE r idem_claim_result; BEGIN r := idem_claim(k, 'forms'); RETURN r.claimed; END $$""")
    q(c, """CREATE OR REPLACE FUNCTION forms_select_into(k text) RETURNS boolean LANGUAGE plpgsql AS $$
            DECLARE r idem_claim_result; BEGIN SELECT * INTO r FROM idem_claim(k, 'forms'); RETURN r.claimed; END $$""")
    table = []
    for i, (name, sql, delegated) in enumerate(FORMS):
        k = f"form{i}-{RUN}"
        state = sqlstate_of(lambda: c.execute(sql.replace("K", k)), c)
        rows = one(c, "SELECT count(*) FROM idem.claims WHERE key = %s AND biz_type = 'forms'", k)[0]
        if "lookup" in sql:
            good = state == "0A000"
        else:
            good = (state is None and rows == 1) if delegated else (state == "0A000" and rows == 0)
        table.append((name, "delegated" if delegated else "refused", state or "ok", rows))
        ok(good, f"coordinator, {name}: {'works' if delegated else 'refused (0A000), nothing written'} (got {state or 'ok'}, {rows} row)")
    # on a worker: a local key in a non-delegated form runs there; a remote key is refused
    for node in ("w1", "w2"):
        other = "w2" if node == "w1" else "w1"
        with conn(node) as w:
            kl = keys_on(node, f"formlocal-{node}")[0]
            kr = keys_on(other, f"formremote-{node}")[0]
            ok(one(w, "SELECT (idem_claim(%s, 'forms')).claimed", kl)[0], f"{node} directly, local key, (idem_claim(...)).claimed: claimed there")
            ok(sqlstate_of(lambda: q(w, "SELECT (idem_claim(%s, 'forms')).claimed", kr)) == "0A000",
               f"{node} directly, key of {other}, (idem_claim(...)).claimed: 0A000")
            ok(one(w, "SELECT claimed FROM idem_claim(%s, 'forms')", kr)[0], f"{node} directly, key of {other}, delegated form: claimed on {other}")
    # never a double claim: a delegated claim holds the key, a non-delegated form is refused at once
    k = f"dbl-{RUN}"
    first = conn("coord", autocommit=False)
    q(first, "SELECT claimed FROM idem_claim(%s, 'forms')", k)
    for name, sql, delegated in FORMS:
        if not delegated and "lookup" not in sql and "BEGIN" not in sql:
            ok(sqlstate_of(lambda: c.execute(sql.replace("K", k)), c) == "0A000",
               f"while a delegated claim of the key is open, {name} is refused at once")
    first.commit()
    ok(live_rows(k, "forms") == 1, "one live row after all of them")
    summary["forms"] = table


# ---------------------------------------------------------------- configure / TTL
def ttl_of(c, k, bt, delegated=True):
    sql = ("SELECT expires_at - first_claimed_at FROM idem_claim(%s, %s)" if delegated
           else "SELECT (r).expires_at - (r).first_claimed_at FROM (SELECT idem_claim(%s, %s) r) s")
    return str(one(c, sql, k, bt)[0])


def check_ttl():
    """idem_configure works on the coordinator and reaches sessions Citus
    keeps open on the workers, and sessions opened directly on a worker."""
    bt = f"ttl.{RUN}"
    pooled = conn("coord")   # its delegated calls use Citus's cached worker connections
    direct = conn("w1")
    k1, k2 = keys_on("w1", "ttl1", 4), keys_on("w2", "ttl2", 4)
    got = [ttl_of(pooled, k1[0], bt), ttl_of(pooled, k2[0], bt), ttl_of(direct, k1[1], bt, delegated=False)]
    ok(got == ["1 day, 0:00:00"] * 3, f"default TTL everywhere before idem_configure: {got}")
    with conn("coord") as admin:
        q(admin, "SELECT idem_configure(%s, '2 hours')", bt)
    got = [ttl_of(pooled, k1[2], bt), ttl_of(pooled, k2[2], bt), ttl_of(direct, k1[3], bt, delegated=False)]
    ok(got == ["2:00:00"] * 3, f"after idem_configure(…, '2 hours') on the coordinator: pooled sessions on both workers and a direct one: {got}")
    with conn("w2") as admin:
        q(admin, "SELECT idem_configure(%s, '3 hours')", bt)
    got = [ttl_of(pooled, k1[0] + "x", bt), ttl_of(pooled, k2[0] + "x", bt)]
    ok(got == ["3:00:00"] * 2, f"after idem_configure(…, '3 hours') on a worker: {got}")
    with conn("coord") as admin:
        q(admin, "SELECT idem_configure(%s, NULL)", bt)
    ok(ttl_of(pooled, k2[1] + "y", bt) == "1 day, 0:00:00", "idem_configure(…, NULL): back to the default")


# ---------------------------------------------------------------- stress
def stress_worker(node, keys, stop, stats, bt, only_local=None, db=None):
    c = conn(node, autocommit=False, db=db)
    rnd = random.Random(hash((node, threading.get_ident())))
    me = f"{node}-{threading.get_ident()}"
    while not stop.is_set():
        k = rnd.choice(keys)
        delegated = only_local is None or rnd.random() < 0.5
        form = ("SELECT claimed FROM idem_claim(%s, %s)" if delegated
                else "SELECT (idem_claim(%s, %s)).claimed")
        try:
            claimed = one(c, form, k, bt)[0]
            if claimed:
                q(c, "INSERT INTO stress_ledger (order_no, who) VALUES (%s, %s)", k, me)
                if rnd.random() < 0.2:
                    c.rollback()
                    stats["rolled_back"] += 1
                    continue
                q(c, "SELECT idem_complete(%s, %s, %s)", k, bt, json.dumps({"who": me}))
                c.commit()
                stats["acknowledged"] += 1
                stats.setdefault("acks", {})[k] = me
            else:
                c.commit()
                stats["duplicates"] += 1
        except psycopg.Error as e:
            c.rollback()
            stats["err_" + (e.sqlstate or "?")] += 1
            stats[("from_coord_" if node == "coord" else "from_worker_") + (e.sqlstate or "?")] += 1


COORD_CLIENTS = 3


def run_stress(seconds, bt, keys, extra=None, db=None):
    """Coordinator sessions and worker-direct sessions claiming a shared pool
    of keys at once (each worker session uses both forms on its local keys)
    in database db (DB by default), until `seconds` passed or extra()
    returned; returns stats."""
    stop = threading.Event()
    stats = Counter()
    with conn("coord", db=db) as c:
        local = {n: [k for k in keys if node_of_key(k, c) == n] for n in ("w1", "w2")}
    threads = [threading.Thread(daemon=True, target=stress_worker, args=("coord", keys, stop, stats, bt, None, db))
               for _ in range(COORD_CLIENTS)]
    threads += [threading.Thread(daemon=True, target=stress_worker, args=(n, local[n], stop, stats, bt, True, db)) for n in ("w1", "w2")]
    for t in threads:
        t.start()
    try:
        if extra:
            extra()
        else:
            time.sleep(seconds)  # the load's duration, not an ordering
    finally:
        stop.set()
    for t in threads:
        t.join(60)
    return stats


def check_invariants(bt, keys, stats, what, c=None):
    c = c or COORD
    dup = q(c, """SELECT key, count(*) FROM idem.claims WHERE biz_type = %s AND expires_at > now()
                  GROUP BY key HAVING count(*) > 1""", bt)
    ok(not dup, f"{what}: no key with two live rows across all shards ({len(dup)} found)")
    ledger = dict(q(c, "SELECT order_no, count(*) FROM stress_ledger WHERE order_no = ANY(%s) GROUP BY 1", keys))
    ok(all(n == 1 for n in ledger.values()), f"{what}: at most one business row per key ({sum(ledger.values())} rows, {len(ledger)} keys)")
    acks = stats.get("acks", {})
    replay = 0
    for k, who in acks.items():
        r = one(c, "SELECT claimed, state, result FROM idem_claim(%s, %s)", k, bt)
        replay += r == (False, "completed", {"who": who})
    ok(len(acks) > 0 and replay == len(acks), f"{what}: every acknowledged claim replays its own result ({replay}/{len(acks)})")
    ok(set(ledger) == set(acks), f"{what}: a business row exactly for each acknowledged claim")


def check_stress():
    bt = f"stress.{RUN}"
    q(COORD, "CREATE TABLE IF NOT EXISTS stress_ledger (order_no text NOT NULL, who text NOT NULL)")
    if not one(COORD, "SELECT idem.is_distributed('stress_ledger')")[0]:
        q(COORD, "SELECT create_distributed_table('stress_ledger', 'order_no', colocate_with => 'orders')")
    keys = [f"st-{RUN}-{i}" for i in range(2000)]
    t0 = time.monotonic()
    stats = run_stress(int(os.environ.get("CITUS_STRESS_SECONDS", "15")), bt, keys)
    dt = time.monotonic() - t0
    errs = {k: v for k, v in stats.items() if k.startswith("err_")}
    print(f"  stress: {dt:.0f} s, 3 coordinator + 2 worker-direct sessions, 2000 keys: "
          f"{stats['acknowledged']} acknowledged, {stats['duplicates']} duplicates, {stats['rolled_back']} rolled back, errors {errs}", flush=True)
    ok(not {k for k in errs if k != "err_40P01"}, f"stress: no error but deadlocks ({errs})")
    check_invariants(bt, keys, stats, "stress")
    summary["stress"] = dict(seconds=round(dt), acknowledged=stats["acknowledged"], duplicates=stats["duplicates"],
                             rolled_back=stats["rolled_back"], errors=errs)


# ---------------------------------------------------------------- maintenance under load
def pgbench(port, seconds, clients, script, extra=(), db=None):
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script)
    env = dict(os.environ, PGHOST=HOST, PGPORT=str(port), PGUSER="postgres")
    p = subprocess.Popen([f"{PG_BIN}/pgbench", "-n", "-M", "simple", "-c", str(clients), "-j", str(clients),
                          "-T", str(seconds), *extra, "-f", f.name, db or DB],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return p, f.name


def pgbench_result(p, path):
    out = p.communicate()[0]
    os.unlink(path)
    res = {"out": out}
    for line in out.splitlines():
        if line.startswith("number of transactions actually processed"):
            res["done"] = int(line.split(":")[1].split("/")[0])
        if line.startswith("number of failed transactions"):
            res["failed"] = int(line.split(":")[1].split()[0])
        if line.startswith("tps"):
            res["tps"] = float(line.split()[2])
    res["aborted"] = "aborted" in out or "ERROR" in out
    return res


def check_maintenance():
    """idem_maintain on the coordinator once a second while 2 pgbench clients
    claim through it (200 claims a second); widths of 2 s (and a 100 ms run). In MAINT_DB, where
    idem_distribute has run and maintenance has not."""
    m = conn("coord", db=MAINT_DB)
    width, ttl, secs = "2 seconds", "6 seconds", int(os.environ.get("CITUS_MAINT_SECONDS", "25"))
    bt = f"maint.{RUN}"
    q(m, "SELECT set_config('idem.partition_width', %s, false)", width)
    q(m, "SELECT idem_configure(%s, %s::interval)", bt, ttl)
    # claims made before the first run, with a TTL the coming ranges cover: in the default partition
    q(m, "SELECT set_config('idem.default_ttl', %s, false)", ttl)
    ttl_keys = [f"pre-{RUN}-{i}" for i in range(20)]
    for k in ttl_keys:
        q(m, "SELECT claimed FROM idem_claim(%s, %s, ttl => '5 seconds')", k, bt)
    in_default = one(m, "SELECT count(*) FROM idem.claims_default WHERE biz_type = %s", bt)[0]
    first = one(m, "SELECT idem_maintain()")[0]
    ok(in_default == 20 and first.get("rows_moved_from_default", 0) >= 20 and
       one(m, "SELECT count(*) FROM idem.claims_default WHERE biz_type = %s", bt)[0] == 0,
       f"claims waiting in the default partition are moved out, not a failure ({first.get('rows_moved_from_default')} moved)")
    # (Their TTL is 5 s: on a loaded machine some expire before the lookup,
    # and an expired claim answers nothing. Each answers completed, or its
    # row is there and has expired by the time it is read, after the lookup.)
    def answers(k):
        return (one(m, "SELECT state FROM idem_lookup(%s, %s)", k, bt)[0] == "completed"
                or one(m, "SELECT count(*) FROM idem.claims WHERE key = %s AND biz_type = %s AND expires_at <= now()", k, bt)[0] == 1)
    live = sum(one(m, "SELECT state FROM idem_lookup(%s, %s)", k, bt)[0] == "completed" for k in ttl_keys)
    ok(all(answers(k) for k in ttl_keys),
       f"the moved claims still answer until they expire ({live} of 20 answered completed when counted after)")
    # (At 200 claims a second, not flat out: what is tested is claims and
    # partitions made and dropped under them at once; check_maintenance_busy
    # below runs its clients flat out.)
    p, path = pgbench(PORTS["coord"], secs, 2,
                      f"\\set n random(1, 2000000000)\nSELECT claimed FROM idem_claim('m' || :n, '{bt}');\n",
                      ("--max-tries=1", "--failures-detailed", "--rate=200"), db=MAINT_DB)
    runs, errors, attempts, durations = Counter(), Counter(), [], []
    created = dropped = 0
    end = time.monotonic() + secs - 2
    while time.monotonic() < end:
        t0 = time.monotonic()
        try:
            r = one(m, "SELECT idem_maintain()")[0]
            runs["skipped" if r.get("skipped") else "ok"] += 1
            attempts.append(r.get("lock_attempts", 0))
            created += len(r.get("partitions_created", []))
            dropped += len(r.get("partitions_dropped", []))
        except psycopg.Error as e:
            runs["error"] += 1
            errors[(e.sqlstate, str(e).splitlines()[0][:100])] += 1
        durations.append(time.monotonic() - t0)
        time.sleep(1.0)  # pacing: one run a second
    b = pgbench_result(p, path)
    total = sum(runs.values())
    print(f"  maintenance under load ({secs} s, width {width}, TTL {ttl}): runs {dict(runs)}, "
          f"lock attempts max {max(attempts or [0])}, run time max {max(durations):.2f} s, "
          f"{created} partitions created, {dropped} dropped; claims: {b.get('done')} at {b.get('tps', 0):.0f} TPS, "
          f"{b.get('failed')} failed", flush=True)
    for (state, msg), n in errors.items():
        print(f"    {n} x {state}: {msg}")
    ok(runs["error"] == 0 and runs["ok"] > 0, f"maintenance under load: {runs['error']} of {total} runs failed")
    ok(b.get("failed") == 0 and not b["aborted"] and b.get("done", 0) > 0,
       f"claims under maintenance: {b.get('failed')} failed, none aborted")
    ok(created > 0 and dropped > 0, f"partitions rotated under load ({created} created, {dropped} dropped)")
    names = [r[0] for r in q(m, "SELECT partition FROM idem_partitions WHERE NOT is_default")]
    ok(names and all(re.fullmatch(r"claims_c[0-9]+_[0-9]{8}_[0-9]{6}_[0-9]{3}", n) for n in names),
       "partitions are named by TTL class and start, to the millisecond")
    idx = q(m, """SELECT result FROM run_command_on_workers($$
                    SELECT count(*) FILTER (WHERE NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = h.inhrelid))
                      FROM pg_inherits h$$)""")
    ok(all(r[0] == "0" for r in idx), f"every partition shard on the workers has its key index ({[r[0] for r in idx]} without)")
    ri = q(m, """SELECT result FROM run_command_on_workers($$
                   SELECT count(*) FROM pg_class c WHERE c.relreplident <> 'f'
                      AND c.oid IN (SELECT inhrelid FROM pg_inherits UNION SELECT inhparent FROM pg_inherits)$$)""")
    ok(all(r[0] == "0" for r in ri), f"idem.claims' shards and every partition shard have REPLICA IDENTITY FULL ({[r[0] for r in ri]} without)")
    rows = one(m, "SELECT sum(estimated_rows), sum(bytes) FROM idem_partitions")
    ok(rows[1] > 100000, f"idem_partitions on the coordinator sums the workers' shards ({rows[1]} bytes)")
    # 100 ms: the single-node minimum, names to the millisecond
    q(m, "SELECT set_config('idem.partition_width', '100 milliseconds', false), set_config('idem.premake_limit', '4', false), "
         "set_config('idem.default_ttl', '30 seconds', false)")
    q(m, "SELECT idem_configure(%s, NULL)", bt)
    r = one(m, "SELECT idem_maintain()")[0]
    made = r.get("partitions_created", [])
    ok(len(made) == 4 and len(set(made)) == 4, f"width 100 ms, premake_limit 4: 4 partitions, distinct ms names ({made})")
    q(m, "SELECT set_config('idem.partition_width', '1 day', false), set_config('idem.premake_limit', '32', false)")
    summary["maintenance"] = dict(seconds=secs, width=width, ttl=ttl, runs=dict(runs), max_lock_attempts=max(attempts or [0]),
                                  max_run_s=round(max(durations), 2), created=created, dropped=dropped,
                                  claims=b.get("done"), claim_tps=round(b.get("tps", 0)), claims_failed=b.get("failed"))


def check_maintenance_busy():
    """Maintenance through the coordinator while 4 clients claim in
    multi-statement transactions (claim, then a business row on the same
    worker), with about 20 partitions to create at first (the 60 s TTL's
    class at idem.partition_width = 1 second: 11 s partitions, 16 of them
    ahead), one run a second: the runs get the lock on every node (a
    lock that waits idem.maintenance_lock_timeout at a time: NOWAIT found
    some worker's idem.claims locked at every attempt). Then the skips are
    made certain (a transaction left open on a worker holds idem.claims
    there): idem_health's maintenance_lock check counts them and warns at
    3 in a row, and is ok again after the next run that got the lock."""
    m = conn("coord", db=MAINT_DB)
    bt = f"busy.{RUN}"
    secs = int(os.environ.get("CITUS_MAINT_SECONDS", "25"))
    q(m, "SELECT set_config('idem.partition_width', '1 second', false), set_config('idem.default_ttl', '60 seconds', false)")
    q(m, "SELECT idem_configure(%s, NULL)", bt)
    to_create = one(m, "SELECT count(*) FROM idem.coming_partitions(128, clock_timestamp())")[0]
    p, path = pgbench(PORTS["coord"], secs, 4,
                      f"\\set n random(1, 2000000000)\nBEGIN;\nSELECT claimed FROM idem_claim('busy' || :n, '{bt}');\n"
                      f"INSERT INTO m_orders (order_no) VALUES ('busy' || :n) ON CONFLICT DO NOTHING;\nEND;\n",
                      ("--max-tries=1", "--failures-detailed"), db=MAINT_DB)
    wait_until("pgbench claims", lambda: one(m, "SELECT count(*) > 0 FROM idem.claims WHERE biz_type = %s", bt)[0], timeout=60)
    runs, errors, attempts, durations, created = Counter(), Counter(), [], [], []
    end = time.monotonic() + secs - 3
    while time.monotonic() < end:
        t0 = time.monotonic()
        try:
            r = one(m, "SELECT idem_maintain()")[0]
            runs["skipped" if r.get("skipped") else "ok"] += 1
            attempts.append(r.get("lock_attempts", 0))
            created.append(len(r.get("partitions_created", [])))
        except psycopg.Error as e:
            runs["error"] += 1
            errors[(e.sqlstate, str(e).splitlines()[0][:100])] += 1
        durations.append(time.monotonic() - t0)
        time.sleep(1.0)  # pacing: one run a second
    b = pgbench_result(p, path)
    print(f"  maintenance under 4 clients in multi-statement transactions ({secs} s, 1 s partitions, 60 s TTL, "
          f"{to_create} partitions to create at first): runs {dict(runs)}, partitions created per run {created}, "
          f"lock attempts {attempts} (max {max(attempts or [0])}), run time max {max(durations or [0]):.2f} s; "
          f"claims: {b.get('done')} at {b.get('tps', 0):.0f} TPS, {b.get('failed')} failed", flush=True)
    for (state, msg), n in errors.items():
        print(f"    {n} x {state}: {msg}")
    ok(runs["error"] == 0 and created and created[0] >= to_create - 1 and to_create >= 15,
       f"the first run under load made the {to_create} partitions ({created[:1]}), no run failed")
    ok(runs["skipped"] == 0, f"no run skipped under 4 claiming clients ({runs['skipped']} of {sum(runs.values())})")
    ok(b.get("failed") == 0 and not b["aborted"] and b.get("done", 0) > 0, f"claims under maintenance: {b.get('failed')} failed, none aborted")
    summary["maintenance_busy"] = dict(seconds=secs, to_create=to_create, runs=dict(runs), created=created, lock_attempts=attempts,
                                       max_run_s=round(max(durations or [0]), 2), claims=b.get("done"), claim_tps=round(b.get("tps", 0)),
                                       claims_failed=b.get("failed"))
    # Certain skips: a claim left open in a transaction holds idem.claims on its worker.
    holder = conn("coord", autocommit=False, db=MAINT_DB)
    one(holder, "SELECT claimed FROM idem_claim(%s, %s)", f"hold-{RUN}", bt)
    q(m, "SELECT set_config('idem.maintenance_lock_retries', '2', false)")
    skipped = []
    for _ in range(3):
        wait_until("maintenance has partitions to make (1 s partitions)", lambda: one(
            m, "SELECT count(*) > 0 FROM idem.coming_partitions(128, clock_timestamp())")[0])
        skipped.append(bool(one(m, "SELECT idem_maintain()")[0].get("skipped")))
    health = one(m, "SELECT severity, value FROM idem_health WHERE check_name = 'maintenance_lock'")
    ok(skipped == [True] * 3 and health == ("warning", 3),
       f"runs skipped while a worker's transaction holds idem.claims: {skipped}; idem_health maintenance_lock: {health}")
    holder.rollback()
    holder.close()
    r = one(m, "SELECT idem_maintain()")[0]
    health = one(m, "SELECT severity, value FROM idem_health WHERE check_name = 'maintenance_lock'")
    ok(not r.get("skipped") and health == ("ok", 0), f"once the transaction ends, the next run gets the lock; idem_health: {health}")
    q(m, "SELECT set_config('idem.partition_width', '1 day', false)")
    m.close()


# ---------------------------------------------------------------- shard moves
def drain_cleanup():
    """Wait until Citus has dropped the orphaned copies earlier moves left
    (pg_dist_cleanup empty), asking it to clean up on each look: its drop of
    an old copy waits at most 1 s for queries still using it, then leaves the
    record for a later attempt."""
    def done():
        with conn("coord") as c:
            q(c, "CALL citus_cleanup_orphaned_resources()")
            return one(c, "SELECT count(*) = 0 FROM pg_dist_cleanup")[0]
    wait_until("Citus dropped the orphaned shards of earlier moves (pg_dist_cleanup empty)", done, timeout=180)


def move(shard, src, dst, mode="block_writes"):
    """Move shard's colocation group from src to dst, once the orphans of
    earlier moves are gone (a move onto a node that still holds an orphaned
    copy of the shard is refused)."""
    drain_cleanup()
    with conn("coord") as c:
        q(c, """SELECT citus_move_shard_placement(%s, '127.0.0.1', %s, '127.0.0.1', %s,
                                                  shard_transfer_mode => %s::citus.shard_transfer_mode)""",
          shard, PORTS[src], PORTS[dst], mode)


def blocked(node, pid):
    """pid, a backend of node, waits for a lock there or (through Citus) on another node."""
    with conn(node) as c:
        return one(c, """SELECT cardinality(pg_blocking_pids(%s)) > 0
                            OR EXISTS (SELECT 1 FROM citus_lock_waits
                                        WHERE waiting_gpid = citus_calculate_gpid(
                                              (SELECT nodeid FROM pg_dist_node WHERE nodeport = %s), %s))""",
                   pid, PORTS[node], pid)[0]


def check_move_race():
    """The race of docs/design.md §13: a claim waiting on a worker while its
    shard moves away. The claim holds the shard's metadata lock, so the move
    waits for it; the row moves with the shard; one live row."""
    bt = f"move.{RUN}"
    K = keys_on("w1", "mv")[0]
    S = shard_of_key(K)
    A = conn("w1", autocommit=False)
    ok(one(A, "SELECT claimed FROM idem_claim(%s, %s)", K, bt)[0], "A (w1 directly) claims K, not committed")
    B = conn("w1", autocommit=False)
    b_pid = one(B, "SELECT pg_backend_pid()")[0]
    B.commit()
    res = {}

    def run_b():
        try:
            res["b"] = one(B, "SELECT claimed, state FROM idem_claim(%s, %s)", K, bt)
        except psycopg.Error as e:
            res["b"] = e.sqlstate
            B.rollback()
    tb = threading.Thread(daemon=True, target=run_b)
    tb.start()
    wait_until("B waits for A on w1", lambda: blocked("w1", b_pid))
    M = conn("coord")
    m_pid = one(M, "SELECT pg_backend_pid()")[0]

    def run_m():
        try:
            q(M, """SELECT citus_move_shard_placement(%s, '127.0.0.1', %s, '127.0.0.1', %s,
                                                      shard_transfer_mode => 'block_writes')""", S, PORTS["w1"], PORTS["w2"])
            res["m"] = "done"
        except psycopg.Error as e:
            res["m"] = str(e)
    drain_cleanup()  # no orphan of an earlier move on w2 to refuse this one
    tm = threading.Thread(daemon=True, target=run_m)
    tm.start()
    wait_until("the move waits (or ends)", lambda: not tm.is_alive() or blocked("coord", m_pid))
    ok(tm.is_alive(), "the move waits for the claims that hold the shard's metadata lock")
    A.rollback()
    tb.join(30)
    ok(res.get("b") == (True, "new"), f"after A rolls back, B claims K on w1, the move still waiting: {res.get('b')}")
    ok(tm.is_alive(), "the move still waits, for B")
    B.commit()
    tm.join(120)
    ok(res.get("m") == "done" and node_of_key(K) == "w2", "after B commits, the move finishes: K's shard is on w2")
    ok(one(COORD, "SELECT claimed, state FROM idem_claim(%s, %s)", K, bt) == (False, "completed"),
       "C through the coordinator (now delegated to w2): (f, completed), B's claim moved with the shard")
    ok(live_rows(K, bt) == 1, "one live row of K")
    with conn("w1") as w:
        ok(sqlstate_of(lambda: q(w, "SELECT (idem_claim(%s, %s)).claimed", K, bt)) == "0A000",
           "on w1, which no longer holds the shard, a claim of K is refused")
    move(S, "w2", "w1")


def check_move_under_load():
    """Claims from the coordinator and from both workers on keys of two
    shards while the shards move back and forth; the invariants after."""
    bt = f"moveload.{RUN}"
    # A shard of w2: not the one move_race moved (back to w1), whose
    # orphaned copy on w2 Citus drops later; and drop the orphans now.
    drain_cleanup()
    k1 = keys_on("w2", "ml1", 1)[0]
    S = shard_of_key(k1)
    keys = [r[0] for r in q(COORD, """SELECT k FROM (SELECT %s || g AS k FROM generate_series(1, 40000) g) s
                                     WHERE get_shard_id_for_distribution_column('idem.claims', k) = %s LIMIT 300""",
                              f"ml-{RUN}-", S)] + [f"mlx-{RUN}-{i}" for i in range(300)]
    moves, move_deadlocks = [], Counter()

    def mover():
        # A move takes the shard's metadata lock on the coordinator, then on
        # the workers; a transaction whose delegated claim locked it on a
        # worker and that then writes through the coordinator takes them in
        # the other order. Citus's detector cancels one of the two (40P01):
        # a cancelled move is retried, as the rebalancer's jobs do. A move
        # back to a node whose orphaned copy of the shard Citus could not
        # drop yet (its drop waits 1 s for queries still using it) is
        # refused: clean up the orphans, as Citus's docs say, and retry.
        where = node_of_key(keys[0])
        for _ in range(4):
            dst = "w2" if where == "w1" else "w1"
            t0 = time.monotonic()
            for attempt in range(10):
                try:
                    move(S, where, dst)
                    break
                except psycopg.errors.DeadlockDetected:
                    move_deadlocks["move"] += 1
                except psycopg.Error as e:
                    if "orphaned shard" not in str(e) or attempt == 9:
                        raise
                    move_deadlocks["orphan"] += 1
            moves.append(round(time.monotonic() - t0, 2))
            where = dst
    stats = run_stress(0, bt, keys, extra=mover)
    errs = {k: v for k, v in stats.items() if k.startswith("err_")}
    print(f"  moves of shard {S} under load: {len(moves)} moves, each {moves} s (moves cancelled by a distributed deadlock "
          f"and retried: {move_deadlocks['move']}; refused for an orphaned copy not yet dropped and retried: "
          f"{move_deadlocks['orphan']}); {stats['acknowledged']} acknowledged, "
          f"{stats['duplicates']} duplicates, errors {errs}", flush=True)
    ok(len(moves) == 4 and node_of_key(keys[0]) == node_of_key(k1), "four moves finished under load")
    ok(not {k for k in errs if k not in ("err_40P01", "err_0A000")},
       f"under moves, errors are only refusals of a call whose shard had just left (0A000) or deadlocks: {errs}")
    # A delegated call from the coordinator that Citus sent to the old node
    # as a move committed gets 0A000 too, not only a worker-direct one:
    # counted apart (docs/scaling.md says both).
    from_coord = stats["from_coord_0A000"]
    print(f"  0A000 under moves: {from_coord} to coordinator clients, {stats['from_worker_0A000']} to worker-direct clients", flush=True)
    check_invariants(bt, keys, stats, "moves under load")
    summary["moves"] = dict(moves=moves, move_deadlocks=move_deadlocks["move"], orphan_retries=move_deadlocks["orphan"], acknowledged=stats["acknowledged"], errors=errs,
                           coordinator_0A000=from_coord, worker_0A000=stats["from_worker_0A000"])


# ---------------------------------------------------------------- replica identity after moves
RI_MISSING_ON_WORKERS = """SELECT nodeport, result FROM run_command_on_workers($$
    SELECT coalesce(string_agg(c.relname, ' ' ORDER BY c.relname), '') FROM pg_class c
     WHERE c.relnamespace = 'idem'::regnamespace AND c.relreplident <> 'f'
       AND c.oid IN (SELECT inhrelid FROM pg_inherits UNION SELECT inhparent FROM pg_inherits)$$) ORDER BY 1"""


def ri_missing(c):
    """Tables of idem.claims' family (shards and shells) on each worker without REPLICA IDENTITY FULL."""
    return {port: r.split() for port, r in q(c, RI_MISSING_ON_WORKERS)}


def check_replica_identity():
    """A shard move (block_writes, or logical: 'auto') recreates the moved
    shard of the partitioned idem.claims with REPLICA IDENTITY DEFAULT on its
    new node (the partitions' shards keep FULL). idem_maintain finds it on
    the workers and sets it again, on every node; one logical move back
    (shard_transfer_mode 'auto') needs it, and claims still answer after."""
    bt = f"ri.{RUN}"
    # A logical move needs a replica identity on every table of the colocation group.
    q(COORD, "ALTER TABLE stress_ledger REPLICA IDENTITY FULL")
    k = keys_on("w1", "ri")[0]
    S = shard_of_key(k)
    q(COORD, "SELECT claimed FROM idem_claim(%s, %s)", k, bt)
    move(S, "w1", "w2")
    after_move = ri_missing(COORD)
    print(f"  after a block_writes move of shard {S} to w2, tables without REPLICA IDENTITY FULL: {after_move}", flush=True)
    r = one(COORD, "SELECT idem_maintain()")[0]
    ok(not r.get("skipped"), f"idem_maintain ran ({r})")
    # The move's source copy stays on w1 as an orphan until Citus drops it
    # (deferred, sooner or later by load): no placement, so not idem's to
    # fix, and not counted.
    drain_cleanup()
    ok(all(not v for v in ri_missing(COORD).values()),
       f"after idem_maintain every shard of idem.claims and its partitions on the workers has REPLICA IDENTITY FULL "
       f"(after the move: {after_move}; now: {ri_missing(COORD)}; report: {r.get('replica_identity_set')})")
    move(S, "w2", "w1", mode="auto")
    after_logical = ri_missing(COORD)
    q(COORD, "SELECT idem_maintain()")
    ok(all(not v for v in ri_missing(COORD).values()),
       f"after a logical move ('auto') back to w1 and idem_maintain: REPLICA IDENTITY FULL everywhere again (after the move: {after_logical})")
    ok(node_of_key(k) == "w1" and one(COORD, "SELECT claimed, state FROM idem_claim(%s, %s)", k, bt) == (False, "completed"),
       "the claim moved twice with its shard (the second time logically) still answers completed")


# ---------------------------------------------------------------- a worker killed under load
CLUSTER_SH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib", "cluster.sh")
UNKNOWN_OUTCOME = ("08006", "08003", "08000", "57P01", "XX000", None)


def cluster(*args, db=None):
    subprocess.run(["bash", CLUSTER_SH, "citus", *args], check=True, env=dict(os.environ, CITUS_DB=db or DB),
                   stdout=subprocess.DEVNULL)


def kill_client(keys, bt, stats, lock):
    """Pay each key once: BEGIN; claim; business row; complete; COMMIT. An
    error whose outcome the client cannot know (the connection broke, or
    Citus could not confirm the commit) and every other error are retried
    with the same key, in a new connection when the old one is gone, until
    the key answers claimed or replayed."""
    c = None
    for k in keys:
        tries = 0
        while True:
            tries += 1
            at_commit = False
            try:
                if c is None or c.closed:
                    c = conn("coord", autocommit=False)
                claimed = one(c, "SELECT claimed FROM idem_claim(%s, %s)", k, bt)[0]
                if claimed:
                    q(c, "INSERT INTO stress_ledger (order_no, who) VALUES (%s, 'kill')", k)
                    q(c, "SELECT idem_complete(%s, %s, '{\"paid\": true}')", k, bt)
                at_commit = True
                c.commit()
                with lock:
                    stats["claimed" if claimed else "replayed"] += 1
                    if not claimed:
                        stats.setdefault("replayed_keys", set()).add(k)
                break
            except psycopg.Error as e:
                state = e.sqlstate
                msg = str(e).splitlines()[0] if str(e) else ""
                with lock:
                    kind = state or "no SQLSTATE (connection lost)"
                    if state == "XX000" and "could not commit transaction" in msg:
                        kind = "XX000 could not commit transaction"
                    stats["err " + kind] += 1
                    if state in UNKNOWN_OUTCOME:
                        stats.setdefault("unknown_keys", set()).add(k)
                    if at_commit:
                        stats.setdefault("commit_failed_keys", set()).add(k)
                try:
                    c.rollback()
                except psycopg.Error:
                    c.close()
                time.sleep(0.05)  # pacing of the retries while the worker is down, not an ordering
        with lock:
            stats["done"] += 1


def check_worker_kill():
    """A worker crashes (immediate stop) while 4 clients pay through the
    coordinator; it is started again; every transaction whose outcome the
    client could not know is retried with the same key. Each key ends with
    exactly one business row and a completed claim: a retry of a transaction
    that had committed replays it instead of paying twice."""
    bt = f"kill.{RUN}"
    q(COORD, "CREATE TABLE IF NOT EXISTS stress_ledger (order_no text NOT NULL, who text NOT NULL)")
    if not one(COORD, "SELECT idem.is_distributed('stress_ledger')")[0]:
        q(COORD, "SELECT create_distributed_table('stress_ledger', 'order_no', colocate_with => 'orders')")
    keys = [f"kill-{RUN}-{i}" for i in range(1600)]
    stats, lock = Counter(), threading.Lock()
    threads = [threading.Thread(daemon=True, target=kill_client, args=(keys[i::4], bt, stats, lock)) for i in range(4)]
    for t in threads:
        t.start()
    wait_until("clients paid 200 keys", lambda: stats["done"] >= 200, timeout=300)
    cluster("crash", "w2")
    errors_at_crash = sum(v for k, v in stats.items() if k.startswith("err "))
    wait_until("clients met the crash", lambda: sum(v for k, v in stats.items() if k.startswith("err ")) > errors_at_crash + 8,
               timeout=120)
    cluster("start")
    for t in threads:
        t.join(600)
    ok(not any(t.is_alive() for t in threads), "every client paid all its keys after the worker came back")
    errs = {k[4:]: v for k, v in stats.items() if k.startswith("err ")}
    unknown = stats.get("unknown_keys", set())
    replayed_after_unknown = len(unknown & stats.get("replayed_keys", set()))
    commit_failed = stats.get("commit_failed_keys", set())
    committed_anyway = len(commit_failed & stats.get("replayed_keys", set()))
    ledger = dict(q(COORD, "SELECT order_no, count(*) FROM stress_ledger WHERE order_no = ANY(%s) GROUP BY 1", keys))
    double = sum(1 for n in ledger.values() if n > 1)
    # (state 'c': completed, sql/storage.sql)
    states = dict(q(COORD, "SELECT CASE state WHEN 'c' THEN 'completed' ELSE state::text END, count(*) FROM idem.claims "
                           "WHERE biz_type = %s AND key = ANY(%s) GROUP BY 1", bt, keys))
    print(f"  worker w2 crashed under 4 paying clients, 1600 keys: {stats['claimed']} claimed, {stats['replayed']} replayed; "
          f"errors {errs}; {len(unknown)} keys retried after an unknown outcome, {replayed_after_unknown} of them "
          f"replayed (an attempt had committed); {len(commit_failed)} keys whose COMMIT failed, {committed_anyway} of them "
          f"had committed; business rows {sum(ledger.values())} for {len(ledger)} keys, "
          f"{double} keys paid twice; claims {states}", flush=True)
    ok(len(unknown) > 0, f"the crash gave clients unknown outcomes ({errs})")
    ok(double == 0 and len(ledger) == len(keys), f"0 double applies: one business row for each of the {len(keys)} keys ({double} twice, {len(keys) - len(ledger)} none)")
    ok(states == {"completed": len(keys)}, f"every claim completed ({states})")
    summary["worker_kill"] = dict(keys=len(keys), claimed=stats["claimed"], replayed=stats["replayed"], errors=errs,
                                  unknown_outcome_keys=len(unknown), replayed_after_unknown=replayed_after_unknown,
                                  commit_failed=len(commit_failed), committed_anyway=committed_anyway,
                                  double_applies=double)


# ---------------------------------------------------------------- uninstall and reinstall
UNINSTALL_DB = os.environ.get("CITUS_UNINSTALL_DB", "idem_u")


def check_uninstall():
    """In a fresh database: idem distributed, claimed, maintained; then a
    plain DROP EXTENSION idem on the coordinator removes it from every node;
    CREATE EXTENSION, idem_distribute and claims work again."""
    cluster("reset", db=UNINSTALL_DB)
    u = conn("coord", db=UNINSTALL_DB)
    q(u, "CREATE EXTENSION idem")
    q(u, "CREATE TABLE u_orders (order_no text PRIMARY KEY)")
    q(u, "SELECT create_distributed_table('u_orders', 'order_no')")
    q(u, "SELECT idem_distribute('u_orders')")
    ok(one(u, "SELECT claimed FROM idem_claim('u-1', 'u')")[0], "claim in the fresh database")
    q(u, "SELECT idem_maintain()")
    state = sqlstate_of(lambda: q(u, "DROP EXTENSION idem"))
    left = q(u, "SELECT nodeport, result FROM run_command_on_all_nodes($$SELECT count(*) FROM pg_extension WHERE extname = 'idem'$$) JOIN pg_dist_node USING (nodeid) ORDER BY 1")
    ok(state is None and all(r[1] == "0" for r in left), f"plain DROP EXTENSION idem after idem_distribute: {state or 'ok'}, idem left on nodes {left}")
    rest = q(u, """SELECT nodeport, result FROM run_command_on_all_nodes($$SELECT count(*) FROM pg_namespace WHERE nspname = 'idem'$$)
                   JOIN pg_dist_node USING (nodeid) ORDER BY 1""")
    ok(all(r[1] == "0" for r in rest) and one(u, "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::text LIKE 'idem.%%'")[0] == 0,
       f"no schema idem on any node, no Citus metadata left ({rest})")
    q(u, "CREATE EXTENSION idem")
    q(u, "SELECT idem_distribute('u_orders')")
    ok(one(u, "SELECT claimed FROM idem_claim('u-1', 'u')")[0] and
       one(u, "SELECT claimed, state FROM idem_claim('u-1', 'u')") == (False, "completed"),
       "reinstalled and distributed again: a claim, then its duplicate replays")
    r = one(u, "SELECT idem_maintain()")[0]
    ok(not r.get("skipped") and len(r.get("partitions_created", [])) > 0, f"maintenance after the reinstall ({len(r.get('partitions_created', []))} partitions)")
    ok(sqlstate_of(lambda: q(u, "DROP EXTENSION idem")) is None, "and a second DROP EXTENSION idem, with maintenance's partitions, works too")
    u.close()


# ---------------------------------------------------------------- the update racing a claim
RACE_DB = os.environ.get("CITUS_RACE_DB", "idem_race")


def race_db_at_0_3_0():
    """RACE_DB anew with idem 0.3.0 (tests/upgrade's frozen script)
    distributed next to orders, and a business table stress_ledger beside
    it; returns a coordinator session there."""
    cluster("reset", db=RACE_DB)
    extdir = os.path.join(subprocess.run([os.environ.get("PG_CONFIG", "pg_config"), "--sharedir"], check=True,
                                         capture_output=True, text=True).stdout.strip(), "extension")
    frozen = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "upgrade", "idem--0.3.0.sql")
    with open(frozen) as f, open(os.path.join(extdir, "idem--0.3.0.sql"), "w") as g:
        g.write(f.read())
    # (The update these checks run is this checkout's, not one another
    # checkout's build left in the shared Citus tree.)
    script = "idem--0.3.0--0.4.0.sql"
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "sql", script)) as f, \
         open(os.path.join(extdir, script)) as g:
        ok(f.read() == g.read(), f"the installed {script} is this checkout's")
    c = conn("coord", db=RACE_DB)
    for sql in ("CREATE EXTENSION idem VERSION '0.3.0'",
                "CREATE TABLE orders (order_no text PRIMARY KEY)",
                "SELECT create_distributed_table('orders', 'order_no')",
                "CREATE TABLE stress_ledger (order_no text NOT NULL, who text NOT NULL)",
                "SELECT create_distributed_table('stress_ledger', 'order_no', colocate_with => 'orders')",
                "SELECT idem_distribute('orders')"):
        q(c, sql)
    current = versions(c)
    ok(current == ["0.3.0"] * 3, f"idem 0.3.0 on every node, distributed ({current})")
    return c


def versions(c):
    """idem's version on each node (coordinator first)."""
    return [r[0] for r in q(c, """SELECT result FROM run_command_on_all_nodes(
                                      $$SELECT extversion FROM pg_extension WHERE extname = 'idem'$$) ORDER BY nodeid""")]


def check_update_race():
    """ALTER EXTENSION idem UPDATE from 0.3.0 rebuilds idem.claims (new
    shards; the old ones are dropped) while claims go on directly on a
    worker. A claim reads its type's settings from the worker's shard of
    the reference table idem.biz_types, then locks idem.claims; the update
    must take them in that order there too, not only the shells Citus's
    LOCK TABLE reaches (it once locked the shells of both, then altered the
    shard of biz_types: a claim holding that shard and queued for
    idem.claims deadlocked with it, 40P01). H's open transaction has claimed
    on worker 1, so the update waits there for H; C's claim, made then, is
    found waiting for the update (pg_locks, pg_blocking_pids). When H
    commits, both go on with the default deadlock_timeout: the update
    succeeds on every node, C's claim is answered after it (claimed, and
    completed with its result in the new idem.claims); no 40P01, no XX000.
    Retries replay the stored result: one business row per key."""
    c = race_db_at_0_3_0()
    keys = []
    for i in range(5000):
        k = f"race-{RUN}-{i}"
        if one(c, """SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
                      WHERE p.shardid = get_shard_id_for_distribution_column('idem.claims', %s::text)""", k)[0] == PORTS["w1"]:
            keys.append(k)
            if len(keys) == 2:
                break
    hk, ck = keys

    def pay(s, k, who):
        claimed = one(s, "SELECT claimed FROM idem_claim(%s, 'race')", k)[0]
        if claimed:
            q(s, "INSERT INTO stress_ledger (order_no, who) VALUES (%s, %s)", k, who)
            q(s, "SELECT idem_complete(%s, 'race', '{\"paid\": true}')", k)
        return claimed
    H = conn("w1", autocommit=False, db=RACE_DB)
    ok(pay(H, hk, "H"), "H claims on worker 1 and pays, not committed")
    h_pid = one(H, "SELECT pg_backend_pid()")[0]
    U = conn("coord", db=RACE_DB)
    C = conn("w1", autocommit=False, db=RACE_DB)
    c_pid = one(C, "SELECT pg_backend_pid()")[0]
    C.commit()
    res = {}

    def run(name, fn):
        try:
            res[name] = fn()
        except psycopg.Error as e:
            res[name] = e.sqlstate
    tu = threading.Thread(daemon=True, target=run, args=("u", lambda: q(U, "ALTER EXTENSION idem UPDATE") or "updated"))
    tu.start()
    w1 = conn("w1", db=RACE_DB)
    # Who waits on worker 1 for an idem table, and for whom: (pid, relation,
    # mode, blocking pids).
    waiting = lambda: q(w1, """SELECT l.pid, l.relation::regclass::text, l.mode, pg_blocking_pids(l.pid)
                                FROM pg_locks l WHERE NOT l.granted AND l.locktype = 'relation'
                                 AND l.relation::regclass::text LIKE 'idem.%%'""")

    def wait_for(what, thread, match):
        found = []
        wait_until(what, lambda: not thread.is_alive() or bool(found.extend(w for w in waiting() if match(w)) or found))
        return found
    biz_shard = one(c, "SELECT shard_name('idem.biz_types', shardid) FROM pg_dist_shard WHERE logicalrelid = 'idem.biz_types'::regclass")[0]
    # (the update reaches worker 1 as a session of Citus's: found by its wait)
    claims_locks = lambda pid: one(w1, """SELECT count(*) FROM pg_locks WHERE pid = %s AND locktype = 'relation'
                                           AND relation::regclass::text LIKE 'idem.claims%%'""", pid)[0]
    u_wait = wait_for("the update waits on worker 1 for H", tu, lambda w: h_pid in w[3])
    u_pid = u_wait[0][0] if u_wait else None
    u_claims = claims_locks(u_pid)
    ok(tu.is_alive() and [w[1:3] for w in u_wait] == [(biz_shard, "AccessExclusiveLock")] and u_claims == 0,
       f"the update waits on worker 1 for H, to alter the shard of idem.biz_types, before it locks idem.claims "
       f"({u_wait}; {u_claims} locks on idem.claims*)")
    tc = threading.Thread(daemon=True, target=run, args=("c", lambda: pay(C, ck, "C")))
    tc.start()
    c_wait = wait_for("C's claim waits on worker 1", tc, lambda w: w[0] == c_pid)
    c_claims = claims_locks(c_pid)
    ok(tc.is_alive() and [(w[1], u_pid in w[3]) for w in c_wait] == [(biz_shard, True)] and c_claims == 0,
       f"C's claim queues behind the update for the shard of idem.biz_types, holding nothing of idem.claims ({c_wait}; {c_claims} locks on idem.claims*)")
    H.commit()
    tu.join(300)
    tc.join(300)
    ok(res.get("u") == "updated", f"the update goes on after H, without a deadlock ({res.get('u')})")
    ok(res.get("c") is True, f"C's claim goes on after the update: claimed ({res.get('c')})")
    if res.get("c") is True:
        C.commit()
    else:
        C.rollback()
    current = versions(c)
    ok(len(set(current)) == 1 and current[0] != "0.3.0", f"every node on the new version ({current})")
    # C's claim, made before the update and answered after it, is a claim of
    # the new table: its row there with its TTL class, completed with C's
    # result.
    row = q(c, "SELECT state, result, ttl_class = idem.ttl_class(expires_at - claimed_at) FROM idem.claims WHERE key = %s", ck)
    ok(row == [("c", {"paid": True}, True)], f"C's claim stands in the new idem.claims: completed, its result, its TTL class ({row})")
    for k in (hk, ck):
        got = one(c, "SELECT claimed, state, result FROM idem_claim(%s, 'race')", k)
        ok(got == (False, "completed", {"paid": True}), f"{k} retried through the coordinator after the update: replayed ({got})")
    rows = dict(q(c, "SELECT order_no, count(*) FROM stress_ledger GROUP BY 1"))
    ok(rows == {hk: 1, ck: 1}, f"one business row per key ({rows})")
    for s in (H, U, C, w1, c):
        s.close()


def check_update_load():
    """The update from 0.3.0 under load: three coordinator sessions and a
    worker-direct session on each worker (run_stress, both call forms)
    claim, write a business row and complete, from before ALTER EXTENSION
    idem UPDATE until after it. Every claim waits for the update or the
    update for it, on every node, in the claims' lock order: no session gets
    40P01 (nor any other error), the update succeeds on every node, and the
    invariants hold across the rebuilt idem.claims (one business row per
    acknowledged claim, each replaying its own result). (With the update's
    first lock reaching only the workers' shells of idem.biz_types and
    idem.claims, such runs had sessions, and often the update, end with
    40P01.)"""
    c = race_db_at_0_3_0()
    bt = f"upload.{RUN}"
    keys = [f"ul-{RUN}-{i}" for i in range(2000)]
    rows = lambda: one(c, "SELECT count(*) FROM stress_ledger")[0]
    res = {}

    def update():
        # The load is under way before the update and still after it: told
        # by the business rows committed, not by time.
        # (The timeouts only bound a stalled load.)
        wait_until("the load commits business rows", lambda: rows() >= 20, timeout=300)
        with conn("coord", db=RACE_DB) as u:
            res["u"] = sqlstate_of(lambda: q(u, "ALTER EXTENSION idem UPDATE")) or "updated"
        after = rows()
        wait_until("the load commits business rows after the update", lambda: rows() >= after + 20, timeout=300)
    stats = run_stress(0, bt, keys, extra=update, db=RACE_DB)
    errs = {k: v for k, v in stats.items() if k.startswith("err_")}
    print(f"  the update under load: {stats['acknowledged']} acknowledged, {stats['duplicates']} duplicates, "
          f"{stats['rolled_back']} rolled back, errors {errs}", flush=True)
    ok(res.get("u") == "updated", f"the update under load succeeds ({res.get('u')})")
    ok(not errs, f"no claim under the update gets an error, 40P01 or other ({errs})")
    current = versions(c)
    ok(len(set(current)) == 1 and current[0] != "0.3.0", f"every node on the new version ({current})")
    check_invariants(bt, keys, stats, "the update under load", c)
    summary["update_load"] = dict(acknowledged=stats["acknowledged"], duplicates=stats["duplicates"], errors=errs, update=res.get("u"))
    c.close()


CHECKS = {
    "semantics": check_semantics,
    "forms": check_forms,
    "ttl": check_ttl,
    "stress": check_stress,
    "maintenance": check_maintenance,
    "maintenance_busy": check_maintenance_busy,
    "move_race": check_move_race,
    "move_load": check_move_under_load,
    "replica_identity": check_replica_identity,
    "worker_kill": check_worker_kill,
    "uninstall": check_uninstall,
    "update_race": check_update_race,
    "update_load": check_update_load,
}

if __name__ == "__main__":
    COORD = conn("coord")
    names = sys.argv[1:] or list(CHECKS)
    for n in names:
        print(f"# {n}", flush=True)
        t0 = time.monotonic()
        try:
            CHECKS[n]()
        except Exception as e:  # a check that cannot go on fails, the next ones still run
            ok(False, f"{n}: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}")
        summary.setdefault("seconds", {})[n] = round(time.monotonic() - t0, 1)
    out = os.environ.get("CITUS_SUMMARY")
    if out:
        with open(out, "w") as f:
            json.dump(summary, f, indent=1, default=str)
    print(f"# {len(failures)} failed", flush=True)
    # Threads of a failed check may still wait on the server.
    os._exit(min(len(failures), 100))
