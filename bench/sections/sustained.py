"""sustained section: each variant for a long run on one growing table, TPS
per window (pgbench -P), and what its dedup store looks like at the end."""
import os
import re
import subprocess
import time

from measure import noise
from variants import STORE, VARIANTS

from .common import BenchError


def store_stats(b, db, v):
    """Size and tuple counts of the table variant v writes (all leaf
    partitions for idem.claims)."""
    store = STORE.get(v, "orders")
    rels = ("SELECT relid FROM pg_partition_tree('idem.claims') WHERE isleaf"
            if store == "idem.claims" else f"SELECT '{store}'::regclass")
    row = b.val(db, f"""
        SELECT (SELECT count(*) FROM {store}),
               coalesce(sum(pg_relation_size(c.oid)), 0), coalesce(sum(pg_indexes_size(c.oid)), 0),
               coalesce(sum(s.n_live_tup), 0), coalesce(sum(s.n_dead_tup), 0),
               coalesce(sum(s.autovacuum_count), 0), coalesce(sum(s.autoanalyze_count), 0),
               coalesce(sum(s.n_tup_hot_upd), 0), coalesce(sum(s.n_tup_upd), 0)
          FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
         WHERE c.oid IN ({rels})""")
    keys = ("rows", "heap", "indexes", "n_live_tup", "n_dead_tup", "autovacuums",
            "autoanalyzes", "hot_updates", "updates")
    return dict(zip(keys, (int(x) for x in row.split("|"))), store=store)


def run(b):
    """Each variant for sustained_seconds on one growing table: no
    CHECKPOINT or VACUUM during the run (autovacuum as configured); TPS
    per window from pgbench -P."""
    p = b.p
    db = "bench"
    secs, win, c = p["sustained_seconds"], p["sustained_window"], p["sustained_clients"]
    for i, v in enumerate(p["sustained_variants"]):
        b.wait_quiet()
        b.reset_main(db, p["prefill"], checkpoint=True)
        # (not pg_stat_reset(): autovacuum schedules from those counters)
        st0 = store_stats(b, db, v)
        run = b.next_run()
        # pgbench prints no progress line for the interval that ends with
        # the run: run a second longer and keep the full windows only.
        cmd = b.pgbench_cmd(db, VARIANTS[v][1], c, run, p["prefill"]) + \
            ["-T", str(secs + 1), "-P", str(win), db]
        env = dict(os.environ, PGOPTIONS="-c synchronous_commit=off")
        logf = os.path.join(b.logs, f"run{run:05d}-sustained-{v}.log")
        b.log(f"sustained {i + 1}/{len(p['sustained_variants'])}: {v}, {c} clients, "
              f"{secs} s, windows of {win} s")
        with open(logf, "w") as fh:
            fh.write(" ".join(cmd) + "\n")
            fh.flush()
            t0 = time.time()
            snaps = [b.meter.snap()]
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=b.logs)
            while proc.poll() is None:
                nxt = t0 + len(snaps) * win
                time.sleep(max(0.05, min(0.5, nxt - time.time())))
                if time.time() >= nxt and len(snaps) <= secs // win:
                    snaps.append(b.meter.snap())
        with open(logf) as fh:
            out = fh.read()
        windows = []
        for m in re.finditer(r"^progress: ([\d.]+) s, ([\d.]+) tps, lat ([\d.]+) ms", out, re.M):
            t, tps, lat = float(m.group(1)), float(m.group(2)), float(m.group(3))
            if t <= secs + 0.5:
                windows.append({"end_s": t, "tps": tps, "lat_ms": lat})
        for j, w in enumerate(windows):
            if j + 1 < len(snaps):
                w["foreign_cores"] = round(b.meter.foreign(snaps[j], snaps[j + 1]), 3)
        failed = re.search(r"number of failed transactions: (\d+)", out)
        tps = re.search(r"^tps = ([\d.]+) \(without initial connection time\)", out, re.M)
        if proc.returncode != 0 or not tps or (failed and int(failed.group(1)) > 0) or not windows:
            raise BenchError(f"pgbench sustained {v} failed (exit {proc.returncode}):\n{out[-1500:]}")
        time.sleep(1.0)   # the backends' last statistics reach the shared counters
        st = store_stats(b, db, v)
        for k in ("autovacuums", "autoanalyzes", "hot_updates", "updates"):
            st[k] -= st0[k]
        res = {"variant": v, "clients": c, "sync": "off", "seconds": secs, "window": win,
               "tps": float(tps.group(1)), "windows": windows, "end": st, "run": run}
        res.update(noise())
        b.raw["sustained"].append(res)
        first, last = windows[0]["tps"], windows[-1]["tps"]
        b.log(f"sustained {v}: " + " ".join(f"{w['tps']:.0f}" for w in windows)
              + f" TPS per window (last/first {last / first:.2f}); {st['store']}: "
                   f"{st['rows']} rows, {st['n_dead_tup']} dead, {st['autovacuums']} autovacuums")
        b.save()
