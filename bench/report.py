#!/usr/bin/env python3
"""Turn OUT/raw.json (bench/bench.py's) into OUT/report.md, results.csv,
results.json and tps.svg, and print the targets; each section's tables come
from its module's report(R). Needs no database: run it again on a raw.json.

    python3 bench/report.py bench/out"""
import csv
import json
import math
import os
import statistics
import sys

from bench import MOD, SECTIONS
from lib import VARIANTS

COLORS = ["#7f7f7f", "#1f77b4", "#aec7e8", "#17becf", "#9467bd", "#d62728", "#ff9896", "#8c564b", "#ff7f0e",
          "#2ca02c", "#bcbd22"]


class Report:
    def __init__(self, out):
        self.out = out
        with open(os.path.join(out, "raw.json")) as f:
            self.raw = json.load(f)
        self.meta = self.raw["meta"]
        self.smoke = self.meta.get("profile") == "smoke"
        self.summary, self.targets, self.md, self.csv = {}, [], [], []

    def target(self, name, measured, ok):
        self.targets.append({"target": name, "measured": measured,
                             "status": "SKIP" if ok is None else ("PASS" if ok else "MISS")})

    def svg(self):
        """TPS per variant, client count and synchronous_commit: median bars, min–max whiskers."""
        summ = self.summary.get("matrix")
        if not summ:
            return
        syncs = list(dict.fromkeys(k.split("/")[0] for k in summ))
        clients = sorted(set(int(k.split("/")[1]) for k in summ))
        vs = [v for v in VARIANTS if v != "B0c" and any(v in c for c in summ.values())]
        ymax = max(d["max"] for c in summ.values() for v, d in c.items() if v in vs)
        e = 10 ** math.floor(math.log10(ymax / 5))
        step = next(m * e for m in (1, 2, 2.5, 5, 10) if m * e >= ymax / 5)
        top, pw, ph, ml, mt = step * (int(ymax / step) + 1), 440, 300, 70, 60
        W, H = ml + len(syncs) * (pw + 30) + 10, mt + ph + 70 + 18 * (len(vs) // 4 + 1)
        o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
             f'<rect width="{W}" height="{H}" fill="white"/>',
             f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="15">idem benchmark: TPS per variant (median; '
             f'whiskers min–max){" — SMOKE: numbers meaningless" if self.smoke else ""}</text>']
        for si, s in enumerate(syncs):
            x0 = ml + si * (pw + 30)
            o.append(f'<text x="{x0 + pw / 2}" y="{mt - 6}" text-anchor="middle">synchronous_commit = {s}</text>'
                     f'<rect x="{x0}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
            for k in range(int(top / step) + 1):
                y = mt + ph - k * step / top * ph
                o.append(f'<line x1="{x0}" x2="{x0 + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                         + (f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{k * step:,.0f}</text>' if si == 0 else ""))
            gw = pw / len(clients)
            bw = (gw - 16) / len(vs)
            for ci, c in enumerate(clients):
                o.append(f'<text x="{x0 + ci * gw + gw / 2}" y="{mt + ph + 16}" text-anchor="middle">{c} client(s)</text>')
                for vi, v in enumerate(vs):
                    d = summ.get(f"{s}/{c}", {}).get(v)
                    if d:
                        bx, bh, cx = x0 + ci * gw + 8 + vi * bw, d["median"] / top * ph, x0 + ci * gw + 8 + (vi + 0.5) * bw
                        o.append(f'<rect x="{bx:.1f}" y="{mt + ph - bh:.1f}" width="{bw - 1:.1f}" height="{bh:.1f}" '
                                 f'fill="{COLORS[vi % len(COLORS)]}"><title>{v} {s} c={c}: {d["median"]:,.0f}</title></rect>'
                                 f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{mt + ph - d["min"] / top * ph:.1f}" '
                                 f'y2="{mt + ph - d["max"] / top * ph:.1f}" stroke="black"/>')
        for vi, v in enumerate(vs):
            lx, ly = ml + (vi % 4) * 230, mt + ph + 36 + 18 * (vi // 4)
            o.append(f'<rect x="{lx}" y="{ly}" width="12" height="12" fill="{COLORS[vi % len(COLORS)]}"/>'
                     f'<text x="{lx + 16}" y="{ly + 10}" font-size="11">{v} {VARIANTS[v][2].replace("&", "&amp;")}</text>')
        with open(os.path.join(self.out, "tps.svg"), "w") as f:
            f.write("\n".join(o + ["</svg>"]) + "\n")

    def noise(self):
        """How much other work ran beside the measurements."""
        timed = [r for v in self.raw.values() if isinstance(v, (list, dict))
                 for r in (v if isinstance(v, list) else v.get("runs", [])) if isinstance(r, dict) and "foreign_cores" in r]
        if not timed:
            return []
        fc = sorted(r["foreign_cores"] for r in timed)
        noisy = [r for r in timed if r["foreign_cores"] >= 0.25 or r.get("foreign")]
        out = [f"- noise: other processes used {statistics.median(fc):.2f} cores (median; max {fc[-1]:.2f}) during "
               f"the timed runs; {len(self.raw.get('discarded', []))} run(s) measured again for that reason", ""]
        if noisy:
            out += [f"> **Noise:** {len(noisy)} of {len(timed)} timed runs shared the machine with other work; their "
                    "numbers are suspect.", ""]
        return out

    def write(self):
        m, s = self.meta, self.meta.get("settings", {})
        head = ["# idem benchmark report", ""] + \
            (["**SMOKE RUN: tiny sizes; the numbers and PASS/MISS mean nothing.**", ""] if self.smoke else []) + [
            f"- date: {m['date']}; command: `{m['command']}` (profile {m['profile']}, "
            f"{m.get('total_seconds', 0) / 60:.1f} min; section seconds {m.get('section_seconds')})",
            f"- machine: nproc {m['nproc']}, {m['cpu']}, {m['mem_gb']} GB RAM, {m['os']}",
            f"- {m['pg_version']}; idem {m['idem_version']}, installed build: **{m['idem_build']}**",
            "- cluster: bench/run.sh's own, unix socket only; " + ", ".join(f"{k} = {v}" for k, v in s.items())
            + "; CHECKPOINT before every measured run",
            "- driver: pgbench -n -M prepared -c N -j N (B3, B0c, I1t: bench/txn.c); synchronous_commit per session", ""]
        if "debug" in str(m.get("idem_build")):
            head += ["> **Warning:** idem.so is an unoptimized debug build; its numbers understate a release build.", ""]
        head += self.noise() + [f"> note: {n}" for n in self.raw.get("notes", [])] + \
            [f"> **ERROR** in section {e['section']}: {e['error'][:800]}" for e in self.raw.get("errors", [])] + [""]
        tl = ["## Targets", "", "A MISS states what was measured; sizes below the target's are flagged in brackets.", "",
              "| target | measured | status |", "|---|---|---|"] + \
            [f"| {t['target']} | {t['measured']} | **{t['status']}** |" for t in self.targets] + [""] + \
            (["![TPS](tps.svg)", ""] if os.path.exists(os.path.join(self.out, "tps.svg")) else [])
        with open(os.path.join(self.out, "report.md"), "w") as f:
            f.write("\n".join(head + tl + self.md) + "\n")
        with open(os.path.join(self.out, "results.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["section", "variant", "sync", "clients", "round", "metric", "value", "unit"])
            w.writerows(self.csv)
        with open(os.path.join(self.out, "results.json"), "w") as f:
            json.dump({"meta": m, "targets": self.targets, "summary": self.summary, "notes": self.raw.get("notes"),
                       "errors": self.raw.get("errors")}, f, indent=1, default=str)
        print(f"\nidem {m['idem_version']} ({m['idem_build']}), {m['pg_version'][:60]}, profile {m['profile']}")
        for line in [l for l in self.noise() if l] + [f"note: {n}" for n in self.raw.get("notes", [])] + \
                [f"ERROR in section {e['section']}: {e['error'][:800]}" for e in self.raw.get("errors", [])]:
            print(line)
        print("\n## Targets" + (" (smoke sizes: not meaningful)" if self.smoke else ""))
        w = max([len(t["target"]) for t in self.targets] + [10])
        for t in self.targets:
            print(f"  {t['status']:4s}  {t['target']:<{w}}  {t['measured']}")
        print("tables: " + os.path.join(self.out, "report.md"))


def main():
    r = Report(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"))
    for s in SECTIONS:
        MOD[s].report(r)
    r.svg()
    r.write()


if __name__ == "__main__":
    main()
