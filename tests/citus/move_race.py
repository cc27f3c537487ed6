"""A shard move while a claim waits for its key lock (issue 14, item 1, the
placement check): deterministic steps, no sleeps as synchronization (the
script waits for states it can see in pg_locks / pg_stat_activity).

  A (worker w1, direct)  BEGIN; idem_claim(K)       -- claimed; holds K's key lock and (its INSERT)
                                                   Citus's shard metadata ShareLock on w1
  B (worker w1, direct)  BEGIN; [lock_shard_metadata(ShareLock, S);] idem_claim(K)  -- waits for A's key lock
  M (coordinator)        citus_move_shard_placement(S, w1 -> w2, block_writes) -- waits for A's metadata lock
  A ROLLBACK             -- B gets the key lock; M gets the metadata lock first (it queued first), so
                            B's INSERT waits for the move, then goes to w2
  C (coordinator)        BEGIN; SELECT claimed FROM idem_claim(K)   -- delegated to w2 after the move
  B COMMIT, C COMMIT; count live rows of K

Usage: python tests/citus/move_race.py [plain|metadata_lock]
"""
import sys, threading, time
import psycopg

HOST = sys.argv[2] if len(sys.argv) > 2 else "127.0.0.1"
PORTS = {"coord": 5530, "w1": 5531, "w2": 5532}
DB = "idem_citus"
variant = sys.argv[1] if len(sys.argv) > 1 else "plain"
BT = "iso.move"

def conn(node, autocommit=True):
    return psycopg.connect(host=HOST, port=PORTS[node], dbname=DB, user="postgres", autocommit=autocommit)

def q(c, sql, *args):
    cur = c.execute(sql, args)
    return cur.fetchall() if cur.description else None

CHECK = """SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_placement p
            WHERE p.shardid = (SELECT pg_catalog.get_shard_id_for_distribution_column('idem.claims', %s::text))
              AND p.groupid = (SELECT groupid FROM pg_catalog.pg_dist_local_group))"""

def wait_until(what, fn, timeout=60):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if fn():
            return
        time.sleep(0.01)  # polling an observable state, not a synchronization by time
    raise SystemExit(f"timed out waiting for: {what}; B={b_result}")

def blocked(node, pid):
    """pid (a backend of node) waits for a lock, there or on another node for it"""
    nodeid = q(obs[node], "SELECT nodeid FROM pg_dist_node WHERE nodeport = %s", PORTS[node])[0][0]
    return q(obs[node], """SELECT cardinality(pg_blocking_pids(%s)) > 0
        OR EXISTS (SELECT 1 FROM citus_lock_waits WHERE waiting_gpid = citus_calculate_gpid(%s, %s))""", pid, nodeid, pid)[0][0]

def log(*a):
    print(*a, flush=True)

b_result = {}
obs = {n: conn(n) for n in PORTS}
node_of = lambda s: q(obs["coord"], "SELECT nodeport FROM pg_dist_placement JOIN pg_dist_node USING (groupid) WHERE shardid = %s", s)[0][0]

# a fresh key whose shard is on w1
run = str(int(time.time() * 1000) % 10**8)
for i in range(1000):
    K = f"mv-{run}-{i}"
    S = q(obs["coord"], "SELECT get_shard_id_for_distribution_column('idem.claims', %s::text)", K)[0][0]
    if node_of(S) == PORTS["w1"]:
        break
log(f"variant {variant}: key {K}, shard {S} on port {node_of(S)}")
log("check on w1 / w2:", q(obs["w1"], CHECK, K)[0][0], q(obs["w2"], CHECK, K)[0][0])

A = conn("w1", autocommit=False)
log("A(w1) claim ->", q(A, "SELECT claimed, state FROM idem_claim(%s, %s)", K, BT)[0], "(uncommitted)")

B = conn("w1", autocommit=False)
b_pid = q(B, "SELECT pg_backend_pid()")[0][0]
B.commit()

