#!/usr/bin/env python3
"""The measuring half of idem's benchmark. bench/run.sh starts the cluster
(and redis) and calls this with --host/--port; it writes OUT/raw.json, which
bench/report.py turns into the tables, CSV/JSON, report.md and tps.svg.

Sections (README.md explains each):
  matrix      TPS of every variant, interleaved, per synchronous_commit and
              client count
  latency     p50/p99 per transaction at 2 clients, from per-transaction logs
  wal         WAL bytes and transaction ids per transaction, per variant
  bytes       bytes per claim after N claims; heap bytes per completed claim
              (I2's pattern) vs the hand-written table with a result (B1r's)
  sustained   TPS per window over a long run on one growing table
  scale       claim cost with few vs many live keys
  partitions  claim cost vs number of live partitions of idem.claims
  cleanup     idem_maintain() vs DELETE ... WHERE expires_at < now()
  ttl         claim cost per business type TTL (1 h .. 400 days) in one
              database, against a database with only a 1-day type
              (sections/ttl.py)
  handwritten a hand-written dedup table with a periodic DELETE job vs idem
              with idem_maintain() on the same schedule, at a short TTL,
              until steady state (sections/handwritten.py)
  kills       what each approach leaves behind when the client is killed
              between the dedup step and COMMIT (sections/kills.py)
  portable    the portable edition (plain script) next to the native edition
              and B1/B1r, two databases of one cluster (sections/portable.py)
"""
import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time

import drivers
from drivers import build_redis_driver, idem_build, idem_so_digest
from measure import NOISY_CORES, QUIET_CORES, CpuMeter, hist_stats, lat_stats, noise, pct
from sections import common
from sections import handwritten as section_handwritten_mod
from sections import kills as section_kills_mod
from sections import portable as section_portable_mod
from sections import ttl as section_ttl_mod
from variants import (LATENCY_VARIANTS, MATRIX_VARIANTS, STORE, SUSTAINED_VARIANTS, VARIANTS,
                      WAL_VARIANTS)

BENCH = os.path.dirname(os.path.abspath(__file__))
SQL = os.path.join(BENCH, "sql")

PROFILES = {
    # tiny: proves every code path runs; numbers mean nothing. Kept under ~3
    # minutes: one matrix configuration (synchronous_commit off, 2 clients;
    # the latency runs use on, so both modes run), and the sustained section
    # on the pair the issue is about (B1r, I2) for 20 s each.
    "smoke": dict(duration=1, rounds=1, clients=[2], sync=["off"], prefill=1000,
                  latency_duration=1, latency_rounds=1, latency_sync=["on"], latency_clients=2,
                  sustained_seconds=20, sustained_window=5, sustained_clients=2,
                  sustained_variants=["B1r", "I2"],
                  wal_txns=200, bytes_claims=4000, bytes_clients=2,
                  scale_small=2000, scale_big=10000,
                  scale_rounds=1, scale_duration=1, parts=[0, 8], parts_rounds=1,
                  parts_duration=1, cleanup_rows=[2000, 5000, 20000], cleanup_reps=1,
                  cleanup_live=1000, p99_rows=5000, p99_duration=2, p99_rounds=1,
                  **section_ttl_mod.PROFILES["smoke"], **section_handwritten_mod.PROFILES["smoke"],
                  **section_kills_mod.PROFILES["smoke"], **section_portable_mod.PROFILES["smoke"]),
    # default: in between (1 M live keys in the scale section, cleanup up to
    # 1 M rows, 3 rounds)
    "default": dict(duration=4, rounds=3, clients=[1, 2, 4], sync=["off", "on"], prefill=10000,
                    latency_duration=6, latency_rounds=3, latency_sync=["off", "on"], latency_clients=2,
                    sustained_seconds=300, sustained_window=30, sustained_clients=2,
                    sustained_variants=SUSTAINED_VARIANTS,
                    wal_txns=10000, bytes_claims=1000000, bytes_clients=2,
                    scale_small=10000, scale_big=1000000,
                    scale_rounds=5, scale_duration=4, parts=[0, 8, 32], parts_rounds=3,
                    parts_duration=4, cleanup_rows=[100000, 1000000], cleanup_reps=3,
                    cleanup_live=10000, p99_rows=1000000, p99_duration=6, p99_rounds=2,
                    **section_ttl_mod.PROFILES["default"], **section_handwritten_mod.PROFILES["default"],
                    **section_kills_mod.PROFILES["default"], **section_portable_mod.PROFILES["default"]),
    # full: the sizes of the targets (10 M live keys, cleanup of 10 M rows)
    "full": dict(duration=5, rounds=5, clients=[1, 2, 4], sync=["off", "on"], prefill=10000,
                 latency_duration=10, latency_rounds=3, latency_sync=["off", "on"], latency_clients=2,
                 sustained_seconds=300, sustained_window=30, sustained_clients=2,
                 sustained_variants=SUSTAINED_VARIANTS,
                 wal_txns=20000, bytes_claims=1000000, bytes_clients=2,
                 scale_small=10000, scale_big=10000000,
                 scale_rounds=5, scale_duration=5, parts=[0, 8, 32, 128], parts_rounds=3,
                 parts_duration=5, cleanup_rows=[100000, 1000000, 10000000], cleanup_reps=3,
                 cleanup_live=10000, p99_rows=1000000, p99_duration=8, p99_rounds=3,
                 **section_ttl_mod.PROFILES["full"], **section_handwritten_mod.PROFILES["full"],
                 **section_kills_mod.PROFILES["full"], **section_portable_mod.PROFILES["full"]),
}

SECTION_MODULES = [section_ttl_mod, section_handwritten_mod, section_kills_mod, section_portable_mod]
ALL_SECTIONS = ["matrix", "latency", "wal", "bytes", "sustained", "scale", "partitions", "cleanup",
                "ttl", "handwritten", "kills", "portable"]

# The benchmark's own partitions of idem.claims (partitions section, and the
# expired partition of the cleanup section) get the index idem's partitions
# have: inherited from a partitioned index on the parent when there is one,
# else copied from the default partition's definition.
MAKE_PARTITION_SQL = r"""
CREATE FUNCTION public.bench_index_like_default(name text) RETURNS void
LANGUAGE plpgsql AS $f$
DECLARE def text;
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_index WHERE indrelid = format('idem.%I', name)::regclass)
     AND NOT EXISTS (SELECT 1 FROM pg_index WHERE indrelid = 'idem.claims'::regclass) THEN
    SELECT pg_get_indexdef(indexrelid) INTO def
      FROM pg_index WHERE indrelid = 'idem.claims_default'::regclass LIMIT 1;
    def := regexp_replace(def, '^CREATE (UNIQUE )?INDEX \S+ ON (ONLY )?\S+',
                          'CREATE \1INDEX ON idem.' || quote_ident(name));
    EXECUTE def;
  END IF;
END $f$;

-- With a storage by TTL class (idem.claims partitioned by (ttl_class,
-- expires_at)): the class of the business type 'bench', whose claims the
-- benchmark's own partitions hold; NULL with a storage by expiry only.
CREATE FUNCTION public.bench_class() RETURNS smallint LANGUAGE plpgsql AS $f$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'idem.claims'::regclass
                    AND attname = 'ttl_class' AND NOT attisdropped) THEN
    RETURN NULL;
  END IF;
  RETURN idem.ttl_class(coalesce((SELECT ttl FROM idem.biz_types WHERE biz_type = 'bench'),
                                 current_setting('idem.default_ttl')::interval));
END $f$;

CREATE FUNCTION public.bench_make_partition(name text, lo timestamptz, hi timestamptz)
RETURNS void LANGUAGE plpgsql AS $f$
DECLARE c smallint := bench_class();
BEGIN
  IF c IS NULL THEN
    EXECUTE format('CREATE TABLE idem.%I PARTITION OF idem.claims FOR VALUES FROM (%L) TO (%L)',
                   name, lo, hi);
  ELSE
    EXECUTE format('CREATE TABLE idem.%I PARTITION OF idem.claims FOR VALUES FROM (%s, %L) TO (%s, %L)',
                   name, c, lo, c, hi);
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_index WHERE indrelid = format('idem.%I', name)::regclass) THEN
    PERFORM bench_index_like_default(name);
  END IF;
END $f$;

-- n new keys md5(prefix || i), i = lo..hi, claimed through idem_claim in one
-- statement; an error unless every one was claimed.
CREATE FUNCTION public.bench_claim(prefix text, lo bigint, hi bigint) RETURNS bigint
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

FAKE_MAINTAIN_SQL = r"""
-- BENCH SELF-TEST ONLY (BENCH_FAKE_MAINTAIN=1): a stand-in for idem_maintain()
-- that drops partitions of idem.claims whose upper bound has passed. Its
-- numbers are not idem's.
CREATE FUNCTION public.idem_maintain() RETURNS jsonb LANGUAGE plpgsql AS $f$
DECLARE r record; n int := 0;
BEGIN
  FOR r IN SELECT c.oid::regclass AS rel, pg_get_expr(c.relpartbound, c.oid) AS b
             FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
            WHERE i.inhparent = 'idem.claims'::regclass LOOP
    IF r.b <> 'DEFAULT'
       AND (regexp_match(r.b, 'TO \(''([^'']*)''\)'))[1]::timestamptz <= now() THEN
      EXECUTE format('DROP TABLE %s', r.rel);
      n := n + 1;
    END IF;
  END LOOP;
  RETURN jsonb_build_object('dropped', n, 'fake', true);
