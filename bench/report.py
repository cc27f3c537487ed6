#!/usr/bin/env python3
"""Turn OUT/raw.json (written by bench/bench.py) into the printed tables,
OUT/results.csv, OUT/results.json, OUT/report.md and OUT/tps.svg.

    python3 bench/report.py bench/out

Re-running it on an existing raw.json regenerates everything (no database
needed)."""
import csv
import json
import os
import statistics
import sys

ORDER = ["B0", "B1", "B2", "B3", "B0c", "I1", "I2", "I3"]
DESC = {
    "B0": "business insert only",
    "B1": "+ INSERT ... ON CONFLICT DO NOTHING",
    "B2": "+ PL/pgSQL EXCEPTION WHEN unique_violation",
    "B3": "+ Redis SET NX EX (C driver)",
    "B0c": "B0 via the C driver (calibration)",
    "I1": "+ idem_claim (new key)",
    "I2": "+ idem_claim + idem_complete",
    "I3": "idem_claim, duplicate key",
    "B1d": "ON CONFLICT DO NOTHING, existing key",
}
COLORS = {"B0": "#7f7f7f", "B1": "#1f77b4", "B2": "#17becf", "B3": "#9467bd", "B0c": "#c7c7c7",
          "I1": "#d62728", "I2": "#ff7f0e", "I3": "#2ca02c"}


def med(xs):
    return statistics.median(xs) if xs else None


def fmt(x, nd=0, unit=""):
    if x is None:
        return "—"
    if isinstance(x, float) and nd == 0:
        return f"{x:,.0f}{unit}"
    return f"{x:,.{nd}f}{unit}"


def mib(b):
    return None if b is None else b / 1048576


