"""ttl section: does a claim's cost depend on its business type's TTL? New
and duplicate claims of types of 1 hour to 400 days against a database with
the 1-day type alone, and the relation locks one claim holds. The method is
bench/README.md's ("ttl")."""
import os
import re
import shutil
import subprocess

from . import common

TYPES = [("t1h", "1 hour", 3600), ("t1d", "1 day", 86400), ("t30d", "30 days", 30 * 86400),
         ("t400d", "400 days", 400 * 86400)]
MIXED_DB, BASE_DB = "bench_ttl_mixed", "bench_ttl_base"
KINDS = [("new", "ttl_new.sql"), ("dup", "ttl_dup.sql")]
TARGET = 1.1

PROFILES = {
    "smoke": dict(ttl_keys=500, ttl_spread=1000, ttl_rounds=1, ttl_duration=1, ttl_clients=[2],
                  ttl_callgrind=0),
    "default": dict(ttl_keys=10000, ttl_spread=8000, ttl_rounds=3, ttl_duration=4, ttl_clients=[1, 2],
                    ttl_callgrind=100),
    "full": dict(ttl_keys=10000, ttl_spread=20000, ttl_rounds=5, ttl_duration=5, ttl_clients=[1, 2],
                 ttl_callgrind=300),
}
OPTIONS = [("--ttl-rounds", "ttl_rounds", int, "ttl section: rounds per client count"),
           ("--ttl-duration", "ttl_duration", int, "ttl section: seconds per run"),
           ("--ttl-spread", "ttl_spread", int,
            "ttl section: claims per type spread over its TTL (every partition non-empty)"),
           ("--ttl-callgrind", "ttl_callgrind", int,
            "ttl section: transactions per variant counted by callgrind (bench/profile.sh ttl; "
            "0 = skip; default 100, smoke 0)")]


def variants():
    """(label, database, business type, kind, script): every type of the
    mixed database, then the baseline's 1-day type."""
    out = []
    for kind, script in KINDS:
        for t, _, _ in TYPES:
            out.append((f"{t}-{kind}", MIXED_DB, t, kind, script))
        out.append((f"base-{kind}", BASE_DB, "t1d", kind, script))
    return out


def estimate(p, rates):
    n = len(variants()) * len(p["ttl_clients"]) * p["ttl_rounds"]
    fill = (len(TYPES) + 1) * (p["ttl_keys"] + p["ttl_spread"]) / 3000
    cg = 200 * p["ttl_callgrind"] / 100 if p["ttl_callgrind"] else 0
    return 30 + fill + n * (p["ttl_duration"] + rates["run_overhead_s"]) + cg


# Claims of type t as a database that has been claiming for the type's
# whole TTL holds them: n completed claims, claimed at times spread evenly
# over the past TTL, so their expiries run from now to now + TTL and every
# partition of that span holds rows. idem_claim cannot claim in the past
# (and a per-call ttl => would put the rows in other TTL classes and
# register the type there), so they are written into idem.claims as claims
# of that age would have left them: with a storage by TTL class (a ttl_class
# column), in the TTL's class and with the type registered in it, as
# tests/scenarios/recovery.sh retention writes them; idem_maintain() then moves any
# that landed in the default partition. One line: bench/profile.sh feeds it
# to a single-user backend.
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


def prefill(b, db, types):
    """Configure the types, make the partitions their TTLs need, then per
    type: ttl_spread claims aged evenly over the type's TTL (AGE_SQL: the
    live rows span every partition of the TTL range) and ttl_keys claims
    made now through idem_claim (the duplicates' keys, live for the run)."""
    p = b.p
    for t, ttl, _ in types:
        b.psql(db, f"SELECT idem_configure('{t}', '{ttl}')")
    b.psql(db, AGE_SQL)
    common.maintain_fully(b, db)
    for t, _, _ in types:
        n = int(b.val(db, f"SELECT bench_age_claims('{t}', {p['ttl_spread']})"))
        if n != p["ttl_spread"]:
            raise common.BenchError(f"ttl prefill of {t}: {n} of {p['ttl_spread']} aged claims written")
    parts = common.maintain_fully(b, db)   # moves what landed in the default partition
    for t, _, _ in types:
        n = int(b.val(db, f"""
            SELECT count(*) FROM generate_series(1, {p['ttl_keys']}) g,
                   LATERAL idem_claim(md5('p' || g::text), '{t}') c WHERE c.claimed"""))
        if n != p["ttl_keys"]:
            raise common.BenchError(f"ttl prefill of {t}: {n} of {p['ttl_keys']} keys claimed")
    b.psql(db, "VACUUM ANALYZE")
    layout = b.val(db, """
        SELECT count(*), count(*) FILTER (WHERE pg_relation_size(relid) > 0)
          FROM pg_partition_tree('idem.claims') WHERE isleaf""").split("|")
    rows = int(b.val(db, "SELECT count(*) FROM idem.claims"))
    return {"partitions": int(layout[0]), "nonempty": int(layout[1]), "rows": rows,
            "partitions_after_maintain": parts}


