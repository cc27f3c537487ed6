"""Red-team interleavings of the portable edition's gate rows (real sessions).
usage: python interleave.py HOST PORT DB APP_ROLE OWNER_ROLE"""
import sys, threading, time, uuid
import psycopg
host, port, db, app, owner = sys.argv[1:6]
def conn(role=app, iso=None):
    c = psycopg.connect(host=host, port=port, dbname=db, user=role, autocommit=False)
    if iso: c.isolation_level = iso
    return c
def one(c, sql, *a):
    return c.execute(sql, a).fetchone()
def claim(c, k, **kw):
    extra = ''.join(f", {n} => %s" for n in kw)
    return one(c, f"select (r).claimed, (r).state from (select idem_claim(%s, 'rt'{extra}) r) s", k, *kw.values())
mon = psycopg.connect(host=host, port=port, dbname=db, user='postgres', autocommit=True)
def waiting(c):
    pid = c.info.backend_pid
    for _ in range(20000):
        r = mon.execute("select wait_event_type from pg_stat_activity where pid=%s", (pid,)).fetchone()
        if r and r[0] == 'Lock': return True
        time.sleep(0.001)
    return False
class Bg:
    def __init__(s, f): s.r = None; s.e = None; s.t = threading.Thread(target=s.run, args=(f,)); s.t.start()
    def run(s, f):
        try: s.r = f()
        except Exception as e: s.e = e
    def get(s): s.t.join(); return s.e if s.e else s.r
def live(k):
    return one(mon, "select count(*) from idem.claims where biz_type='rt' and key=%s", k)[0]
def report(name, ok, detail):
    print(("ok" if ok else "FAIL") + f": {name}: {detail}", flush=True)
def K(): return 'k' + uuid.uuid4().hex[:8]
oc = psycopg.connect(host=host, port=port, dbname=db, user=owner, autocommit=True)

# Q6: first claim in flight
k = K(); a = conn(); b = conn(); b.autocommit = True
claim(a, k)
r1 = claim(b, k, wait=False); r2 = one(b, "select (idem_lookup(%s,'rt')).state", k)
try: one(b, "select idem_complete(%s,'rt')", k); r3 = 'ok'
except psycopg.Error as e: r3 = e.sqlstate
a.commit(); report("Q6 wait=>false / lookup / complete during first claim", True, f"claim(wait=>false)={r1} lookup={r2} complete={r3}")

# Q1a savepoint: claim in savepoint, rollback to, other claims, first claims again
k = K(); a = conn(); b = conn()
a.execute("savepoint s"); claim(a, k); a.execute("rollback to s")
rb = claim(b, k)
bg = Bg(lambda: claim(a, k)); w = waiting(a)
b.commit(); ra = bg.get(); a.commit()
report("Q1 savepoint rolled back then both claim", live(k) == 1 and not (rb[0] and ra[0]), f"B={rb} A={ra} waited={w} live={live(k)}")

# Q1b claim, savepoint complete, rollback to; other session claims
k = K(); a = conn(); b = conn()
claim(a, k); a.execute("savepoint s"); one(a, "select idem_complete(%s,'rt')", k); a.execute("rollback to s")
bg = Bg(lambda: claim(b, k)); w = waiting(b); a.commit(); rb = bg.get(); b.commit()
report("Q1 claim; complete in rolled-back savepoint; other claims", w and live(k) == 1 and not rb[0], f"B={rb} waited={w} live={live(k)}")

# Q1c claim inside savepoint released, then rollback to an outer savepoint after another claim
k = K(); a = conn(); b = conn()
a.execute("savepoint s1"); claim(a, k); a.execute("release s1"); a.execute("savepoint s2"); one(a, "select idem_complete(%s,'rt')", k); a.execute("rollback to s2")
bg = Bg(lambda: claim(b, k)); w = waiting(b); a.commit(); rb = bg.get(); b.commit()
report("Q1 claim in released savepoint; other claims", w and live(k) == 1 and not rb[0], f"B={rb} waited={w} live={live(k)}")

