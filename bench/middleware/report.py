"""The table of bench/middleware.sh, from its results.jsonl (one line per
measured run: server, variant, round, the load client's JSON). Markdown on
stdout. Medians over rounds; ratios are ratios of medians, with the range of
the same-round ratios in brackets; the cost per request is 1/rps in
microseconds (with N connections in flight, the machine's time per request,
not a latency), and its difference with c (hand-written) and d (no
idempotency) is what the middleware adds.

    python3 bench/middleware/report.py results.jsonl --meta key=value ...
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict

NAMES = {
    "a": "a: middleware, new key",
    "b": "b: middleware, replay",
    "c": "c: hand-written dedup",
    "d": "d: no idempotency",
    "e": "e: a without the lock_timeout bound (diagnostic)",
}
SERVERS = {"python": "Python: FastAPI + uvicorn (1 worker), idem-http", "node": "Node: Express 5, idem-pg"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--meta", nargs="*", default=[])
    args = ap.parse_args()
    meta = dict(m.split("=", 1) for m in args.meta)
    rps: dict[str, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    p50: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    p99: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    cpu: dict[str, dict[str, list[dict[str, float]]]] = defaultdict(lambda: defaultdict(list))
    with open(args.results) as f:
        for line in f:
            r = json.loads(line)
            rps[r["server"]][r["variant"]][r["round"]] = r["result"]["rps"]
            p50[r["server"]][r["variant"]].append(r["result"]["p50_us"])
            p99[r["server"]][r["variant"]].append(r["result"]["p99_us"])
            if "cpu_before" in r:
                b, a, n = r["cpu_before"], r["cpu_after"], r["result"]["requests"]
                us = 1e6 / b["hz"] / n  # µs per tick per request
                server, postgres = (a["server"] - b["server"]) * us, (a["postgres"] - b["postgres"]) * us
                client = r["result"]["client_cpu_s"] * 1e6 / n
                busy = (a["machine_busy"] - b["machine_busy"]) * us
                cpu[r["server"]][r["variant"]].append({
                    "server": server, "postgres": postgres, "client": client,
                    "others": max(0.0, busy - server - postgres - client), "busy": busy,
                    "busy_share": (a["machine_busy"] - b["machine_busy"]) / max(1, a["machine_total"] - b["machine_total"]),
                })

    print("# Middleware: requests per second\n")
    for k in ("date", "command", "machine", "load_start", "load_end", "postgres", "python", "node", "setup"):
        if k in meta:
            print(f"- {k.replace('_', ' ')}: {meta[k]}")
    print()
    summary = []
    for server in ("python", "node"):
        if server not in rps:
            continue
        v = rps[server]
        med = {x: statistics.median(v[x].values()) for x in v}
        us = {x: 1e6 / med[x] for x in med}
        print(f"## {SERVERS[server]}\n")
        print("| variant | req/s (median) | min-max | p50 / p99 latency (ms, median) | µs per request | vs c | vs d |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for x in ("a", "b", "c", "d", "e"):
            if x not in v:
                continue
            vals = v[x].values()
            lat = f"{statistics.median(p50[server][x]) / 1000:.1f} / {statistics.median(p99[server][x]) / 1000:.1f}"
            vs_c = f"{us[x] - us['c']:+.0f} µs" if "c" in us and x != "c" else ""
            vs_d = f"{us[x] - us['d']:+.0f} µs" if "d" in us and x != "d" else ""
            print(f"| {NAMES[x]} | {med[x]:.0f} | {min(vals):.0f}-{max(vals):.0f} | {lat} | {us[x]:.0f} | {vs_c} | {vs_d} |")
        print()
        if server in cpu:
            print("CPU time per request (µs, median over rounds; from /proc: the server process, every process of the "
                  "cluster, the load client, and the rest of the machine meanwhile):\n")
            print("| variant | server | PostgreSQL | load client | other programs | machine busy (share of 2 cores) |")
            print("|---|---:|---:|---:|---:|---:|")
            for x in ("a", "b", "c", "d", "e"):
                if x not in cpu[server]:
                    continue
                m = {k: statistics.median(c[k] for c in cpu[server][x]) for k in cpu[server][x][0]}
                print(f"| {x} | {m['server']:.0f} | {m['postgres']:.0f} | {m['client']:.0f} | {m['others']:.0f} "
                      f"| {m['busy']:.0f} ({100 * m['busy_share']:.0f} %) |")
            print()
        for x, target in (("a", 0.9), ("b", None), ("e", None)):
            if x not in v or "c" not in v:
                continue
            ratio = med[x] / med["c"]
            rounds = sorted(set(v[x]) & set(v["c"]))
            per_round = [v[x][r] / v["c"][r] for r in rounds]
            verdict = ""
            if target is not None:
                verdict = f", target ≥ {target}: " + ("PASS" if ratio >= target else f"MISS by {target - ratio:.2f}")
            line = f"{server}: ({x})/(c) = {ratio:.2f} (same-round ratios {min(per_round):.2f}-{max(per_round):.2f}){verdict}"
            summary.append(line)
        own = {x: statistics.median(c["server"] + c["postgres"] for c in cpu[server][x]) for x in cpu.get(server, {})}
        for x in ("a", "b", "e"):
            if x in own and "c" in own:
                summary.append(f"{server}: CPU of server + PostgreSQL per request, (c)/({x}) = {own['c'] / own[x]:.2f} "
                               f"({own[x]:.0f} µs vs {own['c']:.0f} µs): what ({x})/(c) would be where these two are the "
                               "bottleneck and share the cores with nothing else (an estimate)")
        if "d" in med:
            summary.append(f"{server}: (c)/(d) = {med['c'] / med['d']:.2f}, (a)/(d) = {med['a'] / med['d']:.2f}")
    print("## Ratios\n")
    for line in summary:
        print(f"- {line}")


if __name__ == "__main__":
    main()
