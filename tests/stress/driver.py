#!/usr/bin/env python3
"""Stress driver for idem: concurrent claims with faults, then invariants.

N client threads (one connection each) run one transaction per claim over a
key space in which about 30 % of the claims reuse an earlier key. Each
transaction claims, writes a business row and then, at random: commits
(idem_complete, idem_fail, or neither), rolls back, fails mid-way (division
by zero after the claim, after the business row or after idem_complete),
claims with wait => false, or claims inside a savepoint that it rolls back
before claiming again. A maintenance thread runs idem_maintain() with short
partitions and a TTL of a few seconds, so that partitions rotate and are
dropped during the run; a verifier thread looks up acknowledged claims that
must still be live.

The client side records what the server acknowledged: every transaction
whose COMMIT returned (acked), every transaction that claimed and then
certainly did not commit (aborted), every COMMIT that got no answer because
a fault hit (in flight), and every duplicate answer (replay). At the end
these are compared with what the server holds.

Faults (--fault crash|failover): at --fault-at seconds into a phase the
driver runs --fault-cmd (which kills/restarts the server or promotes the
replica and returns once the new server accepts connections), then, against
--dsn-after, retries each key that was in flight and checks that every
acknowledged claim that is still live is replayed, not claimed again.

A lookup or retry counts a claim as lost only if the server's clock, read
after the call returned, is still before the claim's expires_at: a check
that ran late (it waited behind maintenance's lock, or this process lagged)
proves nothing either way and is counted apart.

--sabotage N is a negative control: it evicts N live acknowledged claims
mid-run with idem_forget, and the run must then fail.

Exit status 0 when every invariant holds; 1 otherwise (the reasons are
printed). A JSON summary goes to --summary.
"""
import argparse
import collections
import datetime as dt
import json
import random
import subprocess
import sys
import threading
import time

import psycopg
from psycopg import errors as pgerr
from psycopg.types.json import Jsonb

BIZ = "stress"

# SQLSTATE classes a fault produces: connection exceptions, operator
# intervention (admin/crash shutdown, cannot connect now).
FAULT_CLASSES = ("08", "57")


def now_ts():
    return dt.datetime.now(dt.timezone.utc)


def is_fault_error(exc):
    if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
        state = getattr(exc, "sqlstate", None)
        return state is None or state[:2] in FAULT_CLASSES
    return False


class Run:
    """State shared by every thread; mutated under self.lock."""

    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.recent = collections.deque(maxlen=args.recent)
        self.fresh = 0
        # seq -> (key, claimed_at, expires_at, outcome)
        self.acked = {}
        self.latest_ack = {}  # key -> seq of its latest acknowledged claim
        self.ack_log = []  # seqs in acknowledgement order
        self.aborted = set()  # seqs that claimed and certainly did not commit
        self.inflight = []  # COMMIT sent, no answer (a fault hit)
        self.lost_before_commit = []  # claimed, fault hit before COMMIT was sent
        self.replays = []  # (key, first_claimed_at, result seq or None, state)
        self.counts = collections.Counter()
        self.unexpected = collections.Counter()
        self.samples = []  # a few unexpected errors, verbatim
        self.failures = []  # invariant violations, one line each
        self.maint = collections.Counter()
        self.next_seq = {w: w * 10**9 for w in range(args.clients)}
        self.fault_started = threading.Event()
        self.stop = threading.Event()
        self.phase = 0
        self.unresolved = set()  # in-flight seqs whose claim expired before the retry
        self.dsn = args.dsn

    def fail(self, msg):
        with self.lock:
            self.failures.append(msg)
        print("FAIL:", msg, flush=True)

    def note_unexpected(self, where, exc):
        state = getattr(exc, "sqlstate", None) or type(exc).__name__
        with self.lock:
            self.unexpected[f"{where}:{state}"] += 1
            if len(self.samples) < 20:
                self.samples.append(f"{where}: {state}: {str(exc).strip()}")
        print(f"UNEXPECTED {where}: {state}: {str(exc).strip()}", flush=True)

    def pick_key(self, rnd):
        with self.lock:
            if self.recent and rnd.random() < self.args.dup:
                self.counts["picked_dup_key"] += 1
                # Recent keys collide with transactions still running
                # (waits, in_progress); older ones with committed, rolled
                # back and expired claims.
                if rnd.random() < 0.4:
                    return self.recent[-1 - rnd.randrange(min(64, len(self.recent)))]
                return self.recent[rnd.randrange(len(self.recent))]
            self.fresh += 1
            key = f"{self.args.run_id}-{self.fresh}"
            if self.args.long_every and self.fresh % self.args.long_every == 0:
                key += "L"  # claimed with --long-ttl (see claim_ttl)
            self.recent.append(key)
            self.counts["picked_fresh_key"] += 1
            return key


MODES = ["commit", "rollback", "error", "nowait", "savepoint"]
WEIGHTS = [50, 15, 15, 15, 5]
CLAIM_SQL = (
    "SELECT claimed, state, result, first_claimed_at, expires_at "
    "FROM idem_claim(%s, 'stress', ttl => %s, wait => %s)"
)