def run_b():
    try:
        if variant == "metadata_lock":
            q(B, "SELECT lock_shard_metadata(5, ARRAY[%s::bigint])", S)
        b_result["check_at_start"] = q(B, CHECK, K)[0][0]
        b_result["claim"] = q(B, "SELECT claimed, state FROM idem_claim(%s, %s)", K, BT)[0]
    except Exception as e:
        b_result["error"] = f"{type(e).__name__}: {e}".strip()
        B.rollback()
tb = threading.Thread(target=run_b); tb.start()
wait_until("B waits for the key lock on w1", lambda: q(obs["w1"],
    "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted AND locktype = 'advisory' AND objsubid = 18756", b_pid)[0][0] == 1)
log("B(w1) waits for the key lock; check at its start:", b_result.get("check_at_start"))

M = conn("coord")
m_pid = q(M, "SELECT pg_backend_pid()")[0][0]
m_result = {}
def run_m():
    try:
        q(M, "SELECT citus_move_shard_placement(%s, '127.0.0.1', 5531, '127.0.0.1', 5532, shard_transfer_mode => 'block_writes')", S)
        m_result["done"] = True
    except Exception as e:
        m_result["error"] = str(e).strip()
tm = threading.Thread(target=run_m); tm.start()
def m_done_or_blocked():
    if not tm.is_alive():
        return True
    return blocked("coord", m_pid)
wait_until("the move finishes or waits", m_done_or_blocked)
moved = not tm.is_alive()
log("move:", "finished" if moved else "WAITS (blocked by a lock)", m_result)
log("shard now on port", node_of(S), "; check on w1 / w2:", q(obs["w1"], CHECK, K)[0][0], q(obs["w2"], CHECK, K)[0][0])

if not moved:
    A.rollback()
    log("A rolled back")
    # either the move goes first (B's INSERT then waits for it) or B does
    wait_until("the move or B finishes", lambda: not tm.is_alive() or not tb.is_alive())
    if not tm.is_alive():
        log("move finished first:", m_result, "; shard now on port", node_of(S))
        wait_until("B finishes or waits", lambda: not tb.is_alive() or blocked("w1", b_pid))
    moved = not tm.is_alive()
else:
    A.rollback()
    log("A rolled back")
if moved:
    tb.join(60)
    log("B:", b_result)
    C = conn("coord", autocommit=False)
    c_pid = q(C, "SELECT pg_backend_pid()")[0][0]; C.commit()
    c_result = {}
    def run_c():
        try:
            c_result["claim"] = q(C, "SELECT claimed, state FROM idem_claim(%s, %s)", K, BT)[0]
        except Exception as e:
            c_result["error"] = str(e).strip(); C.rollback()
    tc = threading.Thread(target=run_c); tc.start()
    wait_until("C finishes or waits", lambda: not tc.is_alive() or blocked("coord", c_pid))
    log("C(coord, delegated):", c_result if not tc.is_alive() else "WAITS")
    B.commit(); log("B committed")
    tc.join(60)
    if c_result.get("claim"):
        C.commit()
    log("C:", c_result)
else:
    tb.join(60)
    log("B:", b_result)
    B.commit(); log("B committed")
    tm.join(120)
    log("move:", m_result, "; shard now on port", node_of(S))
    C = conn("coord")
    log("C(coord, delegated):", q(C, "SELECT claimed, state FROM idem_claim(%s, %s)", K, BT)[0])
log("after: shard on port", node_of(S), "; check on w1 / w2:", q(obs["w1"], CHECK, K)[0][0], q(obs["w2"], CHECK, K)[0][0])
log("live rows of K:", q(obs["coord"], "SELECT count(*) FROM idem.claims WHERE biz_type = %s AND key = %s AND expires_at > now()", BT, K)[0][0])
try:
    log("lookup:", q(obs["coord"], "SELECT claimed, state FROM idem_lookup(%s, %s)", K, BT)[0])
except Exception as e:
    log("lookup: ERROR", str(e).strip().splitlines()[0])
# move it back, so that the next run finds the same layout
q(obs["coord"], "SELECT citus_move_shard_placement(%s, '127.0.0.1', 5532, '127.0.0.1', 5531, shard_transfer_mode => 'block_writes')", S)
