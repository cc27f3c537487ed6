"""matrix: TPS of every variant per synchronous_commit and client count, in
interleaved rounds (each round runs every variant once, in an order that
rotates from round to round, each run after the same reset and CHECKPOINT),
and the latency of every transaction of the runs at `latency_clients`."""
import collections

import lib
from lib import ORDER, VARIANTS, fmt, fmt_ratio, median, table

PARAMS = {
    "duration": (1, 4, 5, "seconds per run"),
    "rounds": (1, 3, 5, "rounds per (sync, clients)"),
    "clients": ([2], [1, 2, 4], [1, 2, 4], "client counts"),
    "sync": (["off"], ["off", "on"], ["off", "on"], "synchronous_commit values"),
    "matrix_variants": ([], [], [], "only these variants (empty: all; B3, B0c, I1t need redis)"),
    "latency_clients": (2, 2, 2, "client count whose runs log every transaction's latency"),
}
VARIANTS_RUN = ["B0", "B1", "B1r", "B2", "B3", "B0c", "I1t", "I1", "I1c", "I1f", "I2", "I3"]
# (numerator, denominator, target, what)
RATIOS = [("I1c", "B1", 1.0, "new-key claim, recommended form `SELECT claimed FROM idem_claim(…)`"),
          ("I1", "B1", 0.95, "new-key claim, plain form `SELECT idem_claim(…)`"),
          ("I1f", "B1", None, "new-key claim, `SELECT (idem_claim(…)).claimed`"),
          ("I2", "B1r", 1.0, "claim + stored result vs ON CONFLICT + UPDATE"),
          ("I3", "I1", 2.0, "duplicate vs new-key claim"),
          ("I1t", "B3", 1.0, "idem vs Redis SET NX + PostgreSQL, one client program (bench/txn.c); floor: performance.md")]


def variants(p, redis):
    vs = [v for v in VARIANTS_RUN if redis or VARIANTS[v][0] != "txn"]
    return [v for v in vs if v in p["matrix_variants"]] if p["matrix_variants"] else vs


def estimate(p):
    return len(p["sync"]) * len(p["clients"]) * p["rounds"] * len(variants(p, True)) * (p["duration"] + 1.5)


def run(b):
    p = b.p
    vs = variants(p, b.redis)
    runs, hist = b.raw.setdefault("matrix", []), b.raw.setdefault("latency", {})
    configs = [(s, c) for s in p["sync"] for c in p["clients"]]
    k, total = 0, len(configs) * p["rounds"] * len(vs)
    for sync, clients in configs:
        for r in range(p["rounds"]):
            for pos, v in enumerate(lib.rotated(vs, r, p["rounds"])):
                k += 1
                log = f"lat-{sync}-{v}-r{r}" if clients == p["latency_clients"] and VARIANTS[v][0] == "pgbench" else None
                res = b.measured(lambda: b.reset_main("bench", p["prefill"], checkpoint=True),
                                 lambda: b.run_variant("bench", v, clients, sync, p["duration"], p["prefill"], log))
                if log:
                    lats = [lat for _, lat in b.read_txn_log(log)]
                    h = hist.setdefault(f"{sync}/{v}", {})
                    for x in lats:
                        h[x] = h.get(x, 0) + 1
                    res.update(lib.hist_stats(collections.Counter(lats)))
                res.update(variant=v, sync=sync, clients=clients, round=r, position=pos)
                runs.append(res)
                b.log(f"matrix {k}/{total}: sync={sync} c={clients} round={r} {v:4s} tps={res['tps']:9.1f}"
                      + (f" p99={res['p99']:.3f} ms" if log else ""))
            b.save()


