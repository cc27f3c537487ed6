"""scale section: the claim cost (I1, and B1 for context) with few vs many
live keys, two databases, runs alternating between them."""
import time

from variants import VARIANTS


def run(b):
    """I1 (and B1, for context) with few vs many live keys: two
    databases, runs alternating between them."""
    p = b.p
    sizes = {"small": p["scale_small"], "big": p["scale_big"]}
    for label, n in sizes.items():
        db = f"bench_{label}"
        b.create_db(db)
        t0 = time.time()
        b.claim_keys(db, "p", n)
        b.psql(db, f"INSERT INTO dedup (key) SELECT md5('p' || g::text) FROM generate_series(1, {n}) g")
        b.psql(db, "VACUUM ANALYZE")
        b.log(f"scale: {db} prefilled with {n} keys in {time.time() - t0:.0f}s")
    combos = [(v, label) for v in ("I1", "B1") for label in sizes]
    for r in range(p["scale_rounds"]):
        off = r % len(combos)
        order = combos[off:] + combos[:off]
        for v, label in order:
            db = f"bench_{label}"
            if label == "small":
                # keep "small" small: back to exactly scale_small keys
                b.psql(db, "TRUNCATE idem.claims, dedup")
                b.claim_keys(db, "p", sizes[label])
                b.psql(db, f"INSERT INTO dedup (key) SELECT md5('p' || g::text) "
                              f"FROM generate_series(1, {sizes[label]}) g")
                b.psql(db, "VACUUM ANALYZE idem.claims, dedup")
            b.psql(db, "TRUNCATE orders")
            store = "idem.claims" if v == "I1" else "dedup"
            live = int(b.val(db, f"SELECT count(*) FROM {store}"))
            res = b.measured(
                lambda: b.checkpoint(db),
                lambda: b.pgbench(db, VARIANTS[v][1], 1, "off", duration=p["scale_duration"],
                                  tag=f"scale-{v}-{label}"))
            res.update(variant=v, size=label, keys=sizes[label], live_at_start=live, round=r)
            b.raw["scale"].append(res)
            b.log(f"scale round={r} {v} {label} ({live} live keys): tps={res['tps']:.1f}")
            b.save()
    b.raw["scale_sizes"] = {l: claims_size_db(b, f"bench_{l}") for l in sizes}
    for label in sizes:
        b.psql("postgres", f"DROP DATABASE bench_{label} WITH (FORCE)")
    b.save()


def claims_size_db(b, db):
    s = b.claims_size(db)
    s["rows"] = int(b.val(db, "SELECT count(*) FROM idem.claims"))
    return s
