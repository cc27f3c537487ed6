"""handwritten section: idem with idem_maintain() against the dedup table
users write by hand with a DELETE job, until both reach their steady size:
throughput, latency (during the cleanups too), WAL per claim, size. The
method is bench/README.md's ("handwritten")."""
import bisect
import os
import re
import subprocess
import time

import measure

from . import common

DB = "bench_hw"
APPROACHES = {
    # name -> (pgbench script, cleanup statement (ttl in seconds), what)
    "handwritten": ("hw_claim.sql", "WITH d AS (DELETE FROM hw_dedup WHERE created_at < now() - "
                    "make_interval(secs => {ttl}) RETURNING 1) SELECT count(*) FROM d",
                    "INSERT … ON CONFLICT DO NOTHING RETURNING; DELETE job"),
    "idem": ("hw_idem.sql", "SELECT idem_maintain()", "idem_claim; idem_maintain() job"),
}
TARGET_TPS = 1.2
TARGET_P99 = 0.5
TARGET_P99_OWN = 1.5   # idem during its own cleanup vs its whole run

PROFILES = {
    "smoke": dict(hw_ttl=3, hw_interval=1, hw_seconds=6, hw_clients=2, hw_rounds=1),
    "default": dict(hw_ttl=60, hw_interval=5, hw_seconds=300, hw_clients=2, hw_rounds=1),
    "full": dict(hw_ttl=60, hw_interval=5, hw_seconds=600, hw_clients=2, hw_rounds=2),
}
OPTIONS = [("--hw-ttl", "hw_ttl", int, "handwritten section: TTL in seconds (60)"),
           ("--hw-interval", "hw_interval", int, "handwritten section: seconds between cleanups (5)"),
           ("--hw-seconds", "hw_seconds", int, "handwritten section: length of each run (300)"),
           ("--hw-rounds", "hw_rounds", int, "handwritten section: runs per approach (1)")]


def estimate(p, rates):
    return 20 + p["hw_rounds"] * len(APPROACHES) * (p["hw_seconds"] + 15)


def store_size(b, approach):
    """Rows, live rows, heap/index/total bytes of the approach's store, and
    its autovacuum count."""
    if approach == "handwritten":
        rels = "SELECT 'hw_dedup'::regclass"
        counts = f"SELECT count(*), count(*) FILTER (WHERE created_at >= now() - make_interval(secs => {b.p['hw_ttl']})) FROM hw_dedup"
    else:
        rels = "SELECT relid FROM pg_partition_tree('idem.claims') WHERE isleaf"
        counts = "SELECT count(*), count(*) FILTER (WHERE expires_at > now()) FROM idem.claims"
    row = b.val(DB, f"""
        SELECT 0, coalesce(sum(pg_relation_size(c.oid)), 0), coalesce(sum(pg_indexes_size(c.oid)), 0),
               coalesce(sum(pg_total_relation_size(c.oid)), 0), count(*),
               coalesce(sum(s.autovacuum_count), 0)
          FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
         WHERE c.oid IN ({rels})""").split("|")
    rows, live = [int(x) for x in b.val(DB, counts).split("|")]
    return {"rows": rows, "live": live, "heap": int(row[1]), "indexes": int(row[2]),
            "total": int(row[3]), "relations": int(row[4]), "autovacuums": int(row[5])}


def reset(b):
    b.psql(DB, "TRUNCATE orders, hw_dedup; TRUNCATE idem.claims")
    common.maintain_fully(b, DB)
    b.psql(DB, "VACUUM ANALYZE orders, hw_dedup, idem.claims; CHECKPOINT")