END $f$;
"""


# Raised by a section that cannot go on; run() records it and goes on with
# the next section. Defined beside the sections' helpers, which raise it too.
BenchError = common.BenchError


class Bench:
    def __init__(self, a):
        self.a = a
        self.out = a.out
        self.logs = os.path.join(a.out, "logs")
        shutil.rmtree(self.logs, ignore_errors=True)
        os.makedirs(self.logs)
        self.pg_bin = a.pg_bin
        self.run_id = 0
        self.fake_maintain = os.environ.get("BENCH_FAKE_MAINTAIN") == "1"
        self.raw = {"meta": {}, "runs": [], "latency": [], "latency_pooled": [], "sustained": [],
                    "wal": [], "bytes": [], "scale": [], "partitions": [], "cleanup": {},
                    "loads": [], "errors": [], "notes": [], "ttl": {}, "handwritten": {},
                    "kills": {}, "portable": {}}
        self.t_start = time.time()
        self.redis_driver = None
        self.meter = CpuMeter(a.host, a.port, a.redis_pid)
        self.quiet_budget = a.quiet_wait if a.quiet_wait is not None else (
            0 if a.profile == "smoke" else 1800)

    # ---- plumbing -------------------------------------------------------
    def log(self, msg):
        el = time.time() - self.t_start
        print(f"[{el:7.1f}s] {msg}", flush=True)

    def save(self):
        tmp = os.path.join(self.out, "raw.json.tmp")
        with open(tmp, "w") as f:
            json.dump(self.raw, f, indent=1, default=str)
        os.replace(tmp, os.path.join(self.out, "raw.json"))

    def conn_args(self, db):
        return ["-h", self.a.host, "-p", str(self.a.port), "-U", "postgres", "-d", db]

    def psql(self, db, sql, timing=False):
        """Run SQL (one or more statements) in one psql session; return the
        unaligned, tuples-only output of all statements."""
        cmd = [os.path.join(self.pg_bin, "psql"), "-X", "-A", "-t", "-q",
               "-v", "ON_ERROR_STOP=1"] + self.conn_args(db)
        if timing:
            sql = "\\timing on\n" + sql
        p = subprocess.run(cmd, input=sql, capture_output=True, text=True)
        if p.returncode != 0:
            raise BenchError(f"psql failed in {db}: {p.stderr.strip()}\nSQL: {sql[:500]}")
        return p.stdout.strip()

    def val(self, db, sql):
        out = self.psql(db, sql)
        return out.splitlines()[-1] if out else ""

    def next_run(self):
        self.run_id += 1
        return self.run_id

    def pgbench_cmd(self, db, script, clients, run, prefill=1, defines=None):
        extra = [x for k, v in (defines or {}).items() for x in ("-D", f"{k}={v}")]
        return [os.path.join(self.pg_bin, "pgbench"), "-n", "-M", "prepared",
                "-c", str(clients), "-j", str(clients),
                "-D", "n=0", "-D", f"run={run}", "-D", f"prefill={prefill}"] + extra + \
               ["-f", os.path.join(SQL, script)] + self.conn_args(db)[:-2]

    def drop_logs(self, prefix):
        for f in os.listdir(self.logs):
            if f.startswith(prefix + "."):
                os.remove(os.path.join(self.logs, f))

    def pgbench(self, db, script, clients, sync, duration=None, txns=None, prefill=1,
                log_prefix=None, tag="", defines=None):
        run = self.next_run()
        cmd = self.pgbench_cmd(db, script, clients, run, prefill, defines)
        if duration:
            cmd += ["-T", str(duration)]
        else:
            cmd += ["-t", str(txns)]
        cwd = self.logs
        if log_prefix:
            # a retried run must not leave the earlier attempt's log behind
            self.drop_logs(log_prefix)
            cmd += ["--log", "--log-prefix", log_prefix]
        cmd.append(db)
        env = dict(os.environ, PGOPTIONS=f"-c synchronous_commit={sync}")
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
        with open(os.path.join(self.logs, f"run{run:05d}-{tag or script}.log"), "w") as f:
            f.write(" ".join(cmd) + "\n" + p.stdout + p.stderr)
        tps = re.search(r"^tps = ([\d.]+) \(without initial connection time\)", p.stdout, re.M)
        lat = re.search(r"^latency average = ([\d.]+) ms", p.stdout, re.M)
        done = re.search(r"number of transactions actually processed: (\d+)", p.stdout)
        failed = re.search(r"number of failed transactions: (\d+)", p.stdout)
        if p.returncode != 0 or not tps or (failed and int(failed.group(1)) > 0):
            raise BenchError(f"pgbench {script} ({tag}) failed (exit {p.returncode}):\n"
                             + (p.stderr or p.stdout)[-1500:])
        return {"tps": float(tps.group(1)), "lat_ms": float(lat.group(1)) if lat else None,
                "txns": int(done.group(1)) if done else None, "driver": "pgbench", "run": run}

    def redis_run(self, db, mode, clients, sync, duration, tag=""):
        run = self.next_run()
        conninfo = (f"host={self.a.host} port={self.a.port} user=postgres dbname={db} "
                    f"options='-c synchronous_commit={sync}'")
        cmd = [self.redis_driver, mode, conninfo, self.a.redis_sock, str(clients),
               str(duration), str(run)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        with open(os.path.join(self.logs, f"run{run:05d}-{tag or mode}.log"), "w") as f:
            f.write(" ".join(cmd) + "\n" + p.stdout + p.stderr)
        m = dict(re.findall(r"(\w+)=([\d.]+)", p.stdout))
        if p.returncode != 0 or "tps" not in m:
            raise BenchError(f"redis_txn {mode} failed (exit {p.returncode}): {p.stderr[-1500:]}")
        return {"tps": float(m["tps"]), "lat_ms": float(m["lat_avg_ms"]), "txns": int(m["txns"]),
                "driver": "redis_txn", "run": run, "dup": int(m["dup"])}

    def run_variant(self, db, v, clients, sync, duration, prefill):
        return self._run_variant(db, v, clients, sync, duration, prefill)

    def wait_quiet(self):
        """Wait until nothing else uses the CPU (a build or another
        cluster's tests next to the benchmark skew it), within the
        --quiet-wait budget."""
        if self.quiet_budget <= 0:
            return
        t0 = time.time()
        said = False
        while self.quiet_budget > 0:
            a = self.meter.snap()
            time.sleep(1.0)
            f = self.meter.foreign(a, self.meter.snap())
            comp = noise().get("foreign")
            if f < QUIET_CORES and not comp:
                break
            if not said:
                self.log(f"  waiting for the machine to be quiet (other CPU use {f:.2f} cores"
                         f"{', ' + ' '.join(comp) if comp else ''}; budget {self.quiet_budget:.0f}s)")
                said = True
            time.sleep(4.0)
            self.quiet_budget -= time.time() - t0
            t0 = time.time()
        if said:
            self.log("  quiet again" if self.quiet_budget > 0 else "  quiet-wait budget spent; going on")

    def measured(self, prepare, run):
        """prepare(); run() with the CPU other processes used during it
        recorded; re-run (up to twice) when that was more than a trace."""
        for attempt in range(3):
            self.wait_quiet()
            if prepare:
                prepare()
            a = self.meter.snap()
            res = run()
            b = self.meter.snap()
            res["foreign_cores"] = round(self.meter.foreign(a, b), 3)
            res["attempt"] = attempt
            res.update(noise())
            if res["foreign_cores"] < NOISY_CORES or self.quiet_budget <= 0 or attempt == 2:
                return res
            self.log(f"  other processes used {res['foreign_cores']:.2f} cores during the run: "
                     f"measuring again")
            self.raw.setdefault("discarded", []).append(res)

    def _run_variant(self, db, v, clients, sync, duration, prefill):
        driver, what, _ = VARIANTS[v]
        if driver == "redis":
            r = self.redis_run(db, what, clients, sync, duration, tag=v)
            # Keys stay in redis for the whole run (as a dedup store would);
            # they are unique per run id, so nothing is ever a duplicate.
            return r
        return self.pgbench(db, what, clients, sync, duration=duration, prefill=prefill, tag=v)

    def has_maintain(self, db):
        return self.val(db, "SELECT to_regprocedure('idem_maintain()') IS NOT NULL") == "t"

    def create_db(self, db):
        self.psql("postgres", f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        self.psql("postgres", f"CREATE DATABASE {db}")
        with open(os.path.join(SQL, "schema.sql")) as f:
            self.psql(db, f.read())
        self.psql(db, "CREATE EXTENSION idem; CREATE EXTENSION pg_walinspect;")
        self.psql(db, MAKE_PARTITION_SQL)
        if self.fake_maintain and not self.has_maintain(db):
            self.psql(db, FAKE_MAINTAIN_SQL)
            self.raw["meta"]["fake_maintain_used"] = True
        # Register the business type the benchmark claims under (outside any
        # measurement), and let maintenance premake its partitions, as a
        # deployment would.
        self.psql(db, "SELECT idem_claim('bench-setup', 'bench')")
        if self.has_maintain(db):
            self.psql(db, "SELECT idem_maintain()")

    def checkpoint(self, db="postgres"):
        self.psql(db, "CHECKPOINT")

    def set_autovacuum(self, on):
        self.psql("postgres", f"ALTER SYSTEM SET autovacuum = {'on' if on else 'off'}; "
                              "SELECT pg_reload_conf();")
        time.sleep(0.2)

    def claim_keys(self, db, prefix, n, batch=100000):
        """Claim n keys md5(prefix || i) through idem_claim, batch per
        transaction (the rows are exactly what the extension writes)."""
        done = 0
        t0 = time.time()
        while done < n:
            hi = min(n, done + batch)
            self.psql(db, f"SELECT bench_claim('{prefix}', {done + 1}, {hi})")
            done = hi
        if n >= 100000:
            self.load_rate("idem_claim bulk", n, time.time() - t0)

    def load_rate(self, what, rows, seconds):
        """Remember how fast a bulk load went (the duration estimate of a
        full run uses it)."""
        self.raw["loads"].append({"what": what, "rows": rows, "seconds": round(seconds, 3)})

    def claims_size(self, db):
        row = self.val(db, """
            SELECT count(*), coalesce(sum(pg_total_relation_size(relid)), 0),
                   coalesce(sum(pg_relation_size(relid)), 0),
                   coalesce(sum(pg_indexes_size(relid)), 0)
              FROM pg_partition_tree('idem.claims') WHERE isleaf""")
        parts, total, heap, idx = [int(x) for x in row.split("|")]
        return {"partitions": parts, "total": total, "heap": heap, "indexes": idx}

    def reset_main(self, db, prefill, checkpoint=False):
        """Every run starts from the same state: empty business and dedup
        tables except `prefill` committed keys in each dedup store (the
        duplicates I3 reads; B1r's with their result), vacuumed; with
        checkpoint, then a CHECKPOINT. One psql session."""
        self.psql(db, f"""
            TRUNCATE orders, dedup, dedup_r, dedup_exc;
            TRUNCATE idem.claims;
            INSERT INTO dedup (key) SELECT md5('p' || g::text) FROM generate_series(1, {prefill}) g;
            INSERT INTO dedup_r (key, result)
              SELECT md5('p' || g::text), '{{"ok": true}}' FROM generate_series(1, {prefill}) g;
            INSERT INTO dedup_exc (key) SELECT md5('p' || g::text) FROM generate_series(1, {prefill}) g;
            SELECT bench_claim('p', 1, {prefill});
            VACUUM ANALYZE orders, dedup, dedup_r, dedup_exc, idem.claims;
            {"CHECKPOINT;" if checkpoint else ""}
        """)

    # ---- sections -------------------------------------------------------
    def meta(self):
        m = self.raw["meta"]
        m["command"] = self.a.command
        m["profile"] = self.a.profile
        m["params"] = self.p
        m["date"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        m["nproc"] = os.cpu_count()
        try:
            m["nproc"] = int(subprocess.run(["nproc"], capture_output=True, text=True).stdout)
        except Exception:
            pass
        cpu = ""
        try:
            with open("/proc/cpuinfo") as f:
                cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
        except OSError:
            pass
        m["cpu"] = cpu
        try:
            with open("/proc/meminfo") as f:
                m["mem_gb"] = round(int(f.readline().split()[1]) / 1024 / 1024, 1)
        except OSError:
            pass
        m["os"] = platform.platform()
        m["pg_version"] = self.val("postgres", "SELECT version()")
        m["settings"] = dict(
            l.split("|") for l in self.psql("postgres", """
            SELECT name, setting || coalesce(unit, '') FROM pg_settings WHERE name IN
            ('shared_buffers','max_wal_size','checkpoint_timeout','fsync','full_page_writes',
             'wal_level','autovacuum','data_checksums','wal_buffers','huge_pages',
             'max_connections','work_mem','maintenance_work_mem')""").splitlines())
        m["idem_version"] = self.val("postgres", "SELECT default_version FROM pg_available_extensions WHERE name = 'idem'")
        m["idem_build"] = idem_build()
        m["idem_so_md5"] = idem_so_digest()
        m["redis"] = bool(self.redis_driver)
        self.save()

    def section_matrix(self):
        p = self.p
        db = "bench"
        variants = list(MATRIX_VARIANTS)
        if self.redis_driver:
            variants[4:4] = ["B3", "B0c"]
        if p.get("matrix_variants"):
            variants = [v for v in variants if v in p["matrix_variants"]]
        configs = [(s, c) for s in p["sync"] for c in p["clients"]]
        total = len(configs) * p["rounds"] * len(variants)
        k = 0
        for sync, clients in configs:
            for r in range(p["rounds"]):
                off = (r * len(variants)) // p["rounds"]
                order = variants[off:] + variants[:off]
                for pos, v in enumerate(order):
                    k += 1
                    res = self.measured(
                        lambda: self.reset_main(db, p["prefill"], checkpoint=True),
                        lambda: self.run_variant(db, v, clients, sync, p["duration"], p["prefill"]))
                    res.update(section="matrix", variant=v, sync=sync, clients=clients,
                               round=r, position=pos)
                    self.raw["runs"].append(res)
                    self.log(f"matrix {k}/{total}: sync={sync} c={clients} round={r} "
                             f"{v:4s} tps={res['tps']:9.1f}")
                self.save()

    # ---- latency -----------------------------------------------------------
    def read_latency_logs(self, prefix, keep=True):
        """Per-transaction latencies (µs) from pgbench's --log files of one
        run (one file per thread); the files are then gzipped into one."""
        import gzip
        lats = []
        files = sorted(f for f in os.listdir(self.logs) if f.startswith(prefix + "."))
        out = gzip.open(os.path.join(self.logs, prefix + ".log.gz"), "wt") if keep else None
        for f in files:
            path = os.path.join(self.logs, f)
            with open(path) as fh:
                for line in fh:
                    if out:
                        out.write(line)
                    parts = line.split()
                    if len(parts) >= 6 and parts[2].isdigit():
                        lats.append(int(parts[2]))
            os.remove(path)
        if out:
            out.close()
        return lats

    def section_latency(self):
        """p50/p99 of a whole transaction at 2 clients, computed exactly from
        pgbench's per-transaction logs; interleaved rounds like the matrix."""
        p = self.p
        db = "bench"
        variants = list(LATENCY_VARIANTS)
        c = p["latency_clients"]
        hist = {}
        total = len(p["latency_sync"]) * p["latency_rounds"] * len(variants)
        k = 0
        for sync in p["latency_sync"]:
            for r in range(p["latency_rounds"]):
                off = (r * len(variants)) // p["latency_rounds"]
                order = variants[off:] + variants[:off]
                for v in order:
                    k += 1
                    tag = f"lat-{sync}-{v}-r{r}"
                    res = self.measured(
                        lambda: self.reset_main(db, p["prefill"], checkpoint=True),
                        lambda: self.pgbench(db, VARIANTS[v][1], c, sync, duration=p["latency_duration"],
                                             prefill=p["prefill"], log_prefix=tag, tag=tag))
                    lats = self.read_latency_logs(tag)
                    h = hist.setdefault((sync, v), {})
                    for x in lats:
                        h[x] = h.get(x, 0) + 1
                    res.update(section="latency", variant=v, sync=sync, clients=c, round=r,
                               logged=len(lats), **lat_stats(lats))
                    self.raw["latency"].append(res)
                    self.log(f"latency {k}/{total}: sync={sync} c={c} round={r} {v:4s} "
                             f"p50={res['p50_ms']:.3f} ms p99={res['p99_ms']:.3f} ms "
                             f"({len(lats)} txns)")
                self.save()
        # Over all rounds: exact percentiles of every logged transaction.
        for (sync, v), h in hist.items():
            self.raw["latency_pooled"].append(dict(sync=sync, variant=v, clients=c,
                                                   rounds=p["latency_rounds"], **hist_stats(h)))
        self.save()

    # ---- sustained ---------------------------------------------------------
    def store_stats(self, db, v):
        """Size and tuple counts of the table variant v writes (all leaf
        partitions for idem.claims)."""
        store = STORE.get(v, "orders")
        rels = ("SELECT relid FROM pg_partition_tree('idem.claims') WHERE isleaf"
                if store == "idem.claims" else f"SELECT '{store}'::regclass")
        row = self.val(db, f"""
            SELECT (SELECT count(*) FROM {store}),
                   coalesce(sum(pg_relation_size(c.oid)), 0), coalesce(sum(pg_indexes_size(c.oid)), 0),
                   coalesce(sum(s.n_live_tup), 0), coalesce(sum(s.n_dead_tup), 0),
                   coalesce(sum(s.autovacuum_count), 0), coalesce(sum(s.autoanalyze_count), 0),
                   coalesce(sum(s.n_tup_hot_upd), 0), coalesce(sum(s.n_tup_upd), 0)
              FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
             WHERE c.oid IN ({rels})""")
        keys = ("rows", "heap", "indexes", "n_live_tup", "n_dead_tup", "autovacuums",
                "autoanalyzes", "hot_updates", "updates")
        return dict(zip(keys, (int(x) for x in row.split("|"))), store=store)

    def section_sustained(self):
        """Each variant for sustained_seconds on one growing table: no
        CHECKPOINT or VACUUM during the run (autovacuum as configured); TPS
        per window from pgbench -P."""
        p = self.p
        db = "bench"
        secs, win, c = p["sustained_seconds"], p["sustained_window"], p["sustained_clients"]
        for i, v in enumerate(p["sustained_variants"]):
            self.wait_quiet()
            self.reset_main(db, p["prefill"], checkpoint=True)
            # (not pg_stat_reset(): autovacuum schedules from those counters)
            st0 = self.store_stats(db, v)
            run = self.next_run()
            # pgbench prints no progress line for the interval that ends with
            # the run: run a second longer and keep the full windows only.
            cmd = self.pgbench_cmd(db, VARIANTS[v][1], c, run, p["prefill"]) + \
                ["-T", str(secs + 1), "-P", str(win), db]
            env = dict(os.environ, PGOPTIONS="-c synchronous_commit=off")
            logf = os.path.join(self.logs, f"run{run:05d}-sustained-{v}.log")
            self.log(f"sustained {i + 1}/{len(p['sustained_variants'])}: {v}, {c} clients, "
                     f"{secs} s, windows of {win} s")
            with open(logf, "w") as fh:
                fh.write(" ".join(cmd) + "\n")
                fh.flush()
                t0 = time.time()
                snaps = [self.meter.snap()]
                proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=self.logs)
                while proc.poll() is None:
                    nxt = t0 + len(snaps) * win
                    time.sleep(max(0.05, min(0.5, nxt - time.time())))
                    if time.time() >= nxt and len(snaps) <= secs // win:
                        snaps.append(self.meter.snap())
            with open(logf) as fh:
                out = fh.read()
            windows = []
            for m in re.finditer(r"^progress: ([\d.]+) s, ([\d.]+) tps, lat ([\d.]+) ms", out, re.M):
                t, tps, lat = float(m.group(1)), float(m.group(2)), float(m.group(3))
                if t <= secs + 0.5:
                    windows.append({"end_s": t, "tps": tps, "lat_ms": lat})
            for j, w in enumerate(windows):
                if j + 1 < len(snaps):
                    w["foreign_cores"] = round(self.meter.foreign(snaps[j], snaps[j + 1]), 3)
            failed = re.search(r"number of failed transactions: (\d+)", out)
            tps = re.search(r"^tps = ([\d.]+) \(without initial connection time\)", out, re.M)
            if proc.returncode != 0 or not tps or (failed and int(failed.group(1)) > 0) or not windows:
                raise BenchError(f"pgbench sustained {v} failed (exit {proc.returncode}):\n{out[-1500:]}")
            time.sleep(1.0)   # the backends' last statistics reach the shared counters
            st = self.store_stats(db, v)
            for k in ("autovacuums", "autoanalyzes", "hot_updates", "updates"):
                st[k] -= st0[k]
            res = {"variant": v, "clients": c, "sync": "off", "seconds": secs, "window": win,
                   "tps": float(tps.group(1)), "windows": windows, "end": st, "run": run}
            res.update(noise())
            self.raw["sustained"].append(res)
            first, last = windows[0]["tps"], windows[-1]["tps"]
            self.log(f"sustained {v}: " + " ".join(f"{w['tps']:.0f}" for w in windows)
                     + f" TPS per window (last/first {last / first:.2f}); {st['store']}: "
                       f"{st['rows']} rows, {st['n_dead_tup']} dead, {st['autovacuums']} autovacuums")
            self.save()

    def section_wal(self):
        """WAL bytes and xids per transaction, 1 client, a fixed number of
        transactions, autovacuum off (it writes WAL and takes xids)."""
        p = self.p
        db = "bench"
        variants = WAL_VARIANTS
        self.set_autovacuum(False)
        try:
            for v in variants:
                self.checkpoint(db)
                self.reset_main(db, p["prefill"])
                n = p["wal_txns"]
                x0 = int(self.val(db, "SELECT txid_current()"))
                l0 = self.val(db, "SELECT pg_current_wal_insert_lsn()")
                res = self.pgbench(db, VARIANTS[v][1], 1, "off", txns=n, prefill=p["prefill"],
                                   tag=f"wal-{v}")
                l1 = self.val(db, "SELECT pg_current_wal_insert_lsn()")
                x1 = int(self.val(db, "SELECT txid_current()"))
                # pg_walinspect reads only flushed WAL; with synchronous_commit
                # off (and txid_current()'s commit, which wrote nothing before
                # it, is asynchronous too) the WAL writer gets there within
                # wal_writer_delay.
                for _ in range(200):
                    if self.val(db, f"SELECT pg_current_wal_flush_lsn() >= '{l1}'::pg_lsn") == "t":
                        break
                    time.sleep(0.05)
                # txid_current() assigns an xid itself: x1 is its own, so the
                # transactions between took x1 - x0 - 1.
                wal = int(self.val(db, f"SELECT '{l1}'::pg_lsn - '{l0}'::pg_lsn"))
                stats = []
                for line in [] if wal == 0 else self.psql(db, f"""
                        SELECT "resource_manager/record_type", count, record_size, fpi_size, combined_size
                          FROM pg_get_wal_stats('{l0}', '{l1}', false) WHERE count > 0""").splitlines():
                    rm, cnt, rs, fs, cs = line.split("|")
                    stats.append({"rmgr": rm, "count": int(cnt), "record": int(rs),
                                  "fpi": int(fs), "combined": int(cs)})
                # Records no transaction of the run wrote: the background
                # writer's running-xacts snapshot (Standby) and checkpoint
                # records (XLOG), so that "0 WAL" means 0 for the workload.
                # Their LSN span, not their size: each record is padded to 8
                # bytes (a 50-byte running-xacts record takes 56), and the
                # padding is no workload's either.
                background = 0 if wal == 0 else int(self.val(db, f"""
                        SELECT coalesce(sum(end_lsn - start_lsn), 0)
                          FROM pg_get_wal_records_info('{l0}', '{l1}')
                         WHERE resource_manager IN ('Standby', 'XLOG')"""))
                fpi = sum(s["fpi"] for s in stats)
                row = {"variant": v, "txns": n, "wal_bytes": wal, "background_bytes": background,
                       "fpi_bytes": fpi, "xids": x1 - x0 - 1, "tps": res["tps"],
                       "wal_per_txn": (wal - background) / n, "wal_total_per_txn": wal / n,
                       "xids_per_txn": (x1 - x0 - 1) / n, "rmgr": stats}
                self.raw["wal"].append(row)
                self.log(f"wal {v:4s}: {row['wal_per_txn']:7.1f} B/txn, "
                         f"{row['xids_per_txn']:.2f} xid/txn")
                self.save()
        finally:
            self.set_autovacuum(True)

    def section_bytes(self):
        """Bytes per claim: N claims without a result (bulk through
        idem_claim); then N transactions of I2's pattern (claim + business
        insert + idem_complete with a small result, pgbench) against N of
        B1r's (ON CONFLICT + business insert + UPDATE of the result); the
        plain hand-written tables for comparison. Autovacuum is off for the
        section: what the write pattern itself leaves behind (page pruning
        included), not what a vacuum later reclaims."""
        p = self.p
        db = "bench_bytes"
        n = p["bytes_claims"]
        c = p["bytes_clients"]
        self.create_db(db)
        pgst = self.ensure_pgstattuple(db)
        self.set_autovacuum(False)
        try:
            self.psql(db, "TRUNCATE idem.claims")
            t0 = time.time()
            self.claim_keys(db, "b", n)
            el = time.time() - t0
            row = self.measure_store(db, "idem.claims", pgst)
            row.update(store="idem.claims", pattern="bulk", result=False, load_seconds=el,
                       load_per_s=n / el if el else None)
            self.add_bytes_row(row)
            # one transaction per claim, as the application writes them
            for v, store in (("I2", "idem.claims"), ("B1r", "dedup_r")):
                self.psql(db, "TRUNCATE orders, dedup_r; TRUNCATE idem.claims; CHECKPOINT")
                res = self.pgbench(db, VARIANTS[v][1], c, "off", txns=max(1, n // c),
                                   tag=f"bytes-{v}")
                row = self.measure_store(db, store, pgst)
                row.update(store=store, pattern=v, result=True, tps=res["tps"], clients=c,
                           load_per_s=res["tps"])
                self.add_bytes_row(row)
                self.load_rate(f"pgbench {v} {c} clients", row["rows"], row["rows"] / res["tps"])
            self.psql(db, "TRUNCATE orders, dedup_r; TRUNCATE idem.claims")
            # The plain hand-written tables (INSERT ... SELECT, no result).
            for table in ("dedup", "dedup_ttl"):
                t0 = time.time()
                self.psql(db, f"TRUNCATE {table}; INSERT INTO {table} (key) "
                              f"SELECT md5('b' || g::text) FROM generate_series(1, {n}) g")
                if table == "dedup" and n >= 100000:
                    self.load_rate("INSERT ... SELECT into dedup", n, time.time() - t0)
                row = self.measure_store(db, table, pgst)
                row.update(store=table, pattern="bulk", result=False)
                self.add_bytes_row(row)
                self.psql(db, f"TRUNCATE {table}")
        finally:
            self.set_autovacuum(True)
        self.save()
        self.psql("postgres", f"DROP DATABASE {db} WITH (FORCE)")

    def measure_store(self, db, store, pgst):
        """Rows, heap (main fork), index and total bytes of a table (summed
        over the leaf partitions of idem.claims), with pgstattuple's live /
        dead tuples and free space."""
        rels = ("SELECT relid FROM pg_partition_tree('idem.claims') WHERE isleaf"
                if store == "idem.claims" else f"SELECT '{store}'::regclass")
        row = self.val(db, f"""
            SELECT (SELECT count(*) FROM {store}), count(*),
                   coalesce(sum(pg_relation_size(oid)), 0), coalesce(sum(pg_indexes_size(oid)), 0),
                   coalesce(sum(pg_total_relation_size(oid)), 0)
              FROM pg_class WHERE oid IN ({rels})""")
        rows, parts, heap, idx, total = [int(x) for x in row.split("|")]
        r = {"rows": rows, "partitions": parts, "heap": heap, "indexes": idx, "total": total,
             "bytes_per_row": total / rows if rows else None,
             "heap_per_row": heap / rows if rows else None,
             "heap_index_per_row": (heap + idx) / rows if rows else None}
        if pgst:
            st = self.val(db, f"""
                SELECT coalesce(sum(s.tuple_count), 0), coalesce(sum(s.tuple_len), 0),
                       coalesce(sum(s.dead_tuple_count), 0), coalesce(sum(s.dead_tuple_len), 0),
                       coalesce(sum(s.free_space), 0)
                  FROM pg_class c, LATERAL pgstattuple(c.oid) s WHERE c.oid IN ({rels})""")
            tc, tl, dc, dl, fs = [int(x) for x in st.split("|")]
            r.update(live_tuples=tc, live_tuple_bytes=tl, dead_tuples=dc, dead_tuple_bytes=dl,
                     free_bytes=fs)
        return r

    def add_bytes_row(self, row):
        self.raw["bytes"].append(row)
        self.log(f"bytes {row['store']} ({row['pattern']}): {row['rows']} rows, "
                 f"heap {row['heap_per_row']:.1f} B/row, heap+index {row['heap_index_per_row']:.1f}, "
                 f"total {row['bytes_per_row']:.1f}; dead tuples {row.get('dead_tuples')}")
        self.save()

    def ensure_pgstattuple(self, db):
        try:
            self.psql(db, "CREATE EXTENSION IF NOT EXISTS pgstattuple")
            return True
        except BenchError:
            return False

    def section_scale(self):
        """I1 (and B1, for context) with few vs many live keys: two
        databases, runs alternating between them."""
        p = self.p
        sizes = {"small": p["scale_small"], "big": p["scale_big"]}
        for label, n in sizes.items():
            db = f"bench_{label}"
            self.create_db(db)
            t0 = time.time()
            self.claim_keys(db, "p", n)
            self.psql(db, f"INSERT INTO dedup (key) SELECT md5('p' || g::text) FROM generate_series(1, {n}) g")
            self.psql(db, "VACUUM ANALYZE")
            self.log(f"scale: {db} prefilled with {n} keys in {time.time() - t0:.0f}s")
        combos = [(v, label) for v in ("I1", "B1") for label in sizes]
        for r in range(p["scale_rounds"]):
            off = r % len(combos)
            order = combos[off:] + combos[:off]
            for v, label in order:
                db = f"bench_{label}"
                if label == "small":
                    # keep "small" small: back to exactly scale_small keys
                    self.psql(db, "TRUNCATE idem.claims, dedup")
                    self.claim_keys(db, "p", sizes[label])
                    self.psql(db, f"INSERT INTO dedup (key) SELECT md5('p' || g::text) "
                                  f"FROM generate_series(1, {sizes[label]}) g")
                    self.psql(db, "VACUUM ANALYZE idem.claims, dedup")
                self.psql(db, "TRUNCATE orders")
                store = "idem.claims" if v == "I1" else "dedup"
                live = int(self.val(db, f"SELECT count(*) FROM {store}"))
                res = self.measured(
                    lambda: self.checkpoint(db),
                    lambda: self.pgbench(db, VARIANTS[v][1], 1, "off", duration=p["scale_duration"],
                                         tag=f"scale-{v}-{label}"))
                res.update(variant=v, size=label, keys=sizes[label], live_at_start=live, round=r)
                self.raw["scale"].append(res)
                self.log(f"scale round={r} {v} {label} ({live} live keys): tps={res['tps']:.1f}")
                self.save()
        self.raw["scale_sizes"] = {l: self.claims_size_db(f"bench_{l}") for l in sizes}
        for label in sizes:
            self.psql("postgres", f"DROP DATABASE bench_{label} WITH (FORCE)")
        self.save()

    def claims_size_db(self, db):
        s = self.claims_size(db)
        s["rows"] = int(self.val(db, "SELECT count(*) FROM idem.claims"))
        return s

    def section_partitions(self):
        """I1 with extra live range partitions of idem.claims (as premade
        by maintenance): every claim locks and probes each live partition."""
        p = self.p
        dbs = {}
        for n in p["parts"]:
            db = f"bench_parts{n}"
            dbs[n] = db
            self.create_db(db)
            if n:
                # n hourly partitions 401 days out (past the longest TTL, so
                # that they collide with nothing maintenance makes): live
                # (upper bound in the future), hence locked and probed by
                # every claim, but empty: a lower bound on what populated
                # premade partitions cost.
                self.psql(db, f"""
                  DO $$
                  DECLARE t0 timestamptz := date_trunc('hour', now()) + interval '401 days';
                  BEGIN
                    FOR i IN 0..{n - 1} LOOP
                      PERFORM bench_make_partition('bench_part_' || i,
                                     t0 + i * interval '1 hour', t0 + (i + 1) * interval '1 hour');
                    END LOOP;
                  END $$""")
            self.claim_keys(db, "p", p["prefill"])
            self.psql(db, "VACUUM ANALYZE")
        counts = {n: self.claims_size(db)["partitions"] for n, db in dbs.items()}
        for r in range(p["parts_rounds"]):
            order = list(dbs.items())
            off = r % len(order)
            order = order[off:] + order[:off]
            for n, db in order:
                res = self.measured(
                    lambda: (self.psql(db, "TRUNCATE orders"), self.checkpoint(db)),
                    lambda: self.pgbench(db, "i1.sql", 1, "off", duration=p["parts_duration"],
                                         tag=f"parts{n}"))
                res.update(extra_partitions=n, partitions=counts[n], round=r)
                self.raw["partitions"].append(res)
                self.log(f"partitions round={r}: {counts[n]} live partitions: tps={res['tps']:.1f}")
                self.save()
        for db in dbs.values():
            self.psql("postgres", f"DROP DATABASE {db} WITH (FORCE)")

    # -- cleanup --
    def timed(self, db, sql, pre=""):
        """Run one statement, after `pre` in the same session (so that the
        session is warm); return (ms, wal_bytes, start_epoch, end_epoch,
        output of the statement)."""
        script = (
            (pre.rstrip() + "\n" if pre else "") +
            "\\echo __TIMED__\n"
            "SELECT pg_current_wal_insert_lsn() AS l0 \\gset\n"
            "SELECT extract(epoch FROM clock_timestamp()) AS e0 \\gset\n"
            "\\timing on\n" + sql.rstrip(";") + ";\n\\timing off\n"
            "SELECT 'WAL=' || (pg_current_wal_insert_lsn() - :'l0'::pg_lsn);\n"
            "SELECT 'E0=' || :'e0';\n"
            "SELECT 'E1=' || extract(epoch FROM clock_timestamp());\n")
        self.last_pre, _, out = self.psql(db, script).rpartition("__TIMED__")
        ms = float(re.findall(r"^Time: ([\d.]+) ms", out, re.M)[-1])
        wal = int(re.search(r"^WAL=(\d+)", out, re.M).group(1))
        e0 = float(re.search(r"^E0=([\d.]+)", out, re.M).group(1))
        e1 = float(re.search(r"^E1=([\d.]+)", out, re.M).group(1))
        body = "\n".join(l for l in out.splitlines()
                         if l.strip() and not re.match(r"^(Time:|WAL=|E0=|E1=)", l))
        return ms, wal, e0, e1, body

    def load_expired_handwritten(self, db, rows, live):
        """dedup_ttl with `rows` expired rows (in expiry order, as a table
        fills) and `live` current ones. Loaded without its indexes, which are
        built afterwards: 10 M rows in a minute or two, not twenty."""
        t0 = time.time()
        self.psql(db, f"""
            TRUNCATE dedup_ttl;
            ALTER TABLE dedup_ttl DROP CONSTRAINT dedup_ttl_pkey;
            DROP INDEX dedup_ttl_expires_at;
            INSERT INTO dedup_ttl (key, created_at, expires_at)
              SELECT md5('x' || g::text), now() - interval '30 days',
                     now() - interval '29 days' + g * interval '1 ms'
                FROM generate_series(1, {rows}) g;
            INSERT INTO dedup_ttl (key) SELECT md5('l' || g::text) FROM generate_series(1, {live}) g;
            ALTER TABLE dedup_ttl ADD CONSTRAINT dedup_ttl_pkey PRIMARY KEY (key);
            CREATE INDEX dedup_ttl_expires_at ON dedup_ttl (expires_at);
            VACUUM ANALYZE dedup_ttl;
            CHECKPOINT;""")
        if rows >= 100000:
            self.load_rate("expired rows into dedup_ttl (+ indexes, VACUUM, CHECKPOINT)", rows,
                           time.time() - t0)

    def expired_idem_sql(self, db, rows, live):
        """SQL that fills idem.claims with `rows` claims that expired long
        ago, in a partition whose upper bound is past, plus `live` current
        claims through idem_claim, then ANALYZE and CHECKPOINT. The clock
        cannot be moved, so the benchmark makes that partition itself (as
        maintenance would have, a month ago): a standalone table filled by
        INSERT ... SELECT in the extension's row format, then its index, a
        CHECK of its range (so that ATTACH scans nothing), then ATTACH.
        Autovacuum is off for that partition: a month-old partition has long
        been vacuumed, and an autovacuum of the freshly loaded one would hold
        a lock the measured DROP waits for (a full VACUUM pass instead would
        double the load's writes)."""
        # The row format follows whatever idem.claims looks like: the type is
        # a type_id (early versions) or the biz_type name.
        cols = self.psql(db, "SELECT attname FROM pg_attribute WHERE attrelid = 'idem.claims'::regclass "
                             "AND attnum > 0 AND NOT attisdropped").split()
        if "type_id" in cols:
            tcol, tval = "type_id", "(SELECT type_id FROM idem.biz_types WHERE biz_type = 'bench')"
        else:
            tcol, tval = "biz_type", "'bench'"
        # With a storage by TTL class, the rows (a 1-day TTL, the type's) go
        # into that class's range: (class, lo) to (class, hi).
        if "ttl_class" in cols:
            tcol, tval = tcol + ", ttl_class", tval + ", :cls"
            check, lo, hi = "ttl_class = :cls AND ", "(:cls, :'lo')", "(:cls, :'hi')"
        else:
            check, lo, hi = "", "(:'lo')", "(:'hi')"
        return f"""
            TRUNCATE idem.claims;
            DROP TABLE IF EXISTS idem.bench_expired;
            SELECT date_trunc('hour', now()) - interval '31 days' AS lo,
                   date_trunc('hour', now()) - interval '28 days' AS hi,
                   bench_class() AS cls \gset
            CREATE TABLE idem.bench_expired (LIKE idem.claims INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
            INSERT INTO idem.bench_expired (expires_at, claimed_at, {tcol}, state, key)
              SELECT now() - interval '29 days' + g * interval '1 ms', now() - interval '30 days',
                     {tval}, 'c', md5('x' || g::text)
                FROM generate_series(1, {rows}) g;
            SELECT bench_index_like_default('bench_expired');
            ALTER TABLE idem.bench_expired ADD CONSTRAINT bench_expired_range
              CHECK ({check}expires_at >= :'lo' AND expires_at < :'hi');
            ALTER TABLE idem.bench_expired SET (autovacuum_enabled = off);
            ALTER TABLE idem.claims ATTACH PARTITION idem.bench_expired FOR VALUES FROM {lo} TO {hi};
            SELECT bench_claim('l', 1, {live});
            ANALYZE idem.claims;
            CHECKPOINT;
        """

    def load_expired_idem(self, db, rows, live):
        t0 = time.time()
        self.psql(db, self.expired_idem_sql(db, rows, live))
        if rows >= 100000:
            self.load_rate("expired claims into a past partition (+ index, ANALYZE, CHECKPOINT)", rows,
                           time.time() - t0)

    def maintain_result(self, db, rows, ms, wal, out, before, kind, rep):
        after = self.claims_size(db)
        left = int(self.val(db, "SELECT count(*) FROM idem.claims WHERE expires_at < now()"))
        live_after = int(self.val(db, "SELECT count(*) FROM idem.claims WHERE expires_at >= now()"))
        r = {"rows": rows, "session": kind, "rep": rep, "ms": ms, "wal": wal,
             "size_before": before["total"], "size_after": after["total"],
             "partitions_before": before["partitions"], "partitions_after": after["partitions"],
             "expired_left": left, "live_left": live_after, "report": out[-2000:]}
        m = re.search(r'"duration_ms": ([\d.]+)', out)
        if m:
            # what idem_maintain() measured itself: without its commit,
            # where DROP TABLE unlinks the files and drops the buffers
            r["own_duration_ms"] = float(m.group(1))
        m = re.search(r'"partitions_created": \[([^\]]*)\]', out)
        r["partitions_created"] = len([x for x in (m.group(1) if m else "").split(",") if x.strip()])
        self.log(f"cleanup idem_maintain ({kind} session) {rows} rows: {ms:.1f} ms, {wal} B WAL, "
                 f"size {before['total'] / 1e6:.1f} -> {after['total'] / 1e6:.1f} MB, "
                 f"{left} expired rows left")
        return r

    def section_cleanup(self):
        p = self.p
        db = "bench_cleanup"
        self.create_db(db)
        sizes = sorted(p["cleanup_rows"])
        live = p["cleanup_live"]
        res = {"rows": sizes, "live": live, "reps": p["cleanup_reps"], "p99_rows": p["p99_rows"],
               "delete": [], "idem": [], "idem_cold": [], "p99": {}}
        self.raw["cleanup"] = res
        # hand-written: DELETE ... WHERE expires_at < now()
        for rows in sizes:
            self.load_expired_handwritten(db, rows, live)
            before = int(self.val(db, "SELECT pg_total_relation_size('dedup_ttl')"))
            ms, wal, _, _, _ = self.timed(db, "DELETE FROM dedup_ttl WHERE expires_at < now()")
            after = int(self.val(db, "SELECT pg_total_relation_size('dedup_ttl')"))
            t0 = time.time()
            self.psql(db, "VACUUM dedup_ttl")
            vac_s = time.time() - t0
            after_vac = int(self.val(db, "SELECT pg_total_relation_size('dedup_ttl')"))
            left = int(self.val(db, "SELECT count(*) FROM dedup_ttl WHERE expires_at < now()"))
            r = {"rows": rows, "ms": ms, "wal": wal, "size_before": before, "size_after": after,
                 "size_after_vacuum": after_vac, "vacuum_s": vac_s, "expired_left": left}
            res["delete"].append(r)
            self.log(f"cleanup DELETE {rows} rows: {ms:.0f} ms, {wal / 1e6:.1f} MB WAL, "
                     f"size {before / 1e6:.1f} -> {after / 1e6:.1f} MB "
                     f"({after_vac / 1e6:.1f} MB after VACUUM, which took {vac_s:.1f}s)")
            self.save()
        # latency of hand-written claims without / during the DELETE
        self.p99_rounds(db, "delete", "b1ttl.sql", "DELETE FROM dedup_ttl WHERE expires_at < now()",
                        lambda: self.load_expired_handwritten(db, p["p99_rows"], live))
        self.psql(db, "TRUNCATE dedup_ttl")

        if not self.has_maintain(db):
            res["idem_skipped"] = "skipped: idem_maintain not available"
            self.log("cleanup idem: skipped: idem_maintain not available")
            self.save()
            self.psql("postgres", f"DROP DATABASE {db} WITH (FORCE)")
            return
        # Warm: one session per measurement, whose first idem_maintain()
        # call (nothing to drop yet: it compiles the function and fills the
        # caches) comes before the load; the measured call is its second.
        for rep in range(p["cleanup_reps"]):
            order = sizes[rep % len(sizes):] + sizes[:rep % len(sizes)]
            for rows in order:
                self.wait_quiet()
                t0 = time.time()
                ms, wal, _, _, out = self.timed(
                    db, "SELECT idem_maintain()",
                    pre="SELECT idem_maintain();\n" + self.expired_idem_sql(db, rows, live) +
                        "SELECT 'SIZE=' || sum(pg_total_relation_size(relid)) || '/' || count(*)"
                        "  FROM pg_partition_tree('idem.claims') WHERE isleaf;")
                if rows >= 100000:
                    self.load_rate("expired claims into a past partition (+ index, ANALYZE, CHECKPOINT)",
                                   rows, time.time() - t0 - ms / 1000)
                m = re.search(r"^SIZE=(\d+)/(\d+)", self.last_pre, re.M)
                before = {"total": int(m.group(1)), "partitions": int(m.group(2))}
                res["idem"].append(self.maintain_result(db, rows, ms, wal, out, before, "warm", rep))
                self.save()
        # Cold: the first call of a fresh session (as a cron job's psql or a
        # pg_cron run makes it), once per size.
        for rows in sizes:
            self.wait_quiet()
            self.load_expired_idem(db, rows, live)
            before = self.claims_size(db)
            ms, wal, _, _, out = self.timed(db, "SELECT idem_maintain()")
            res["idem_cold"].append(self.maintain_result(db, rows, ms, wal, out, before, "cold", 0))
            self.save()
        self.p99_rounds(db, "idem", "i1.sql", "SELECT idem_maintain()",
                        lambda: self.load_expired_idem(db, p["p99_rows"], live))
        self.psql("postgres", f"DROP DATABASE {db} WITH (FORCE)")

    def p99_run(self, db, script, during_sql, tag):
        """pgbench (1 client, sync off) for p99_duration seconds with
        per-transaction logging; with during_sql, that statement starts 1 s
        in. Returns latency stats overall and within the cleanup window."""
        p = self.p
        prefix = f"lat-{tag}"
        for f in os.listdir(self.logs):
            if f.startswith(prefix + "."):
                os.remove(os.path.join(self.logs, f))
        run = self.next_run()
        cmd = [os.path.join(self.pg_bin, "pgbench"), "-n", "-M", "prepared", "-c", "1", "-j", "1",
               "-D", "n=0", "-D", f"run={run}", "-D", "prefill=1", "-T", str(p["p99_duration"]),
               "--log", "--log-prefix", prefix, "-f", os.path.join(SQL, script)] + \
            self.conn_args(db)[:-2] + [db]
        env = dict(os.environ, PGOPTIONS="-c synchronous_commit=off")
        proc = subprocess.Popen(cmd, cwd=self.logs, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        window = None
        cleanup = None
        if during_sql:
            time.sleep(1.0)
            ms, wal, e0, e1, body = self.timed(db, during_sql)
            window = (e0, max(e1, e0 + 1.0))
            cleanup = {"ms": ms, "wal": wal, "output": body}
        out, _ = proc.communicate()
        with open(os.path.join(self.logs, f"run{run:05d}-{tag}.log"), "w") as f:
            f.write(" ".join(cmd) + "\n" + out)
        errors = re.findall(r"aborted in command \d+ query \d+: (.*)", out)
        if proc.returncode != 0 and not (during_sql and errors):
            raise BenchError(f"pgbench {script} ({tag}) failed: {out[-1500:]}")
        lats, win = [], []
        for f in os.listdir(self.logs):
            if not f.startswith(prefix + "."):
                continue
            with open(os.path.join(self.logs, f)) as fh:
                for line in fh:
                    parts = line.split()
                    if len(parts) < 6:
                        continue
                    lat_us = int(parts[2])
                    end = int(parts[4]) + int(parts[5]) / 1e6
                    lats.append(lat_us)
                    if window and end >= window[0] and end - lat_us / 1e6 <= window[1]:
                        win.append(lat_us)
        res = {"tag": tag, "txns": len(lats), "p50_ms": pct(lats, 50), "p99_ms": pct(lats, 99),
               "max_ms": max(lats) / 1000 if lats else None, "client_errors": errors}
        if errors:
            self.log(f"  claims FAILED while {during_sql} ran: {errors[0]}")
        if window:
            res.update(window_txns=len(win), window_p99_ms=pct(win, 99),
                       window_max_ms=max(win) / 1000 if win else None,
                       window_s=window[1] - window[0], cleanup=cleanup)
        return res

    def p99_rounds(self, db, name, script, cleanup_sql, load):
        """Per round: load the expired rows, CHECKPOINT, a run without
        cleanup, CHECKPOINT, a run with the cleanup starting 1 s in."""
        res = self.raw["cleanup"]["p99"]
        for r in range(self.p["p99_rounds"]):
            self.wait_quiet()
            load()
            self.psql(db, "TRUNCATE orders")
            base = self.measured(lambda: self.checkpoint(db),
                                 lambda: self.p99_run(db, script, None, f"{name}-base-{r}"))
            # the cleanup cannot be re-run on the same rows: no retry here
            self.wait_quiet()
            self.checkpoint(db)
            a = self.meter.snap()
            during = self.p99_run(db, script, cleanup_sql, f"{name}-during-{r}")
            during["foreign_cores"] = round(self.meter.foreign(a, self.meter.snap()), 3)
            during.update(noise())
            res.setdefault(f"{name}_base", []).append(base)
            res.setdefault(f"{name}_during", []).append(during)
            self.log(f"cleanup p99 round {r}, {script}: {base['p99_ms']:.2f} ms without, "
                     f"{during.get('window_p99_ms') or 0:.2f} ms during {cleanup_sql} "
                     f"({during.get('window_txns')} claims in the window, cleanup "
                     f"{during['cleanup']['ms']:.0f} ms)")
            self.save()

    # The retention sections live in their own modules (bench/sections/).
    def section_ttl(self):
        section_ttl_mod.run(self)

    def section_handwritten(self):
        section_handwritten_mod.run(self)

    def section_kills(self):
        section_kills_mod.run(self)

    def section_portable(self):
        section_portable_mod.run(self)

    # ---- main -------------------------------------------------------------
    def run(self):
        a = self.a
        self.p = profile_params(a)
        sections = a.sections.split(",") if a.sections else ALL_SECTIONS
        for s in sections:
            if s not in ALL_SECTIONS:
                raise SystemExit(f"unknown section {s}; known: {','.join(ALL_SECTIONS)}")
        est = estimate(self.p, sections, bool(a.redis_sock and not a.no_redis))
        full = estimate(PROFILES["full"], ALL_SECTIONS, True)
        self.raw["meta"]["estimate_s"] = est
        self.log(f"estimated duration of this run: {est['total'] / 60:.0f} min "
                 f"(a full run, --full, about {full['total'] / 60:.0f} min on an idle 2-core machine)")
        if a.redis_sock and not a.no_redis:
            self.redis_driver = build_redis_driver(self.out, self.pg_bin)
            if not self.redis_driver:
                self.raw["notes"].append("B3 skipped: could not compile bench/redis_txn.c "
                                         "(needs cc and libpq-fe.h)")
        elif not a.no_redis:
            self.raw["notes"].append("B3 skipped: redis-server not available")
        self.meta()
        self.raw["meta"]["sections"] = sections
        self.create_db("bench")
        self.raw["meta"]["maintain"] = self.has_maintain("bench")
        self.raw["meta"]["partitions_at_start"] = self.claims_size("bench")["partitions"]
        self.save()
        ok = True
        for s in sections:
            self.log(f"--- section {s}")
            t0 = time.time()
            self.raw["meta"].setdefault("section_build", {})[s] = idem_so_digest()
            try:
                getattr(self, f"section_{s}")()
            except BenchError as e:
                ok = False
                self.raw["errors"].append({"section": s, "error": str(e)})
                self.log(f"ERROR in section {s}: {e}")
            self.raw["meta"].setdefault("section_seconds", {})[s] = round(time.time() - t0, 1)
            self.save()
        self.raw["meta"]["total_seconds"] = round(time.time() - self.t_start, 1)
        # The full run's duration, from what this run measured on this machine
        rates = measured_rates(self.raw)
        full = estimate(PROFILES["full"], ALL_SECTIONS, True, rates)
        self.raw["meta"]["full_estimate_s"] = full
        self.raw["meta"]["measured_rates"] = rates
        self.log(f"done in {self.raw['meta']['total_seconds'] / 60:.1f} min; a full run (--full) "
                 f"would take about {full['total'] / 60:.0f} min on this machine at the rates "
                 f"this run measured")
        end = idem_so_digest()
        if end != self.raw["meta"].get("idem_so_md5"):
            builds = self.raw["meta"].get("section_build", {})
            changed = [s for s, d in builds.items() if d != self.raw["meta"].get("idem_so_md5")]
            self.raw["notes"].append(
                "idem.so was reinstalled during the run (its md5 changed): "
                + (f"sections {', '.join(changed)} started with a newer build than the first ones; "
                   if changed else "after the last section started; ")
                + "a section during which it changed mixes builds")
            self.log("WARNING: idem.so changed during the run")
        self.save()
        return ok


def profile_params(a):
    """The profile's parameters with the command line's overrides."""
    p = dict(PROFILES[a.profile])
    for k in ("duration", "rounds", "prefill", "wal_txns", "bytes_claims", "scale_small",
              "scale_big", "cleanup_reps", "p99_rows", "sustained_seconds", "sustained_window",
              "latency_duration", "latency_rounds") + \
            tuple(dest for mod in SECTION_MODULES for _, dest, _, _ in mod.OPTIONS):
        v = getattr(a, k, None)
        if v is not None:
            p[k] = v
    ints = lambda x: [int(v) for v in x.split(",")]
    for k, conv in (("clients", ints), ("sync", lambda x: x.split(",")), ("parts", ints),
                    ("cleanup_rows", ints), ("latency_sync", lambda x: x.split(",")),
                    ("sustained_variants", lambda x: x.split(",")),
                    ("matrix_variants", lambda x: x.split(","))):
        v = getattr(a, k, None)
        if v:
            p[k] = conv(v)
    for v in p["sustained_variants"]:
        if v not in STORE:
            raise SystemExit(f"--sustained-variants: {v} is not a pgbench variant with a dedup store")
    if p["sustained_window"] > p["sustained_seconds"]:
        raise SystemExit("--sustained-window must not be longer than --sustained-seconds")
    return p


# Rates for the duration estimate: an idle 2-core machine, release build.
# measured_rates() replaces them with what a run measured.
DEFAULT_RATES = {
    "run_overhead_s": 1.2,        # reset, VACUUM, CHECKPOINT, connections around a timed run
    "claim_bulk_per_s": 100000,   # idem_claim in bulk (INSERT ... SELECT-like)
    "insert_bulk_per_s": 250000,  # INSERT ... SELECT md5 into a table with a primary key
    "pgbench_load_per_s": 7000,   # I2 / B1r transactions at 2 clients
    "expired_idem_per_s": 120000,  # expired claims: load, index, ANALYZE, CHECKPOINT
    "expired_ttl_per_s": 100000,  # expired dedup_ttl rows: load, indexes, VACUUM, CHECKPOINT
    "delete_vacuum_per_s": 150000,  # DELETE of expired rows, then VACUUM
    "wal_txn_per_s": 3000,        # 1 client, synchronous_commit off
}


def measured_rates(raw):
    r = dict(DEFAULT_RATES)
    loads = raw.get("loads") or []

    def rate(prefix):
        xs = [l["rows"] / l["seconds"] for l in loads if l["what"].startswith(prefix) and l["seconds"] > 0]
        return statistics.median(xs) if xs else None
    for key, prefix in (("claim_bulk_per_s", "idem_claim bulk"),
                        ("insert_bulk_per_s", "INSERT ... SELECT into dedup"),
                        ("pgbench_load_per_s", "pgbench "),
                        ("expired_idem_per_s", "expired claims"),
                        ("expired_ttl_per_s", "expired rows into dedup_ttl")):
        x = rate(prefix)
        if x:
            r[key] = x
    d = [x for x in (raw.get("cleanup") or {}).get("delete", []) if x["rows"] >= 100000]
    if d:
        r["delete_vacuum_per_s"] = statistics.median(
            [x["rows"] / (x["ms"] / 1000 + x["vacuum_s"]) for x in d])
    runs = [x for x in raw.get("runs", []) if x.get("section") == "matrix"]
    secs = (raw.get("meta") or {}).get("section_seconds", {}).get("matrix")
    dur = ((raw.get("meta") or {}).get("params") or {}).get("duration")
    if runs and secs and dur:
        r["run_overhead_s"] = max(0.3, secs / len(runs) - dur)
    w = raw.get("wal") or []
    if w:
        r["wal_txn_per_s"] = statistics.median([x["tps"] for x in w])
    return {k: round(v, 2) for k, v in r.items()}


def estimate(p, sections, redis, rates=None):
    """Seconds each section of a run with parameters p should take."""
    R = dict(DEFAULT_RATES, **(rates or {}))
    ov = R["run_overhead_s"]
    nmat = len(p.get("matrix_variants") or []) or len(MATRIX_VARIANTS) + (2 if redis else 0)
    e = {}
    e["matrix"] = len(p["sync"]) * len(p["clients"]) * p["rounds"] * nmat * (p["duration"] + ov)
    e["latency"] = len(p["latency_sync"]) * p["latency_rounds"] * len(LATENCY_VARIANTS) * \
        (p["latency_duration"] + ov + 0.5)
    e["sustained"] = len(p["sustained_variants"]) * (p["sustained_seconds"] + 1 + 3 * ov)
    e["wal"] = len(WAL_VARIANTS) * (p["wal_txns"] / R["wal_txn_per_s"] + 2 * ov)
    n = p["bytes_claims"]
    e["bytes"] = 10 + n / R["claim_bulk_per_s"] + 2 * n / R["pgbench_load_per_s"] + \
        2 * n / R["insert_bulk_per_s"] + 3 * n / 1e6 * 5   # + pgstattuple
    big, small = p["scale_big"], p["scale_small"]
    e["scale"] = 10 + (big + small) * (1 / R["claim_bulk_per_s"] + 1 / R["insert_bulk_per_s"]) + \
        big / 200000 + p["scale_rounds"] * 4 * (p["scale_duration"] + ov) + \
        p["scale_rounds"] * 2 * small * (1 / R["claim_bulk_per_s"] + 1 / R["insert_bulk_per_s"])
    e["partitions"] = len(p["parts"]) * (5 + p["prefill"] / R["claim_bulk_per_s"]) + \
        p["parts_rounds"] * len(p["parts"]) * (p["parts_duration"] + ov)
    rows = sum(p["cleanup_rows"])
    e["cleanup"] = 10 + rows * (1 / R["expired_ttl_per_s"] + 1 / R["delete_vacuum_per_s"]) + \
        (p["cleanup_reps"] + 1) * rows / R["expired_idem_per_s"] + \
        p["p99_rounds"] * (p["p99_rows"] * (1 / R["expired_ttl_per_s"] + 1 / R["expired_idem_per_s"])
                           + 4 * (p["p99_duration"] + ov))
    e["ttl"] = section_ttl_mod.estimate(p, R)
    e["handwritten"] = section_handwritten_mod.estimate(p, R)
    e["kills"] = section_kills_mod.estimate(p, R, redis)
    e["portable"] = section_portable_mod.estimate(p, R)
    e = {k: round(v) for k, v in e.items() if k in sections}
    e["total"] = sum(e.values()) + 15
    return e



def main():
    ap = argparse.ArgumentParser(
        prog="bash bench/run.sh",
        description="idem benchmark suite. Starts its own cluster; see bench/README.md.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Profiles: --smoke (tiny, < 3 min), default (1 M live keys, cleanup up to 1 M rows), "
               "--full (the targets' sizes: 10 M live keys, cleanup of 10 M rows, 5 rounds). "
               "The run prints its estimated duration first.\n"
               "run.sh only: --out DIR (default bench/out, bench/out/smoke for --smoke), "
               "--keep-cluster (leave it running after the run), --no-redis.\n"
               "Environment: BENCH_PORT (default 5498); BENCH_FAKE_MAINTAIN=1 installs a "
               "PL/pgSQL stand-in for idem_maintain() to self-test the cleanup section "
               "(its numbers are not idem's).")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--smoke", dest="profile", action="store_const", const="smoke")
    g.add_argument("--full", dest="profile", action="store_const", const="full")
    ap.set_defaults(profile="default")
    ap.add_argument("--sections", help="comma list of " + ",".join(ALL_SECTIONS) + " (default: all)")
    ap.add_argument("--duration", type=int, help="seconds per matrix run")
    ap.add_argument("--rounds", type=int, help="matrix rounds per (sync, clients)")
    ap.add_argument("--clients", help="comma list of client counts (default 1,2,4)")
    ap.add_argument("--sync", help="comma list of synchronous_commit values (default off,on)")
    ap.add_argument("--matrix-variants", help="comma list: only these matrix variants (default all; B3 and B0c need redis)")
    ap.add_argument("--prefill", type=int, help="committed keys per dedup store (I3 draws from them)")
    ap.add_argument("--wal-txns", dest="wal_txns", type=int, help="transactions per WAL measurement")
    ap.add_argument("--claims", dest="bytes_claims", type=int, help="claims in the bytes section")
    ap.add_argument("--small-keys", dest="scale_small", type=int, help="live keys, small case (10000)")
    ap.add_argument("--big-keys", dest="scale_big", type=int,
                    help="live keys, big case (default 1000000; 10000000 with --full)")
    ap.add_argument("--parts", help="comma list of extra partition counts (default 0,8,32)")
    ap.add_argument("--cleanup-rows", dest="cleanup_rows",
                    help="comma list of expired row counts to clean up (full: 100000,1000000,10000000)")
    ap.add_argument("--cleanup-reps", dest="cleanup_reps", type=int,
                    help="warm idem_maintain() measurements per size (median; default 3)")
    ap.add_argument("--p99-rows", dest="p99_rows", type=int,
                    help="expired rows behind the claim-latency-during-cleanup runs (1000000)")
    ap.add_argument("--latency-duration", dest="latency_duration", type=int,
                    help="seconds per latency run")
    ap.add_argument("--latency-rounds", dest="latency_rounds", type=int, help="latency rounds")
    ap.add_argument("--latency-sync", dest="latency_sync",
                    help="comma list of synchronous_commit values for the latency section (off,on)")
    ap.add_argument("--sustained-seconds", dest="sustained_seconds", type=int,
                    help="length of each sustained run (default 300; 20 with --smoke)")
    ap.add_argument("--sustained-window", dest="sustained_window", type=int,
                    help="TPS window of the sustained runs (default 30; 5 with --smoke)")
    ap.add_argument("--sustained-variants", dest="sustained_variants",
                    help="comma list (default " + ",".join(SUSTAINED_VARIANTS) + ")")
    for mod in SECTION_MODULES:
        for flag, dest, typ, hlp in mod.OPTIONS:
            ap.add_argument(flag, dest=dest, type=typ, help=hlp)
    # set by run.sh
    ap.add_argument("--out", required=True)
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, default=5498)
    ap.add_argument("--pg-bin", default="/usr/lib/postgresql/15/bin")
    ap.add_argument("--redis-sock", default="")
    ap.add_argument("--no-redis", action="store_true")
    ap.add_argument("--redis-pid", type=int, default=0)
    ap.add_argument("--quiet-wait", dest="quiet_wait", type=float,
                    help="seconds, in all, the run may wait for other CPU work (a build, "
                         "another cluster's tests) to stop before a measurement, and re-run "
                         "a measurement it disturbed (default 1800; 0 with --smoke)")
    ap.add_argument("--command", default="bash bench/run.sh")
    a = ap.parse_args()
    drivers.PG_CONFIG = os.path.join(a.pg_bin, "pg_config")
    b = Bench(a)
    ok = b.run()
    if not ok:
        print("some sections failed; see errors in raw.json and logs/", file=sys.stderr)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
