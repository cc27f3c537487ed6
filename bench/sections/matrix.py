"""matrix section: TPS of every variant, interleaved, per synchronous_commit
and client count. Each round runs every variant once, in an order that
rotates from round to round, each run after the same reset and CHECKPOINT."""
from variants import MATRIX_VARIANTS

from .common import rotated


def run(b):
    p = b.p
    db = "bench"
    variants = list(MATRIX_VARIANTS)
    if b.redis_driver:
        variants[4:4] = ["B3", "B0c"]
    if p.get("matrix_variants"):
        variants = [v for v in variants if v in p["matrix_variants"]]
    configs = [(s, c) for s in p["sync"] for c in p["clients"]]
    total = len(configs) * p["rounds"] * len(variants)
    k = 0
    for sync, clients in configs:
        for r in range(p["rounds"]):
            for pos, v in enumerate(rotated(variants, r, p["rounds"])):
                k += 1
                res = b.measured(
                    lambda: b.reset_main(db, p["prefill"], checkpoint=True),
                    lambda: b.run_variant(db, v, clients, sync, p["duration"], p["prefill"]))
                res.update(section="matrix", variant=v, sync=sync, clients=clients,
                           round=r, position=pos)
                b.raw["runs"].append(res)
                b.log(f"matrix {k}/{total}: sync={sync} c={clients} round={r} "
                      f"{v:4s} tps={res['tps']:9.1f}")
            b.save()
