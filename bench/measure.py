"""Measurement utilities that are not about one section: how much CPU
other processes used during a run (CpuMeter, noise, and the thresholds the
quiet-wait uses), and exact nearest-rank latency percentiles (lat_stats,
hist_stats, pct)."""
import collections
import math
import os
import subprocess
import time

QUIET_CORES = 0.15   # "quiet": other processes use less than this many cores
NOISY_CORES = 0.25   # a run during which they used more is measured again


class CpuMeter:
    """CPU time used during a run by processes that are not the benchmark's
    (everything except this script and its children -- pgbench, psql, the C
    driver --, the benchmark cluster's postmaster and its backends, and
    redis-server), from /proc/<pid>/stat, plus the hypervisor's steal time.
    Processes that start and exit within one run are missed; the compiler
    check in noise() covers the usual case of those (a build)."""

    def __init__(self, host, port, redis_pid):
        self.lockfile = os.path.join(host, f".s.PGSQL.{port}.lock")
        self.redis_pid = redis_pid
        self.hz = os.sysconf("SC_CLK_TCK")

    def snap(self):
        procs = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    parts = f.read().rsplit(")", 1)[1].split()
                procs[int(d)] = (int(parts[1]), int(parts[11]) + int(parts[12]))
            except (OSError, IndexError, ValueError):
                pass
        try:
            with open(self.lockfile) as f:
                pm = int(f.readline())
        except (OSError, ValueError):
            pm = None
        roots = {os.getpid(), pm, self.redis_pid} - {None, 0}
        ours = set()
        for pid in procs:
            p, seen = pid, 0
            while p and p not in roots and p in procs and seen < 64:
                p, seen = procs[p][0], seen + 1
            if p in roots:
                ours.add(pid)
        with open("/proc/stat") as f:
            v = f.readline().split()
        steal = int(v[8]) if len(v) > 8 else 0
        return time.time(), {pid: cpu for pid, (pp, cpu) in procs.items() if pid not in ours}, steal

    def foreign(self, a, b):
        el = max(b[0] - a[0], 1e-3)
        ticks = sum(cpu - a[1].get(pid, 0) for pid, cpu in b[1].items() if cpu >= a[1].get(pid, 0))
        return max(0.0, (ticks + b[2] - a[2]) / self.hz / el)


def noise():
    """What else was running: the 1-minute load average and any compiler or
    cargo process (a build next to the benchmark skews it)."""
    out = {}
    try:
        with open("/proc/loadavg") as f:
            out["loadavg"] = float(f.read().split()[0])
    except OSError:
        pass
    try:
        ps = subprocess.run(["ps", "-eo", "comm="], capture_output=True, text=True).stdout.split()
        busy = sorted(set(c for c in ps if c in ("cargo", "rustc", "cc1", "cc1plus", "ld", "clang",
                                                  "make", "pg_regress", "postgres_fdw")))
        if busy:
            out["foreign"] = busy
    except OSError:
        pass
    return out


def lat_stats(lats_us):
    """p50/p99/p99.9/max/mean in ms of a list of latencies in µs (exact,
    nearest-rank percentiles)."""
    return hist_stats(collections.Counter(lats_us))


def hist_stats(h):
    """The same from a histogram {latency µs: count}: exact too."""
    n = sum(h.values())
    if not n:
        return {"txns": 0, "p50_ms": None, "p99_ms": None, "p999_ms": None, "max_ms": None,
                "mean_ms": None}
    keys = sorted(h)
    out = {"txns": n, "max_ms": keys[-1] / 1000, "mean_ms": sum(k * c for k, c in h.items()) / n / 1000}
    for name, q in (("p50_ms", 50), ("p99_ms", 99), ("p999_ms", 99.9)):
        rank = max(1, min(n, math.ceil(q / 100 * n)))
        acc = 0
        for k in keys:
            acc += h[k]
            if acc >= rank:
                out[name] = k / 1000
                break
    return out


def pct(values, q):
    """Nearest-rank percentile, in ms, of latencies in µs."""
    if not values:
        return None
    # nearest rank: the smallest value with at least q % of them at or below
    v = sorted(values)
    k = max(1, min(len(v), math.ceil(q / 100 * len(v)))) - 1
    return v[k] / 1000.0


def wal_and_xids(b, db, run):
    """Run run() (a pgbench run) between two readings of the WAL insert
    position and of txid_current(), and once the WAL is flushed (what
    pg_walinspect reads; with synchronous_commit off the WAL writer gets
    there within wal_writer_delay) measure what it wrote. txid_current()
    assigns an xid itself: the second reading is its own, so the run took
    x1 - x0 - 1. background: the LSN span of the records no transaction of
    the run wrote (the background writer's running-xacts snapshots,
    Standby; checkpoints, XLOG), padding included, so that "0 WAL" means 0
    for the workload. Returns (run()'s result, l0, l1, wal, background,
    xids)."""
    x0 = int(b.val(db, "SELECT txid_current()"))
    l0 = b.val(db, "SELECT pg_current_wal_insert_lsn()")
    res = run()
    l1 = b.val(db, "SELECT pg_current_wal_insert_lsn()")
    x1 = int(b.val(db, "SELECT txid_current()"))
    for _ in range(200):
        if b.val(db, f"SELECT pg_current_wal_flush_lsn() >= '{l1}'::pg_lsn") == "t":
            break
        time.sleep(0.05)
    wal = int(b.val(db, f"SELECT '{l1}'::pg_lsn - '{l0}'::pg_lsn"))
    background = 0 if wal == 0 else int(b.val(db, f"""
        SELECT coalesce(sum(end_lsn - start_lsn), 0) FROM pg_get_wal_records_info('{l0}', '{l1}')
         WHERE resource_manager IN ('Standby', 'XLOG')"""))
    return res, l0, l1, wal, background, x1 - x0 - 1
