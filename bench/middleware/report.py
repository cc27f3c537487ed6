"""The tables of bench/middleware.sh from its results.jsonl (one line per
measured run: server, variant, round, the load client's JSON, the CPU
snapshots of cpu.py around it), as markdown on stdout. Medians over rounds;
ratios of medians with the same-round range; µs per request = 1/rps (with N
connections in flight, the machine's time per request, not a latency).

    python3 bench/middleware/report.py results.jsonl --meta key=value ..."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lib import fmt_ratio, median, ratio, table  # noqa: E402

NAMES = {"a": "a: middleware, new key", "b": "b: middleware, replay", "c": "c: hand-written dedup",
         "d": "d: no idempotency"}
SERVERS = {"python": "Python: FastAPI + uvicorn (1 worker), idem-http", "django": "Python: Django (runserver), idem-http",
           "node": "Node: Express 5, idem-pg", "fastify": "Node: Fastify 5, idem-pg",
           "java": "Java: Spring MVC filter (clients/java conformance server)"}


def main():
    meta = dict(m.split("=", 1) for m in sys.argv[sys.argv.index("--meta") + 1:]) if "--meta" in sys.argv else {}
    runs = []
    with open(sys.argv[1]) as f:
        for line in f:
            r = json.loads(line)
            res, b, a = r["result"], r.get("cpu_before"), r.get("cpu_after")
            run = {"server": r["server"], "variant": r["variant"], "round": r["round"], "tps": res["rps"],
                   "p50": res["p50_us"] / 1000, "p99": res["p99_us"] / 1000}
            if b:
                us = 1e6 / b["hz"] / res["requests"]   # µs per tick per request
                d = {k: (a[k] - b[k]) * us for k in ("server", "postgres", "machine_busy")}
                client = res["client_cpu_s"] * 1e6 / res["requests"]
                run.update(cpu_server=d["server"], cpu_postgres=d["postgres"], cpu_client=client,
                           cpu_others=max(0.0, d["machine_busy"] - d["server"] - d["postgres"] - client),
                           cpu_busy=d["machine_busy"], cpu_own=d["server"] + d["postgres"],
                           busy_share=(a["machine_busy"] - b["machine_busy"]) / max(1, a["machine_total"] - b["machine_total"]))
            runs.append(run)
    print("# Middleware: requests per second\n")
    for k in ("date", "command", "machine", "load_start", "load_end", "postgres", "python", "node", "setup"):
        if meta.get(k):
            print(f"- {k.replace('_', ' ')}: {meta[k]}")
    summary = []
    for server, title in SERVERS.items():
        rs = [r for r in runs if r["server"] == server]
        if not rs:
            continue
        med = lambda v, k: median([r.get(k) for r in rs if r["variant"] == v])
        vs = [v for v in NAMES if med(v, "tps")]
        us = {v: 1e6 / med(v, "tps") for v in vs}
        print(f"\n## {title}\n")
        print("\n".join(table(["variant", "req/s (median)", "min-max", "p50 / p99 ms", "µs per request", "vs c", "vs d"], [
            [NAMES[v], f"{med(v, 'tps'):.0f}", "–".join(f"{f(r['tps'] for r in rs if r['variant'] == v):.0f}" for f in (min, max)),
             f"{med(v, 'p50'):.1f} / {med(v, 'p99'):.1f}", f"{us[v]:.0f}"] +
            [f"{us[v] - us[o]:+.0f} µs" if o in us and o != v else "" for o in ("c", "d")] for v in vs])))
        if "cpu_own" in rs[0]:
            print("CPU time per request (µs, median over rounds, from /proc; other programs: the rest of the machine "
                  "meanwhile):\n")
            print("\n".join(table(["variant", "server", "PostgreSQL", "load client", "other programs", "machine busy"], [
                [v] + [f"{med(v, k):.0f}" for k in ("cpu_server", "cpu_postgres", "cpu_client", "cpu_others")] +
                [f"{med(v, 'cpu_busy'):.0f} ({100 * med(v, 'busy_share'):.0f} %)"] for v in vs])))
        for v in ("a", "b"):
            if v in vs and "c" in vs:
                r = ratio(rs, v, "c")
                summary.append(f"{server}: ({v})/(c) = {fmt_ratio(r)} by requests/s" +
                               (f", target ≥ 0.9: {'PASS' if r[0] >= 0.9 else 'MISS'}" if v == "a" else ""))
                if "cpu_own" in rs[0]:
                    summary.append(f"{server}: CPU of server + PostgreSQL per request, (c)/({v}) = "
                                   f"{med('c', 'cpu_own') / med(v, 'cpu_own'):.2f} ({med(v, 'cpu_own'):.0f} µs vs "
                                   f"{med('c', 'cpu_own'):.0f} µs): ({v})/(c) where these two are the bottleneck")
        if "d" in vs and "c" in vs:
            summary.append(f"{server}: (c)/(d) = {med('c', 'tps') / med('d', 'tps'):.2f}, (a)/(d) = "
                           f"{med('a', 'tps') / med('d', 'tps'):.2f}")
    print("## Ratios\n")
    print("\n".join(f"- {line}" for line in summary))


if __name__ == "__main__":
    main()
