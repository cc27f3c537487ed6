#!/usr/bin/env python3
"""Turn OUT/raw.json (written by bench/bench.py) into the targets printed,
OUT/results.csv, OUT/results.json, OUT/report.md and OUT/tps.svg.

    python3 bench/report.py bench/out

Re-running it on an existing raw.json regenerates everything (no database
needed)."""
import csv
import json
import os
import statistics
import sys

from sections import batch as section_batch
from sections import handwritten as section_handwritten
from sections import kills as section_kills
from sections import portable as section_portable
from sections import ttl as section_ttl
from sections.common import median as med
from sections.common import ratio

ORDER = ["B0", "B1", "B1r", "B2", "B3", "B0c", "I1", "I1c", "I1f", "I2", "I3"]
DESC = {
    "B0": "business insert only",
    "B1": "+ INSERT ... ON CONFLICT DO NOTHING",
    "B1r": "+ ON CONFLICT DO NOTHING, then UPDATE of the result",
    "B2": "+ PL/pgSQL EXCEPTION WHEN unique_violation",
    "B3": "+ Redis SET NX EX (C driver)",
    "B0c": "B0 via the C driver (calibration)",
    "I1": "+ SELECT idem_claim(…) (new key)",
    "I1c": "+ SELECT claimed FROM idem_claim(…) (new key)",
    "I1f": "+ SELECT (idem_claim(…)).claimed (new key)",
    "I2": "+ idem_claim + idem_complete",
    "I3": "idem_claim, duplicate key",
    "B1d": "ON CONFLICT DO NOTHING, existing key",
}
COLORS = {"B0": "#7f7f7f", "B1": "#1f77b4", "B1r": "#aec7e8", "B2": "#17becf", "B3": "#9467bd",
          "B0c": "#c7c7c7", "I1": "#d62728", "I1c": "#ff9896", "I1f": "#8c564b", "I2": "#ff7f0e",
          "I3": "#2ca02c"}
# Ratios of the matrix: (numerator, denominator, target or None, what)
RATIOS = [
    ("I1c", "B1", 1.0, "new-key claim, recommended form `SELECT claimed FROM idem_claim(…)`"),
    ("I1", "B1", 0.95, "new-key claim, plain form `SELECT idem_claim(…)`"),
    ("I1f", "B1", None, "new-key claim, `SELECT (idem_claim(…)).claimed`"),
    ("I2", "B1r", 1.0, "claim + stored result vs ON CONFLICT + UPDATE"),
    ("I3", "I1", 2.0, "duplicate vs new-key claim"),
]
# The idem variant of the sustained section -> its hand-written counterpart
SUSTAINED_BASE = {"I1": "B1", "I1c": "B1", "I1f": "B1", "I3": "B1", "I2": "B1r"}
# Targets in the order the benchmark states them, then the earlier ones
TARGET_ORDER = ["I1c", "I1", "I2", "heap", "I3", "I3wal", "clean_time", "clean_wal", "clean_delete",
                "clean_p99", "scale", "latency", "sustained", "bytes120", "ttl", "hw_tps", "hw_p99",
                "kills", "portable_i1", "portable_i3"]


def fmt(x, nd=0, unit=""):
    if x is None:
        return "—"
    if isinstance(x, float) and nd == 0:
        return f"{x:,.0f}{unit}"
    return f"{x:,.{nd}f}{unit}"


def mib(b):
    return None if b is None else b / 1048576


def pct_change(keep):
    """last/first as a change: 0.81 -> "−19.0 %", 1.38 -> "+38.0 %"."""
    return "—" if keep is None else f"{(keep - 1) * 100:+.1f} %".replace("-", "−")


