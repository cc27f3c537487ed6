"""ttl: does a claim cost more because other business types keep their claims
longer? New and duplicate claims of types of 1 hour to 400 days in one
database, each type holding claims spread over its whole TTL, against a
database with the 1-day type alone; the relation locks one claim holds; and
(bench/profile.sh ttl) the instructions per transaction."""
import os
import re
import shutil
import subprocess

import lib
from lib import BenchError, table

PARAMS = {
    "ttl_keys": (100, 10000, 10000, "claims per type made now (the duplicates' keys)"),
    "ttl_spread": (200, 8000, 20000, "claims per type spread over its TTL (every partition non-empty)"),
    "ttl_rounds": (1, 3, 5, "rounds per client count"),
    "ttl_clients": ([2], [1, 2], [1, 2], "client counts of the ttl section"),
    "ttl_callgrind": (0, 100, 300, "transactions per variant counted by callgrind (bench/profile.sh ttl; 0 = skip)"),
}
TYPES = [("t1h", "1 hour"), ("t1d", "1 day"), ("t30d", "30 days"), ("t400d", "400 days")]
MIXED_DB, BASE_DB = "bench_ttl_mixed", "bench_ttl_base"
TARGET = 1.1
# (label, database, type, kind, script): every type of the mixed database, then the baseline's
VARIANTS = [(f"{t}-{kind}", MIXED_DB, t, kind, f"ttl_{kind}.sql") for kind in ("new", "dup") for t, _ in TYPES] + \
    [(f"base-{kind}", BASE_DB, "t1d", kind, f"ttl_{kind}.sql") for kind in ("new", "dup")]

# Claims of type t as a database that has been claiming for the type's whole
# TTL holds them: n completed claims, claimed at times spread evenly over the
# past TTL, so their expiries run from now to now + TTL and every partition of
# that span holds rows. idem_claim cannot claim in the past (and a per-call
# ttl => would put them in other TTL classes), so they are written into
# idem.claims as claims of that age would have left them (with a storage by
# TTL class, in the TTL's class with the type registered in it, as
# tests/scenarios/recovery.sh retention does); idem_maintain() then moves any
# that landed in the default partition. One line: profile.sh feeds it to a
# single-user backend.
AGE_SQL = " ".join("""
CREATE FUNCTION public.bench_age_claims(t text, n int) RETURNS bigint LANGUAGE plpgsql AS $f$
DECLARE ttl interval; done bigint;
BEGIN
  SELECT b.ttl INTO ttl FROM idem.biz_types b WHERE b.biz_type = t;
  IF EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'idem.claims'::regclass
                AND attname = 'ttl_class' AND NOT attisdropped) THEN
    EXECUTE 'INSERT INTO idem.claims (expires_at, claimed_at, ttl_class, state, biz_type, key, result)
             SELECT at + $1, at, idem.ttl_class($1), ''c'', $2, md5(''s'' || g::text), ''{"ok": true}''
               FROM generate_series(1, $3) g, LATERAL (SELECT now() - $1 * (g / ($3 + 1.0)) AS at) c'
      USING ttl, t, n;
    GET DIAGNOSTICS done = ROW_COUNT;
    EXECUTE 'INSERT INTO idem.type_classes (biz_type, ttl_class, until)
             SELECT $1, idem.ttl_class($2), now() + $2' USING t, ttl;
  ELSE
    EXECUTE 'INSERT INTO idem.claims (expires_at, claimed_at, state, biz_type, key, result)
             SELECT at + $1, at, ''c'', $2, md5(''s'' || g::text), ''{"ok": true}''
               FROM generate_series(1, $3) g, LATERAL (SELECT now() - $1 * (g / ($3 + 1.0)) AS at) c'
      USING ttl, t, n;
    GET DIAGNOSTICS done = ROW_COUNT;
  END IF;
  RETURN done;
END $f$;""".split())


def estimate(p):
    return 30 + 5 * (p["ttl_keys"] + p["ttl_spread"]) / 3000 + len(VARIANTS) * len(p["ttl_clients"]) * \
        p["ttl_rounds"] * (p["duration"] + 1.5) + 2 * p["ttl_callgrind"]


def prefill(b, db, types):
    """The types configured and their partitions made; per type ttl_spread
    aged claims (AGE_SQL) and ttl_keys claims made now through idem_claim."""
    p = b.p
    b.psql(db, "".join(f"SELECT idem_configure('{t}', '{ttl}');" for t, ttl in types) + AGE_SQL)
    b.maintain_fully(db)
    for t, _ in types:
        if int(b.val(db, f"SELECT bench_age_claims('{t}', {p['ttl_spread']})")) != p["ttl_spread"]:
            raise BenchError(f"ttl prefill of {t}: not every aged claim was written")
    b.maintain_fully(db)   # moves what landed in the default partition
    for t, _ in types:
        n = int(b.val(db, f"SELECT count(*) FROM generate_series(1, {p['ttl_keys']}) g, "
                          f"LATERAL idem_claim(md5('p' || g::text), '{t}') c WHERE c.claimed"))
        if n != p["ttl_keys"]:
            raise BenchError(f"ttl prefill of {t}: {n} of {p['ttl_keys']} keys claimed")
    parts, nonempty, rows = b.val(db, "VACUUM ANALYZE; SELECT count(*), count(*) FILTER (WHERE pg_relation_size(relid) > 0), "
                                      "(SELECT count(*) FROM idem.claims) FROM pg_partition_tree('idem.claims') "
                                      "WHERE isleaf").split("|")
    return {"partitions": int(parts), "nonempty": int(nonempty), "rows": int(rows)}