def locks(b, db, t):
    """Relation locks held in a transaction that made one claim (new key,
    then a duplicate), and before any claim (the pg_locks query's own), in
    a session whose caches a first claim has filled."""
    q = ("SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'relation'{};")
    out = {}
    for kind, key in (("new", f"md5('lockprobe-{t}')"), ("dup", "md5('p1')")):
        # a first claim in a session fills its caches (reading more
        # relations): warm them in a transaction rolled back first
        res = b.psql(db, f"BEGIN; SELECT 1 FROM idem_claim('lockwarm', '{t}'); ROLLBACK;\n"
                     "BEGIN;\n" + q.format("") + q.format(" AND NOT fastpath")
                     + f"SELECT claimed FROM idem_claim({key}, '{t}');\n"
                     + q.format("") + q.format(" AND NOT fastpath") + "ROLLBACK;").split()[-5:]
        before, before_slow, claimed, total, slow = res
        out[kind] = {"before": int(before), "before_not_fastpath": int(before_slow),
                     "claimed": claimed == "t", "relation": int(total), "not_fastpath": int(slow),
                     "claim_relation": int(total) - int(before),
                     "claim_not_fastpath": int(slow) - int(before_slow)}
    return out


def run(b):
    p = b.p
    raw = b.raw["ttl"] = {"runs": [], "layout": {}, "locks": {}}
    for db, types in ((MIXED_DB, TYPES), (BASE_DB, [x for x in TYPES if x[0] == "t1d"])):
        common.create_db(b, db)
        raw["layout"][db] = lay = prefill(b, db, types)
        b.log(f"ttl: {db}: types {', '.join(t for t, _, _ in types)}; {lay['rows']} live claims in "
              f"{lay['nonempty']} non-empty of {lay['partitions']} partitions")
    for label, db, t, kind, _ in variants():
        if kind == "new":
            raw["locks"][label.rsplit("-", 1)[0]] = lk = locks(b, db, t)
            b.log(f"ttl locks {label.rsplit('-', 1)[0]:5s}: new claim holds {lk['new']['claim_relation']} "
                  f"relation locks ({lk['new']['claim_not_fastpath']} not fast-path); duplicate "
                  f"{lk['dup']['claim_relation']} ({lk['dup']['claim_not_fastpath']})")
    b.save()
    vs = variants()
    total = len(p["ttl_clients"]) * p["ttl_rounds"] * len(vs)
    k = 0
    for clients in p["ttl_clients"]:
        for r in range(p["ttl_rounds"]):
            for label, db, t, kind, script in common.rotated(vs, r, p["ttl_rounds"]):
                k += 1
                res = b.measured(
                    lambda: b.checkpoint(db),
                    lambda: b.pgbench(db, script, clients, "off", duration=p["ttl_duration"],
                                      prefill=p["ttl_keys"], tag=f"ttl-{label}",
                                      defines={"type": t}))
                res.update(section="ttl", variant=label, type=t, kind=kind, db=db, clients=clients,
                           round=r, sync="off")
                raw["runs"].append(res)
                b.log(f"ttl {k}/{total}: c={clients} round={r} {label:9s} tps={res['tps']:9.1f}")
            b.save()
    for db in (MIXED_DB, BASE_DB):
        b.psql("postgres", f"DROP DATABASE {db} WITH (FORCE)")
    b.save()
    if p["ttl_callgrind"]:
        callgrind(b, raw)


def callgrind(b, raw):
    """Instructions per transaction of each variant, by bench/profile.sh ttl
    (single-user backends under callgrind, on their own cluster, after the
    timed runs so that valgrind's CPU use skews none of them)."""
    p = b.p
    if not shutil.which("valgrind"):
        raw["callgrind_note"] = "valgrind is not installed: no instruction counts"
        return
    b.log(f"ttl: instruction counts (callgrind, {p['ttl_callgrind']} transactions per variant)")
    env = dict(os.environ, PG_CONFIG=os.path.join(b.pg_bin, "pg_config"))
    r = subprocess.run(["bash", os.path.join(common.BENCH, "profile.sh"), "ttl", str(p["ttl_callgrind"]),
                        str(min(p["ttl_spread"], 2000))], capture_output=True, text=True, env=env)
    with open(os.path.join(b.logs, "ttl-callgrind.log"), "w") as f:
        f.write(r.stdout + r.stderr)
    counts = {m.group(1): int(m.group(2))
              for m in re.finditer(r"^(\S+-(?:new|dup))\s+(\d+)$", r.stdout, re.M)}
    if r.returncode != 0 or not counts:
        raise common.BenchError(f"ttl: bench/profile.sh ttl failed: {(r.stderr or r.stdout)[-800:]}")
    raw["callgrind"] = counts
    raw["callgrind_txns"] = p["ttl_callgrind"]
    b.log("ttl instr/txn: " + ", ".join(f"{k} {v:,}" for k, v in counts.items()))


