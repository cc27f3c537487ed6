"""What the Python test drivers that run concurrent sessions share (import
it with tests/lib on sys.path): waiting for an observable state, a call in
a thread of its own, a connection's backend, checks and their summary."""
import sys
import threading
import time


def wait_until(what, cond, timeout=15.0, slowest=0.05):
    """Poll an observable condition; False if it never held (the caller's
    check then fails: the limit is a safety net, never the verdict)."""
    # (Every 5 ms at first, then less often, up to every `slowest` seconds:
    # a state that comes at once is seen at once, and a long wait on a
    # loaded machine does not spend a core on asking.)
    end, pause = time.monotonic() + timeout, 0.005
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(pause)
        pause = min(pause * 1.5, slowest)
    print(f"     (gave up waiting for: {what})")
    return False


def in_thread(fn):
    """Run fn in a thread; returns the thread and a box that gets its
    "value" or its "error" (reported by the caller)."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except Exception as e:  # reported by the caller
            box["error"] = e
    t = threading.Thread(target=run)
    t.start()
    return t, box


def pid(conn):
    return conn.execute("SELECT pg_backend_pid()").fetchone()[0]


def checker():
    """A check function that prints an "ok: ..." or "FAIL: ..." line and
    returns its condition, and the list the failed ones go to (Checks
    without a label)."""
    check = Checks()
    return check, check.failures


class Checks:
    """ok/FAIL lines, counted: "ok: what" / "FAIL: what", or with a label
    "ok   [LABEL] what" / "FAIL [LABEL] what", and then the summary line the
    shell wrappers read ("summary [LABEL]: N checks, M failed"). Call it as
    check(cond, msg), which returns cond; `finish` prints the summary and
    exits, 1 on any failure."""

    def __init__(self, label=None):
        self.label = label
        self.count = 0
        self.failures = []

    def __call__(self, cond, msg):
        self.count += 1
        verdict = "ok" if cond else "FAIL"
        line = f"{verdict}: {msg}" if self.label is None else f"{verdict:<5}[{self.label}] {msg}"
        print(line, flush=True)
        if not cond:
            self.failures.append(msg)
        return cond

    def finish(self, what=""):
        print(f"summary [{self.label}]: {what}{self.count} checks, {len(self.failures)} failed", flush=True)
        sys.exit(1 if self.failures else 0)


def sqlstate_of(conn, sql, params=()):
    """"00000" if the statement ran, else its SQLSTATE."""
    import psycopg
    try:
        conn.execute(sql, params)
        return "00000"
    except psycopg.Error as e:
        return e.sqlstate


def run_sections(obs, sections, check, failures):
    """Each check section in turn, one's exception a failed check rather
    than the end of the run; prints the summary line the shell wrappers
    look for and returns the exit status (failed checks, capped)."""
    for section in sections:
        try:
            section(obs)
        except Exception as e:
            check(False, f"{section.__name__}: {type(e).__name__}: {str(e).splitlines()[0]}")
    print(f"summary: {len(failures)} failed", flush=True)
    return min(len(failures), 100)