def locks(b, db, t):
    """Relation locks (and those not fast-path) one claim holds, a new key and
    a duplicate, in a session whose caches a first claim (rolled back) filled;
    the pg_locks query's own taken off."""
    q = "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'relation'{};"
    out = {}
    for kind, key in (("new", f"md5('lockprobe-{t}')"), ("dup", "md5('p1')")):
        r = b.psql(db, f"BEGIN; SELECT 1 FROM idem_claim('lockwarm', '{t}'); ROLLBACK; BEGIN;" + q.format("")
                   + q.format(" AND NOT fastpath") + f"SELECT claimed FROM idem_claim({key}, '{t}');" + q.format("")
                   + q.format(" AND NOT fastpath") + "ROLLBACK;").split()[-5:]
        out[kind] = {"relation": int(r[3]) - int(r[0]), "not_fastpath": int(r[4]) - int(r[1])}
    return out


def run(b):
    p = b.p
    raw = b.raw["ttl"] = {"runs": [], "layout": {}, "locks": {}}
    for db, types in ((MIXED_DB, TYPES), (BASE_DB, TYPES[1:2])):
        b.create_db(db)
        raw["layout"][db] = lay = prefill(b, db, types)
        b.log(f"ttl: {db}: {lay['rows']} live claims in {lay['nonempty']} non-empty of {lay['partitions']} partitions")
    for label, db, t, kind, _ in VARIANTS:
        if kind == "new":
            raw["locks"][label.split("-")[0]] = locks(b, db, t)
    k, total = 0, len(p["ttl_clients"]) * p["ttl_rounds"] * len(VARIANTS)
    for clients in p["ttl_clients"]:
        for r in range(p["ttl_rounds"]):
            for label, db, t, kind, script in lib.rotated(VARIANTS, r, p["ttl_rounds"]):
                k += 1
                res = b.measured(lambda: b.checkpoint(db),
                                 lambda: b.pgbench(db, script, clients, "off", duration=p["duration"], prefill=p["ttl_keys"],
                                                   tag=f"ttl-{label}", defines={"type": t}))
                res.update(variant=label, clients=clients, round=r)
                raw["runs"].append(res)
                b.log(f"ttl {k}/{total}: c={clients} round={r} {label:9s} tps={res['tps']:9.1f}")
            b.save()
    for db in (MIXED_DB, BASE_DB):
        b.drop_db(db)
    if p["ttl_callgrind"] and shutil.which("valgrind"):
        # after the timed runs, so that valgrind's CPU use skews none of them
        r = subprocess.run(["bash", os.path.join(lib.BENCH, "profile.sh"), "ttl", str(p["ttl_callgrind"]),
                            str(min(p["ttl_spread"], 2000))], capture_output=True, text=True,
                           env=dict(os.environ, PG_CONFIG=lib.PG_CONFIG))
        raw["callgrind"] = {m[0]: int(m[1]) for m in re.findall(r"^(\S+-(?:new|dup))\s+(\d+)$", r.stdout, re.M)}
        if r.returncode != 0 or not raw["callgrind"]:
            raise BenchError(f"ttl: bench/profile.sh ttl failed: {(r.stderr or r.stdout)[-800:]}")


def report(R):
    raw = R.raw.get("ttl") or {}
    runs = raw.get("runs") or []
    if not runs:
        return
    clients = sorted(set(x["clients"] for x in runs))
    cg, lk, rows, worst = raw.get("callgrind") or {}, raw.get("locks") or {}, [], []
    for label, _, t, kind, _ in VARIANTS:
        who = label.split("-")[0]
        row = [t if who != "base" else "**t1d alone (baseline)**", kind]
        for c in clients:
            here = [x for x in runs if x["clients"] == c]
            cost = lib.ratio(here, f"base-{kind}", label)
            row += [lib.spread([x["tps"] for x in here if x["variant"] == label]), "—" if who == "base" else lib.fmt_ratio(cost)]
            if who != "base" and cost[0]:
                worst.append((cost[0], f"{t} {kind} c={c}"))
        d, ins, base = lk.get(who, {}).get(kind), cg.get(label), cg.get(f"base-{kind}")
        rows.append(row + [f"{d['relation']} ({d['not_fastpath']})" if d else "—", lib.fmt(ins),
                           f"{ins / base:.2f}" if ins and base and who != "base" else "—"])
    for x in runs:
        R.csv.append(("ttl", x["variant"], "off", x["clients"], x["round"], "tps", x["tps"], "tx/s"))
    R.md += ["## TTL as a dimension", "", f"Cost × base = the 1-day-only baseline's TPS / the type's (ratio of medians, "
             f"same-round range); target ≤ {TARGET}. Relation locks after one claim in an open transaction (not "
             "fast-path in brackets: a backend has 16 fast-path slots). instr/txn: bench/profile.sh ttl "
             + ("(callgrind)." if cg else "(not run: --ttl-callgrind 0 or no valgrind)."), ""] + \
        [f"- `{db}`: {d['rows']:,} live claims, {d['nonempty']} non-empty of {d['partitions']} partitions"
         for db, d in raw["layout"].items()] + [""] + \
        table(["type", "kind"] + [h for c in clients for h in (f"c={c} TPS (range)", "cost × base")] +
              ["relation locks", "instr/txn", "instr × base"], rows)
    R.summary["ttl"] = {"worst": max(worst) if worst else None, "locks": lk, "callgrind": cg}
    if worst:
        w = max(worst)
        R.target(f"ttl: every type's claim cost ≤ {TARGET} × the 1-day-only baseline (new and duplicate claims, "
                 "each client count)", "; ".join(f"{n}: {c:.2f}" for c, n in sorted(worst, reverse=True)[:4]),
                 w[0] <= TARGET)