def claim_ttl(args, key):
    """The ttl argument for a key: --long-ttl for every --long-every-th new
    key (marked "L"), the type's own TTL (NULL) for the rest. Long claims
    outlive any recovery, however slow the machine, so the checks after a
    fault always have acknowledged live claims to look for; short ones
    expire and rotate partitions during the run."""
    return dt.timedelta(seconds=args.long_ttl) if key.endswith("L") else None
BIZ_SQL = (
    "INSERT INTO stress_biz (seq, key, claimed_at, expires_at, outcome, worker) "
    "VALUES (%s, %s, %s, %s, %s, %s)"
)


def worker(run, wid, budget):
    args = run.args
    rnd = random.Random(args.seed * 7919 + wid * 104729 + run.phase)
    c = collections.Counter()
    try:
        conn = psycopg.connect(run.dsn, autocommit=False, application_name="stress-worker")
    except Exception as exc:  # noqa: BLE001
        if run.fault_started.is_set() and is_fault_error(exc):
            c["connect_failed_after_fault"] += 1
        else:
            run.note_unexpected("connect", exc)
        with run.lock:
            run.counts.update(c)
        return
    done = 0
    while done < budget and not run.stop.is_set():
        with run.lock:
            run.next_seq[wid] += 1
            seq = run.next_seq[wid]
        key = run.pick_key(rnd)
        mode = rnd.choices(MODES, WEIGHTS)[0]
        mine = None  # (claimed_at, expires_at, outcome) once this tx holds a claim
        commit_sent = False
        try:
            cur = conn.cursor()
            if mode == "savepoint":
                # A claim undone by ROLLBACK TO SAVEPOINT leaves nothing: the
                # same transaction claims the key again.
                cur.execute("SAVEPOINT s")
                cur.execute(CLAIM_SQL, (key, claim_ttl(args, key), True))
                r = cur.fetchone()
                if r[0]:
                    cur.execute(BIZ_SQL, (seq, key, r[3], r[4], "rolledback", wid))
                    c["savepoint_rolled_back_claim"] += 1
                cur.execute("ROLLBACK TO SAVEPOINT s")
                mode = "commit"
            cur.execute(CLAIM_SQL, (key, claim_ttl(args, key), mode != "nowait"))
            claimed, state, result, first_at, expires_at = cur.fetchone()
            if claimed != (state == "new"):
                run.fail(f"claimed={claimed} with state={state} for {key}")
            if not claimed:
                if state == "in_progress":
                    if mode != "nowait":
                        run.fail(f"in_progress answered to a waiting claim of {key}")
                    c["nowait_in_progress"] += 1
                elif state in ("completed", "failed"):
                    rseq = result.get("seq") if isinstance(result, dict) else None
                    if state == "failed" and rseq is None:
                        run.fail(f"failed replay of {key} without its error document: {result!r}")
                    with run.lock:
                        run.replays.append((key, first_at, rseq, state))
                    c["replay_" + state] += 1
                else:
                    run.fail(f"unexpected state {state} for {key}")
                conn.rollback()
                done += 1
                continue
            c["claimed_new"] += 1
            if mode == "nowait":
                c["nowait_claimed"] += 1
                mode = "commit"
            outcome = rnd.choices(["complete", "fail", "bare"], [70, 15, 15])[0]
            mine = (first_at, expires_at, outcome)
            err_at = rnd.randrange(3) if mode == "error" else -1
            if err_at == 0:
                cur.execute("SELECT 1/0")
            cur.execute(BIZ_SQL, (seq, key, first_at, expires_at, outcome, wid))
            if err_at == 1:
                cur.execute("SELECT 1/0")
            if outcome == "complete":
                cur.execute("SELECT idem_complete(%s, 'stress', %s)", (key, Jsonb({"seq": seq})))
            elif outcome == "fail":
                cur.execute("SELECT idem_fail(%s, 'stress', %s)", (key, Jsonb({"seq": seq, "error": "out of stock"})))
            if err_at == 2:
                cur.execute("SELECT 1/0")
            if mode == "rollback":
                conn.rollback()
                with run.lock:
                    run.aborted.add(seq)
                c["rolled_back"] += 1
            else:
                commit_sent = True
                conn.commit()
                with run.lock:
                    run.acked[seq] = (key, first_at, expires_at, outcome)
                    run.ack_log.append(seq)
                    prev = run.latest_ack.get(key)
                    if prev is None or run.acked[prev][1] < first_at:
                        run.latest_ack[key] = seq
                c["committed_" + outcome] += 1
        except pgerr.DivisionByZero:
            with run.lock:
                run.aborted.add(seq)
            c["error_midway"] += 1
            try:
                conn.rollback()
            except Exception as exc:  # noqa: BLE001
                if not (run.fault_started.is_set() and is_fault_error(exc)):
                    run.note_unexpected("rollback", exc)
                break
        except Exception as exc:  # noqa: BLE001
            if run.fault_started.is_set() and is_fault_error(exc):
                rec = {"seq": seq, "key": key, "worker": wid}
                if mine:
                    rec.update(claimed_at=mine[0], expires_at=mine[1], outcome=mine[2])
                with run.lock:
                    if commit_sent and mine:
                        run.inflight.append(rec)
                    elif mine:
                        run.lost_before_commit.append(rec)
                c["hit_by_fault"] += 1
                break
            run.note_unexpected(f"worker[{mode}]", exc)
            try:
                conn.rollback()
            except Exception:  # noqa: BLE001
                break
            if mine:
                with run.lock:
                    run.aborted.add(seq)
        done += 1
    try:
        conn.close()
    except Exception:  # noqa: BLE001
        pass
    with run.lock:
        run.counts.update(c)
        run.counts["transactions"] += done