def one_run(b, approach, rnd):
    p = b.p
    ttl, every, secs, c = p["hw_ttl"], p["hw_interval"], p["hw_seconds"], p["hw_clients"]
    script, cleanup_sql, _ = APPROACHES[approach]
    cleanup_sql = cleanup_sql.format(ttl=ttl)
    size_sql = ("SELECT pg_total_relation_size('hw_dedup')" if approach == "handwritten" else
                "SELECT coalesce(sum(pg_total_relation_size(relid)), 0) FROM "
                "pg_partition_tree('idem.claims') WHERE isleaf")
    b.wait_quiet()
    reset(b)
    av0 = store_size(b, approach)["autovacuums"]
    prefix = f"hw-{approach}-r{rnd}"
    b.drop_logs(prefix)
    run = b.next_run()
    cmd = b.pgbench_cmd(DB, script, c, run) + ["-T", str(secs), "--log", "--log-prefix", prefix, DB]
    env = dict(os.environ, PGOPTIONS="-c synchronous_commit=off")
    l0 = b.val(DB, "SELECT pg_current_wal_insert_lsn()")
    snap0 = b.meter.snap()
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=b.logs, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    cleanups = []
    seen = set()
    k = 1
    while True:
        nxt = t0 + k * every
        while proc.poll() is None and time.time() < nxt:
            time.sleep(min(0.05, max(0.0, nxt - time.time())))
        if proc.poll() is not None:
            break
        # one session per run of the job, as cron's psql or pg_cron would
        out = b.psql(DB, "SELECT extract(epoch FROM clock_timestamp());\n" + cleanup_sql + ";\n"
                     "SELECT extract(epoch FROM clock_timestamp());\n" + size_sql + ";").splitlines()
        start, body, end, size = float(out[0]), out[1:-2], float(out[-2]), int(out[-1])
        cleanups.append({"start": start, "end": end, "ms": (end - start) * 1000,
                         "t": start - t0, "size_after": size, "output": " ".join(body)[:300]})
        # a build that starts and ends within the run escapes the CPU meter's
        # two snapshots: look for compilers at every cleanup too
        seen.update(common_noise(b).get("foreign", []))
        k += 1
    out, _ = proc.communicate()
    l1 = b.val(DB, "SELECT pg_current_wal_insert_lsn()")
    foreign = round(b.meter.foreign(snap0, b.meter.snap()), 3)
    with open(os.path.join(b.logs, f"run{run:05d}-{prefix}.log"), "w") as f:
        f.write(" ".join(cmd) + "\n" + out)
    tps = re.search(r"^tps = ([\d.]+) \(without initial connection time\)", out, re.M)
    done = re.search(r"number of transactions actually processed: (\d+)", out)
    failed = re.search(r"number of failed transactions: (\d+)", out)
    if proc.returncode != 0 or not tps or (failed and int(failed.group(1)) > 0):
        raise common.BenchError(f"pgbench {script} ({prefix}) failed (exit {proc.returncode}):\n{out[-1500:]}")
    wal = int(b.val(DB, f"SELECT '{l1}'::pg_lsn - '{l0}'::pg_lsn"))
    time.sleep(1.0)   # the backends' last statistics reach the shared counters
    end = store_size(b, approach)
    end["autovacuums"] -= av0
    txns = common.read_txn_log(b, prefix)
    res = analyse(txns, cleanups, t0, ttl)
    claims = int(done.group(1)) if done else len(txns)
    res.update(approach=approach, round=rnd, clients=c, seconds=secs, ttl=ttl, interval=every,
               pgbench_tps=float(tps.group(1)), claims=claims, wal_bytes=wal,
               wal_per_claim=wal / claims if claims else None, end=end, cleanups=cleanups,
               foreign_cores=foreign, run=run)
    res.update(common_noise(b))
    if seen:
        res["foreign"] = sorted(seen | set(res.get("foreign", [])))
    return res


def common_noise(b):
    return measure.noise()


