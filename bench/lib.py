"""What bench.py, the sections and report.py share: the variants, the CPU
meter of the quiet wait, exact latency percentiles, WAL and xids around a
run, the installed build, the C client, medians, ratios and markdown tables."""
import collections
import hashlib
import math
import os
import shutil
import subprocess
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
SQL = os.path.join(BENCH, "sql")
PG_CONFIG = "/usr/lib/postgresql/15/bin/pg_config"   # bench.py sets it from --pg-bin
QUIET_CORES = 0.15   # "quiet": other processes use less than this many cores
NOISY_CORES = 0.25   # a run during which they used more is measured again


class BenchError(Exception):
    """A section cannot go on (an SQL error, a failed pgbench run)."""


# Variant -> (driver, pgbench script or txn.c mode, description); the order is
# the first round's, later rounds rotate it.
VARIANTS = {
    "B0": ("pgbench", "b0.sql", "business insert only"),
    "B1": ("pgbench", "b1.sql", "+ INSERT ... ON CONFLICT DO NOTHING"),
    "B1r": ("pgbench", "b1r.sql", "+ ON CONFLICT DO NOTHING, then UPDATE of the result"),
    "B2": ("pgbench", "b2.sql", "+ PL/pgSQL EXCEPTION WHEN unique_violation"),
    "B3": ("txn", "b3", "+ Redis SET NX EX (C driver)"),
    "B0c": ("txn", "b0", "B0 via the C driver (calibration)"),
    "I1t": ("txn", "i1", "+ SELECT idem_claim(…) (C driver, as B3)"),
    "I1": ("pgbench", "i1.sql", "+ SELECT idem_claim(…) (new key)"),
    "I1c": ("pgbench", "i1c.sql", "+ SELECT claimed FROM idem_claim(…) (new key)"),
    "I1f": ("pgbench", "i1f.sql", "+ SELECT (idem_claim(…)).claimed (new key)"),
    "I2": ("pgbench", "i2.sql", "+ idem_claim + idem_complete"),
    "I3": ("pgbench", "i3.sql", "idem_claim, duplicate key"),
    "B1d": ("pgbench", "b1d.sql", "ON CONFLICT DO NOTHING, existing key"),
}
ORDER = list(VARIANTS)
# The table each variant's dedup step writes
STORE = {"B1": "dedup", "B1r": "dedup_r", "B2": "dedup_exc", "I1": "idem.claims",
         "I1c": "idem.claims", "I1f": "idem.claims", "I2": "idem.claims", "I3": "idem.claims"}

# n new keys md5(prefix || i), i = lo..hi, claimed through idem_claim in one
# statement; an error unless every one was claimed.
BENCH_CLAIM_SQL = r"""
CREATE OR REPLACE FUNCTION public.bench_claim(prefix text, lo bigint, hi bigint) RETURNS bigint
LANGUAGE plpgsql AS $f$
DECLARE n bigint;
BEGIN
  SELECT count(*) INTO n FROM generate_series(lo, hi) g,
         LATERAL idem_claim(md5(prefix || g::text), 'bench') c WHERE c.claimed;
  IF n <> hi - lo + 1 THEN
    RAISE EXCEPTION 'bench_claim: % of % keys claimed', n, hi - lo + 1;
  END IF;
  RETURN n;
END $f$;
"""


# ---- the other processes' CPU ---------------------------------------------------
class CpuMeter:
    """CPU time used during a run by processes that are not the benchmark's
    (everything but this script and its children, the cluster's postmaster
    and backends, and redis-server), from /proc/<pid>/stat, plus the
    hypervisor's steal time. Processes that start and exit within one run
    are missed; noise()'s compiler check covers the usual case (a build)."""

    def __init__(self, host, port, redis_pid):
        self.lockfile = os.path.join(host, f".s.PGSQL.{port}.lock")
        self.redis_pid = redis_pid
        self.hz = os.sysconf("SC_CLK_TCK")

    def snap(self):
        procs = {}
        for d in os.listdir("/proc"):
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
        return time.time(), {pid: cpu for pid, (_, cpu) in procs.items() if pid not in ours}, int(v[8])

    def foreign(self, a, b):
        ticks = sum(cpu - a[1].get(pid, 0) for pid, cpu in b[1].items() if cpu >= a[1].get(pid, 0))
        return max(0.0, (ticks + b[2] - a[2]) / self.hz / max(b[0] - a[0], 1e-3))


def noise():
    """The 1-minute load average, and any compiler or test process running."""
    out = {}
    with open("/proc/loadavg") as f:
        out["loadavg"] = float(f.read().split()[0])
    ps = subprocess.run(["ps", "-eo", "comm="], capture_output=True, text=True).stdout.split()
    busy = sorted(set(ps) & {"cargo", "rustc", "cc1", "cc1plus", "ld", "clang", "make", "pg_regress"})
    if busy:
        out["foreign"] = busy
    return out