def maintainer(run):
    args = run.args
    try:
        conn = psycopg.connect(run.dsn, autocommit=True)
        conn.execute(f"SET idem.partition_width = '{args.width} seconds'")
        conn.execute(f"SET idem.premake_ahead = '{args.width} seconds'")
    except Exception as exc:  # noqa: BLE001
        if not (run.fault_started.is_set() and is_fault_error(exc)):
            run.note_unexpected("maintain-connect", exc)
        return
    conn.add_notice_handler(lambda d: None)
    rnd = random.Random(args.seed + 31)
    n = 0
    hold_done = False
    while not run.stop.is_set():
        n += 1
        # No pause before the first partition was dropped: every run is
        # checked for rotation, and a pause of up to two TTLs before the
        # first claims expire could outlast a short run (a failover run of
        # 13 s once saw none). After it, random pauses as configured, and
        # one hold (from the 10th run on, again until a run has moved a
        # claim out of the default partition): maintenance waits until the
        # default partition holds a claim with half its TTL still to live,
        # so that every stress run long enough moves claims out of it (the
        # counter is the whole run's, across fault phases). The hold
        # ends on that state, read from the table, not on a timer: under
        # load, a fixed pause once ended with no claim there.
        with run.lock:
            rotated = run.maint.get("partitions_dropped", 0) > 0
            hold_done = hold_done or run.maint.get("rows_moved_from_default", 0) > 0
        if rotated and n >= 10 and not hold_done:
            with run.lock:
                run.maint["holds"] += 1
            try:
                landed = hold_until_default_has_live_claim(run, conn)
            except Exception as exc:  # noqa: BLE001
                if run.fault_started.is_set() and is_fault_error(exc):
                    return
                run.note_unexpected("maintain-hold", exc)
                landed = False
            if run.stop.is_set():
                break
            if not landed:
                with run.lock:
                    run.maint["holds_without_default_claim"] += 1
        elif rotated and rnd.random() < args.maintain_pause:
            with run.lock:
                run.maint["pauses"] += 1
            # (Up to two TTLs: a claim's TTL class premakes partitions for
            # TTLs up to 4·√2 widths, so a pause must outlast that, less the
            # TTL, to leave live claims beyond the partitions.)
            if run.stop.wait(rnd.uniform(2 * args.width, 2 * args.ttl)):
                break
        try:
            rep = conn.execute("SELECT idem_maintain()").fetchone()[0]
        except Exception as exc:  # noqa: BLE001
            if run.fault_started.is_set() and is_fault_error(exc):
                return
            run.note_unexpected("maintain", exc)
            time.sleep(args.maintain_every)
            continue
        with run.lock:
            m = run.maint
            m["runs"] += 1
            if rep.get("skipped"):
                m["runs_skipped"] += 1
            m["partitions_created"] += len(rep.get("partitions_created") or [])
            m["partitions_dropped"] += len(rep.get("partitions_dropped") or [])
            m["rows_removed"] += rep.get("rows_removed") or 0
            m["rows_moved_from_default"] += rep.get("rows_moved_from_default") or 0
            m["expired_rows_deleted_from_default"] += rep.get("expired_rows_deleted_from_default") or 0
        run.stop.wait(args.maintain_every)
    conn.close()


def hold_until_default_has_live_claim(run, conn):
    """Wait, maintenance held off, until idem.claims_default holds a claim
    with at least half its TTL left (so the next idem_maintain() moves it
    out rather than deleting it expired). Polls the table; gives up after
    ten TTLs (returns False) so that a phase with no clients left ends."""
    args = run.args
    deadline = time.monotonic() + 10 * args.ttl
    while time.monotonic() < deadline:
        live = conn.execute(
            "SELECT EXISTS (SELECT FROM idem.claims_default"
            " WHERE expires_at > now() + make_interval(secs => %s))", (args.ttl / 2,)).fetchone()[0]
        if live:
            return True
        if run.stop.wait(0.1):
            return False
    return False


def live_acked(run, margin, full=True):
    """The latest acknowledged claim of each key that is still live (with a margin).

    full=False walks the acknowledgement log from its end only (acks come
    roughly in expiry order), so that the verifier does not hold the lock
    over the whole map while the clients wait for it."""
    limit = now_ts() + dt.timedelta(seconds=margin)
    with run.lock:
        if full:
            return [(k, run.acked[s][1], s) for k, s in run.latest_ack.items() if run.acked[s][2] > limit]
        out = []
        stop_at = limit - dt.timedelta(seconds=2)
        for i in range(len(run.ack_log) - 1, -1, -1):
            s = run.ack_log[i]
            k, c, e, _o = run.acked[s]
            if e <= stop_at:
                break
            if e > limit and run.latest_ack.get(k) == s:
                out.append((k, c, s))
        return out