def analyse(txns, cleanups, t0, ttl):
    """Throughput and latency from the per-transaction log: overall, over
    the steady part (after two TTLs: both stores full and cleaning up), and
    the transactions that overlap a cleanup (start <= cleanup end and end >=
    cleanup start)."""
    if not txns:
        return {}
    lats = [lat for _, lat in txns]
    t_last = txns[-1][0]
    warm = t0 + min(2 * ttl, (t_last - t0) / 2)
    steady = [lat for end, lat in txns if end >= warm]
    starts = [cl["start"] for cl in cleanups]
    during = []
    for end, lat in txns:
        i = bisect.bisect_right(starts, end) - 1
        if i >= 0 and cleanups[i]["end"] >= end - lat / 1e6:
            during.append(lat)
    steady_during = []
    for end, lat in txns:
        if end < warm:
            continue
        i = bisect.bisect_right(starts, end) - 1
        if i >= 0 and cleanups[i]["end"] >= end - lat / 1e6:
            steady_during.append(lat)
    # TPS per TTL-long window, to see the steady state come
    windows = []
    w0 = t0
    while w0 < t_last:
        n = sum(1 for end, _ in txns if w0 <= end < w0 + ttl)
        span = min(ttl, t_last - w0)
        if span > 0.5 * ttl:
            windows.append(round(n / span, 1))
        w0 += ttl
    return {"txns_logged": len(txns), "tps_overall": len(txns) / max(1e-3, t_last - t0),
            "tps_steady": len(steady) / max(1e-3, t_last - warm), "steady_from_s": warm - t0,
            "p50_ms": measure.pct(lats, 50), "p99_ms": measure.pct(lats, 99),
            "p999_ms": measure.pct(lats, 99.9), "max_ms": max(lats) / 1000,
            "steady_p99_ms": measure.pct(steady, 99),
            "during_txns": len(during), "during_p99_ms": measure.pct(during, 99),
            "during_max_ms": max(during) / 1000 if during else None,
            "steady_during_p99_ms": measure.pct(steady_during, 99),
            "tps_per_ttl_window": windows}


def run(b):
    p = b.p
    raw = b.raw["handwritten"] = {"runs": [], "settings": {}}
    ttl = p["hw_ttl"]
    settings = {"idem.default_ttl": f"{ttl} seconds", "idem.partition_width": f"{ttl} seconds"}
    raw["settings"] = settings
    common.create_db(b, DB, settings, f"SELECT idem_configure('hw', '{ttl} seconds')")
    names = list(APPROACHES)
    for rnd in range(p["hw_rounds"]):
        order = names if rnd % 2 == 0 else names[::-1]
        for approach in order:
            b.log(f"handwritten round {rnd}: {approach}, {p['hw_clients']} clients, {p['hw_seconds']} s, "
                  f"TTL {ttl} s, cleanup every {p['hw_interval']} s")
            res = one_run(b, approach, rnd)
            raw["runs"].append(res)
            cl = res["cleanups"]
            b.log(f"handwritten {approach}: {res['tps_steady']:.0f} TPS steady ({res['tps_overall']:.0f} "
                  f"overall), p99 {res['p99_ms']:.2f} ms, p99 during cleanup "
                  f"{res['during_p99_ms'] or 0:.2f} ms ({res['during_txns']} txns in {len(cl)} cleanups, "
                  f"median {common.median([x['ms'] for x in cl]) or 0:.0f} ms), "
                  f"{res['wal_per_claim']:.0f} WAL B/claim, {res['end']['total'] / 1048576:.1f} MiB at the end")
            b.save()
    b.psql("postgres", f"DROP DATABASE {DB} WITH (FORCE)")


