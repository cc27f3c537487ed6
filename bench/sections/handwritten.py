"""handwritten: idem with an idem_maintain() job against the dedup table users
write by hand with a DELETE job, until both reach their steady size:
throughput, latency (during the cleanups too), WAL per claim, size."""
import bisect
import time

import lib
from lib import fmt, median, table

PARAMS = {
    "hw_ttl": (2, 60, 60, "TTL in seconds of the handwritten section"),
    "hw_interval": (1, 5, 5, "seconds between its cleanups"),
    "hw_seconds": (2, 300, 600, "length of each of its runs"),
    "hw_rounds": (1, 1, 2, "its runs per approach"),
}
DB = "bench_hw"
# name -> (pgbench script, cleanup statement, what)
APPROACHES = {
    "handwritten": ("hw_claim.sql", "WITH d AS (DELETE FROM hw_dedup WHERE created_at < now() - make_interval(secs => {ttl}) "
                    "RETURNING 1) SELECT count(*) FROM d", "INSERT … ON CONFLICT DO NOTHING RETURNING; DELETE job"),
    "idem": ("hw_idem.sql", "SELECT idem_maintain()", "idem_claim; idem_maintain() job"),
}
TARGET_TPS, TARGET_P99, TARGET_P99_OWN = 1.2, 0.5, 1.5


def estimate(p):
    return 20 + p["hw_rounds"] * 2 * (p["hw_seconds"] + 15)


def one_run(b, approach, rnd):
    p = b.p
    ttl, every = p["hw_ttl"], p["hw_interval"]
    script, cleanup_sql, _ = APPROACHES[approach]
    store = "hw_dedup" if approach == "handwritten" else "idem.claims"
    b.wait_quiet()
    b.psql(DB, "TRUNCATE orders, hw_dedup; TRUNCATE idem.claims")
    b.maintain_fully(DB)
    b.psql(DB, "VACUUM ANALYZE orders, hw_dedup, idem.claims;" + b.ckpt)
    av0, cleanups, seen = b.store(DB, store)["autovacuums"], [], set()

    def cleanup():   # one session per run of the job, as cron's psql or pg_cron would
        out = b.psql(DB, "SELECT extract(epoch FROM clock_timestamp());" + cleanup_sql.format(ttl=ttl) +
                     "; SELECT extract(epoch FROM clock_timestamp());").splitlines()
        cleanups.append({"start": float(out[0]), "end": float(out[-1]), "ms": (float(out[-1]) - float(out[0])) * 1000})
        seen.update(lib.noise().get("foreign", []))   # a build within the run escapes the meter's two snapshots
    prefix = f"hw-{approach}-r{rnd}"
    l0, snap0, t0 = b.val(DB, "SELECT pg_current_wal_insert_lsn()"), b.meter.snap(), time.time()
    res = b.pgbench(DB, script, 2, "off", duration=p["hw_seconds"], log_prefix=prefix, tag=prefix, tick=cleanup,
                    every=every)
    wal = int(b.val(DB, f"SELECT pg_current_wal_insert_lsn() - '{l0}'::pg_lsn"))
    foreign = round(b.meter.foreign(snap0, b.meter.snap()), 3)
    time.sleep(1.0)   # the backends' last statistics reach the shared counters
    end = b.store(DB, store)
    end["autovacuums"] -= av0
    txns = b.read_txn_log(prefix)
    claims = res["txns"] or len(txns)
    out = analyse(txns, cleanups, t0, ttl)
    out.update(approach=approach, round=rnd, pgbench_tps=res["tps"], claims=claims, wal_per_claim=wal / claims,
               end=end, cleanups=cleanups, foreign_cores=foreign, foreign=sorted(seen))
    return out


def analyse(txns, cleanups, t0, ttl):
    """Throughput and latency from the per-transaction log: overall, over the
    steady part (after two TTLs: both stores full and cleaning up), and of the
    transactions that overlap a cleanup (start <= its end, end >= its start)."""
    if not txns:
        return {}
    t_last = txns[-1][0]
    warm = t0 + min(2 * ttl, (t_last - t0) / 2)
    starts = [c["start"] for c in cleanups]
    overlaps = lambda end, lat: (lambda i: i >= 0 and cleanups[i]["end"] >= end - lat / 1e6)(bisect.bisect_right(starts, end) - 1)
    lats = [lat for _, lat in txns]
    during = [lat for end, lat in txns if overlaps(end, lat)]
    windows, w0 = [], t0   # TPS per TTL-long window: flat once steady
    while w0 < t_last:
        span = min(ttl, t_last - w0)
        if span > 0.5 * ttl:
            windows.append(round(sum(1 for end, _ in txns if w0 <= end < w0 + ttl) / span, 1))
        w0 += ttl
    return {"tps_overall": len(txns) / max(1e-3, t_last - t0),
            "tps_steady": sum(1 for end, _ in txns if end >= warm) / max(1e-3, t_last - warm),
            "p50_ms": lib.pct(lats, 50), "p99_ms": lib.pct(lats, 99), "during_txns": len(during),
            "during_p99_ms": lib.pct(during, 99), "tps_per_ttl_window": windows}