def verifier(run):
    """During the run: acknowledged claims that are still live must be found."""
    args = run.args
    try:
        conn = psycopg.connect(run.dsn, autocommit=True)
    except Exception as exc:  # noqa: BLE001
        if not (run.fault_started.is_set() and is_fault_error(exc)):
            run.note_unexpected("verify-connect", exc)
        return
    rnd = random.Random(args.seed + 17)
    sabotaged = False
    while not run.stop.wait(0.5):
        live = live_acked(run, 0.5, full=False)
        # (with --long-every, victims among the long claims only: they are
        # still live at the final check however long the run took)
        candidates = [v for v in live if v[0].endswith("L")] if args.long_every else live
        if args.sabotage and not sabotaged and len(candidates) > args.sabotage:
            # Negative control: evict live acknowledged claims behind the
            # clients' backs (idem_forget, the operator's tool). The run
            # must then FAIL; scenarios use it to show the checks can fail.
            victims = rnd.sample(candidates, args.sabotage)
            conn.execute("SELECT idem_forget(k, 'stress') FROM unnest(%s::text[]) k", ([v[0] for v in victims],))
            print(f"sabotage: evicted {len(victims)} live acknowledged claims with idem_forget", flush=True)
            sabotaged = True
            continue
        sample = rnd.sample(live, min(200, len(live)))
        if not sample:
            continue
        try:
            # t_after: the server's clock once the lookup has returned (a
            # lookup can wait behind maintenance's lock, and this thread can
            # lag behind the clients): only a claim still live then counts.
            rows = conn.execute(
                """SELECT k, c.state, c.first_claimed_at, t.t_after
                     FROM unnest(%s::text[]) k, LATERAL idem_lookup(k, 'stress') c,
                          LATERAL (SELECT clock_timestamp() AS t_after, c.state) t""",
                ([s[0] for s in sample],),
            ).fetchall()
        except Exception as exc:  # noqa: BLE001
            if run.fault_started.is_set() and is_fault_error(exc):
                return
            run.note_unexpected("verify", exc)
            continue
        want = {s[0]: s for s in sample}
        for k, state, first_at, t_after in rows:
            expires_at = run.acked[want[k][2]][2]
            if t_after >= expires_at:
                with run.lock:
                    run.counts["verifier_expired_before_lookup"] += 1
                continue
            with run.lock:
                run.counts["verifier_lookups"] += 1
            if state not in ("completed", "failed") or first_at != want[k][1]:
                # A later claim of the same key can only come after this one
                # expired, which t_after excludes.
                run.fail(
                    f"acknowledged live claim not found during the run: key {k} "
                    f"claimed_at {want[k][1]} expires_at {expires_at} (lookup at {t_after}: {state} {first_at})"
                )
                with run.lock:
                    run.counts["verifier_lost"] += 1
    conn.close()


def args_progress(run):
    return run.args.progress if run.args.progress > 0 else float("inf")


def run_phase(run, budget, fault_at=None):
    run.stop.clear()
    run.fault_started.clear()
    threads = [threading.Thread(target=worker, args=(run, w, budget), daemon=True) for w in range(run.args.clients)]
    aux = [threading.Thread(target=maintainer, args=(run,), daemon=True),
           threading.Thread(target=verifier, args=(run,), daemon=True)]
    t0 = time.monotonic()
    for t in threads + aux:
        t.start()
    fault = None
    if fault_at is not None:
        deadline = t0 + fault_at
        while time.monotonic() < deadline and any(t.is_alive() for t in threads):
            time.sleep(0.05)
        run.fault_started.set()
        f0 = time.monotonic()
        cmd = run.args.fault_cmd.replace("{n}", str(run.phase + 1))
        proc = subprocess.run(cmd, shell=True, capture_output=True, text=True)
        fault = {"seconds": round(time.monotonic() - f0, 2), "rc": proc.returncode,
                 "output": (proc.stdout + proc.stderr).strip()}
        print(f"fault {run.phase + 1}: `{cmd}` took {fault['seconds']} s, rc {proc.returncode}", flush=True)
        if fault["output"]:
            print("  " + fault["output"].replace("\n", "\n  "), flush=True)
        if proc.returncode != 0:
            run.fail(f"fault command failed (rc {proc.returncode})")
        run.stop.set()
    last = time.monotonic()
    for t in threads:
        while t.is_alive():
            t.join(1.0)
            if time.monotonic() - last >= args_progress(run):
                last = time.monotonic()
                with run.lock:
                    n, dropped = len(run.acked), run.maint["partitions_dropped"]
                print(f"  {last - t0:6.0f} s: {n} commits acknowledged, {dropped} partitions dropped", flush=True)
    run.stop.set()
    for t in aux:
        t.join()
    run.phase += 1
    return time.monotonic() - t0, fault


