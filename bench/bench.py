#!/usr/bin/env python3
"""The driver of idem's benchmark. bench/run.sh starts the cluster (and
redis-server) and calls it; it runs the sections and writes OUT/raw.json,
which bench/report.py turns into report.md, results.csv/json and tps.svg.
Each section is bench/sections/<name>.py: PARAMS (name: smoke, default and
full value, help; each is an option --name), estimate(p) in seconds, run(b)
and report(R)."""
import argparse
import gzip
import importlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time

import lib
from lib import BenchError, VARIANTS

SECTIONS = ["matrix", "wal", "bytes", "sustained", "scale", "cleanup", "ttl", "handwritten", "kills",
            "portable", "batch"]
MOD = {n: importlib.import_module(f"sections.{n}") for n in SECTIONS}
PROFILES = ("smoke", "default", "full")
# Shared by the sections that reset the main database
PARAMS = {
    "prefill": (200, 10000, 10000, "committed keys per dedup store before each run (I3 draws from them)"),
    "steady": (200, 100000, 200000, "steady state: completed claims aged over the 1-day TTL (every "
               "partition of its class full) and as many rows per dedup store, before each run of the "
               "matrix, sustained and wal sections (0: fresh tables)"),
}
ALL_PARAMS = dict(PARAMS, **{k: v for m in MOD.values() for k, v in m.PARAMS.items()})


def convert(example, text):
    """A command-line value as the type of the profile's value."""
    if isinstance(example, list):
        kind = type(example[0]) if example else str
        return [kind(x) for x in text.split(",") if x]
    return type(example)(text)