# ---- report ------------------------------------------------------------------
def report(R):
    raw = R.raw.get("handwritten") or {}
    runs = raw.get("runs") or []
    if not runs:
        return
    by = {}
    for x in runs:
        by.setdefault(x["approach"], []).append(x)
        for metric, unit in (("tps_steady", "tx/s"), ("tps_overall", "tx/s"), ("p50_ms", "ms"),
                             ("p99_ms", "ms"), ("during_p99_ms", "ms"), ("wal_per_claim", "B"),
                             ("end_total", "B")):
            v = x["end"]["total"] if metric == "end_total" else x.get(metric)
            R.csv.append(("handwritten", x["approach"], "off", x["clients"], x["round"], metric, v, unit))
    m = lambda a, f: common.median([f(x) for x in by.get(a, [])])
    x0 = runs[0]
    lines = ["## Hand-written dedup table with a DELETE job vs idem (handwritten section)", "",
             f"TTL {x0['ttl']} s, cleanup every {x0['interval']} s, {x0['clients']} clients, {x0['seconds']} s "
             f"per run; medians over {len(by.get('idem', []))} run(s) per approach (method: "
             "bench/README.md, handwritten).", "",
             "| approach | TPS steady | TPS overall | p50 ms | p99 ms | p99 during cleanup ms "
             "(txns) | cleanup ms (median, max) | WAL B/claim | store at end: rows (live) | heap+index "
             "MiB | autovacuums |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for a in APPROACHES:
        if a not in by:
            continue
        last = by[a][-1]
        cms = [c["ms"] for x in by[a] for c in x["cleanups"]]
        lines.append("| " + " | ".join([
            f"**{a}** ({APPROACHES[a][2]})", f"{m(a, lambda x: x['tps_steady']):,.0f}",
            f"{m(a, lambda x: x['tps_overall']):,.0f}", f"{m(a, lambda x: x['p50_ms']):.2f}",
            f"{m(a, lambda x: x['p99_ms']):.2f}",
            f"{m(a, lambda x: x['during_p99_ms']) or 0:.2f} ({m(a, lambda x: x['during_txns']):,.0f})",
            f"{common.median(cms) or 0:.1f}, {max(cms) if cms else 0:.1f}",
            f"{m(a, lambda x: x['wal_per_claim']):,.0f}",
            f"{last['end']['rows']:,} ({last['end']['live']:,})",
            f"{(last['end']['heap'] + last['end']['indexes']) / 1048576:.1f}",
            f"{last['end']['autovacuums']}"]) + " |")
    noisy = [f"{x['approach']} round {x['round']} ({', '.join(x['foreign'])})" for x in runs if x.get("foreign")]
    if noisy:
        lines += ["", "> **Noise:** a compiler or test run shared the machine during " + "; ".join(noisy)
                  + ": those numbers are suspect."]
    lines.append("")
    lines.append("TPS per TTL-long window (steady state when flat): " + "; ".join(
        f"{a}: " + " ".join(f"{w:,.0f}" for w in by[a][-1].get("tps_per_ttl_window", []))
        for a in APPROACHES if a in by))
    lines.append("")
    R.md += lines
    hw, idem = by.get("handwritten"), by.get("idem")
    if hw and idem:
        r_tps = m("idem", lambda x: x["tps_steady"]) / m("handwritten", lambda x: x["tps_steady"])
        hp, ip = m("handwritten", lambda x: x["during_p99_ms"]), m("idem", lambda x: x["during_p99_ms"])
        R.summary["handwritten"] = {"tps_ratio": r_tps, "p99_during_ratio": ip / hp if hp and ip else None}
        R.target("hw_tps", f"handwritten: idem sustained throughput ≥ {TARGET_TPS} × hand-written table "
                 f"with a DELETE job (TTL {x0['ttl']} s)", f"{r_tps:.2f} (steady TPS, medians)",
                 r_tps >= TARGET_TPS)
        R.target("hw_p99", f"handwritten: idem p99 during cleanup ≤ {TARGET_P99} × hand-written's",
                 f"{ip:.2f} ms vs {hp:.2f} ms = {ip / hp:.2f}" if hp and ip else "not measured",
                 (ip / hp <= TARGET_P99) if hp and ip else None)
        # (does idem_maintain() slow the claims beside it: against idem's own run)
        ia = m("idem", lambda x: x["p99_ms"])
        R.target("clean_p99", f"Claim p99 during idem_maintain() ≤ {TARGET_P99_OWN} × the claims' p99 over "
                 "the whole run (handwritten section, idem)",
                 f"{ip:.2f} ms vs {ia:.2f} ms = {ip / ia:.2f}" if ia and ip else "not measured",
                 (ip / ia <= TARGET_P99_OWN) if ia and ip else None)