def recover(run, fault_kind):
    """After a fault: retry what was in flight; every acknowledged live claim must replay."""
    args = run.args
    c = collections.Counter()
    conn = psycopg.connect(args.dsn_after, autocommit=False)
    cur = conn.cursor()
    margin = dt.timedelta(seconds=0.5)

    def biz_exists(seq):
        cur.execute("SELECT count(*) FROM stress_biz WHERE seq = %s", (seq,))
        return cur.fetchone()[0] == 1

    with run.lock:
        inflight = list(run.inflight)
        lost_before = list(run.lost_before_commit)
        run.inflight.clear()
        run.lost_before_commit.clear()
    c["in_flight"] = len(inflight)
    for rec in inflight:
        seq, key = rec["seq"], rec["key"]
        if rec["expires_at"] - margin <= now_ts():
            # Too late to tell a replay from a legitimate new claim.
            c["in_flight_expired_before_retry"] += 1
            with run.lock:
                run.unresolved.add(seq)
            continue
        cur.execute(CLAIM_SQL, (key, claim_ttl(args, key), True))
        claimed, state, result, first_at, expires_at = cur.fetchone()
        present = biz_exists(seq)
        if claimed:
            if present:
                run.fail(f"in-flight key {key}: its business row (seq {seq}) committed but the claim is gone")
            c["in_flight_lost_claims_again"] += 1
            with run.lock:
                run.aborted.add(seq)
            # The retry does the work now, as a client would.
            nseq = seq + 500_000_000
            cur.execute(BIZ_SQL, (nseq, key, first_at, expires_at, "complete", rec["worker"]))
            cur.execute("SELECT idem_complete(%s, 'stress', %s)", (key, Jsonb({"seq": nseq})))
            conn.commit()
            with run.lock:
                run.acked[nseq] = (key, first_at, expires_at, "complete")
                run.ack_log.append(nseq)
                run.latest_ack[key] = nseq
        elif state in ("completed", "failed") and first_at == rec["claimed_at"]:
            rseq = result.get("seq") if isinstance(result, dict) else None
            if rec["outcome"] != "bare" and rseq != seq:
                run.fail(f"in-flight key {key}: replayed result {result!r} is not seq {seq}'s")
            if not present:
                run.fail(f"in-flight key {key}: the claim committed but its business row (seq {seq}) is missing")
            c["in_flight_committed_replays"] += 1
            conn.rollback()
            with run.lock:
                run.acked[seq] = (key, rec["claimed_at"], rec["expires_at"], rec["outcome"])
                run.ack_log.append(seq)
                prev = run.latest_ack.get(key)
                if prev is None or run.acked[prev][1] < rec["claimed_at"]:
                    run.latest_ack[key] = seq
        else:
            run.fail(f"in-flight key {key} (seq {seq}): retry got claimed={claimed} state={state} "
                     f"first_claimed_at={first_at}, expected a new claim or seq {seq}'s replay")
            c["in_flight_other"] += 1
            conn.rollback()
    # Claimed, and the fault came before COMMIT was sent: must have left nothing.
    c["claimed_not_committed_at_fault"] = len(lost_before)
    for rec in lost_before:
        if biz_exists(rec["seq"]):
            run.fail(f"key {rec['key']}: business row of seq {rec['seq']} committed without COMMIT")
        with run.lock:
            run.aborted.add(rec["seq"])
    conn.rollback()
    # Every acknowledged claim still live must be replayed, not claimed again.
    # Checked inside a transaction that is rolled back, so that a lost claim
    # (claimed = true) leaves nothing behind.
    live = live_acked(run, 0.5)
    c["acked_live_checked"] = 0
    for i in range(0, len(live), 1000):
        # (re-filtered per batch: the check itself takes time)
        limit = now_ts() + margin
        batch = [b for b in live[i:i + 1000] if run.acked[b[2]][2] > limit]
        if not batch:
            continue
        c["acked_live_checked"] += len(batch)
        cur.execute(
            """SELECT k, c.claimed, c.first_claimed_at, t.t_after
                 FROM unnest(%s::text[]) k, LATERAL idem_claim(k, 'stress') c,
                      LATERAL (SELECT clock_timestamp() AS t_after, c.claimed) t""",
            ([b[0] for b in batch],),
        )
        want = {b[0]: b for b in batch}
        for k, claimed, first_at, t_after in cur.fetchall():
            if t_after >= run.acked[want[k][2]][2]:
                c["acked_live_expired_during_check"] += 1
            elif claimed:
                c["acked_live_lost"] += 1
                run.fail(f"acknowledged claim of {k} (seq {want[k][2]}, claimed_at {want[k][1]}) was claimed again after the {fault_kind}")
            elif first_at != want[k][1]:
                c["acked_live_mismatch"] += 1
                run.fail(f"acknowledged claim of {k}: replay is of another claim ({first_at} vs {want[k][1]})")
            else:
                c["acked_live_replayed"] += 1
        conn.rollback()
    conn.close()
    return c


