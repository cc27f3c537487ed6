"""scale: the claim cost (I1; B1 for context) with few and with many live keys:
two databases, 1-client runs alternating between them. Cost = 1/TPS."""
import lib
from lib import VARIANTS, fmt, table

PARAMS = {
    "small_keys": (1000, 10000, 10000, "live keys, small case"),
    "big_keys": (3000, 1000000, 10000000, "live keys, big case"),
    "scale_rounds": (1, 5, 5, "rounds of the scale section"),
}


def estimate(p):
    return 10 + (p["big_keys"] + p["small_keys"] * (1 + p["scale_rounds"] * 2)) / 70000 + p["scale_rounds"] * 4 * 5.5


def load(b, db, n):
    b.psql(db, "TRUNCATE idem.claims, dedup")
    b.claim_keys(db, "p", n)
    b.psql(db, f"INSERT INTO dedup (key) SELECT md5('p' || g::text) FROM generate_series(1, {n}) g; "
               "VACUUM ANALYZE idem.claims, dedup")


def run(b):
    p, rows = b.p, b.raw.setdefault("scale", [])
    sizes = {"small": p["small_keys"], "big": p["big_keys"]}
    for label, n in sizes.items():
        b.create_db(f"bench_{label}")
        load(b, f"bench_{label}", n)
    combos = [(v, label) for v in ("I1", "B1") for label in sizes]
    for r in range(p["scale_rounds"]):
        for v, label in combos[r % 4:] + combos[:r % 4]:
            db = f"bench_{label}"
            if label == "small":
                load(b, db, sizes["small"])   # back to exactly small_keys; the big one keeps what runs add
            b.psql(db, "TRUNCATE orders")
            live = int(b.val(db, f"SELECT count(*) FROM {'idem.claims' if v == 'I1' else 'dedup'}"))
            res = b.measured(lambda: b.checkpoint(db),
                             lambda: b.pgbench(db, VARIANTS[v][1], 1, "off", duration=b.p["duration"], tag=f"scale-{v}-{label}"))
            res.update(variant=v, size=label, keys=sizes[label], live_at_start=live, round=r)
            rows.append(res)
            b.log(f"scale round={r} {v} {label} ({live} live keys): tps={res['tps']:.1f}")
            b.save()
    b.raw["scale_big"] = b.store("bench_big", "idem.claims")
    for label in sizes:
        b.drop_db(f"bench_{label}")


def report(R):
    rows = R.raw.get("scale") or []
    if not rows:
        return
    tps = lambda v, s: [r["tps"] for r in rows if r["variant"] == v and r["size"] == s]
    keys = {r["size"]: r["keys"] for r in rows}
    cost = {v: lib.median(tps(v, "small")) / lib.median(tps(v, "big")) for v in ("I1", "B1") if tps(v, "small") and tps(v, "big")}
    R.md += ["## Claim cost with few vs many live keys", "", f"1 client, synchronous_commit off, {keys['small']:,} and "
             f"{keys['big']:,} live keys; cost big/small = TPS(small) / TPS(big).", ""] + \
        table(["variant", "TPS small", "TPS big", "cost big/small"],
              [[f"**{v}**", lib.spread(tps(v, "small")), lib.spread(tps(v, "big")), f"{c:.2f}"] for v, c in cost.items()])
    s = R.raw.get("scale_big")
    if s:
        R.md += [f"idem.claims in the big database at the end: {s['rows']:,} rows, {s['heap'] / 1048576:.0f} MiB heap "
                 f"+ {s['indexes'] / 1048576:.0f} MiB index.", ""]
    for r in rows:
        R.csv.append(("scale", r["variant"], "off", 1, r["round"], f"tps_{r['size']}_{r['keys']}", r["tps"], "tx/s"))
    R.summary["scale"] = cost
    if "I1" in cost:
        note = "" if keys["big"] >= 10_000_000 else f" [measured at {keys['small']:,} → {keys['big']:,} keys; the " \
            "target is stated for 10 k → 10 M: --full]"
        R.target(f"scale: I1 cost at {keys['big']:,} live keys ≤ 1.1 × at {keys['small']:,}{note}",
                 f"{cost['I1']:.2f}× (B1: {fmt(cost.get('B1'), 2)}×)", cost["I1"] <= 1.1)