def report(R):
    runs = R.raw.get("matrix") or []
    if not runs:
        return
    p = R.meta["params"]
    syncs = list(dict.fromkeys(r["sync"] for r in runs))
    clients = sorted(set(r["clients"] for r in runs))
    vs = [v for v in ORDER if any(r["variant"] == v for r in runs)]
    cell = lambda s, c, v: [r["tps"] for r in runs if (r["sync"], r["clients"], r["variant"]) == (s, c, v)]
    summ, ratios = {}, {}
    R.md += ["## Throughput (TPS), interleaved", "",
             f"{p['rounds']} round(s) × {p['duration']} s per variant and configuration; median TPS, ratios of "
             "medians to B0 and B1 (bench/txn.c's B3 and I1t over its B0c), min–max over rounds; "
             + (f"steady state of {p['steady']:,} aged claims" if p["steady"] else "fresh tables") + ".", ""]
    for s in syncs:
        rows = []
        for v in vs:
            row = [f"**{v}** {VARIANTS[v][2]}"]
            for c in clients:
                xs = cell(s, c, v)
                m, b0, b1, b0c = median(xs), median(cell(s, c, "B0")), median(cell(s, c, "B1")), median(cell(s, c, "B0c"))
                base = b0c if VARIANTS[v][0] == "txn" and v != "B0c" else b0   # txn.c's runs over its own B0c
                x0 = m / base if m and base else None
                x1 = x0 * b0 / b1 if x0 and b0 and b1 and v != "B0c" else None
                if xs:
                    summ.setdefault(f"{s}/{c}", {})[v] = {"median": m, "min": min(xs), "max": max(xs), "x_b0": x0, "x_b1": x1}
                row += [fmt(m), fmt(x0, 2), fmt(x1, 2), f"{min(xs):,.0f}–{max(xs):,.0f}" if xs else "—"]
            rows.append(row)
        R.md += [f"### synchronous_commit = {s}", ""] + table(
            ["variant"] + [h for c in clients for h in (f"c={c} TPS", "×B0", "×B1", "range")], rows)
    cfgs = [(s, c) for s in syncs for c in clients]
    rows = []
    for num, den, goal, what in RATIOS:
        row = [f"**{num}/{den}** {what}", f"≥ {goal:.2f}" if goal else "—"]
        for s, c in cfgs:
            r = lib.ratio([x for x in runs if x["sync"] == s and x["clients"] == c], num, den)
            if r[0] is not None:
                ratios.setdefault(f"{num}/{den}", {})[f"{s}/{c}"] = {"ratio": r[0], "round_min": r[1], "round_max": r[2]}
            row.append(fmt_ratio(r))
        rows.append(row)
    R.md += ["### Ratios", "", "Ratio of median TPS; in brackets the range of the same-round ratios.", ""] + \
        table(["ratio", "target"] + [f"{s}, {c} cl." for s, c in cfgs], rows)
    R.summary.update(matrix=summ, ratios=ratios)
    for num, den, goal, what in RATIOS:
        d = ratios.get(f"{num}/{den}")
        if goal and d:
            miss = [cfg for cfg, x in d.items() if x["ratio"] < goal]
            partial = "" if len(d) >= 6 else " [not every configuration measured]"
            R.target(f"{num}/{den} ≥ {goal} ({what}), 1/2/4 clients, sync off and on{partial}",
                     "; ".join(f"{cfg.replace('/', ' ')}: {x['ratio']:.2f}" for cfg, x in d.items())
                     + (f" — below at {', '.join(m.replace('/', ' ') for m in miss)}" if miss else ""), not miss)
    for r in runs:
        R.csv.append(("matrix", r["variant"], r["sync"], r["clients"], r["round"], "tps", r["tps"], "tx/s"))
    # latency: exact percentiles over every logged transaction of all rounds
    hist = R.raw.get("latency") or {}
    if not hist:
        return
    rows, out = [], {}
    for key, h in hist.items():
        s, v = key.split("/")
        st = lib.hist_stats({int(k): n for k, n in h.items()})
        out[key] = st
        rr = [x["p99"] for x in runs if x["sync"] == s and x["variant"] == v and x.get("p99") is not None]
        rows.append([s, f"**{v}** {VARIANTS[v][2]}", f"{st['txns']:,}", fmt(st["p50"], 3), fmt(st["p99"], 3),
                     fmt(st["p99.9"], 3), fmt(st["max_ms"], 1), f"{min(rr):.3f}–{max(rr):.3f}" if rr else "—"])
        for q in ("p50", "p99"):
            R.csv.append(("latency", v, s, p["latency_clients"], "all", q, st[q], "ms"))
    R.md += ["## Latency per transaction", "", f"The matrix's runs at {p['latency_clients']} clients: exact "
             "percentiles over every logged transaction of all rounds (BEGIN to END as the client sees it).", ""] + \
        table(["sync", "variant", "transactions", "p50 ms", "p99 ms", "p99.9 ms", "max ms", "per-round p99 ms"], rows)
    R.summary["latency"] = out
    want = ["I1", "I1c", "I2", "I3", "B1", "B1r"]
    s0 = "off" if any(k.startswith("off/") for k in out) else syncs[0]
    have = {v: out.get(f"{s0}/{v}") for v in want if out.get(f"{s0}/{v}")}
    missing = [v for v in want if v not in have]
    R.target(f"latency: p50/p99 ms of I1, I1c, I2, I3 next to B1, B1r at {p['latency_clients']} clients (sync {s0}; "
             "reported)", "; ".join(f"{v} {d['p50']:.3f}/{d['p99']:.3f}" for v, d in have.items())
             + (f" — missing {', '.join(missing)}" if missing else ""), not missing)