class Bench:
    def __init__(self, a):
        self.a, self.out, self.pg_bin = a, a.out, a.pg_bin
        self.smoke = a.profile == "smoke"
        self.ckpt = "" if self.smoke else "CHECKPOINT;"   # a smoke run proves the code paths, quickly
        self.logs = os.path.join(a.out, "logs")
        shutil.rmtree(self.logs, ignore_errors=True)
        os.makedirs(self.logs)
        self.p = {k: (convert(v[1], getattr(a, k)) if getattr(a, k) is not None else v[PROFILES.index(a.profile)])
                  for k, v in ALL_PARAMS.items()}
        self.run_id = 0
        self.steady_ready = set()
        self.raw = {"meta": {}, "errors": [], "notes": [], "discarded": []}
        self.t_start = time.time()
        self.txn, self.redis = None, False
        self.meter = lib.CpuMeter(a.host, a.port, a.redis_pid)
        self.quiet_budget = a.quiet_wait if a.quiet_wait is not None else (0 if self.smoke else 1800)

    # ---- plumbing ---------------------------------------------------------------
    def log(self, msg):
        print(f"[{time.time() - self.t_start:7.1f}s] {msg}", flush=True)

    def save(self):
        with open(os.path.join(self.out, "raw.json.tmp"), "w") as f:
            json.dump(self.raw, f, indent=1, default=str)
        os.replace(os.path.join(self.out, "raw.json.tmp"), os.path.join(self.out, "raw.json"))

    def conn_args(self):
        return ["-h", self.a.host, "-p", str(self.a.port), "-U", "postgres"]

    def psql(self, db, sql):
        """SQL in one psql session; the unaligned, tuples-only output."""
        p = subprocess.run([os.path.join(self.pg_bin, "psql"), "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1"]
                           + self.conn_args() + ["-d", db], input=sql, capture_output=True, text=True)
        if p.returncode != 0:
            raise BenchError(f"psql failed in {db}: {p.stderr.strip()}\nSQL: {sql[:500]}")
        return p.stdout.strip()

    def val(self, db, sql):
        out = self.psql(db, sql)
        return out.splitlines()[-1] if out else ""

    def next_run(self):
        self.run_id += 1
        return self.run_id

    def pgbench(self, db, script, clients, sync, duration=None, txns=None, prefill=1, log_prefix=None, tag="",
                defines=None, progress=None, tick=None, every=None):
        """One pgbench run (-n -M prepared, a unique run id for the scripts'
        keys). A smoke run makes 50 transactions per client instead of a
        duration, unless it reports progress or calls tick(), which runs
        every `every` seconds while pgbench does."""
        run = self.next_run()
        if duration and self.smoke and not (progress or tick):
            duration, txns = None, 50
        cmd = [os.path.join(self.pg_bin, "pgbench"), "-n", "-M", "prepared", "-c", str(clients), "-j", str(clients),
               "-D", "n=0", "-D", f"run={run}", "-D", f"prefill={prefill}"] + \
            [x for k, v in (defines or {}).items() for x in ("-D", f"{k}={v}")] + \
            ["-f", script if os.path.isabs(script) else os.path.join(lib.SQL, script)] + self.conn_args() + \
            (["-T", str(duration)] if duration else ["-t", str(txns)]) + (["-P", str(progress)] if progress else [])
        if log_prefix:
            for f in os.listdir(self.logs):   # a retried run must not keep the earlier attempt's log
                if f.startswith(log_prefix + "."):
                    os.remove(os.path.join(self.logs, f))
            cmd += ["--log", "--log-prefix", log_prefix]
        cmd.append(db)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=self.logs,
                                env=dict(os.environ, PGOPTIONS=f"-c synchronous_commit={sync}"))
        if tick:
            t0, k = time.time(), 1
            while proc.poll() is None:
                time.sleep(max(0.0, min(0.05, t0 + k * every - time.time())))
                if proc.poll() is None and time.time() >= t0 + k * every:
                    tick()
                    k += 1
        out = proc.communicate()[0]
        with open(os.path.join(self.logs, f"run{run:05d}-{tag or os.path.basename(script)}.log"), "w") as f:
            f.write(" ".join(cmd) + "\n" + out)
        m = lambda pat: re.search(pat, out, re.M)
        tps, lat = m(r"^tps = ([\d.]+) \(without initial connection time\)"), m(r"^latency average = ([\d.]+) ms")
        done, failed = m(r"number of transactions actually processed: (\d+)"), m(r"number of failed transactions: (\d+)")
        if proc.returncode != 0 or not tps or (failed and int(failed.group(1)) > 0):
            raise BenchError(f"pgbench {script} ({tag}) failed (exit {proc.returncode}):\n{out[-1500:]}")
        return {"tps": float(tps.group(1)), "lat_ms": float(lat.group(1)) if lat else None,
                "txns": int(done.group(1)) if done else None, "run": run, "output": out if progress else None}

    def run_variant(self, db, v, clients, sync, duration, prefill, log_prefix=None):
        """One run of variant v: pgbench, or bench/txn.c (B3, B0c, I1t: the Redis comparison's one client program)."""
        driver, mode, _ = VARIANTS[v]
        if driver == "pgbench":
            return self.pgbench(db, mode, clients, sync, duration=duration, prefill=prefill, tag=v, log_prefix=log_prefix)
        run = self.next_run()
        cmd = [self.txn, mode, f"host={self.a.host} port={self.a.port} user=postgres dbname={db} "
               f"options='-c synchronous_commit={sync}'", self.a.redis_sock, str(clients), str(max(1, duration)), str(run)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        with open(os.path.join(self.logs, f"run{run:05d}-{v}.log"), "w") as f:
            f.write(" ".join(cmd) + "\n" + p.stdout + p.stderr)
        m = dict(re.findall(r"(\w+)=([\d.]+)", p.stdout))
        if p.returncode != 0 or "tps" not in m:
            raise BenchError(f"txn {mode} failed (exit {p.returncode}): {p.stderr[-1500:]}")
        return {"tps": float(m["tps"]), "lat_ms": float(m["lat_avg_ms"]), "txns": int(m["txns"]), "run": run}

    def wait_quiet(self):
        """Wait, within the --quiet-wait budget, until nothing else uses the CPU
        (a build or another cluster's tests beside the benchmark skew it)."""
        said = False
        while self.quiet_budget > 0:
            t0, a = time.time(), self.meter.snap()
            time.sleep(1.0)
            f, comp = self.meter.foreign(a, self.meter.snap()), lib.noise().get("foreign")
            if f < lib.QUIET_CORES and not comp:
                break
            if not said:
                self.log(f"  waiting for the machine to be quiet (other CPU use {f:.2f} cores"
                         f"{', ' + ' '.join(comp) if comp else ''}; budget {self.quiet_budget:.0f}s)")
                said = True
            time.sleep(4.0)
            self.quiet_budget -= time.time() - t0
        if said:
            self.log("  quiet again" if self.quiet_budget > 0 else "  quiet-wait budget spent; going on")

    def measured(self, prepare, run):
        """prepare(); run() with the CPU other processes used during it
        recorded; run again (up to twice) when that was more than a trace."""
        for attempt in range(3):
            self.wait_quiet()
            prepare()
            a = self.meter.snap()
            res = run()
            res.update(foreign_cores=round(self.meter.foreign(a, self.meter.snap()), 3), attempt=attempt,
                       **lib.noise())
            if res["foreign_cores"] < lib.NOISY_CORES or self.quiet_budget <= 0 or attempt == 2:
                return res
            self.log(f"  other processes used {res['foreign_cores']:.2f} cores during the run: measuring again")
            self.raw["discarded"].append(res)

    # ---- databases ------------------------------------------------------------------
    def create_db(self, db, settings=None, sql="", edition="native"):
        """A fresh database with the benchmark's tables (sql/schema.sql) and
        idem: the extension, or the portable edition's plain script from this
        checkout. settings (idem.* GUCs) are set on the database first, so
        that every session of it runs with them."""
        self.psql("postgres", f"DROP DATABASE IF EXISTS {db} WITH (FORCE); CREATE DATABASE {db}")
        for k, v in (settings or {}).items():
            self.psql("postgres", f"ALTER DATABASE {db} SET {k} = '{v}'")
        with open(os.path.join(lib.SQL, "schema.sql")) as f:
            self.psql(db, f.read())
        if edition == "portable":
            dist = os.path.join(self.out, "portable-dist")
            r = subprocess.run(["python3", os.path.join(os.path.dirname(lib.BENCH), "scripts", "portable.py"),
                                "--out", dist], capture_output=True, text=True)
            if r.returncode != 0:
                raise BenchError(f"scripts/portable.py failed: {r.stderr[-800:]}")
            with open(os.path.join(dist, "idem_portable.sql")) as f:
                self.psql(db, f.read())
        else:
            self.psql(db, "CREATE EXTENSION idem")
        # The WAL figures need pg_walinspect (contrib); the other sections run without it.
        if self.val(db, "SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_walinspect'") == "1":
            self.psql(db, "CREATE EXTENSION pg_walinspect")
        # The business type registered and its partitions made, as a deployment has them
        self.psql(db, lib.BENCH_CLAIM_SQL + "SELECT idem_claim('bench-setup', 'bench'); SELECT idem_maintain();"
                  + sql)

    def checkpoint(self, db):
        if self.ckpt:
            self.psql(db, self.ckpt)

    def drop_db(self, db):
        self.psql("postgres", f"DROP DATABASE {db} WITH (FORCE)")

    def maintain_fully(self, db):
        """idem_maintain() until the partition set stops changing: one run makes
        at most idem.premake_limit partitions, and a 400-day TTL needs ~400."""
        last = None
        for _ in range(50):
            n = self.val(db, "SET idem.premake_limit = 10000; SELECT idem_maintain(); "
                             "SELECT count(*) FROM pg_partition_tree('idem.claims') WHERE isleaf")
            if n == last:
                break
            last = n
        return int(last)

    def set_autovacuum(self, on):
        self.psql("postgres", f"ALTER SYSTEM SET autovacuum = {'on' if on else 'off'}; SELECT pg_reload_conf();")
        time.sleep(0.2)

    def claim_keys(self, db, prefix, n, batch=100000):
        """n keys md5(prefix || i) claimed through idem_claim, batch per transaction."""
        for lo in range(0, n, batch):
            self.psql(db, f"SELECT bench_claim('{prefix}', {lo + 1}, {min(n, lo + batch)})")

    def store(self, db, store):
        """A store's rows, leaf relations, heap (main fork), index and total
        bytes, and its table statistics (all partitions of idem.claims)."""
        rels = ("SELECT relid FROM pg_partition_tree('idem.claims') WHERE isleaf"
                if store == "idem.claims" else f"SELECT '{store}'::regclass")
        row = self.val(db, f"""
            SELECT (SELECT count(*) FROM {store}), count(*),
                   coalesce(sum(pg_relation_size(c.oid)), 0), coalesce(sum(pg_indexes_size(c.oid)), 0),
                   coalesce(sum(pg_total_relation_size(c.oid)), 0),
                   coalesce(sum(s.n_dead_tup), 0), coalesce(sum(s.autovacuum_count), 0),
                   coalesce(sum(s.n_tup_hot_upd), 0), coalesce(sum(s.n_tup_upd), 0)
              FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid WHERE c.oid IN ({rels})""")
        keys = ("rows", "partitions", "heap", "indexes", "total", "n_dead_tup", "autovacuums", "hot_updates",
                "updates")
        return dict(zip(keys, (int(x) for x in row.split("|"))), store=store)

    def reset_main(self, db, prefill, checkpoint=False):
        """Every run starts from the same state: empty business and dedup
        tables but `prefill` committed keys in each store (I3's duplicates;
        B1r's with their result), vacuumed, then (checkpoint) a CHECKPOINT.
        At steady state (`steady` > 0) the 1-day type also holds `steady`
        completed claims aged evenly over its TTL, as a table that has
        claimed for a whole day holds them (every partition a claim probes
        full; ttl.AGE_SQL), and each dedup store as many rows."""
        steady = self.p["steady"]
        if steady and db not in self.steady_ready:
            self.psql(db, "SELECT idem_configure('bench', '1 day');" + MOD["ttl"].AGE_SQL)
            self.maintain_fully(db)
            self.steady_ready.add(db)
        fill = lambda p, n: f"""
            INSERT INTO dedup (key) SELECT md5('{p}' || g::text) FROM generate_series(1, {n}) g;
            INSERT INTO dedup_r (key, result) SELECT md5('{p}' || g::text), '{{"ok": true}}' FROM generate_series(1, {n}) g;
            INSERT INTO dedup_exc (key) SELECT md5('{p}' || g::text) FROM generate_series(1, {n}) g;"""
        self.psql(db, "TRUNCATE orders, dedup, dedup_r, dedup_exc; TRUNCATE idem.claims;"
                  + (f"SELECT bench_age_claims('bench', {steady}); SELECT idem_maintain();" + fill("s", steady)
                     if steady else "") + fill("p", prefill) + f"SELECT bench_claim('p', 1, {prefill});"
                  "VACUUM ANALYZE orders, dedup, dedup_r, dedup_exc, idem.claims;" + (self.ckpt if checkpoint else ""))

    def read_txn_log(self, prefix):
        """(end epoch s, latency µs) of every transaction of pgbench's --log
        files of one run, sorted; the files are gzipped into logs/<prefix>.log.gz."""
        rows = []
        with gzip.open(os.path.join(self.logs, prefix + ".log.gz"), "wt") as out:
            for f in sorted(f for f in os.listdir(self.logs) if f.startswith(prefix + ".") and not f.endswith(".gz")):
                with open(os.path.join(self.logs, f)) as fh:
                    for line in fh:
                        out.write(line)
                        parts = line.split()
                        if len(parts) >= 6 and parts[2].isdigit():
                            rows.append((int(parts[4]) + int(parts[5]) / 1e6, int(parts[2])))
                os.remove(os.path.join(self.logs, f))
        return sorted(rows)

    # ---- main -------------------------------------------------------------------------
    def meta(self, sections):
        m = self.raw["meta"]
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
        with open("/proc/meminfo") as f:
            mem = round(int(f.readline().split()[1]) / 1048576, 1)
        settings = self.psql("postgres", """SELECT name, setting || coalesce(unit, '') FROM pg_settings WHERE name IN
            ('shared_buffers','max_wal_size','checkpoint_timeout','fsync','full_page_writes', 'wal_level',
             'autovacuum','data_checksums','wal_buffers','huge_pages','max_connections','work_mem')""")
        m.update(command=self.a.command, profile=self.a.profile, params=self.p, sections=sections,
                 date=time.strftime("%Y-%m-%d %H:%M:%S %Z"), nproc=os.cpu_count(), cpu=cpu, mem_gb=mem,
                 os=platform.platform(), pg_version=self.val("postgres", "SELECT version()"),
                 settings=dict(l.split("|") for l in settings.splitlines()),
                 idem_version=self.val("postgres", "SELECT default_version FROM pg_available_extensions "
                                                   "WHERE name = 'idem'"),
                 idem_build=lib.idem_build(), idem_so_md5=lib.digest(lib.idem_so()), redis=self.redis,
                 estimate_s={s: round(MOD[s].estimate(self.p)) for s in sections})

    def run(self, sections):
        a = self.a
        self.txn = lib.build_txn(self.out, self.pg_bin)   # B3, B0c, I1t and the kills' client
        self.redis = bool(self.txn and a.redis_sock and not a.no_redis)
        if not self.txn:
            self.raw["notes"].append("B3 and the kills skipped: bench/txn.c did not compile (needs cc and libpq-fe.h)")
        elif not a.no_redis and not a.redis_sock:
            self.raw["notes"].append("B3 skipped: redis-server not available")
        self.meta(sections)
        est = sum(self.raw["meta"]["estimate_s"].values())
        self.log(f"estimated duration of this run: {est / 60:.0f} min on an idle 2-core machine")
        self.create_db("bench")
        ok, build = True, self.raw["meta"]["idem_so_md5"]
        for s in sections:
            self.log(f"--- section {s}")
            t0 = time.time()
            if lib.digest(lib.idem_so()) != build:
                self.raw["notes"].append(f"idem.so was reinstalled during the run, before section {s}: "
                                         "the sections from there on ran a newer build")
                build = lib.digest(lib.idem_so())
            try:
                MOD[s].run(self)
            except BenchError as e:
                ok = False
                self.raw["errors"].append({"section": s, "error": str(e)})
                self.log(f"ERROR in section {s}: {e}")
            self.raw["meta"].setdefault("section_seconds", {})[s] = round(time.time() - t0, 1)
            self.save()
        self.raw["meta"]["total_seconds"] = round(time.time() - self.t_start, 1)
        self.log(f"done in {self.raw['meta']['total_seconds'] / 60:.1f} min")
        self.save()
        return ok


def main():
    ap = argparse.ArgumentParser(
        prog="bash bench/run.sh", description="idem's benchmark; starts its own cluster (bench/README.md).",
        epilog="run.sh only: --out DIR (default bench/out, bench/out/smoke for --smoke), --keep-cluster, "
               "--no-redis; BENCH_PORT (default 5498).")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--smoke", dest="profile", action="store_const", const="smoke", help="tiny sizes: proves it runs")
    g.add_argument("--full", dest="profile", action="store_const", const="full", help="the targets' sizes")
    ap.set_defaults(profile="default")
    ap.add_argument("--sections", help="comma list of " + ",".join(SECTIONS) + " (default: all)")
    ap.add_argument("--quiet-wait", type=float, help="seconds, in all, the run may wait for other CPU work to stop "
                    "before a measurement and re-run a disturbed one (default 1800; 0 with --smoke)")
    show = lambda v: ",".join(map(str, v)) if isinstance(v, list) else v
    for k, (s, d, f, h) in ALL_PARAMS.items():
        ap.add_argument("--" + k.replace("_", "-"), dest=k, help=f"{h} ({show(d)}; smoke {show(s)}, full {show(f)})")
    for k in ("out", "host"):
        ap.add_argument("--" + k, required=True, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=5498, help=argparse.SUPPRESS)
    ap.add_argument("--pg-bin", default="/usr/lib/postgresql/15/bin", help=argparse.SUPPRESS)
    ap.add_argument("--redis-sock", default="", help=argparse.SUPPRESS)
    ap.add_argument("--redis-pid", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--no-redis", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--command", default="bash bench/run.sh", help=argparse.SUPPRESS)
    a = ap.parse_args()
    sections = a.sections.split(",") if a.sections else SECTIONS
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        raise SystemExit(f"unknown section {','.join(unknown)}; known: {','.join(SECTIONS)}")
    lib.PG_CONFIG = os.path.join(a.pg_bin, "pg_config")
    if not Bench(a).run(sections):
        print("some sections failed; see errors in raw.json and logs/", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