class Report:
    def __init__(self, out):
        self.out = out
        with open(os.path.join(out, "raw.json")) as f:
            self.raw = json.load(f)
        self.meta = self.raw["meta"]
        self.smoke = self.meta.get("profile") == "smoke"
        self.summary = {}
        self.targets = []
        self.md = []      # report.md lines
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
        summ = {}
        for s in syncs:
            for c in clients:
                cell = {}
                by_round = {}
                for v in variants:
                    xs = [r["tps"] for r in runs if r["sync"] == s and r["clients"] == c and r["variant"] == v]
                    if xs:
                        cell[v] = {"median": med(xs), "min": min(xs), "max": max(xs), "n": len(xs),
                                   "lat_ms": med([r["lat_ms"] for r in runs if r["sync"] == s and r["clients"] == c
                                                  and r["variant"] == v and r.get("lat_ms") is not None])}
                    for r in runs:
                        if r["sync"] == s and r["clients"] == c and r["variant"] == v:
                            by_round.setdefault(r["round"], {})[v] = r["tps"]
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
                    # same-round pairs: how much the ratio moves between rounds
                    ref = "B0c" if v == "B3" else "B1"
                    pairs = [rd[v] / rd[ref] for rd in by_round.values() if v in rd and ref in rd and rd[ref]]
                    if pairs and v not in ("B1",):
                        d[f"paired_x_{ref.lower()}"] = {"median": med(pairs), "min": min(pairs), "max": max(pairs)}
                summ[f"{s}/{c}"] = cell
        self.summary["matrix"] = summ

        p = self.meta.get("params", {})
        lines = ["## Throughput (TPS), interleaved",
                 "",
                 f"{p.get('rounds')} round(s) × {p.get('duration')} s per variant and configuration, "
                 f"variants in rotating order; median TPS over rounds. ×B0 and ×B1 are ratios of "
                 f"medians (B3: its TPS over B0c, the same C driver without Redis; ×B1 for B3 is "
                 f"that ratio times B0/B1). Range: min–max TPS over rounds.",
                 ""]
        for s in syncs:
            lines.append(f"### synchronous_commit = {s}")
            lines.append("")
            head = "| variant | " + " | ".join(f"c={c} TPS | ×B0 | ×B1 | range" for c in clients) + " |"
            lines.append(head)
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
        lat = []
        for s in syncs:
            for c in clients:
                for v in variants:
                    d = summ[f"{s}/{c}"].get(v)
                    if d and d.get("lat_ms"):
                        lat.append((s, c, v, d["lat_ms"]))
        self.md += lines

        # targets
        if "off" in syncs:
            for c in clients:
                d = summ[f"off/{c}"]
                if "I1" in d and "B1" in d:
                    x = d["I1"]["median"] / d["B1"]["median"]
                    pr = d["I1"].get("paired_x_b1")
                    extra = f" (per-round {pr['min']:.2f}–{pr['max']:.2f})" if pr else ""
                    self.target(f"I1 TPS ≥ 1.0 × B1, sync off, {c} client(s)", f"{x:.2f}×{extra}", x >= 1.0)
        for s in syncs:
            for c in clients:
                d = summ[f"{s}/{c}"]
                if "I3" in d and "I1" in d:
                    x = d["I3"]["median"] / d["I1"]["median"]
                    self.target(f"I3 TPS ≥ 1.5 × I1, sync {s}, {c} client(s)", f"{x:.2f}×", x >= 1.5)

    # ---- WAL / xids --------------------------------------------------------
    def wal(self):
        rows = self.raw.get("wal") or []
        if not rows:
            return
        self.summary["wal"] = rows
        lines = ["## WAL and transaction ids per transaction",
                 "",
                 f"1 client, synchronous_commit off, {rows[0]['txns']} transactions per variant after "
                 "a CHECKPOINT and a reset (fresh tables, so hardly any full-page images), autovacuum "
                 "off for the section. WAL = pg_current_wal_insert_lsn() delta minus records no "
                 "transaction of the run wrote (Standby running-xacts snapshots, XLOG); xids = "
                 "txid_current() delta minus the one txid_current() takes itself.",
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
            self.target("I3 writes 0 WAL bytes and takes 0 xids",
                        f"{i3['wal_bytes'] - i3['background_bytes']} B, {i3['xids']} xids over {i3['txns']} txns",
                        ok)

    # ---- bytes per claim ----------------------------------------------------
    def bytes_(self):
        rows = self.raw.get("bytes") or []
        if not rows:
            return
        self.summary["bytes"] = rows
        lines = ["## Bytes per claim",
                 "",
                 "pg_total_relation_size summed over the leaf partitions of idem.claims (heap, "
                 "indexes, TOAST, FSM/VM) divided by the rows, right after loading through "
                 "idem_claim (32-character keys, md5 hex), no VACUUM. The hand-written tables are "
                 "loaded with INSERT ... SELECT, for comparison.",
                 "",
                 "| store | result | rows | partitions | heap MiB | index MiB | total MiB | **bytes/row** | live tuple B/row | dead tuples | free space MiB | bulk load |",
                 "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            load = f"{r['load_per_s']:,.0f} claims/s" if r.get("load_per_s") else "—"
            dead = fmt(r.get("dead_tuples")) if "dead_tuples" in r else "—"
            res = '{"ok": true}' if r["result"] else "none"
            lines.append(f"| {r['store']} | {res} | {r['rows']:,} | "
                         f"{r['partitions']} | {mib(r['heap']):.1f} | {mib(r['indexes']):.1f} | "
                         f"{mib(r['total']):.1f} | **{r['bytes_per_row']:.1f}** | "
                         f"{fmt(r['live_tuple_bytes'] / r['rows'], 1) if r.get('live_tuple_bytes') else '—'} | {dead} | "
                         f"{fmt(mib(r.get('free_bytes')), 1)} | {load} |")
            self.csv.append(("bytes", r["store"] + ("+result" if r["result"] else ""), "", "", "",
                             "bytes_per_row", r["bytes_per_row"], "B"))
        lines.append("")
        self.md += lines
        r = next((r for r in rows if r["store"] == "idem.claims" and not r["result"]), None)
        if r:
            self.target(f"≤ 120 bytes per claim, 32-char keys, no result ({r['rows']:,} claims)",
                        f"{r['bytes_per_row']:.1f} B", r["bytes_per_row"] <= 120)

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
                 f"1 client, synchronous_commit off, runs alternating between two databases "
                 f"({small:,} and {big:,} live keys, loaded through idem_claim and VACUUMed; the "
                 f"hand-written dedup table holds the same keys). The small database is reset to "
                 f"{small:,} keys before each run; the big one grows by what the runs add. "
                 f"Cost ratio = TPS(small) / TPS(big) = per-transaction time big / small.",
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
            note = "" if big >= 10_000_000 else f" [measured at {big:,} keys; the target is stated for 10 M: run --full or --big-keys 10000000]"
            self.target(f"I1 cost at {big:,} live keys ≤ 1.2 × at {small:,}{note}",
                        f"{d['cost_ratio']:.2f}×", d["cost_ratio"] <= 1.2)

    # ---- partitions -------------------------------------------------------------
    def partitions(self):
        rows = self.raw.get("partitions") or []
        if not rows:
            return
        out = {}
        for n in sorted(set(r["extra_partitions"] for r in rows)):
            xs = [r["tps"] for r in rows if r["extra_partitions"] == n]
            parts = rows[[r["extra_partitions"] for r in rows].index(n)]["partitions"]
            out[n] = {"partitions": parts, "median": med(xs), "min": min(xs), "max": max(xs)}
            for r in rows:
                if r["extra_partitions"] == n:
                    self.csv.append(("partitions", "I1", "off", 1, r["round"], f"tps_{parts}_partitions",
                                     r["tps"], "tx/s"))
        self.summary["partitions"] = out
        base = out[min(out)]["median"]
        lines = ["## Claim cost vs live partitions (diagnostic, no target)",
                 "",
                 "I1, 1 client, synchronous_commit off. Extra empty hourly partitions of idem.claims "
                 "401 days out, created by the benchmark to stand in for partitions maintenance "
                 "premakes: each is live (upper bound in the future), so every claim locks and probes "
                 "its heap and index. Empty partitions are the cheapest case.",
                 "",
                 "| live partitions | I1 TPS | range | × fewest |",
                 "|---|---|---|---|"]
        for n, d in out.items():
            lines.append(f"| {d['partitions']} | {d['median']:,.0f} | {d['min']:,.0f}–{d['max']:,.0f} | "
                         f"{d['median'] / base:.2f} |")
        lines.append("")
        self.md += lines

    # ---- cleanup --------------------------------------------------------------------
    def cleanup(self):
        c = self.raw.get("cleanup") or {}
        if not c:
            return
        self.summary["cleanup"] = c
        lines = ["## Cleanup of expired claims",
                 "",
                 f"Expired rows: {c['rows'][0]:,} and {c['rows'][1]:,} (plus {c['live']:,} live ones), "
                 "loaded, VACUUMed, then a CHECKPOINT (so the cleanup pays the full-page images it "
                 "would in production). Hand-written: `DELETE FROM dedup_ttl WHERE expires_at < now()` "
                 "(index on expires_at). idem: `SELECT idem_maintain()` with the expired claims in a "
                 "partition whose upper bound is past (the benchmark creates that partition, 31 to 28 "
                 "days ago, since the clock cannot be moved). Time is psql's \\timing; WAL is the "
                 "insert-LSN delta.",
                 "",
                 "| method | expired rows | time ms | WAL MiB | size before MiB | after MiB | after VACUUM MiB | expired left |",
                 "|---|---|---|---|---|---|---|---|"]
        for r in c.get("delete", []):
            lines.append(f"| DELETE | {r['rows']:,} | {r['ms']:,.0f} | {mib(r['wal']):.2f} | "
                         f"{mib(r['size_before']):.1f} | {mib(r['size_after']):.1f} | "
                         f"{mib(r['size_after_vacuum']):.1f} (VACUUM {r['vacuum_s']:.1f} s) | {r['expired_left']:,} |")
            self.csv.append(("cleanup", "DELETE", "", "", "", f"ms_{r['rows']}", r["ms"], "ms"))
            self.csv.append(("cleanup", "DELETE", "", "", "", f"wal_{r['rows']}", r["wal"], "B"))
        for r in c.get("idem", []):
            own = f" (its own duration_ms: {r['own_duration_ms']:.1f})" if r.get("own_duration_ms") is not None else ""
            lines.append(f"| idem_maintain() | {r['rows']:,} | {r['ms']:,.1f}{own} | {mib(r['wal']):.3f} | "
                         f"{mib(r['size_before']):.1f} | {mib(r['size_after']):.1f} | — | {r['expired_left']:,} |")
            self.csv.append(("cleanup", "idem_maintain", "", "", "", f"ms_{r['rows']}", r["ms"], "ms"))
            self.csv.append(("cleanup", "idem_maintain", "", "", "", f"wal_{r['rows']}", r["wal"], "B"))
        if c.get("idem_skipped"):
            lines.append(f"| idem_maintain() | — | {c['idem_skipped']} | | | | | |")
        lines.append("")
        p = c.get("p99", {})
        if p:
            lines += ["Claim latency (1 client, synchronous_commit off), per round: a run without cleanup, "
                      "then a run with the cleanup starting 1 s in. The window is the cleanup's duration "
                      "(at least 1 s); window p99 is over the claims that overlap it.",
                      "",
                      "| claims | cleanup | round | txns | p50 ms | p99 ms | max ms | window txns | window p99 ms | window max ms | cleanup ms | claim errors |",
                      "|---|---|---|---|---|---|---|---|---|---|---|---|"]
            for key, label in (("delete_base", ("B1 (dedup_ttl)", "none")),
                               ("delete_during", ("B1 (dedup_ttl)", "DELETE")),
                               ("idem_base", ("I1", "none")),
                               ("idem_during", ("I1", "idem_maintain()"))):
                for i, r in enumerate(p.get(key) or []):
                    errs = r.get("client_errors") or []
                    lines.append(f"| {label[0]} | {label[1]} | {i} | {r['txns']:,} | {fmt(r['p50_ms'], 2)} | "
                                 f"{fmt(r['p99_ms'], 2)} | {fmt(r['max_ms'], 1)} | {fmt(r.get('window_txns'))} | "
                                 f"{fmt(r.get('window_p99_ms'), 2)} | {fmt(r.get('window_max_ms'), 1)} | "
                                 f"{fmt((r.get('cleanup') or {}).get('ms'), 1)} | "
                                 f"{esc(errs[0][:120]) if errs else ''} |")
                    for k in ("p50_ms", "p99_ms", "window_p99_ms"):
                        if r.get(k) is not None:
                            self.csv.append(("cleanup", key, "off", 1, i, k, r[k], "ms"))
            lines.append("")
        self.md += lines

        names = ("cleanup ≥ 100× faster than DELETE",
                 "cleanup WAL does not grow with row count",
                 "claim p99 during cleanup ≤ 2× without")
        if c.get("idem_skipped") or not c.get("idem"):
            for n in names:
                self.target(n, c.get("idem_skipped", "skipped"), None)
            return
        d_big, i_big = c["delete"][-1], c["idem"][-1]
        i_small = c["idem"][0]
        if i_big["expired_left"]:
            self.target(names[0], f"idem_maintain() left {i_big['expired_left']:,} expired rows", False)
        else:
            x = d_big["ms"] / max(i_big["ms"], 0.001)
            self.target(names[0] + f" ({d_big['rows']:,} rows)", f"{x:,.0f}× ({d_big['ms']:,.0f} ms vs {i_big['ms']:,.1f} ms)",
                        x >= 100)
        g = i_big["wal"] / max(i_small["wal"], 1)
        self.target(names[1] + f" ({i_small['rows']:,} → {i_big['rows']:,} rows)",
                    f"{i_small['wal']:,} → {i_big['wal']:,} B ({g:.1f}×; pass if ≤ 2× for 10× rows)", g <= 2)
        base, during = p.get("idem_base") or [], p.get("idem_during") or []
        errs = [e for r in during for e in (r.get("client_errors") or [])]
        if errs:
            self.target(names[2], f"claims FAILED while idem_maintain() ran: {errs[0][:160]}", False)
        elif base and during:
            b = med([r["p99_ms"] for r in base if r.get("p99_ms") is not None])
            d = med([r["window_p99_ms"] for r in during if r.get("window_p99_ms") is not None])
            if b and d:
                x = d / b
                self.target(names[2], f"{d:.2f} ms vs {b:.2f} ms ({x:.2f}×, medians over rounds)", x <= 2)
        db_, dd = p.get("delete_base") or [], p.get("delete_during") or []
        if db_ and dd:
            b = med([r["p99_ms"] for r in db_ if r.get("p99_ms") is not None])
            d = med([r["window_p99_ms"] for r in dd if r.get("window_p99_ms") is not None])
            if b and d:
                self.summary.setdefault("cleanup_p99_delete_ratio", d / b)

    # ---- targets ------------------------------------------------------------------------
    def target(self, name, measured, ok):
        self.targets.append({"target": name, "measured": measured,
                             "status": "SKIP" if ok is None else ("PASS" if ok else "MISS")})

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
                [r for r in self.raw.get("partitions", [])]
        for v in (self.raw.get("cleanup") or {}).get("p99", {}).values():
            timed += v
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
                 f"- idem_maintain available: {m.get('maintain')}{' (FAKE stand-in, BENCH_FAKE_MAINTAIN=1)' if m.get('fake_maintain_used') else ''}; "
                 f"partitions of idem.claims at start: {m.get('partitions_at_start')}",
                 f"- cluster: private, started by bench/run.sh (initdb, port 5498, unix socket only); "
                 f"shared_buffers = {s.get('shared_buffers')} (×8kB), max_wal_size = {s.get('max_wal_size')}, "
                 f"checkpoint_timeout = {s.get('checkpoint_timeout')}, fsync = {s.get('fsync')}, "
                 f"full_page_writes = {s.get('full_page_writes')}, wal_level = {s.get('wal_level')}, "
                 f"data_checksums = {s.get('data_checksums')}, autovacuum = {s.get('autovacuum')}; "
                 "checkpoints are spaced so none lands inside a measurement, and the benchmark issues "
                 "CHECKPOINT before every measured run.",
                 f"- driver: pgbench -n -M prepared -c N -j N (B3/B0c: bench/redis_txn.c, same loop); "
                 f"synchronous_commit set per session.",
                 f"- section times (s): {m.get('section_seconds')}",
                 ""]
        if "idem_build" in m and "debug" in str(m["idem_build"]):
            head += ["> **Warning:** the installed idem.so is an unoptimized debug build; its numbers "
                     "understate a release build (`cargo pgrx install --release`).", ""]
        head += self.noise_lines()
        for n in self.raw.get("notes", []):
            head += [f"> note: {n}", ""]
        for e in self.raw.get("errors", []):
            head += [f"> **ERROR** in section {e['section']}: {e['error'][:800]}", ""]
        tl = ["## Targets", "", "| target | measured | status |", "|---|---|---|"]
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
        # The terminal gets the markdown minus the long prose lines.
        print()
        for line in self.md_for_terminal():
            print(line)

    def md_for_terminal(self):
        m = self.meta
        out = [f"idem {m.get('idem_version')} ({m.get('idem_build')}), {m.get('pg_version', '')[:60]}, "
               f"nproc {m.get('nproc')}, profile {m.get('profile')}", ""]
        out += [l for l in self.noise_lines() if l]
        for n in self.raw.get("notes", []):
            out.append(f"note: {n}")
        for e in self.raw.get("errors", []):
            out.append(f"ERROR in section {e['section']}: {e['error'][:800]}")
        out.append("")
        for line in self.md:
            out.append(line)
        out.append("## Targets" + (" (smoke sizes: not meaningful)" if self.smoke else ""))
        w = max([len(t["target"]) for t in self.targets] + [10])
        for t in self.targets:
            out.append(f"  {t['status']:4s}  {t['target']:<{w}}  {t['measured']}")
        out.append("")
        out.append(f"written: {', '.join(os.path.join(self.out, f) for f in ('results.csv', 'results.json', 'report.md', 'tps.svg'))}")
        return out


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
    for part in (r.matrix, r.wal, r.bytes_, r.scale, r.partitions, r.cleanup):
        part()
    r.svg()
    r.write()
    r.print()


if __name__ == "__main__":
    main()
