"""idem_maintain() through the coordinator while pgbench claims through it
(issue 14, item 4): how many maintenance runs fail, with which SQLSTATE, and
how many claim transactions fail. Pacing only (no synchronization by time).

  python tests/citus/maintain_load.py DB SECONDS CLIENTS WIDTH TTL [proto]

With "proto", each run calls maint_proto(WIDTH, TTL) (tests/citus/maint_proto.sql)
instead of idem_maintain().
"""
import collections, json, os, subprocess, sys, tempfile, time
import psycopg

db, secs, clients, width, ttl = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
proto = len(sys.argv) > 6 and sys.argv[6] == "proto"
MAINT = "SELECT maint_proto(%s::interval, %s::interval)" if proto else "SELECT idem_maintain()"
margs = (width, ttl) if proto else ()
PG = "/usr/lib/postgresql/15/bin"
conninfo = dict(host="127.0.0.1", port=5530, dbname=db, user="postgres", autocommit=True)
m = psycopg.connect(**conninfo)
m.execute("SELECT idem_configure('bench.m', %s::interval)", (ttl,))
m.execute("SELECT set_config('idem.partition_width', %s, false), set_config('idem.default_ttl', %s, false)", (width, ttl))
print("first run:", json.dumps(m.execute(MAINT, margs).fetchone()[0])[:300], flush=True)

script = tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False)
script.write("\\set n random(1, 2000000000)\nSELECT idem_claim('m' || :n, 'bench.m');\n")
script.close()
env = dict(os.environ, PGHOST="127.0.0.1", PGPORT="5530", PGUSER="postgres")
bench = subprocess.Popen([f"{PG}/pgbench", "-n", "-M", "simple", "-c", str(clients), "-j", str(clients), "-T", str(secs),
                          "--max-tries=1", "--failures-detailed", "-f", script.name, db],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
runs = collections.Counter(); durations = []; errors = collections.Counter(); attempts = []; moved = 0
end = time.monotonic() + secs - 2
while time.monotonic() < end:
    t0 = time.monotonic()
    try:
        r = m.execute(MAINT, margs).fetchone()[0]
        runs["skipped" if "skipped" in r else "ok"] += 1
        last = r
        attempts.append(r.get("lock_attempts", 0))
        moved += r.get("rows_moved_from_default", 0)
    except psycopg.Error as e:
        runs[e.sqlstate] += 1
        errors[(e.sqlstate, str(e).splitlines()[0][:120])] += 1
    durations.append(time.monotonic() - t0)
    time.sleep(1.0)  # pacing: one run a second
out = bench.communicate()[0]
print("maintenance runs:", dict(runs), "; max duration %.2f s" % max(durations), flush=True)
if runs["ok"]:
    print("last report:", json.dumps(last)[:300])
if proto and attempts:
    print("lock attempts per run: max %d, mean %.1f; rows moved from default: %d" % (max(attempts), sum(attempts) / len(attempts), moved))
for (state, msg), n in errors.most_common():
    print(f"  {n} x {state}: {msg}")
for line in out.splitlines():
    if any(s in line for s in ("tps", "number of transactions actually", "number of failed", "deadlock", "serialization", "ERROR", "aborted")):
        print("pgbench:", line.strip())
os.unlink(script.name)
