#!/usr/bin/env python3
"""The measuring half of idem's benchmark. bench/run.sh starts the cluster
(and redis) and calls this with --host/--port; it writes OUT/raw.json, which
bench/report.py turns into the tables, CSV/JSON, report.md and tps.svg. The
sections (ALL_SECTIONS, each bench/sections/<name>.py) and what each asks:
bench/README.md."""
import argparse
import importlib
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
from measure import NOISY_CORES, QUIET_CORES, CpuMeter, noise
from sections import common
from variants import (LATENCY_VARIANTS, MATRIX_VARIANTS, STORE, SUSTAINED_VARIANTS, VARIANTS,
                      WAL_VARIANTS)

# The sections, in the order they run; each is bench/sections/<name>.py, whose
# run(b) gets the Bench. (A partitions section, claim cost against empty live
# partitions, is gone: the ttl section answers that question with partitions
# that hold claims, and counts the relation locks per claim.)
ALL_SECTIONS = ["matrix", "latency", "wal", "bytes", "sustained", "scale", "cleanup",
                "ttl", "handwritten", "kills", "portable", "batch"]
SECTION = {name: importlib.import_module(f"sections.{name}") for name in ALL_SECTIONS}
# The sections that keep their parameters, options, estimate and report in
# their own module.
SECTION_MODULES = [SECTION[n] for n in ("ttl", "handwritten", "kills", "portable", "batch")]

BENCH = os.path.dirname(os.path.abspath(__file__))
SQL = os.path.join(BENCH, "sql")

PROFILES = {
    # tiny: proves every code path runs; numbers mean nothing. Kept under ~3
    # minutes: one matrix configuration (synchronous_commit off, 2 clients;
    # the latency runs use on, so both modes run), and the sustained section
    # on the pair that matters most (B1r, I2) for 6 s each, in windows of 2 s.
    "smoke": dict(duration=1, rounds=1, clients=[2], sync=["off"], prefill=1000,
                  steady=2000,
                  latency_duration=1, latency_rounds=1, latency_sync=["on"], latency_clients=2,
                  sustained_seconds=6, sustained_window=2, sustained_clients=2,
                  sustained_variants=["B1r", "I2"],
                  wal_txns=200, bytes_claims=4000, bytes_clients=2,
                  scale_small=2000, scale_big=10000,
                  scale_rounds=1, scale_duration=1, cleanup_rows=[2000, 5000, 20000], cleanup_reps=1,
                  cleanup_live=1000,
                  **{k: v for m in SECTION_MODULES for k, v in m.PROFILES["smoke"].items()}),
    # default: in between (1 M live keys in the scale section, cleanup up to
    # 1 M rows, 3 rounds)
    "default": dict(duration=4, rounds=3, clients=[1, 2, 4], sync=["off", "on"], prefill=10000,
                    steady=100000,
                    latency_duration=6, latency_rounds=3, latency_sync=["off", "on"], latency_clients=2,
                    sustained_seconds=300, sustained_window=30, sustained_clients=2,
                    sustained_variants=SUSTAINED_VARIANTS,
                    wal_txns=10000, bytes_claims=1000000, bytes_clients=2,
                    scale_small=10000, scale_big=1000000,
                    scale_rounds=5, scale_duration=4, cleanup_rows=[100000, 1000000], cleanup_reps=3,
                    cleanup_live=10000,
                    **{k: v for m in SECTION_MODULES for k, v in m.PROFILES["default"].items()}),
    # full: the sizes of the targets (10 M live keys, cleanup of 10 M rows)
    "full": dict(duration=5, rounds=5, clients=[1, 2, 4], sync=["off", "on"], prefill=10000,
                 steady=200000,
                 latency_duration=10, latency_rounds=3, latency_sync=["off", "on"], latency_clients=2,
                 sustained_seconds=300, sustained_window=30, sustained_clients=2,
                 sustained_variants=SUSTAINED_VARIANTS,
                 wal_txns=20000, bytes_claims=1000000, bytes_clients=2,
                 scale_small=10000, scale_big=10000000,
                 scale_rounds=5, scale_duration=5, cleanup_rows=[100000, 1000000, 10000000], cleanup_reps=3,
                 cleanup_live=10000,
                 **{k: v for m in SECTION_MODULES for k, v in m.PROFILES["full"].items()}),
}