# ---- report ------------------------------------------------------------------
def report(R):
    raw = R.raw.get("ttl") or {}
    runs = raw.get("runs") or []
    if not runs:
        return
    for x in runs:
        R.csv.append(("ttl", x["variant"], x["sync"], x["clients"], x["round"], "tps", x["tps"], "tx/s"))
    for who, lk in (raw.get("locks") or {}).items():
        for kind, d in lk.items():
            R.csv.append(("ttl", f"{who}-{kind}", "", 1, 0, "relation_locks", d["claim_relation"], "locks"))
            R.csv.append(("ttl", f"{who}-{kind}", "", 1, 0, "relation_locks_not_fastpath",
                          d["claim_not_fastpath"], "locks"))
    clients = sorted(set(x["clients"] for x in runs))
    summ = {}
    lines = ["## TTL as a dimension (ttl section)", "",
             "Cost × base = the 1-day-only baseline's TPS / the type's (ratio of medians; in brackets "
             f"the same-round ratios' range); target ≤ {TARGET} (method: bench/README.md, ttl).", ""]
    for db, lay in (raw.get("layout") or {}).items():
        lines.append(f"- `{db}`: {lay['rows']:,} live claims, {lay['nonempty']} non-empty of "
                     f"{lay['partitions']} partitions of idem.claims")
    lines.append("")
    hdr = "| type | kind | " + " | ".join(f"c={c} TPS | range | cost × base" for c in clients) + \
        " | relation locks (not fast-path) | instr/txn | instr × base |"
    lines += [hdr, "|---|---|" + "---|" * (3 * len(clients) + 3)]
    cg = raw.get("callgrind") or {}
    worst = []
    for kind, _ in KINDS:
        for t in [x[0] for x in TYPES] + ["base"]:
            label = f"{t}-{kind}"
            row = [t if t != "base" else "**t1d alone (baseline)**", kind]
            for c in clients:
                xs = [x["tps"] for x in runs if x["variant"] == label and x["clients"] == c]
                if not xs:
                    row += ["—"] * 3
                    continue
                m = common.median(xs)
                cost, lo, hi = common.ratio([x for x in runs if x["clients"] == c], f"base-{kind}", label)
                summ[f"{label}/{c}"] = {"median": m, "min": min(xs), "max": max(xs), "cost": cost}
                if t != "base" and cost is not None:
                    worst.append((cost, f"{t} {kind} c={c}"))
                rng = f" ({lo:.2f}–{hi:.2f})" if lo is not None and hi > lo else ""
                row += [f"{m:,.0f}", f"{min(xs):,.0f}–{max(xs):,.0f}",
                        "—" if t == "base" else (f"{cost:.2f}{rng}" if cost else "—")]
            lk = (raw.get("locks") or {}).get("base" if t == "base" else t, {}).get(kind)
            row.append(f"{lk['claim_relation']} ({lk['claim_not_fastpath']})" if lk else "—")
            ins, base_ins = cg.get(label), cg.get(f"base-{kind}")
            row.append(f"{ins:,}" if ins else "—")
            row.append(f"{ins / base_ins:.2f}" if ins and base_ins and t != "base" else "—")
            if ins:
                R.csv.append(("ttl", label, "off", 1, 0, "instructions_per_txn", ins, "instr"))
            lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Relation locks: `count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = "
              "'relation'` after one `idem_claim` in an open transaction, minus the same count before it "
              "(the pg_locks query's own); in brackets those that are not fast-path (a backend has 16 "
              "fast-path slots; beyond them locks go through the shared lock table).",
              ""]
    if cg:
        lines += ["instr/txn: instructions per transaction counted by callgrind in a single-user "
                  "backend (`bench/profile.sh ttl`: the same types and prefill built on its own cluster; "
                  f"{raw.get('callgrind_txns')} and a tenth as many transactions per variant, the "
                  "difference over the difference). instr × base: over the 1-day-only baseline's.", ""]
    else:
        lines += ["instr/txn: not measured in this run ("
                  + (raw.get("callgrind_note") or "--ttl-callgrind 0") + ").", ""]
    R.md += lines
    R.summary["ttl"] = summ
    if worst:
        w = max(worst)
        R.target("ttl", f"ttl: every type's claim cost ≤ {TARGET} × the 1-day-only baseline (new and "
                 "duplicate claims, each client count)",
                 "; ".join(f"{n}: {c:.2f}" for c, n in sorted(worst, reverse=True)[:4])
                 + f" (worst {w[1]}: {w[0]:.2f})", w[0] <= TARGET)