def run(b):
    p = b.p
    raw = b.raw["handwritten"] = {"runs": []}
    ttl = p["hw_ttl"]
    # partitions as wide as the TTL, so that maintenance premakes only what it needs
    b.create_db(DB, {"idem.default_ttl": f"{ttl} seconds", "idem.partition_width": f"{ttl} seconds"},
                f"SELECT idem_configure('hw', '{ttl} seconds');")
    for rnd in range(p["hw_rounds"]):
        for approach in list(APPROACHES)[::1 if rnd % 2 == 0 else -1]:
            b.log(f"handwritten round {rnd}: {approach}, {p['hw_seconds']} s, TTL {ttl} s, cleanup every {p['hw_interval']} s")
            res = one_run(b, approach, rnd)
            raw["runs"].append(res)
            b.log(f"handwritten {approach}: {fmt(res.get('tps_steady'))} TPS steady, p99 {fmt(res.get('p99_ms'), 2)} ms, "
                  f"during cleanup {fmt(res.get('during_p99_ms'), 2)} ms, {res['wal_per_claim']:.0f} WAL B/claim")
            b.save()
    b.drop_db(DB)


def report(R):
    runs = (R.raw.get("handwritten") or {}).get("runs") or []
    if not runs:
        return
    by = {a: [x for x in runs if x["approach"] == a] for a in APPROACHES}
    m = lambda a, k: median([x.get(k) for x in by[a]])
    rows = []
    for a, xs in by.items():
        if not xs:
            continue
        cms, e = [c["ms"] for x in xs for c in x["cleanups"]], xs[-1]["end"]
        rows.append([f"**{a}** ({APPROACHES[a][2]})", fmt(m(a, "tps_steady")), fmt(m(a, "tps_overall")), fmt(m(a, "p50_ms"), 2),
                     fmt(m(a, "p99_ms"), 2), f"{fmt(m(a, 'during_p99_ms'), 2)} ({fmt(m(a, 'during_txns'))})",
                     f"{fmt(median(cms), 1)}, {fmt(max(cms, default=None), 1)}", fmt(m(a, "wal_per_claim")), f"{e['rows']:,}",
                     fmt((e["heap"] + e["indexes"]) / 1048576, 1), e["autovacuums"],
                     " ".join(f"{w:,.0f}" for w in xs[-1].get("tps_per_ttl_window", []))])
        for x in xs:
            for k in ("tps_steady", "p99_ms", "during_p99_ms", "wal_per_claim"):
                R.csv.append(("handwritten", a, "off", 2, x["round"], k, x.get(k), ""))
    p = R.meta["params"]
    R.md += ["## Hand-written dedup table with a DELETE job vs idem", "",
             f"TTL {p['hw_ttl']} s, cleanup every {p['hw_interval']} s, 2 clients, {p['hw_seconds']} s per run; medians "
             "over runs; steady = after two TTLs.", ""] + \
        table(["approach", "TPS steady", "TPS overall", "p50 ms", "p99 ms", "p99 during cleanup ms (txns)",
               "cleanup ms (median, max)", "WAL B/claim", "rows at end", "heap+index MiB", "autovacuums",
               "TPS per TTL window"], rows)
    noisy = [f"{x['approach']} round {x['round']} ({', '.join(x['foreign'])})" for x in runs if x.get("foreign")]
    if noisy:
        R.md += ["> **Noise:** a compiler or test run shared the machine during " + "; ".join(noisy), ""]
    if not (by["handwritten"] and by["idem"]):
        return
    r_tps = m("idem", "tps_steady") / m("handwritten", "tps_steady")
    hp, ip, ia = m("handwritten", "during_p99_ms"), m("idem", "during_p99_ms"), m("idem", "p99_ms")
    R.summary["handwritten"] = {"tps_ratio": r_tps, "p99_during_ratio": ip / hp if hp and ip else None}
    R.target(f"handwritten: idem sustained throughput ≥ {TARGET_TPS} × the hand-written table with a DELETE job",
             f"{r_tps:.2f} (steady TPS, medians)", r_tps >= TARGET_TPS)
    R.target(f"handwritten: idem p99 during cleanup ≤ {TARGET_P99} × the hand-written table's",
             f"{fmt(ip, 2)} ms vs {fmt(hp, 2)} ms", ip / hp <= TARGET_P99 if hp and ip else None)
    R.target(f"claim p99 during idem_maintain() ≤ {TARGET_P99_OWN} × the claims' p99 over the whole run",
             f"{fmt(ip, 2)} ms vs {fmt(ia, 2)} ms", ip / ia <= TARGET_P99_OWN if ia and ip else None)