# The benchmark's own partition of idem.claims (the expired partition of the
# cleanup section) gets the index idem's partitions
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
        self._steady_ready = {}   # databases where reset_main's steady state can be made
        self.raw = {"meta": {}, "runs": [], "latency": [], "latency_pooled": [], "sustained": [],
                    "wal": [], "bytes": [], "scale": [], "cleanup": {},
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

    def run_variant(self, db, v, clients, sync, duration, prefill):
        driver, what, _ = VARIANTS[v]
        if driver == "redis":
            r = self.redis_run(db, what, clients, sync, duration, tag=v)
            # Keys stay in redis for the whole run (as a dedup store would);
            # they are unique per run id, so nothing is ever a duplicate.
            return r
        return self.pgbench(db, what, clients, sync, duration=duration, prefill=prefill, tag=v)

    def create_db(self, db):
        common.create_db(self, db)
        # The WAL figures need pg_walinspect (contrib); a server built without
        # it still runs the sections that do not read WAL (batch, say).
        if self.val(db, "SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_walinspect'") == "1":
            self.psql(db, "CREATE EXTENSION pg_walinspect")
        elif db == "bench":
            self.raw["notes"].append("pg_walinspect is not available: the WAL sections will fail")
        self.psql(db, MAKE_PARTITION_SQL)
        self.psql(db, common.BENCH_CLAIM_SQL)
        # Register the business type the benchmark claims under (outside any
        # measurement), and let maintenance premake its partitions, as a
        # deployment would.
        self.psql(db, "SELECT idem_claim('bench-setup', 'bench')")
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
        checkpoint, then a CHECKPOINT. One psql session.

        Steady state (`steady` rows, the default; 0 = fresh tables): the
        1-day type also holds `steady` completed claims aged evenly over
        its TTL, as a table that has claimed for a whole day holds them, so
        every partition of its class that a claim probes is full (ttl.py's
        AGE_SQL), and each dedup store as many rows, so that both sides
        probe indexes of the same size."""
        steady = self.p.get("steady", 0)
        if steady and not self._steady_ready.get(db):
            self.psql(db, "SELECT idem_configure('bench', '1 day')")
            self.psql(db, SECTION["ttl"].AGE_SQL)
            common.maintain_fully(self, db)
            self._steady_ready[db] = True
        aged = ""
        if steady:
            aged = f"""
            SELECT bench_age_claims('bench', {steady});
            SELECT idem_maintain();
            INSERT INTO dedup (key) SELECT md5('s' || g::text) FROM generate_series(1, {steady}) g;
            INSERT INTO dedup_r (key, result)
              SELECT md5('s' || g::text), '{{"ok": true}}' FROM generate_series(1, {steady}) g;
            INSERT INTO dedup_exc (key) SELECT md5('s' || g::text) FROM generate_series(1, {steady}) g;"""
        self.psql(db, f"""
            TRUNCATE orders, dedup, dedup_r, dedup_exc;
            TRUNCATE idem.claims;{aged}
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
        self.raw["meta"]["partitions_at_start"] = self.claims_size("bench")["partitions"]
        self.save()
        ok = True
        for s in sections:
            self.log(f"--- section {s}")
            t0 = time.time()
            self.raw["meta"].setdefault("section_build", {})[s] = idem_so_digest()
            try:
                SECTION[s].run(self)
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
    for k in ("duration", "rounds", "prefill", "steady", "wal_txns", "bytes_claims", "scale_small",
              "scale_big", "cleanup_reps", "sustained_seconds", "sustained_window",
              "latency_duration", "latency_rounds") + \
            tuple(dest for mod in SECTION_MODULES for _, dest, _, _ in mod.OPTIONS):
        v = getattr(a, k, None)
        if v is not None:
            p[k] = v
    ints = lambda x: [int(v) for v in x.split(",")]
    for k, conv in (("clients", ints), ("sync", lambda x: x.split(",")),
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
    rows = sum(p["cleanup_rows"])
    e["cleanup"] = 10 + rows * (1 / R["expired_ttl_per_s"] + 1 / R["delete_vacuum_per_s"]) + \
        (p["cleanup_reps"] + 1) * rows / R["expired_idem_per_s"]
    for name in ("ttl", "handwritten", "portable", "batch"):
        e[name] = SECTION[name].estimate(p, R)
    e["kills"] = SECTION["kills"].estimate(p, R, redis)
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
               "Environment: BENCH_PORT (default 5498).")
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
    ap.add_argument("--steady", type=int,
                    help="steady state: completed claims aged over the 1-day TTL (every partition of "
                         "its class full) and as many rows per dedup store, before each run of the "
                         "matrix, latency, sustained and wal sections (0: fresh tables; "
                         "default 100000, smoke 2000, full 200000)")
    ap.add_argument("--wal-txns", dest="wal_txns", type=int, help="transactions per WAL measurement")
    ap.add_argument("--claims", dest="bytes_claims", type=int, help="claims in the bytes section")
    ap.add_argument("--small-keys", dest="scale_small", type=int, help="live keys, small case (10000)")
    ap.add_argument("--big-keys", dest="scale_big", type=int,
                    help="live keys, big case (default 1000000; 10000000 with --full)")
    ap.add_argument("--cleanup-rows", dest="cleanup_rows",
                    help="comma list of expired row counts to clean up (full: 100000,1000000,10000000)")
    ap.add_argument("--cleanup-reps", dest="cleanup_reps", type=int,
                    help="warm idem_maintain() measurements per size (median; default 3)")
    ap.add_argument("--latency-duration", dest="latency_duration", type=int,
                    help="seconds per latency run")
    ap.add_argument("--latency-rounds", dest="latency_rounds", type=int, help="latency rounds")
    ap.add_argument("--latency-sync", dest="latency_sync",
                    help="comma list of synchronous_commit values for the latency section (off,on)")
    ap.add_argument("--sustained-seconds", dest="sustained_seconds", type=int,
                    help="length of each sustained run (default 300; 6 with --smoke)")
    ap.add_argument("--sustained-window", dest="sustained_window", type=int,
                    help="TPS window of the sustained runs (default 30; 2 with --smoke)")
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