def final_checks(run):
    """Invariants over what the server holds against what the client saw."""
    args = run.args
    res = collections.OrderedDict()
    conn = psycopg.connect(args.dsn_after or args.dsn, autocommit=False)
    cur = conn.cursor()
    cur.execute("""CREATE TEMP TABLE c_acked (seq bigint PRIMARY KEY, key text, claimed_at timestamptz,
                   expires_at timestamptz, outcome text)""")
    cur.execute("CREATE TEMP TABLE c_aborted (seq bigint PRIMARY KEY)")
    cur.execute("CREATE TEMP TABLE c_unknown (seq bigint PRIMARY KEY)")
    cur.execute("CREATE TEMP TABLE c_replays (key text, first_claimed_at timestamptz, rseq bigint, state text)")
    with run.lock:
        acked = list(run.acked.items())
        aborted = list(run.aborted)
        unknown = list(run.unresolved)
        replays = list(run.replays)
    with cur.copy("COPY c_acked FROM STDIN") as cp:
        for seq, (k, a, e, o) in acked:
            cp.write_row((seq, k, a, e, o))
    with cur.copy("COPY c_aborted FROM STDIN") as cp:
        for s in aborted:
            cp.write_row((s,))
    with cur.copy("COPY c_unknown FROM STDIN") as cp:
        for s in unknown:
            cp.write_row((s,))
    with cur.copy("COPY c_replays FROM STDIN") as cp:
        for r in replays:
            cp.write_row(r)
    cur.execute("ANALYZE c_acked; ANALYZE c_replays")

    def q(name, sql, expect_zero=True):
        cur.execute(sql)
        v = cur.fetchone()[0]
        res[name] = v
        if expect_zero and v != 0:
            run.fail(f"{name} = {v} (must be 0)")
        return v

    q("business_rows", "SELECT count(*) FROM stress_biz", False)
    q("business_rows_still_live", "SELECT count(*) FROM stress_biz WHERE expires_at > now()", False)
    q("claim_rows_stored", "SELECT count(*) FROM idem.claims WHERE biz_type = 'stress'", False)
    q("distinct_keys_committed", "SELECT count(DISTINCT key) FROM stress_biz", False)
    q("keys_committed_more_than_once_after_expiry",
      "SELECT count(*) FROM (SELECT key FROM stress_biz GROUP BY key HAVING count(*) > 1) s", False)
    # Exactly one committed claim per key per TTL window.
    q("overlapping_committed_claims",
      """SELECT count(*) FROM (SELECT claimed_at, lag(expires_at) OVER (PARTITION BY key ORDER BY claimed_at) prev
                                FROM stress_biz) s WHERE claimed_at < prev""")
    q("keys_with_two_live_claims",
      """SELECT count(*) FROM (SELECT key FROM idem.claims WHERE biz_type = 'stress' AND expires_at > now()
                               GROUP BY key HAVING count(*) > 1) s""")
    # Every live business row has its claim (none removed before
    # expires_at), in the state its transaction left.
    q("live_business_rows_without_claim",
      """SELECT count(*) FROM stress_biz b WHERE b.expires_at > now() AND NOT EXISTS
           (SELECT 1 FROM idem.claims c WHERE c.biz_type = 'stress' AND c.key = b.key AND c.claimed_at = b.claimed_at)""")
    q("claims_in_wrong_state",
      """SELECT count(*) FROM stress_biz b JOIN idem.claims c ON c.biz_type = 'stress' AND c.key = b.key
                                                          AND c.claimed_at = b.claimed_at
          WHERE c.expires_at <> b.expires_at
             OR (b.outcome = 'complete' AND (c.state <> 'c' OR (c.result->>'seq')::bigint IS DISTINCT FROM b.seq))
             OR (b.outcome = 'fail' AND (c.state <> 'f' OR (c.result->>'seq')::bigint IS DISTINCT FROM b.seq))
             -- (committed without idem_complete/idem_fail: stored as claimed, read as completed)
             OR (b.outcome = 'bare' AND (c.state <> 'p' OR c.result IS NOT NULL))
             OR b.outcome NOT IN ('complete', 'fail', 'bare')""")
    # Every stored claim (live or expired, not yet dropped) has its business row.
    q("claims_without_business_row",
      """SELECT count(*) FROM idem.claims c WHERE c.biz_type = 'stress' AND NOT EXISTS
           (SELECT 1 FROM stress_biz b WHERE b.key = c.key AND b.claimed_at = c.claimed_at)""")
    # The client's record against the server's.
    q("acked_commits", "SELECT count(*) FROM c_acked", False)
    q("acked_commits_missing",
      "SELECT count(*) FROM c_acked a WHERE NOT EXISTS (SELECT 1 FROM stress_biz b WHERE b.seq = a.seq)")
    q("acked_commits_differing",
      """SELECT count(*) FROM c_acked a JOIN stress_biz b USING (seq)
          WHERE (a.key, a.claimed_at, a.expires_at, a.outcome) IS DISTINCT FROM (b.key, b.claimed_at, b.expires_at, b.outcome)""")
    q("aborted_transactions", "SELECT count(*) FROM c_aborted", False)
    q("aborted_but_committed", "SELECT count(*) FROM c_aborted a JOIN stress_biz b USING (seq)")
    q("committed_never_acked",
      """SELECT count(*) FROM stress_biz b WHERE NOT EXISTS (SELECT 1 FROM c_acked a WHERE a.seq = b.seq)
                                             AND NOT EXISTS (SELECT 1 FROM c_unknown u WHERE u.seq = b.seq)""")
    q("unresolved_in_flight", "SELECT count(*) FROM c_unknown", False)
    q("replays", "SELECT count(*) FROM c_replays", False)
    q("replays_of_uncommitted_claims",
      """SELECT count(*) FROM c_replays r WHERE NOT EXISTS
           (SELECT 1 FROM stress_biz b WHERE b.key = r.key AND b.claimed_at = r.first_claimed_at
               AND (r.rseq IS NULL OR r.rseq = b.seq))""")
    q("replays_in_wrong_state",
      """SELECT count(*) FROM c_replays r JOIN stress_biz b ON b.key = r.key AND b.claimed_at = r.first_claimed_at
          WHERE r.state <> CASE b.outcome WHEN 'fail' THEN 'failed' ELSE 'completed' END""")
    q("replays_of_unacknowledged_claims",
      """SELECT count(*) FROM c_replays r WHERE r.rseq IS NOT NULL AND NOT EXISTS
           (SELECT 1 FROM c_acked a WHERE a.seq = r.rseq) AND NOT EXISTS (SELECT 1 FROM c_unknown u WHERE u.seq = r.rseq)""")
    conn.rollback()

    # amcheck on every index of idem's storage and of the business table,
    # heap included (heapallindexed), and verify_heapam on their tables.
    cur.execute("CREATE EXTENSION IF NOT EXISTS amcheck")
    conn.commit()
    cur.execute("""SELECT c.oid::regclass::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
                    JOIN pg_am a ON a.oid = c.relam
                   WHERE a.amname = 'btree' AND c.relpersistence = 'p'
                     AND (c.relnamespace = 'idem'::regnamespace OR i.indrelid = 'stress_biz'::regclass)""")
    indexes = [r[0] for r in cur.fetchall()]
    bad = 0
    for ix in indexes:
        try:
            cur.execute("SELECT bt_index_check(%s::regclass, heapallindexed => true)", (ix,))
            conn.commit()
        except psycopg.Error as exc:
            conn.rollback()
            bad += 1
            run.fail(f"amcheck: bt_index_check({ix}): {exc.sqlstate}: {str(exc).strip()}")
    cur.execute("""SELECT c.oid::regclass::text FROM pg_class c
                   WHERE c.relkind IN ('r', 't') AND c.relpersistence = 'p'
                     AND (c.relnamespace = 'idem'::regnamespace OR c.oid = 'stress_biz'::regclass)""")
    tables = [r[0] for r in cur.fetchall()]
    heap_bad = 0
    for t in tables:
        cur.execute("SELECT count(*) FROM verify_heapam(%s::regclass)", (t,))
        n = cur.fetchone()[0]
        if n:
            heap_bad += n
            cur.execute("SELECT * FROM verify_heapam(%s::regclass) LIMIT 5", (t,))
            run.fail(f"verify_heapam({t}): {n} problems, e.g. {cur.fetchall()}")
    conn.commit()
    res["amcheck_indexes_checked"] = len(indexes)
    res["amcheck_index_failures"] = bad
    res["verify_heapam_tables_checked"] = len(tables)
    res["verify_heapam_problems"] = heap_bad
    cur.execute("SELECT count(*) FROM idem.partition_bounds")
    res["partitions_at_end"] = cur.fetchone()[0]
    conn.close()
    return res