# ---- statistics ------------------------------------------------------------------
def median(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def pct(values, q):
    """Nearest-rank percentile, in ms, of latencies in µs."""
    return hist_stats(collections.Counter(values), (q,))[f"p{q}"] if values else None


def hist_stats(h, qs=(50, 99, 99.9)):
    """Exact nearest-rank percentiles (ms) of a histogram {latency µs: count}."""
    n = sum(h.values())
    out = {"txns": n, "max_ms": max(h) / 1000 if n else None,
           "mean_ms": sum(k * c for k, c in h.items()) / n / 1000 if n else None}
    keys, acc, i = sorted(h), 0, 0
    for q in qs:
        rank = max(1, min(n, math.ceil(q / 100 * n)))
        while n and acc + h[keys[i]] < rank:
            acc += h[keys[i]]
            i += 1
        out[f"p{q:g}"] = keys[i] / 1000 if n else None
    return out


def rotated(items, r, rounds):
    """Round r's order: each round starts r·len/rounds positions further, so
    that a drift of the machine spreads over every item."""
    off = (r * len(items)) // rounds
    return items[off:] + items[:off]


def ratio(runs, num, den, key="tps"):
    """(median num / median den, min and max of the same round's ratios)."""
    xs = [x[key] for x in runs if x["variant"] == num]
    ys = [x[key] for x in runs if x["variant"] == den]
    if not xs or not ys:
        return None, None, None
    by_round = {}
    for x in runs:
        by_round.setdefault(x["round"], {})[x["variant"]] = x[key]
    pairs = [d[num] / d[den] for d in by_round.values() if num in d and den in d and d[den]]
    return median(xs) / median(ys), min(pairs, default=None), max(pairs, default=None)


def spread(xs, nd=0):
    """"median (min–max)" of values."""
    return f"{median(xs):,.{nd}f} ({min(xs):,.{nd}f}–{max(xs):,.{nd}f})" if xs else "—"


def fmt_ratio(r):
    m, lo, hi = r
    return "—" if m is None else f"{m:.2f}" + (f" ({lo:.2f}–{hi:.2f})" if lo is not None and lo != hi else "")


def table(header, rows):
    """Markdown table lines."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + \
        ["| " + " | ".join(str(c) for c in r) + " |" for r in rows] + [""]


def fmt(x, nd=0):
    return "—" if x is None else f"{x:,.{nd}f}"


# ---- WAL and xids around a run ----------------------------------------------------
def wal_and_xids(b, db, script, n, prefill, tag):
    """n transactions of script, 1 client, synchronous_commit off, between two
    readings of the WAL insert position and of txid_current() (whose second
    call takes an xid itself: x1 - x0 - 1). The records no transaction of the
    run wrote (Standby running-xacts snapshots, XLOG) are counted by their
    LSN span, padding included, so that "0 WAL" means 0 for the workload."""
    # (each statement its own transaction: the first xid's commit record lands before l0)
    x0, l0 = b.psql(db, "SELECT txid_current(); SELECT pg_current_wal_insert_lsn();").split()
    res = b.pgbench(db, script, 1, "off", txns=n, prefill=prefill, tag=tag)
    l1, x1 = b.psql(db, "SELECT pg_current_wal_insert_lsn(); SELECT txid_current();").split()
    x0, x1 = int(x0), int(x1)
    for _ in range(200):   # pg_walinspect reads flushed WAL only
        if b.val(db, f"SELECT pg_current_wal_flush_lsn() >= '{l1}'::pg_lsn") == "t":
            break
        time.sleep(0.05)
    wal = int(b.val(db, f"SELECT '{l1}'::pg_lsn - '{l0}'::pg_lsn"))
    bg = 0 if wal == 0 else int(b.val(db, f"""
        SELECT coalesce(sum(end_lsn - start_lsn), 0) FROM pg_get_wal_records_info('{l0}', '{l1}')
         WHERE resource_manager IN ('Standby', 'XLOG')"""))
    rm = []
    for line in [] if wal == 0 else b.psql(db, f"""
            SELECT "resource_manager/record_type", count, fpi_size, combined_size
              FROM pg_get_wal_stats('{l0}', '{l1}', false) WHERE count > 0""").splitlines():
        name, cnt, fpi, comb = line.split("|")
        rm.append({"rmgr": name, "count": int(cnt), "fpi": int(fpi), "combined": int(comb)})
    return {"txns": n, "wal_bytes": wal, "background_bytes": bg, "xids": x1 - x0 - 1,
            "wal_per_txn": (wal - bg) / n, "wal_total_per_txn": wal / n, "xids_per_txn": (x1 - x0 - 1) / n,
            "fpi_bytes": sum(s["fpi"] for s in rm), "rmgr": rm, "tps": res["tps"]}


# ---- the installed build and the C client ------------------------------------------
def idem_so():
    pkglib = subprocess.run([PG_CONFIG, "--pkglibdir"], capture_output=True, text=True).stdout.strip()
    return os.path.join(pkglib, "idem.so")


def digest(path):
    try:
        with open(path, "rb") as f:
            return hashlib.md5(f.read()).hexdigest()
    except OSError:
        return None


def idem_build():
    """Is the installed idem.so an optimized build? The same file as the
    checkout's target/{release,debug}/libidem.so, else by its DWARF sections
    (a release build carries none)."""
    so = idem_so()
    d = digest(so)
    if not d:
        return "unknown (idem.so not found)"
    for kind in ("release", "debug"):
        if digest(os.path.join(os.path.dirname(BENCH), "target", kind, "libidem.so")) == d:
            return f"{kind} (identical to target/{kind}/libidem.so)"
    with open(so, "rb") as f:
        dwarf = b".debug_info" in f.read()
    mb = os.path.getsize(so) / 1e6
    return f"{'probably debug (unoptimized)' if dwarf and mb > 20 else 'probably release'}: {mb:.0f} MB"


def build_txn(out, pg_bin):
    """Compile bench/txn.c; its path, or None (no cc or no libpq-fe.h)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    cfg = lambda opt: subprocess.run([os.path.join(pg_bin, "pg_config"), opt], capture_output=True,
                                     text=True).stdout.strip()
    exe = os.path.join(out, "txn")
    p = subprocess.run([cc, "-O2", "-o", exe, os.path.join(BENCH, "txn.c"), f"-I{cfg('--includedir')}",
                        f"-L{cfg('--libdir')}", "-lpq", "-lpthread"], capture_output=True, text=True)
    return exe if p.returncode == 0 else None