class Report:
    def __init__(self, out):
        self.out = out
        with open(os.path.join(out, "raw.json")) as f:
            self.raw = json.load(f)
        self.meta = self.raw["meta"]
        self.smoke = self.meta.get("profile") == "smoke"
        self.summary = {}
        self.targets = []
        self.md = []      # report.md lines (the sections' tables)
        self.csv = []     # (section, variant, sync, clients, round, metric, value, unit)

    # ---- matrix --------------------------------------------------------------
    def matrix(self):
        runs = [r for r in self.raw["runs"] if r.get("section") == "matrix"]
        if not runs:
            return
        for r in runs:
            self.csv.append(("matrix", r["variant"], r["sync"], r["clients"], r["round"], "tps",
                             r["tps"], "tx/s"))
            if r.get("lat_ms") is not None:
                self.csv.append(("matrix", r["variant"], r["sync"], r["clients"], r["round"],
                                 "latency_avg", r["lat_ms"], "ms"))
        syncs = list(dict.fromkeys(r["sync"] for r in runs))
        clients = sorted(set(r["clients"] for r in runs))
        variants = [v for v in ORDER if any(r["variant"] == v for r in runs)]
        summ, ratios = {}, {}
        for s in syncs:
            for c in clients:
                cell = {}
                here = [r for r in runs if r["sync"] == s and r["clients"] == c]
                for v in variants:
                    xs = [r["tps"] for r in runs if r["sync"] == s and r["clients"] == c and r["variant"] == v]
                    if xs:
                        cell[v] = {"median": med(xs), "min": min(xs), "max": max(xs), "n": len(xs),
                                   "lat_ms": med([r["lat_ms"] for r in runs if r["sync"] == s and r["clients"] == c
                                                  and r["variant"] == v and r.get("lat_ms") is not None])}
                b0 = cell.get("B0", {}).get("median")
                b1 = cell.get("B1", {}).get("median")
                b0c = cell.get("B0c", {}).get("median")
                for v, d in cell.items():
                    m = d["median"]
                    if v == "B3" and b0c:
                        d["x_b0"] = m / b0c
                        d["x_b1"] = m / b0c * b0 / b1 if b0 and b1 else None
                    elif v == "B0c":
                        d["x_b0"] = m / b0 if b0 else None
                        d["x_b1"] = None
                    else:
                        d["x_b0"] = m / b0 if b0 else None
                        d["x_b1"] = m / b1 if b1 else None
                summ[f"{s}/{c}"] = cell
                for num, den, _, _ in RATIOS:
                    x, lo, hi = ratio(here, num, den)
                    if x is not None:
                        ratios.setdefault(f"{num}/{den}", {})[f"{s}/{c}"] = {
                            "ratio": x, "round_min": lo, "round_max": hi}
        self.summary["matrix"] = summ
        self.summary["ratios"] = ratios

        p = self.meta.get("params", {})
        lines = ["## Throughput (TPS), interleaved",
                 "",
                 f"{p.get('rounds')} round(s) × {p.get('duration')} s per variant and configuration; "
                 f"median TPS, ×B0 and ×B1 ratios of medians (B3's over B0c), range min–max; "
                 + (f"steady state of {p.get('steady'):,} aged claims" if p.get("steady") else "fresh tables")
                 + " (method: bench/README.md, matrix).", ""]
        for s in syncs:
            lines.append(f"### synchronous_commit = {s}")
            lines.append("")
            lines.append("| variant | " + " | ".join(f"c={c} TPS | ×B0 | ×B1 | range" for c in clients) + " |")
            lines.append("|" + "---|" * (1 + 4 * len(clients)))
            for v in variants:
                row = [f"**{v}** {DESC[v]}"]
                for c in clients:
                    d = summ[f"{s}/{c}"].get(v)
                    if not d:
                        row += ["—"] * 4
                        continue
                    row += [fmt(d["median"]), fmt(d.get("x_b0"), 2), fmt(d.get("x_b1"), 2),
                            f"{d['min']:,.0f}–{d['max']:,.0f}"]
                lines.append("| " + " | ".join(row) + " |")
            lines.append("")
        cfgs = [(s, c) for s in syncs for c in clients]
        lines += ["### Ratios",
                  "",
                  "Ratio of median TPS; in brackets the range of the same-round ratios.", "",
                  "| ratio | target | " + " | ".join(f"{s}, {c} cl." for s, c in cfgs) + " |",
                  "|---|---|" + "---|" * len(cfgs)]
        for num, den, goal, what in RATIOS:
            d = ratios.get(f"{num}/{den}")
            if not d:
                continue
            row = [f"**{num}/{den}** {what}", f"≥ {goal:.2f}" if goal else "—"]
            for s, c in cfgs:
                x = d.get(f"{s}/{c}")
                row.append("—" if not x else f"{x['ratio']:.2f}" + (
                    f" ({x['round_min']:.2f}–{x['round_max']:.2f})" if x["round_min"] is not None
                    and x["round_min"] != x["round_max"] else ""))
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
        self.md += lines

        # targets: one line per ratio target, every configuration in it
        for num, den, goal, what in RATIOS:
            d = ratios.get(f"{num}/{den}")
            if not goal or not d:
                continue
            vals = [(cfg, x["ratio"]) for cfg, x in d.items()]
            miss = [cfg for cfg, x in vals if x < goal]
            text = "; ".join(f"{cfg.replace('/', ' ')}: {x:.2f}" for cfg, x in vals)
            if miss:
                text += f" — below at {', '.join(m.replace('/', ' ') for m in miss)}"
            n_cfg = len(set(f"{s}/{c}" for s in ("off", "on") for c in (1, 2, 4)))
            partial = "" if len(vals) >= n_cfg else " [not every configuration measured]"
            key = {"I1c": "I1c", "I1": "I1", "I2": "I2", "I3": "I3"}[num]
            label = {"I1c": f"I1c ≥ 1.0 × B1 (recommended form), 1/2/4 clients, sync off and on",
                     "I1": f"I1 ≥ 0.95 × B1 (plain `SELECT idem_claim(…)`), 1/2/4 clients, sync off and on",
                     "I2": f"I2 ≥ 1.0 × B1r (claim + complete vs ON CONFLICT + UPDATE)",
                     "I3": f"I3 ≥ 2 × I1 (duplicate path)"}[num]
            self.target(key, label + partial, text, not miss)

    # ---- latency ---------------------------------------------------------------
    def latency(self):
        pooled = self.raw.get("latency_pooled") or []
        runs = self.raw.get("latency") or []
        if not pooled:
            return
        p = self.meta.get("params", {})
        syncs = list(dict.fromkeys(r["sync"] for r in pooled))
        c = pooled[0]["clients"]
        out = {}
        lines = ["## Latency per transaction",
                 "",
                 f"{c} clients, {p.get('latency_rounds')} round(s) × {p.get('latency_duration')} s per "
                 "variant; exact percentiles over every logged transaction (method: bench/README.md, latency).",
                 ""]
        for s in syncs:
            lines += [f"### synchronous_commit = {s}", "",
                      "| variant | transactions | p50 ms | p99 ms | p99.9 ms | max ms | mean ms | per-round p99 ms |",
                      "|---|---|---|---|---|---|---|---|"]
            for v in ORDER:
                r = next((x for x in pooled if x["sync"] == s and x["variant"] == v), None)
                if not r:
                    continue
                rr = [x["p99_ms"] for x in runs if x["sync"] == s and x["variant"] == v and x.get("p99_ms")]
                out.setdefault(s, {})[v] = r
                lines.append(f"| **{v}** {DESC[v]} | {r['txns']:,} | {fmt(r['p50_ms'], 3)} | "
                             f"{fmt(r['p99_ms'], 3)} | {fmt(r['p999_ms'], 3)} | {fmt(r['max_ms'], 1)} | "
                             f"{fmt(r['mean_ms'], 3)} | "
                             f"{f'{min(rr):.3f}–{max(rr):.3f}' if rr else '—'} |")
                for k in ("p50_ms", "p99_ms", "p999_ms"):
                    self.csv.append(("latency", v, s, c, "all", k, r[k], "ms"))
            lines.append("")
        self.md += lines
        self.summary["latency"] = out
        want = ["I1", "I1c", "I2", "I3", "B1", "B1r"]
        s0 = "off" if "off" in out else syncs[0]
        have = out.get(s0, {})
        missing = [v for v in want if v not in have or have[v].get("p99_ms") is None]
        text = "; ".join(f"{v} {have[v]['p50_ms']:.3f}/{have[v]['p99_ms']:.3f}" for v in want if v in have)
        self.target("latency", f"Latency: p50/p99 ms of I1, I1c, I2, I3 next to B1, B1r at {c} clients "
                    f"(sync {s0}; reported, no threshold)",
                    text + (f" — missing {', '.join(missing)}" if missing else ""), not missing)

    # ---- sustained ---------------------------------------------------------------
    def sustained(self):
        rows = self.raw.get("sustained") or []
        if not rows:
            return
        win = rows[0]["window"]
        secs = rows[0]["seconds"]
        keep = {}
        for r in rows:
            ws = r["windows"]
            keep[r["variant"]] = ws[-1]["tps"] / ws[0]["tps"] if ws and ws[0]["tps"] else None
            for i, w in enumerate(ws):
                self.csv.append(("sustained", r["variant"], r["sync"], r["clients"], i,
                                 f"tps_window_{w['end_s']:g}s", w["tps"], "tx/s"))
        self.summary["sustained"] = {"last_over_first": keep}
        nwin = max(len(r["windows"]) for r in rows)
        lines = ["## Sustained load",
                 "",
                 f"Each variant for {secs} s, {rows[0]['clients']} clients, synchronous_commit "
                 f"{rows[0]['sync']}, on one growing table; TPS per {win} s window, * = the machine "
                 "was shared (method: bench/README.md, sustained).",
                 "",
                 "| variant | " + " | ".join(f"{(i + 1) * win:g} s" for i in range(nwin)) +
                 " | last/first | rows at end | dead tuples | heap MiB | autovacuums |",
                 "|---|" + "---|" * (nwin + 5)]
        for r in sorted(rows, key=lambda r: ORDER.index(r["variant"]) if r["variant"] in ORDER else 99):
            e = r.get("end") or {}
            cells = [f"{w['tps']:,.0f}{'*' if (w.get('foreign_cores') or 0) >= 0.25 else ''}"
                     for w in r["windows"]] + ["—"] * (nwin - len(r["windows"]))
            lines.append(f"| **{r['variant']}** {DESC.get(r['variant'], '')} | " + " | ".join(cells) +
                         f" | {fmt(keep[r['variant']], 2)} | {fmt(e.get('rows'))} | "
                         f"{fmt(e.get('n_dead_tup'))} | {fmt(mib(e.get('heap')), 1)} | "
                         f"{fmt(e.get('autovacuums'))} |")
        lines.append("")
        self.md += lines
        short = "" if secs >= 300 else f" [runs of {secs} s; the target is stated for ≥ 5 minutes]"
        for r in rows:
            v = r["variant"]
            if v not in SUSTAINED_BASE:
                continue
            b = SUSTAINED_BASE[v]
            if b not in keep:
                b = next((x for x in ("B1", "B1r") if x in keep), None)
            kv, kb = keep[v], keep.get(b)
            if kv is None:
                continue
            if kb is None:
                ok = kv >= 0.9
                text = f"{v} last/first {kv:.3f} ({pct_change(kv)}; no baseline measured)"
            elif kb >= 0.9:
                ok = kv >= 0.9
                text = (f"{v} last/first {kv:.3f} ({pct_change(kv)}), {b} {kb:.3f} ({pct_change(kb)}): "
                        f"{b} held")
            else:
                # the baseline lost more than 10 % too: the table or the
                # machine, not idem; idem may lose at most 10 % more than it
                ok = kv >= 0.9 * kb
                text = (f"{v} last/first {kv:.3f} ({pct_change(kv)}), {b} {kb:.3f} ({pct_change(kb)}): "
                        f"{b} lost more than 10 % too, so {v} is held to ≥ 0.9 × {b}'s")
            self.target("sustained", f"Sustained: {v} loses ≤ 10 % first → last window where {b} "
                        f"does not{short}", text, ok)

    # ---- WAL / xids --------------------------------------------------------
    def wal(self):
        rows = self.raw.get("wal") or []
        if not rows:
            return
        self.summary["wal"] = rows
        lines = ["## WAL and transaction ids per transaction",
                 "",
                 f"1 client, synchronous_commit off, {rows[0]['txns']} transactions per variant; "
                 "background records taken off (method: bench/README.md, wal).",
                 "",
                 "| variant | WAL B/txn | of which FPI | raw LSN delta B/txn | xids/txn | TPS (1 client) | WAL by resource manager (B/txn) |",
                 "|---|---|---|---|---|---|---|"]
        for r in rows:
            n = r["txns"]
            rm = ", ".join(f"{s['rmgr']} {s['combined'] / n:.0f}" for s in
                           sorted(r["rmgr"], key=lambda s: -s["combined"]) if s["combined"] / n >= 0.5)
            lines.append(f"| **{r['variant']}** {DESC.get(r['variant'], '')} | {r['wal_per_txn']:.1f} | "
                         f"{r['fpi_bytes'] / n:.1f} | {r['wal_total_per_txn']:.1f} | {r['xids_per_txn']:.2f} | "
                         f"{r['tps']:,.0f} | {rm} |")
            for k in ("wal_per_txn", "wal_total_per_txn", "xids_per_txn"):
                self.csv.append(("wal", r["variant"], "off", 1, "", k, r[k], "B" if "wal" in k else "xid"))
        lines.append("")
        self.md += lines
        i3 = next((r for r in rows if r["variant"] == "I3"), None)
        if i3:
            ok = i3["wal_bytes"] - i3["background_bytes"] == 0 and i3["xids"] == 0
            self.target("I3wal", "I3 (duplicate) writes 0 WAL bytes and takes 0 xids",
                        f"{i3['wal_bytes'] - i3['background_bytes']} B, {i3['xids']} xids over {i3['txns']:,} txns",
                        ok)

    # ---- bytes per claim ----------------------------------------------------
    def bytes_(self):
        rows = self.raw.get("bytes") or []
        if not rows:
            return
        self.summary["bytes"] = rows
        lines = ["## Bytes per claim",
                 "",
                 "Autovacuum off, no VACUUM; *bulk*, *I2* and *B1r* write patterns, heap summed over "
                 "idem's leaf partitions (method: bench/README.md, bytes).",
                 "",
                 "| store | written by | rows | heap B/row | heap+index B/row | total B/row | heap MiB | index MiB | live tuple B/row | dead tuples | free space MiB | load |",
                 "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            load = f"{r['load_per_s']:,.0f}/s" if r.get("load_per_s") else "—"
            lines.append(f"| {r['store']} | {r.get('pattern', 'bulk')} | {r['rows']:,} | "
                         f"{fmt(r.get('heap_per_row'), 1)} | {fmt(r.get('heap_index_per_row'), 1)} | "
                         f"**{fmt(r.get('bytes_per_row'), 1)}** | {mib(r['heap']):.1f} | {mib(r['indexes']):.1f} | "
                         f"{fmt(r['live_tuple_bytes'] / r['rows'], 1) if r.get('live_tuple_bytes') and r['rows'] else '—'} | "
                         f"{fmt(r.get('dead_tuples'))} | {fmt(mib(r.get('free_bytes')), 1)} | {load} |")
            for k in ("heap_per_row", "heap_index_per_row", "bytes_per_row"):
                if r.get(k) is not None:
                    self.csv.append(("bytes", f"{r['store']}:{r.get('pattern', 'bulk')}", "", "", "",
                                     k, r[k], "B"))
        lines.append("")
        self.md += lines
        i2 = next((r for r in rows if r.get("pattern") == "I2"), None)
        b1r = next((r for r in rows if r.get("pattern") == "B1r"), None)
        bulk = next((r for r in rows if r["store"] == "idem.claims" and r.get("pattern", "bulk") == "bulk"), None)
        if i2 and b1r and i2.get("heap_per_row") and b1r.get("heap_per_row"):
            few = "" if i2["rows"] >= 1000000 else f" [after {i2['rows']:,} claims; the target is stated for 1 M]"
            self.target("heap", f"heap bytes per completed claim (I2 pattern) ≤ the B1r table's{few}",
                        f"{i2['heap_per_row']:.1f} vs {b1r['heap_per_row']:.1f} B/row (heap+index "
                        f"{i2['heap_index_per_row']:.1f} vs {b1r['heap_index_per_row']:.1f}; dead tuples "
                        f"{fmt(i2.get('dead_tuples'))} vs {fmt(b1r.get('dead_tuples'))})",
                        i2["heap_per_row"] <= b1r["heap_per_row"])
        if bulk:
            self.target("bytes120", f"(0.1.0 target) ≤ 120 bytes per claim, 32-char keys, no result "
                        f"({bulk['rows']:,} claims)", f"{bulk['bytes_per_row']:.1f} B", bulk["bytes_per_row"] <= 120)

    # ---- scale ----------------------------------------------------------------
    def scale(self):
        rows = self.raw.get("scale") or []
        if not rows:
            return
        out = {}
        for v in ("I1", "B1"):
            d = {}
            for size in ("small", "big"):
                xs = [r["tps"] for r in rows if r["variant"] == v and r["size"] == size]
                keys = next((r["keys"] for r in rows if r["variant"] == v and r["size"] == size), None)
                live = [r["live_at_start"] for r in rows if r["variant"] == v and r["size"] == size]
                if xs:
                    d[size] = {"median": med(xs), "min": min(xs), "max": max(xs), "keys": keys,
                               "live_min": min(live), "live_max": max(live)}
                for r in rows:
                    if r["variant"] == v and r["size"] == size:
                        self.csv.append(("scale", v, "off", 1, r["round"], f"tps_{size}_{keys}", r["tps"], "tx/s"))
            if "small" in d and "big" in d:
                d["cost_ratio"] = d["small"]["median"] / d["big"]["median"]
            out[v] = d
        self.summary["scale"] = out
        big = out.get("I1", {}).get("big", {}).get("keys")
        small = out.get("I1", {}).get("small", {}).get("keys")
        lines = ["## Claim cost with few vs many live keys",
                 "",
                 f"1 client, synchronous_commit off, {small:,} and {big:,} live keys; cost big/small = "
                 "TPS(small) / TPS(big) (method: bench/README.md, scale).",
                 "",
                 "| variant | live keys (small) | TPS | live keys (big) | TPS | cost big/small |",
                 "|---|---|---|---|---|---|"]
        for v, d in out.items():
            if "small" not in d or "big" not in d:
                continue
            lines.append(f"| **{v}** | {d['small']['live_min']:,}–{d['small']['live_max']:,} | "
                         f"{d['small']['median']:,.0f} ({d['small']['min']:,.0f}–{d['small']['max']:,.0f}) | "
                         f"{d['big']['live_min']:,}–{d['big']['live_max']:,} | "
                         f"{d['big']['median']:,.0f} ({d['big']['min']:,.0f}–{d['big']['max']:,.0f}) | "
                         f"{d['cost_ratio']:.2f} |")
        sizes = self.raw.get("scale_sizes") or {}
        if sizes.get("big"):
            s = sizes["big"]
            lines += ["", f"idem.claims in the big database at the end: {s['rows']:,} rows, "
                          f"{mib(s['heap']):.0f} MiB heap + {mib(s['indexes']):.0f} MiB index."]
        lines.append("")
        self.md += lines
        d = out.get("I1", {})
        if "cost_ratio" in d:
            note = "" if big >= 10_000_000 and small <= 10_000 else \
                f" [measured at {small:,} → {big:,} keys; the target is stated for 10 k → 10 M: run --full or --big-keys 10000000]"
            self.target("scale", f"Scale: I1 cost at {big:,} live keys ≤ 1.1 × at {small:,}{note}",
                        f"{d['cost_ratio']:.2f}× (B1: {fmt(out.get('B1', {}).get('cost_ratio'), 2)}×)",
                        d["cost_ratio"] <= 1.1)

    # ---- cleanup --------------------------------------------------------------------
    def cleanup(self):
        c = self.raw.get("cleanup") or {}
        if not c:
            return
        self.summary["cleanup"] = c
        sizes = c["rows"]
        warm = c.get("idem") or []
        cold = c.get("idem_cold") or []
        lines = ["## Cleanup of expired claims",
                 "",
                 f"Expired rows: {', '.join(f'{n:,}' for n in sizes)} (plus {c['live']:,} live ones); "
                 f"*warm*: a session's second call ({c.get('reps')} per size: median, range), *cold*: "
                 "a fresh session's first (method: bench/README.md, cleanup).",
                 "",
                 "| method | expired rows | time ms | range ms | WAL KiB | size before MiB | after MiB | after VACUUM MiB | expired left |",
                 "|---|---|---|---|---|---|---|---|---|"]
        for r in c.get("delete", []):
            lines.append(f"| DELETE | {r['rows']:,} | {r['ms']:,.0f} | — | {r['wal'] / 1024:,.0f} | "
                         f"{mib(r['size_before']):.1f} | {mib(r['size_after']):.1f} | "
                         f"{mib(r['size_after_vacuum']):.1f} (VACUUM {r['vacuum_s']:.1f} s) | {r['expired_left']:,} |")
            self.csv.append(("cleanup", "DELETE", "", "", "", f"ms_{r['rows']}", r["ms"], "ms"))
            self.csv.append(("cleanup", "DELETE", "", "", "", f"wal_{r['rows']}", r["wal"], "B"))
        wsum = {}
        for n in sizes:
            rs = [r for r in warm if r["rows"] == n]
            if not rs:
                continue
            d = {"ms": med([r["ms"] for r in rs]), "wal": med([r["wal"] for r in rs]),
                 "ms_min": min(r["ms"] for r in rs), "ms_max": max(r["ms"] for r in rs),
                 "own_ms": med([r["own_duration_ms"] for r in rs if r.get("own_duration_ms") is not None]),
                 "left": max(r["expired_left"] for r in rs), "n": len(rs),
                 "created": sum(r.get("partitions_created") or 0 for r in rs)}
            wsum[n] = d
            own = f" (own {d['own_ms']:.1f})" if d["own_ms"] is not None else ""
            lines.append(f"| idem_maintain(), warm | {n:,} | {d['ms']:,.1f}{own} | "
                         f"{d['ms_min']:,.1f}–{d['ms_max']:,.1f} | {d['wal'] / 1024:,.1f} | "
                         f"{mib(rs[-1]['size_before']):.1f} | {mib(rs[-1]['size_after']):.1f} | — | {d['left']:,} |")
            for r in rs:
                self.csv.append(("cleanup", "idem_maintain_warm", "", "", r["rep"], f"ms_{n}", r["ms"], "ms"))
                self.csv.append(("cleanup", "idem_maintain_warm", "", "", r["rep"], f"wal_{n}", r["wal"], "B"))
        for r in cold:
            own = f" (own {r['own_duration_ms']:.1f})" if r.get("own_duration_ms") is not None else ""
            lines.append(f"| idem_maintain(), cold | {r['rows']:,} | {r['ms']:,.1f}{own} | — | "
                         f"{r['wal'] / 1024:,.1f} | {mib(r['size_before']):.1f} | {mib(r['size_after']):.1f} | — | "
                         f"{r['expired_left']:,} |")
            self.csv.append(("cleanup", "idem_maintain_cold", "", "", "", f"ms_{r['rows']}", r["ms"], "ms"))
            self.csv.append(("cleanup", "idem_maintain_cold", "", "", "", f"wal_{r['rows']}", r["wal"], "B"))
        lines.append("")
        if any(d["created"] for d in wsum.values()):
            lines += ["Note: some warm calls also created a partition (the premade horizon moved "
                      "during the run); their time and WAL include it.", ""]
        self.md += lines
        dl = {r["rows"]: r for r in c.get("delete", [])}

        big_note = "" if sizes[-1] >= 10_000_000 else \
            f" [measured up to {sizes[-1]:,} rows; the target is stated for 100 k, 1 M and 10 M: run --full]"
        if not wsum:
            for k, n in (("clean_time", "Cleanup flat in rows: time"), ("clean_wal", "Cleanup flat in rows: WAL"),
                         ("clean_delete", "Cleanup ≥ 100× faster than DELETE")):
                self.target(k, n, "skipped", None)
            return
        left = [n for n, d in wsum.items() if d["left"]]
        ms = [d["ms"] for d in wsum.values()]
        wal = [d["wal"] for d in wsum.values()]
        sz = " / ".join(f"{n:,}" for n in wsum)
        tm = max(ms) / max(min(ms), 0.001)
        self.target("clean_time", f"Cleanup flat in rows: idem_maintain() time within 1.2× across {sz} rows "
                    f"(warm session){big_note}",
                    " / ".join(f"{x:,.1f}" for x in ms) + f" ms (max/min {tm:.2f}×; its own duration_ms, "
                    "without the commit that unlinks the files: " +
                    " / ".join(fmt(d["own_ms"], 1) for d in wsum.values()) + "); cold first call: " +
                    ", ".join(f"{r['ms']:,.1f} ms at {r['rows']:,}" for r in cold) +
                    (f" — expired rows LEFT at {left}" if left else ""),
                    tm <= 1.2 and not left)
        wm = max(wal) / max(min(wal), 1)
        self.target("clean_wal", f"Cleanup flat in rows: idem_maintain() WAL within 1.2× across {sz} rows{big_note}",
                    " / ".join(f"{x / 1024:,.1f}" for x in wal) + f" KiB (max/min {wm:.2f}×)", wm <= 1.2)
        n = max(n for n in wsum if n in dl) if any(n in dl for n in wsum) else None
        if n:
            x = dl[n]["ms"] / max(wsum[n]["ms"], 0.001)
            cold_n = next((r for r in cold if r["rows"] == n), None)
            extra = f"; cold call {dl[n]['ms'] / max(cold_n['ms'], 0.001):,.0f}×" if cold_n else ""
            self.target("clean_delete", f"Cleanup ≥ 100× faster than DELETE of the same {n:,} rows{big_note}",
                        f"{x:,.0f}× ({dl[n]['ms']:,.0f} ms vs {wsum[n]['ms']:,.1f} ms warm{extra})",
                        x >= 100 and not wsum[n]["left"])

    # ---- targets ------------------------------------------------------------------------
    def target(self, key, name, measured, ok):
        self.targets.append({"key": key, "target": name, "measured": measured,
                             "status": "SKIP" if ok is None else ("PASS" if ok else "MISS")})

    def sort_targets(self):
        self.targets.sort(key=lambda t: TARGET_ORDER.index(t["key"]) if t["key"] in TARGET_ORDER else 99)
    # ---- SVG ----------------------------------------------------------------------------
    def svg(self):
        summ = self.summary.get("matrix")
        if not summ:
            return
        syncs = list(dict.fromkeys(k.split("/")[0] for k in summ))
        clients = sorted(set(int(k.split("/")[1]) for k in summ))
        variants = [v for v in ORDER if v != "B0c" and any(v in cell for cell in summ.values())]
        ymax = max(d["max"] for cell in summ.values() for v, d in cell.items() if v in variants)
        step = nice_step(ymax / 5)
        ytop = step * (int(ymax / step) + 1)
        pw, ph, ml, mt, mb = 440, 300, 70, 60, 50
        gap = 30
        W = ml + len(syncs) * (pw + gap) + 10
        H = mt + ph + mb + 60
        o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
             f'font-family="sans-serif" font-size="12">',
             f'<rect width="{W}" height="{H}" fill="white"/>',
             f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="15" font-weight="bold">'
             f'idem benchmark: TPS per variant (median of rounds; whiskers min–max)</text>',
             f'<text x="{W / 2}" y="40" text-anchor="middle" font-size="11" fill="#555">'
             f'{esc(self.meta.get("date", ""))} · nproc {self.meta.get("nproc")} · '
             f'{esc(self.meta.get("pg_version", "")[:40])} · idem build: {esc(str(self.meta.get("idem_build", ""))[:40])}'
             f'{" · SMOKE (numbers meaningless)" if self.smoke else ""}</text>']
        for si, s in enumerate(syncs):
            x0 = ml + si * (pw + gap)
            y0 = mt
            o.append(f'<text x="{x0 + pw / 2}" y="{y0 - 6}" text-anchor="middle" font-weight="bold">'
                     f'synchronous_commit = {s}</text>')
            o.append(f'<rect x="{x0}" y="{y0}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
            t = 0
            while t <= ytop + 1e-9:
                y = y0 + ph - t / ytop * ph
                o.append(f'<line x1="{x0}" x2="{x0 + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
                if si == 0:
                    o.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{t:,.0f}</text>')
                t += step
            gw = pw / len(clients)
            bw = (gw - 16) / len(variants)
            for ci, c in enumerate(clients):
                cell = summ.get(f"{s}/{c}", {})
                gx = x0 + ci * gw + 8
                o.append(f'<text x="{x0 + ci * gw + gw / 2}" y="{y0 + ph + 16}" text-anchor="middle">'
                         f'{c} client{"s" if c > 1 else ""}</text>')
                for vi, v in enumerate(variants):
                    d = cell.get(v)
                    if not d:
                        continue
                    bx = gx + vi * bw
                    bh = d["median"] / ytop * ph
                    o.append(f'<rect x="{bx:.1f}" y="{y0 + ph - bh:.1f}" width="{bw - 1:.1f}" '
                             f'height="{bh:.1f}" fill="{COLORS[v]}"><title>{v} sync={s} c={c}: '
                             f'{d["median"]:,.0f} TPS ({d["min"]:,.0f}–{d["max"]:,.0f})</title></rect>')
                    cx = bx + (bw - 1) / 2
                    ylo = y0 + ph - d["min"] / ytop * ph
                    yhi = y0 + ph - d["max"] / ytop * ph
                    o.append(f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{ylo:.1f}" y2="{yhi:.1f}" stroke="black"/>')
        # legend
        lx, ly = ml, mt + ph + 36
        for v in variants:
            o.append(f'<rect x="{lx}" y="{ly}" width="12" height="12" fill="{COLORS[v]}"/>')
            label = f"{v} {DESC[v]}"
            o.append(f'<text x="{lx + 16}" y="{ly + 10}" font-size="11">{esc(label)}</text>')
            lx += 16 + 6.6 * len(label) + 14
            if lx > W - 200:
                lx, ly = ml, ly + 18
        o.append(f'<text x="16" y="{mt + ph / 2}" transform="rotate(-90 16 {mt + ph / 2})" '
                 f'text-anchor="middle">transactions per second</text>')
        o.append("</svg>")
        H2 = ly + 30
        o[0] = o[0].replace(f'height="{H}"', f'height="{H2}"')
        o[1] = o[1].replace(f'height="{H}"', f'height="{H2}"')
        with open(os.path.join(self.out, "tps.svg"), "w") as f:
            f.write("\n".join(o) + "\n")

    def noise_lines(self):
        """How much other work ran next to the measurements."""
        timed = [r for r in self.raw.get("runs", [])] + [r for r in self.raw.get("scale", [])] + \
                [r for r in self.raw.get("latency", [])] + \
                [w for r in self.raw.get("sustained", []) for w in r["windows"]] + \
                list((self.raw.get("ttl") or {}).get("runs", [])) + \
                list((self.raw.get("handwritten") or {}).get("runs", []))
        timed = [r for r in timed if "foreign_cores" in r]
        if not timed:
            return []
        noisy = [r for r in timed if r["foreign_cores"] >= 0.25 or r.get("foreign")]
        redone = len(self.raw.get("discarded", []))
        fc = sorted(r["foreign_cores"] for r in timed)
        line = (f"- noise: other processes used {statistics.median(fc):.2f} cores (median; max "
                f"{fc[-1]:.2f}) during the timed runs; {redone} run(s) were measured again because "
                f"something else was using the CPU")
        out = [line, ""]
        if noisy:
            names = sorted(set(n for r in noisy for n in r.get("foreign", [])))
            out += [f"> **Noise:** {len(noisy)} of {len(timed)} timed runs shared the machine with other "
                    f"work (≥ 0.25 cores{': ' + ', '.join(names) if names else ''}); their numbers are "
                    f"suspect.", ""]
        return out

    # ---- output -------------------------------------------------------------------------
    def write(self):
        m = self.meta
        s = m.get("settings", {})
        head = ["# idem benchmark report", ""]
        if self.smoke:
            head += ["**SMOKE RUN: tiny sizes and durations; the numbers and PASS/MISS mean nothing.**", ""]
        head += [f"- date: {m.get('date')}",
                 f"- command: `{m.get('command')}` (profile {m.get('profile')}, total "
                 f"{m.get('total_seconds', 0) / 60:.1f} min)",
                 f"- machine: nproc = {m.get('nproc')}, {m.get('cpu')}, {m.get('mem_gb')} GB RAM, {m.get('os')}",
                 f"- PostgreSQL: {m.get('pg_version')}",
                 f"- idem {m.get('idem_version')}, installed build: **{m.get('idem_build')}**",
                 f"- partitions of idem.claims at start: {m.get('partitions_at_start')}",
                 f"- cluster: private, started by bench/run.sh (tests/lib/cluster.sh, unix socket only); "
                 f"shared_buffers = {s.get('shared_buffers')} (×8kB), max_wal_size = {s.get('max_wal_size')}, "
                 f"checkpoint_timeout = {s.get('checkpoint_timeout')}, fsync = {s.get('fsync')}, "
                 f"full_page_writes = {s.get('full_page_writes')}, wal_level = {s.get('wal_level')}, "
                 f"data_checksums = {s.get('data_checksums')}, autovacuum = {s.get('autovacuum')}; "
                 "checkpoints are spaced so none lands inside a measurement, and the benchmark issues "
                 "CHECKPOINT before every measured run.",
                 f"- driver: pgbench -n -M prepared -c N -j N (B3/B0c: bench/redis_txn.c, same loop); "
                 f"synchronous_commit set per session.",
                 f"- section times (s): {m.get('section_seconds')}",
                 f"- duration estimated at the start: {(m.get('estimate_s') or {}).get('total', 0) / 60:.0f} min; "
                 f"a full run (`--full`) at the rates this run measured: "
                 f"{(m.get('full_estimate_s') or {}).get('total', 0) / 60:.0f} min",
                 ""]
        if "idem_build" in m and "debug" in str(m["idem_build"]):
            head += ["> **Warning:** the installed idem.so is an unoptimized debug build; its numbers "
                     "understate a release build (`cargo pgrx install --release`).", ""]
        head += self.noise_lines()
        for n in self.raw.get("notes", []):
            head += [f"> note: {n}", ""]
        for e in self.raw.get("errors", []):
            head += [f"> **ERROR** in section {e['section']}: {e['error'][:800]}", ""]
        tl = ["## Targets", "",
              "Ratios are from one interleaved run; a MISS states what was measured. "
              "Sizes below the targets' are flagged in brackets.", "",
              "| target | measured | status |", "|---|---|---|"]
        for t in self.targets:
            tl.append(f"| {t['target']} | {t['measured']} | **{t['status']}** |")
        tl.append("")
        if os.path.exists(os.path.join(self.out, "tps.svg")):
            tl += ["![TPS](tps.svg)", ""]
        md = head + tl + self.md
        with open(os.path.join(self.out, "report.md"), "w") as f:
            f.write("\n".join(md) + "\n")
        with open(os.path.join(self.out, "results.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["section", "variant", "sync", "clients", "round", "metric", "value", "unit"])
            w.writerows(self.csv)
        with open(os.path.join(self.out, "results.json"), "w") as f:
            json.dump({"meta": m, "targets": self.targets, "summary": self.summary,
                       "notes": self.raw.get("notes"), "errors": self.raw.get("errors"),
                       "raw": {k: v for k, v in self.raw.items() if k != "meta"}}, f, indent=1, default=str)
        return md

    def print(self):
        """The terminal gets the verdicts; the tables are in report.md."""
        m = self.meta
        print(f"\nidem {m.get('idem_version')} ({m.get('idem_build')}), {m.get('pg_version', '')[:60]}, "
              f"nproc {m.get('nproc')}, profile {m.get('profile')}\n")
        for line in [l for l in self.noise_lines() if l] + [f"note: {n}" for n in self.raw.get("notes", [])] + \
                [f"ERROR in section {e['section']}: {e['error'][:800]}" for e in self.raw.get("errors", [])]:
            print(line)
        print("\n## Targets" + (" (smoke sizes: not meaningful)" if self.smoke else ""))
        w = max([len(t["target"]) for t in self.targets] + [10])
        for t in self.targets:
            print(f"  {t['status']:4s}  {t['target']:<{w}}  {t['measured']}")
        full = (m.get("full_estimate_s") or {}).get("total")
        if full:
            print(f"\nthis run took {m.get('total_seconds', 0) / 60:.1f} min; a full run (--full) would "
                  f"take about {full / 60:.0f} min on this machine")
        print("every table: " + ", ".join(os.path.join(self.out, f)
                                         for f in ("report.md", "results.csv", "results.json", "tps.svg")))


def nice_step(x):
    import math
    if x <= 0:
        return 1
    e = 10 ** math.floor(math.log10(x))
    for m in (1, 2, 2.5, 5, 10):
        if m * e >= x:
            return m * e
    return 10 * e


def esc(s):
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
    r = Report(out)
    for part in (r.matrix, r.latency, r.wal, r.bytes_, r.sustained, r.scale, r.cleanup):
        part()
    for mod in (section_ttl, section_handwritten, section_kills, section_portable, section_batch):
        mod.report(r)
    r.sort_targets()
    r.svg()
    r.write()
    r.print()


if __name__ == "__main__":
    main()
