"""Traffic for the PL/Proxy deployment that tests/scenarios/scaling.sh plproxy starts.

Every call goes through the proxy database, as an application's would; the
checks read each shard directly. Exits non-zero, after printing every failed
check, when an invariant does not hold.

  1. retries: the same requests from 4 concurrent senders land on one shard
     each and are charged once;
  2. key scope: one request id used for orders on two shards (order-scoped
     key vs a "global" request-id key);
  3. a shard stopped with `pg_ctl stop -m immediate` under traffic: only its
     keys fail, the other shards keep working; after a restart the failed
     requests are retried with the same keys and charged exactly once;
  4. totals per shard: nothing acknowledged lost, nothing charged twice.
"""
import collections
import os
import re
import subprocess
import sys
import threading
import time
from decimal import Decimal

import psycopg

BASE = os.environ["BASE"]
PROXY_PORT = int(os.environ["PROXY_PORT"])
SHARD_PORTS = [int(p) for p in os.environ["SHARD_PORTS"].split()]
NSHARDS = len(SHARD_PORTS)
VICTIM = 1  # the shard stopped in phase 3

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        if len(failures) <= 20:
            print("FAIL:", what, flush=True)
        elif len(failures) == 21:
            print("FAIL: ... (further failures counted, not printed)", flush=True)
    return cond


def proxy():
    return psycopg.connect(host="127.0.0.1", port=PROXY_PORT, dbname="proxy",
                           user="postgres", autocommit=True)


def shard(i):
    return psycopg.connect(host="127.0.0.1", port=SHARD_PORTS[i], dbname=f"orders_{i}",
                           user="postgres", autocommit=True)


def cluster(command, node, *args):
    """The cluster library's command (tests/lib/cluster.sh) on one node."""
    subprocess.run(["bash", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib", "cluster.sh"),
                    command, f"{BASE}/{node}", *args], check=True, stdout=subprocess.DEVNULL)


def pay(conn, fn, order_no, amount, request_id):
    """(outcome, shard, result) from the proxy function fn."""
    return conn.execute(f"SELECT outcome, shard, result FROM {fn}(%s, %s, %s)",
                        (order_no, amount, request_id)).fetchone()


def error_text(e):
    """SQLSTATE and primary message, with the varying parts (function oid,
    ports, pids) kept: this is what the application sees."""
    return f"{e.sqlstate} {e.diag.message_primary}"