def setup(args):
    conn = psycopg.connect(args.dsn, autocommit=True)
    conn.add_notice_handler(lambda d: None)
    db = conn.info.dbname
    conn.execute("CREATE EXTENSION IF NOT EXISTS idem")
    conn.execute("CREATE EXTENSION IF NOT EXISTS amcheck")
    # Maintenance premakes partitions up to the longest TTL ahead: the
    # default TTL must be short too, or each run would premake 32 partitions.
    conn.execute(f"ALTER DATABASE {db} SET idem.default_ttl = '{args.ttl} seconds'")
    conn.execute(f"ALTER DATABASE {db} SET idem.partition_width = '{args.width} seconds'")
    # Maintenance paused for a few widths sends claims to the default
    # partition (what the pauses below are for): premade one width ahead.
    conn.execute(f"ALTER DATABASE {db} SET idem.premake_ahead = '{args.width} seconds'")
    conn.execute("SELECT idem_configure('stress', make_interval(secs => %s))", (args.ttl,))
    conn.execute("""CREATE TABLE IF NOT EXISTS stress_biz (
                      seq        bigint PRIMARY KEY,   -- the driver's transaction number
                      key        text NOT NULL,
                      claimed_at timestamptz NOT NULL, -- the claim's first_claimed_at
                      expires_at timestamptz NOT NULL,
                      outcome    text NOT NULL,        -- complete | fail | bare
                      worker     int NOT NULL)""")
    conn.execute("CREATE INDEX IF NOT EXISTS stress_biz_key ON stress_biz (key, claimed_at)")
    conn.execute(f"SET idem.partition_width = '{args.width} seconds'")
    conn.execute(f"SET idem.premake_ahead = '{args.width} seconds'")
    conn.execute(f"SET idem.default_ttl = '{args.ttl} seconds'")
    conn.execute("SELECT idem_maintain()")
    conn.close()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dsn", required=True)
    p.add_argument("--dsn-after", help="where to connect after a fault (default: --dsn)")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--claims", type=int, default=1000, help="claims per client (no fault), or per client after the last fault")
    p.add_argument("--dup", type=float, default=0.30, help="share of claims that reuse an earlier key")
    p.add_argument("--recent", type=int, default=20000, help="how many earlier keys a duplicate is drawn from")
    p.add_argument("--ttl", type=float, default=3.0, help="TTL of the claims, seconds")
    p.add_argument("--long-every", type=int, default=0,
                   help="every Nth new key is claimed with --long-ttl (0: none)")
    p.add_argument("--long-ttl", type=float, default=600.0, help="TTL of those claims, seconds")
    p.add_argument("--width", type=float, default=1.0, help="idem.partition_width, seconds (at least 0.1)")
    p.add_argument("--maintain-every", type=float, default=0.25, help="seconds between idem_maintain() runs")
    p.add_argument("--maintain-pause", type=float, default=0.03,
                   help="chance, per maintenance run, of a pause of two widths to 1.25 TTL (claims then land "
                        "in the default partition, and the next run moves them out or deletes them expired)")
    p.add_argument("--fault", choices=["none", "crash", "failover"], default="none")
    p.add_argument("--fault-cmd")
    p.add_argument("--fault-at", type=float, default=8.0, help="seconds into each phase")
    p.add_argument("--faults", type=int, default=1)
    p.add_argument("--min-inflight", type=int, default=0,
                   help="after --faults crashes, crash again while fewer COMMITs than this were caught in flight")
    p.add_argument("--max-faults", type=int, default=0, help="upper bound on crashes with --min-inflight")
    p.add_argument("--seed", type=int, default=int(time.time()))
    p.add_argument("--run-id", default=None)
    p.add_argument("--summary")
    p.add_argument("--progress", type=float, default=0, help="print progress every this many seconds")
    p.add_argument("--no-setup", action="store_true")
    p.add_argument("--sabotage", type=int, default=0,
                   help="negative control: evict this many live acknowledged claims mid-run; the run must fail")
    args = p.parse_args()
    args.run_id = args.run_id or f"r{args.seed}"
    args.dsn_after = args.dsn_after or args.dsn
    if args.fault != "none" and not args.fault_cmd:
        p.error("--fault needs --fault-cmd")

    print(f"stress: {args.clients} clients, {args.dup:.0%} duplicate keys, ttl {args.ttl} s, "
          f"partition width {args.width} s, fault {args.fault}, seed {args.seed}", flush=True)
    if not args.no_setup:
        setup(args)
    run = Run(args)
    t_start = time.monotonic()
    phases = []
    recoveries = []
    if args.fault != "none":
        i = 0
        while True:
            if i >= args.faults:
                caught = sum(r.get("in_flight", 0) for r in recoveries)
                if args.fault != "crash" or caught >= args.min_inflight or i >= max(args.max_faults, args.faults):
                    break
                print(f"{caught} COMMITs caught in flight so far (want {args.min_inflight}): one more crash", flush=True)
            before = run.counts["transactions"]
            secs, fault = run_phase(run, budget=10**12, fault_at=args.fault_at)
            phases.append({"seconds": round(secs, 1), "transactions": run.counts["transactions"] - before,
                           "fault": fault})
            run.dsn = args.dsn_after
            rc = recover(run, args.fault)
            recoveries.append(dict(rc))
            print(f"after fault {i + 1}: " + ", ".join(f"{k} {v}" for k, v in rc.items()), flush=True)
            i += 1
            if args.fault == "failover":
                break
    before = run.counts["transactions"]
    secs, _ = run_phase(run, budget=args.claims)
    phases.append({"seconds": round(secs, 1), "transactions": run.counts["transactions"] - before, "fault": None})
    elapsed = time.monotonic() - t_start
    checks = final_checks(run)

    counts = dict(sorted(run.counts.items()))
    for i, ph in enumerate(phases):
        print(f"phase {i + 1}: {ph['transactions']} transactions in {ph['seconds']} s"
              + (", then the fault" if ph["fault"] else ""), flush=True)
    print(f"elapsed {elapsed:.1f} s, {counts.get('transactions', 0)} transactions, "
          f"{counts.get('transactions', 0) / max(elapsed, 1e-9):.0f} per second", flush=True)
    print("client side:", flush=True)
    for k, v in counts.items():
        print(f"  {k:40s} {v}")
    print("maintenance:", flush=True)
    for k, v in sorted(run.maint.items()):
        print(f"  {k:40s} {v}")
    if recoveries:
        tot = collections.Counter()
        for r in recoveries:
            tot.update(r)
        print(f"recovery after {len(recoveries)} {args.fault}(s):", flush=True)
        for k, v in sorted(tot.items()):
            print(f"  {k:40s} {v}")
    print("invariants (server against client):", flush=True)
    for k, v in checks.items():
        print(f"  {k:40s} {v}")
    print("unexpected errors:", sum(run.unexpected.values()), dict(run.unexpected), flush=True)
    for s in run.samples:
        print("  ", s)
    if run.unexpected:
        run.failures.append(f"{sum(run.unexpected.values())} unexpected errors")
    if counts.get("verifier_lost", 0):
        run.failures.append("verifier found lost claims")
    if not run.maint.get("partitions_dropped"):
        run.failures.append("no partition was dropped during the run: rotation did not happen")
    summary = {
        "args": {k: v for k, v in vars(args).items()},
        "elapsed_s": round(elapsed, 1),
        "phases": phases,
        "counts": counts,
        "maintenance": dict(run.maint),
        "recoveries": recoveries,
        "checks": checks,
        "unexpected": dict(run.unexpected),
        "failures": run.failures,
    }
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump(summary, f, indent=2, default=str)
    if run.failures:
        print(f"RESULT: FAIL ({len(run.failures)} problems)")
        for f in run.failures[:50]:
            print("  -", f)
        sys.exit(1)
    print("RESULT: PASS")


if __name__ == "__main__":
    main()
