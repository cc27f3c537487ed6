"""latency section: p50/p99 of a whole transaction at 2 clients, computed
exactly from pgbench's per-transaction logs, in interleaved rounds like the
matrix."""
from measure import hist_stats, lat_stats
from variants import LATENCY_VARIANTS, VARIANTS

from .common import read_txn_log, rotated


def run(b):
    """p50/p99 of a whole transaction at 2 clients, computed exactly from
    pgbench's per-transaction logs; interleaved rounds like the matrix."""
    p = b.p
    db = "bench"
    variants = list(LATENCY_VARIANTS)
    c = p["latency_clients"]
    hist = {}
    total = len(p["latency_sync"]) * p["latency_rounds"] * len(variants)
    k = 0
    for sync in p["latency_sync"]:
        for r in range(p["latency_rounds"]):
            for v in rotated(variants, r, p["latency_rounds"]):
                k += 1
                tag = f"lat-{sync}-{v}-r{r}"
                res = b.measured(
                    lambda: b.reset_main(db, p["prefill"], checkpoint=True),
                    lambda: b.pgbench(db, VARIANTS[v][1], c, sync, duration=p["latency_duration"],
                                      prefill=p["prefill"], log_prefix=tag, tag=tag))
                lats = [lat for _, lat in read_txn_log(b, tag)]
                h = hist.setdefault((sync, v), {})
                for x in lats:
                    h[x] = h.get(x, 0) + 1
                res.update(section="latency", variant=v, sync=sync, clients=c, round=r,
                           logged=len(lats), **lat_stats(lats))
                b.raw["latency"].append(res)
                b.log(f"latency {k}/{total}: sync={sync} c={c} round={r} {v:4s} "
                      f"p50={res['p50_ms']:.3f} ms p99={res['p99_ms']:.3f} ms "
                      f"({len(lats)} txns)")
            b.save()
    # Over all rounds: exact percentiles of every logged transaction.
    for (sync, v), h in hist.items():
        b.raw["latency_pooled"].append(dict(sync=sync, variant=v, clients=c,
                                            rounds=p["latency_rounds"], **hist_stats(h)))
    b.save()