for iso in ('REPEATABLE READ', 'SERIALIZABLE'):
    lvl = psycopg.IsolationLevel.REPEATABLE_READ if iso[0] == 'R' else psycopg.IsolationLevel.SERIALIZABLE
    # Q1d RR: snapshot before B's claim commits; maintain in between
    for sweep in (False, True):
        k = K(); a = conn(iso=lvl); b = conn()
        one(a, "select 1"); claim(b, k); b.commit()
        if sweep: one(oc, "select idem_maintain()")
        try: ra = claim(a, k)
        except psycopg.Error as e: ra = e.sqlstate
        a.rollback()
        report(f"Q1 {iso} claim after concurrent committed claim (maintain between: {sweep})", live(k) == 1 and ra == '40001', f"A={ra} live={live(k)}")
    # forget committed after snapshot
    k = K(); c = conn(); claim(c, k); c.commit()
    a = conn(iso=lvl); one(a, "select 1"); one(oc, "select idem_forget(%s,'rt')", k); one(oc, "select idem_maintain()")
    try: ra = claim(a, k)
    except psycopg.Error as e: ra = e.sqlstate
    a.rollback()
    report(f"Q1 {iso} claim after concurrent forget + maintain (snapshot still sees the row: answered from it, or 40001)", ra == "40001" or ra == (False, "completed"), f"A={ra} live={live(k)}")
    # wait=>false under RR against committed-after-snapshot
    k = K(); a = conn(iso=lvl); one(a, "select 1"); b = conn(); claim(b, k); b.commit()
    try: ra = claim(a, k, wait=False)
    except psycopg.Error as e: ra = e.sqlstate
    a.rollback()
    report(f"Q1 {iso} wait=>false after concurrent committed claim", ra == '40001' and live(k) == 1, f"A={ra} live={live(k)}")

# Q1 lease takeover race
k = K(); c = conn(); claim(c, k, lease='1 second'); c.commit(); time.sleep(1.2)
a = conn(); b = conn()
ra = claim(a, k); bg = Bg(lambda: claim(b, k)); w = waiting(b); a.commit(); rb = bg.get(); b.commit()
att = one(mon, "select result->>'attempt' from idem.claims where biz_type='rt' and key=%s", k)
report("Q1 lease takeover by two sessions", not (ra[0] and rb[0]) and live(k) == 1, f"A={ra} B={rb} waited={w} attempt={att}")

# Q1 forget vs claim
k = K(); c = conn(); claim(c, k); c.commit()
f = conn(owner); one(f, "select idem_forget(%s,'rt')", k)
a = conn(); b = conn()
ra = claim(a, k); rb = claim(b, k)   # the committed outcome, answered without the lock
f.commit(); a.commit(); b.commit()
rc = claim(conn(), k)
report("Q1 claims during a forget in flight see the committed claim; none claims", live(k) == 0 and not ra[0] and not rb[0], f"A={ra} B={rb} after forget: {rc}")

# Q2 prepared transaction holding a gate; maintain; other claims
k = K(); p = conn(); claim(p, k); p.execute("prepare transaction 'rt1'")
one(oc, "select idem_maintain()")
b = conn(); b.autocommit = True; rb = claim(b, k, wait=False)
mon.execute("commit prepared 'rt1'")
report("Q2 prepared transaction's gate survives maintain", rb[1] == 'in_progress' and live(k) == 1, f"B={rb} live={live(k)}")

# Q5 deadlock
k1, k2 = K(), K(); a = conn(); b = conn()
claim(a, k1); claim(b, k2)
bg = Bg(lambda: claim(a, k2)); waiting(a)
try: rb = claim(b, k1)
except psycopg.Error as e: rb = e.sqlstate
ra = bg.get(); ra = ra.sqlstate if isinstance(ra, psycopg.Error) else ra
a.rollback(); b.rollback()
report("Q5 two-key deadlock", '40P01' in (ra, rb), f"A={ra} B={rb}")
