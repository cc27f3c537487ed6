"""Helpers the sections share: a database with chosen idem settings,
pgbench's per-transaction logs read with their timestamps, the rounds'
rotating order, medians and ratios of medians."""
import gzip
import os



class BenchError(Exception):
    """A section cannot go on (an SQL error, a failed pgbench run)."""


BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SQL = os.path.join(BENCH, "sql")


# n new keys md5(prefix || i), i = lo..hi, claimed through idem_claim in one
# statement; an error unless every one was claimed.
BENCH_CLAIM_SQL = r"""
CREATE OR REPLACE FUNCTION public.bench_claim(prefix text, lo bigint, hi bigint) RETURNS bigint
LANGUAGE plpgsql AS $f$
DECLARE n bigint;
BEGIN
  SELECT count(*) INTO n FROM generate_series(lo, hi) g,
         LATERAL idem_claim(md5(prefix || g::text), 'bench') c WHERE c.claimed;
  IF n <> hi - lo + 1 THEN
    RAISE EXCEPTION 'bench_claim: % of % keys claimed', n, hi - lo + 1;
  END IF;
  RETURN n;
END $f$;
"""


def create_db(b, db, settings=None, sql=""):
    """A fresh database with the benchmark's tables (sql/schema.sql) and idem.
    settings (idem.* GUCs) are set on the database before the extension is
    created, so that every session of it -- pgbench's, maintenance's --
    runs with them."""
    b.psql("postgres", f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    b.psql("postgres", f"CREATE DATABASE {db}")
    for k, v in (settings or {}).items():
        try:
            b.psql("postgres", f"ALTER DATABASE {db} SET {k} = '{v}'")
        except BenchError as e:
            # a build without that setting: go on with its defaults, say so
            b.raw["notes"].append(f"{db}: could not set {k} = '{v}' ({str(e).splitlines()[0][:200]})")
    with open(os.path.join(SQL, "schema.sql")) as f:
        b.psql(db, f.read())
    b.psql(db, "CREATE EXTENSION idem")
    if sql:
        b.psql(db, sql)


def maintain_fully(b, db):
    """idem_maintain() until the partition set stops changing: one run makes
    at most idem.premake_limit partitions, and a 400-day TTL needs ~400."""
    last = None
    for _ in range(50):
        b.psql(db, "SET idem.premake_limit = 10000; SELECT idem_maintain()")
        n = b.val(db, "SELECT count(*) FROM pg_partition_tree('idem.claims') WHERE isleaf")
        if n == last:
            return int(n)
        last = n
    return int(last)


def read_txn_log(b, prefix):
    """(end_epoch_s, latency_us) of every transaction in pgbench's --log
    files of one run (one file per thread); the files are then gzipped into
    logs/<prefix>.log.gz."""
    rows = []
    files = sorted(f for f in os.listdir(b.logs) if f.startswith(prefix + ".") and not f.endswith(".gz"))
    with gzip.open(os.path.join(b.logs, prefix + ".log.gz"), "wt") as out:
        for f in files:
            path = os.path.join(b.logs, f)
            with open(path) as fh:
                for line in fh:
                    out.write(line)
                    parts = line.split()
                    if len(parts) >= 6 and parts[2].isdigit():
                        rows.append((int(parts[4]) + int(parts[5]) / 1e6, int(parts[2])))
            os.remove(path)
    rows.sort()
    return rows


def rotated(items, r, rounds):
    """Round r's order of items: each round starts r·len/rounds positions
    further, so that a drift of the machine spreads over all of them."""
    off = (r * len(items)) // rounds
    return items[off:] + items[:off]


def ratio(runs, num, den):
    """Ratio of the median TPS of variant num to den's over runs, with the
    range of the same round's ratios (a tie when the target falls inside):
    (ratio, round_min, round_max), Nones when either was not measured."""
    xs = [x["tps"] for x in runs if x["variant"] == num]
    ys = [x["tps"] for x in runs if x["variant"] == den]
    if not xs or not ys:
        return None, None, None
    by_round = {}
    for x in runs:
        by_round.setdefault(x["round"], {})[x["variant"]] = x["tps"]
    pairs = [d[num] / d[den] for d in by_round.values() if num in d and den in d and d[den]]
    return median(xs) / median(ys), min(pairs, default=None), max(pairs, default=None)


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


