"""partitions section: the claim cost (I1) against the number of live range
partitions of idem.claims."""


def run(b):
    """I1 with extra live range partitions of idem.claims (as premade
    by maintenance): every claim locks and probes each live partition."""
    p = b.p
    dbs = {}
    for n in p["parts"]:
        db = f"bench_parts{n}"
        dbs[n] = db
        b.create_db(db)
        if n:
            # n hourly partitions 401 days out (past the longest TTL, so
            # that they collide with nothing maintenance makes): live
            # (upper bound in the future), hence locked and probed by
            # every claim, but empty: a lower bound on what populated
            # premade partitions cost.
            b.psql(db, f"""
              DO $$
              DECLARE t0 timestamptz := date_trunc('hour', now()) + interval '401 days';
              BEGIN
                FOR i IN 0..{n - 1} LOOP
                  PERFORM bench_make_partition('bench_part_' || i,
                                 t0 + i * interval '1 hour', t0 + (i + 1) * interval '1 hour');
                END LOOP;
              END $$""")
        b.claim_keys(db, "p", p["prefill"])
        b.psql(db, "VACUUM ANALYZE")
    counts = {n: b.claims_size(db)["partitions"] for n, db in dbs.items()}
    for r in range(p["parts_rounds"]):
        order = list(dbs.items())
        off = r % len(order)
        order = order[off:] + order[:off]
        for n, db in order:
            res = b.measured(
                lambda: (b.psql(db, "TRUNCATE orders"), b.checkpoint(db)),
                lambda: b.pgbench(db, "i1.sql", 1, "off", duration=p["parts_duration"],
                                  tag=f"parts{n}"))
            res.update(extra_partitions=n, partitions=counts[n], round=r)
            b.raw["partitions"].append(res)
            b.log(f"partitions round={r}: {counts[n]} live partitions: tps={res['tps']:.1f}")
            b.save()
    for db in dbs.values():
        b.psql("postgres", f"DROP DATABASE {db} WITH (FORCE)")