with proxy() as c:
    def shard_of(orders):
        rows = c.execute("SELECT o, shard_of(o) FROM unnest(%s::text[]) o", (orders,)).fetchall()
        return dict(rows)

    # expected[shard] = [rows, sum]: every payment that must exist at the end
    expected = [[0, Decimal(0)] for _ in range(NSHARDS)]

    def expect(order_no, amount):
        s = owner[order_no]
        expected[s][0] += 1
        expected[s][1] += amount

    # ---- 1. retries from concurrent senders -----------------------------
    orders = [f"A-{i:04d}" for i in range(240)]
    amount = {o: Decimal(i * 37 % 500 + 1) + Decimal("0.25") * (i % 4) for i, o in enumerate(orders)}
    owner = shard_of(orders)
    seen = collections.defaultdict(list)  # order -> [(outcome, shard, result)]
    lock = threading.Lock()
    barrier = threading.Barrier(4)

    def sender(seq):
        with proxy() as pc:
            barrier.wait()
            for o in seq:
                try:
                    r = pay(pc, "pay", o, amount[o], "req-" + o)
                except psycopg.Error as e:
                    r = ("error", error_text(e).splitlines()[0], None)
                with lock:
                    seen[o].append(r)

    # two senders in the same order race on every key; two go the other way
    seqs = [orders, orders, orders[::-1], orders[::-1]]
    t0 = time.monotonic()
    threads = [threading.Thread(target=sender, args=(s,)) for s in seqs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - t0
    claimed = sum(1 for o in orders for r in seen[o] if r[0] == "claimed")
    errored = [r[1] for o in orders for r in seen[o] if r[0] == "error"]
    replayed = sum(1 for o in orders for r in seen[o] if r[0] == "replayed")
    misrouted = [o for o in orders for r in seen[o] if r[0] != "error" and r[1] != f"orders_{owner[o]}"]
    per_shard = collections.Counter(owner[o] for o in orders)
    print(f"1. retries: {len(orders)} requests x 4 concurrent senders = {4 * len(orders)} calls "
          f"in {took:.2f} s: claimed {claimed}, replayed {replayed}, errors {len(errored)}; "
          f"orders per shard {[per_shard[i] for i in range(NSHARDS)]}; misrouted {len(misrouted)}")
    for t, n in collections.Counter(re.sub(r"\d+", "N", t) for t in errored).most_common():
        print(f"   {n:4d} x ERROR {t}")
    for o in orders:
        rs = seen[o]
        check(len(rs) == 4, f"{o}: {len(rs)} answers, expected 4")
        check(all(r[0] != "error" for r in rs), f"{o}: a retry failed: {[r[1] for r in rs if r[0] == 'error']}")
        rs = [r for r in rs if r[0] != "error"]
        check(sum(r[0] == "claimed" for r in rs) == 1, f"{o}: claimed {sum(r[0] == 'claimed' for r in rs)} times")
        check(len({str(r[2]) for r in rs}) == 1, f"{o}: answers differ: {rs}")
        check(all(r[1] == f"orders_{owner[o]}" for r in rs), f"{o}: ran on {[r[1] for r in rs]}, owner orders_{owner[o]}")
        expect(o, amount[o])
    check(min(per_shard.values()) > 0, "every shard owns some of the orders")

    # A retry that arrives while the first call is still running on the shard
    # (here: held open in a transaction on the shard itself) waits for it and
    # gets its answer; it must not be charged again.
    o = "H-0001"
    owner.update(shard_of([o]))
    amount[o] = Decimal(5)
    holder = shard(owner[o])
    holder.autocommit = False
    first = pay(holder, "pay", o, amount[o], "req-" + o)
    late = {}
    def late_retry():
        try:
            with proxy() as pc:
                late["r"] = pay(pc, "pay", o, amount[o], "req-" + o)
        except psycopg.Error as e:
            late["error"] = error_text(e).splitlines()[0]
    t = threading.Thread(target=late_retry)
    t.start()
    waited = False
    for _ in range(100):
        with shard(owner[o]) as sc:
            if sc.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                          "AND query LIKE '%pay(%'").fetchone()[0] > 0:
                waited = True
                break
        time.sleep(0.02)
    holder.commit()
    holder.close()
    t.join(10)
    r = late.get("r")
    expect(o, amount[o])
    print(f"   a retry while the first call was still open on orders_{owner[o]}: waited {waited}, "
          f"then {r[0] if r else 'ERROR ' + late.get('error', '(no answer)')} (first: {first[0]}, same answer: {bool(r) and r[2] == first[2]})")
    check(waited and r is not None and r[0] == "replayed" and r[2] == first[2],
          f"retry during an open first call: waited {waited}, got {r}, first {first}")

    # ---- 2. key scope ----------------------------------------------------
    cand = [f"S-{i}" for i in range(200)]
    owner.update(shard_of(cand))
    on0 = [o for o in cand if owner[o] == 0]
    on1 = [o for o in cand if owner[o] == 1]
    x, z, y = on0[0], on0[1], on1[0]   # x and z share shard 0; y is on shard 1
    amts = {x: Decimal(10), y: Decimal(20), z: Decimal(30)}
    print(f"2. key scope: request id reused for orders {x} (orders_0), {y} (orders_1), {z} (orders_0)")
    for o in (x, y, z):
        r = pay(c, "pay", o, amts[o], "R-shared")
        print(f"   pay({o}, {amts[o]}, 'R-shared')            -> {r[0]} on {r[1]}")
        check(r[0] == "claimed", f"order-scoped key {o}/R-shared: {r[0]}, expected claimed")
        expect(o, amts[o])
    answers = {}
    for o in (x, y, z, x):
        try:
            r = pay(c, "pay_by_request", o, amts[o], "G-shared")
            answers.setdefault(o, []).append(r[0])
            print(f"   pay_by_request({o}, {amts[o]}, 'G-shared') -> {r[0]} on {r[1]}")
        except psycopg.Error as e:
            answers.setdefault(o, []).append(e.sqlstate)
            print(f"   pay_by_request({o}, {amts[o]}, 'G-shared') -> ERROR {error_text(e)}")
    check(answers[x] == ["claimed", "replayed"], f"G-shared on {x}: {answers[x]}")
    check(answers[y] == ["claimed"], f"G-shared on {y} (other shard): {answers[y]}, expected claimed (not detected)")
    check(answers[z] == ["ID001"], f"G-shared on {z} (same shard): {answers[z]}, expected ID001")
    expect(x, amts[x])
    expect(y, amts[y])
    g = []
    for i in range(NSHARDS):
        with shard(i) as sc:
            g.append(sc.execute("SELECT count(*) FROM idem.claims WHERE key = 'G-shared'").fetchone()[0])
    print(f"   live claims of key 'G-shared' per shard: {g}: two payments under one 'global' request id; "
          "per-shard claims do not enforce uniqueness across shards")
    check(g == [1, 1, 0], f"claims of G-shared per shard {g}, expected [1, 1, 0]")

    # ---- 3. answer lost: committed on the shard, never read by the client --
    # The client sends the call and hangs up without reading the answer: the
    # proxy runs it to the end (PostgreSQL notices a vanished client only when
    # it writes to it), the shard commits. The client's retry must be answered
    # from the claim, not charged again.
    lost = [f"L-{i:03d}" for i in range(30)]
    owner.update(shard_of(lost))
    for o in lost:
        amount[o] = Decimal(7)
        pg = psycopg.pq.PGconn.connect(f"host=127.0.0.1 port={PROXY_PORT} dbname=proxy user=postgres".encode())
        check(pg.status == psycopg.pq.ConnStatus.OK, "connect to the proxy")
        pg.send_query_params(b"SELECT outcome FROM pay($1, $2::numeric, $3)",
                             [o.encode(), b"7", ("req-" + o).encode()])
        pg.finish()
        expect(o, Decimal(7))
    deadline = time.monotonic() + 15
    while True:
        stored = {}
        for i in range(NSHARDS):
            with shard(i) as sc:
                stored.update(dict(sc.execute("SELECT order_no, payment_id FROM payments "
                                              "WHERE order_no LIKE 'L-%'").fetchall()))
        if len(stored) == len(lost) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    lost_out = collections.Counter()
    for o in lost:
        r = pay(c, "pay", o, amount[o], "req-" + o)
        lost_out[r[0]] += 1
        check(r[0] == "replayed" and r[2]["payment_id"] == stored.get(o),
              f"{o}: answer lost, retry got {r[0]} {r[2]}, stored payment {stored.get(o)}")
    print(f"3. answer lost: {len(lost)} calls sent, client hung up; committed on the shards "
          f"{len(stored)}; retries: {dict(lost_out)}")

    # A PL/Proxy call is the shard's own (autocommit) transaction: rolling
    # back the proxy's transaction does not undo it, and the retry says so.
    o = "T-rollback"
    owner.update(shard_of([o]))
    amount[o] = Decimal(3)
    with proxy() as tc:
        with tc.transaction(force_rollback=True):
            first = pay(tc, "pay", o, amount[o], "req-" + o)
    again = pay(c, "pay", o, amount[o], "req-" + o)
    expect(o, amount[o])
    print(f"   pay() inside a proxy transaction that rolled back: {first[0]}; the retry: {again[0]} "
          f"(the shard had committed)")
    check(first[0] == "claimed" and again[0] == "replayed" and again[2] == first[2],
          f"proxy rollback: first {first}, retry {again}")

    # ---- 4. a shard stopped under traffic --------------------------------
    orders3 = [f"C-{i:04d}" for i in range(450)]
    owner.update(shard_of(orders3))
    amount.update({o: Decimal(i % 90 + 5) for i, o in enumerate(orders3)})
    queue = collections.deque(orders3)
    acks = {}           # order -> result of the acknowledged call
    errors = {}         # order -> error text of the failed call
    sent_at = {}        # order -> monotonic time the call was sent
    state = {"down_at": None}

    def worker():
        with proxy() as pc:
            while True:
                with lock:
                    if not queue:
                        return
                    o = queue.popleft()
                sent_at[o] = time.monotonic()
                try:
                    r = pay(pc, "pay", o, amount[o], "req-" + o)
                    with lock:
                        acks[o] = r
                except psycopg.Error as e:
                    with lock:
                        errors[o] = error_text(e)
                time.sleep(0.01)   # a steady rate, so the stop falls amid the traffic

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    while len(acks) < 120:
        time.sleep(0.005)
    acks_at_stop = len(acks)
    cluster("ctl", f"s{VICTIM}", "-m", "immediate", "-w", "stop")
    state["down_at"] = time.monotonic()
    for t in threads:
        t.join()
    for o in orders3:
        expect(o, amount[o])

    after = [o for o in orders3 if sent_at[o] > state["down_at"]]
    wrong = [o for o in errors if owner[o] != VICTIM]
    ok_other_after = [o for o in after if o in acks and owner[o] != VICTIM]
    victim_after = [o for o in after if owner[o] == VICTIM]
    print(f"4. orders_{VICTIM} stopped (-m immediate) amid traffic, after {acks_at_stop} acks; "
          f"{len(orders3)} requests: acknowledged {len(acks)}, failed {len(errors)} "
          f"(all on orders_{VICTIM}: {not wrong}); sent while it was down: {len(after)}, "
          f"of which {len(ok_other_after)} on the other shards acknowledged")
    check(not wrong, f"errors on shards that were up: {[(o, errors[o]) for o in wrong][:5]}")
    check(len(victim_after) > 0 and all(o in errors for o in victim_after),
          f"requests to orders_{VICTIM} while it was down: {len(victim_after)}, failed "
          f"{sum(o in errors for o in victim_after)}")
    check(len(ok_other_after) > 0 and all(o in acks for o in after if owner[o] != VICTIM),
          "requests to the other shards while one was down all acknowledged")
    hist = collections.Counter(re.sub(r"\d+", "N", t.splitlines()[0]) for t in errors.values())
    in_flight = {o for o, t in errors.items() if "PQconnectPoll" not in t}
    print("   errors the application saw (digits as N):")
    for t, n in hist.most_common():
        print(f"     {n:4d} x {t}")

    # deterministic, while the shard is still down: its keys fail, the others work
    probe = {}
    probes = shard_of([f"P-{k}" for k in range(30)])
    probe_order = {}
    for i in range(NSHARDS):
        o = min(p for p, s in probes.items() if s == i)
        owner[o] = i
        probe_order[i] = o
        try:
            r = pay(c, "pay", o, Decimal(1), "req-" + o)
            probe[i] = f"{r[0]} on {r[1]}"
            expect(o, Decimal(1))
        except psycopg.Error as e:
            probe[i] = "ERROR " + error_text(e).splitlines()[0]
            probe_victim = (o, Decimal(1))
    for i in range(NSHARDS):
        print(f"   a new payment for an order of orders_{i} while orders_{VICTIM} is down: {probe[i]}")
    try:
        c.execute("SELECT * FROM payment_totals()").fetchall()
        check(False, "payment_totals() (RUN ON ALL) answered while a shard was down")
    except psycopg.Error as e:
        print(f"   payment_totals() (RUN ON ALL) while orders_{VICTIM} is down: ERROR {error_text(e).splitlines()[0]}")
    # the wrapper: a retryable SQLSTATE for the down shard, answers for the others
    try:
        o = probe_order[VICTIM]
        pay(c, "pay_or_retry", o, Decimal(1), "req-" + o)
        check(False, "pay_or_retry answered while its shard was down")
    except psycopg.Error as e:
        print(f"   pay_or_retry() for that order of orders_{VICTIM}: {e.sqlstate} "
              f"{e.diag.message_primary.split(':')[0]} (hint: {e.diag.message_hint})")
        check(e.sqlstate == "08006", f"pay_or_retry raised {e.sqlstate}, not 08006")
    other = (VICTIM + 1) % NSHARDS
    o = probe_order[other]
    r = pay(c, "pay_or_retry", o, Decimal(1), "req-" + o)
    print(f"   pay_or_retry() for the order of orders_{other} paid above: {r[0]} on {r[1]}")
    check(r[0] == "replayed", f"pay_or_retry on a healthy shard answered {r[0]}, not replayed")
    check(probe[VICTIM].startswith("ERROR"), f"orders_{VICTIM} down but its key answered: {probe[VICTIM]}")
    check(all(probe[i].startswith("claimed") for i in range(NSHARDS) if i != VICTIM),
          f"the other shards stopped working: {probe}")
    errors[probe_victim[0]] = probe[VICTIM]
    amount[probe_victim[0]] = probe_victim[1]
    expect(*probe_victim)

    cluster("start", f"s{VICTIM}")
    # retry every failed request with its own key, as a client would
    outcome = collections.Counter()
    attempts_hist = collections.Counter()
    for o in sorted(errors):
        for attempt in range(1, 11):
            try:
                r = pay(c, "pay", o, amount[o], "req-" + o)
                break
            except psycopg.Error as e:
                last = error_text(e)
                time.sleep(0.2)
        else:
            check(False, f"{o}: still failing after the restart: {last}")
            continue
        outcome[r[0]] += 1
        if o in in_flight:
            outcome["in flight: " + r[0]] += 1
        attempts_hist[attempt] += 1
        acks[o] = r
    print(f"   orders_{VICTIM} restarted; the {len(errors)} failed requests retried with the same keys: "
          f"charged now {outcome['claimed']}, replayed {outcome['replayed']} "
          f"(committed before the crash, answer lost); of the {len(in_flight)} cut off in flight: "
          f"charged now {outcome['in flight: claimed']}, replayed {outcome['in flight: replayed']}; "
          f"attempts needed {dict(sorted(attempts_hist.items()))}")

    # every acknowledged request, retried once more, must answer the same
    changed = 0
    replays = collections.Counter()
    for o in list(orders3) + [probe_victim[0]]:
        r = pay(c, "pay", o, amount[o], "req-" + o)
        replays[r[0]] += 1
        if r[2] != acks[o][2]:
            changed += 1
    print(f"   all {sum(replays.values())} phase-4 requests sent once more: {dict(replays)}, answers changed {changed}")
    check(replays.get("claimed", 0) == 0 and changed == 0, "a retry after recovery charged again or answered differently")

    # ---- 5. totals per shard ---------------------------------------------
    print("5. totals per shard (read on each shard):")
    print("   shard     expected rows  rows  dup  expected sum      sum  live claims  acked ids missing")
    acked_ids = collections.defaultdict(set)
    for o, r in acks.items():
        acked_ids[owner[o]].add((r[2]["payment_id"], o))
    for o in orders:
        for r in seen[o]:
            if r[0] != "error":
                acked_ids[owner[o]].add((r[2]["payment_id"], o))
    via_proxy = {r[0]: r[1:] for r in c.execute("SELECT * FROM payment_totals()").fetchall()}
    for i in range(NSHARDS):
        with shard(i) as sc:
            rows, total, dup = sc.execute(
                "SELECT count(*), coalesce(sum(amount), 0),"
                "       count(*) - count(DISTINCT (order_no, request_id)) FROM payments").fetchone()
            live = sc.execute("SELECT count(*) FROM idem.claims WHERE expires_at > now()").fetchone()[0]
            present = set(sc.execute("SELECT payment_id, order_no FROM payments").fetchall())
        missing = acked_ids[i] - present
        print(f"   orders_{i} {expected[i][0]:13d} {rows:5d} {dup:4d} {expected[i][1]:13} {total:8} "
              f"{live:12d} {len(missing):18d}")
        check(rows == expected[i][0] and total == expected[i][1],
              f"orders_{i}: {rows} rows / {total}, expected {expected[i][0]} / {expected[i][1]}")
        check(dup == 0, f"orders_{i}: {dup} duplicate payments")
        check(live == rows, f"orders_{i}: {live} live claims for {rows} payments")
        check(not missing, f"orders_{i}: acknowledged payments missing: {sorted(missing)[:5]}")
        check(via_proxy.get(f"orders_{i}", (None,))[0] == rows,
              f"payment_totals() through the proxy for orders_{i}: {via_proxy.get(f'orders_{i}')}")

if failures:
    print(f"{len(failures)} checks failed")
    sys.exit(1)
print("all checks passed")
