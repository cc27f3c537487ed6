#!/usr/bin/env python3
"""Run the ```sql blocks of one Markdown file, in order, in one psql session.

    sql_blocks.py count FILE        print "run norun error" block counts
    sql_blocks.py run FILE DB       run them against DB (PGHOST/PGPORT/PGUSER
                                    from the environment); exit 1 on failure
    sql_blocks.py block FILE HEADING N
                                    print the body of the N-th (from 1) sql
                                    block under the heading HEADING (any
                                    mode): a scenario that runs a recipe
                                    runs the documented text itself

Fence convention (info string of the fence):
    ```sql             run; any error fails, reported as FILE:LINE
    ```sql norun       shown only (another engine, placeholders, pg_cron)
    ```sql error       must raise an error (any SQLSTATE but XX000 / 42601)
    ```sql error ID001 must raise an error with this SQLSTATE
Any other word after "sql" is refused, so that a typo ("no-run") cannot
silently turn a block off.

All blocks of a file share one session, as a reader pasting them into one
psql would: a table created in one block is there in the next. The blocks are
written into one psql script with markers; psql's "psql:SCRIPT:N:" error
prefix is mapped back to the Markdown line.
"""
import os
import re
import subprocess
import sys
import tempfile

OPEN = re.compile(r"^( *)(`{3,}|~{3,})[ \t]*(.*?)[ \t]*$")
HEADING = re.compile(r"^#{1,6}[ \t]+(.*?)[ \t]*#*[ \t]*$")
# Errors a documented example should never be meant to show: a syntax error
# is a typo, XX000 an internal error (the project promises documented codes).
SUSPECT = {"XX000": "internal error", "42601": "syntax error"}


class Block:
    def __init__(self, path, fence_line, words, body, heading=None):
        self.path = path
        self.heading = heading        # text of the last heading above it
        self.fence_line = fence_line  # 1-based line of the opening fence
        self.words = words            # info string words after "sql"
        self.body = body              # content lines

    @property
    def where(self):
        return f"{self.path}:{self.fence_line}"

    @property
    def mode(self):
        if not self.words:
            return "run"
        if self.words == ["norun"]:
            return "norun"
        if self.words[0] == "error" and len(self.words) <= 2:
            return "error"
        return None

    @property
    def expected_state(self):
        return self.words[1] if self.mode == "error" and len(self.words) == 2 else None


def parse(path):
    """The ```sql blocks of a Markdown file, and convention errors."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    blocks, problems = [], []
    heading = None
    i = 0
    while i < len(lines):
        m = OPEN.match(lines[i])
        if not m or (m.group(2)[0] == "`" and "`" in m.group(3)):
            h = HEADING.match(lines[i])
            if h:
                heading = h.group(1)
            i += 1
            continue
        indent, fence, info = len(m.group(1)), m.group(2), m.group(3)
        close = re.compile(r"^ *" + re.escape(fence[0]) + "{%d,}[ \t]*$" % len(fence))
        fence_line = i + 1
        body = []
        i += 1
        while i < len(lines) and not close.match(lines[i]):
            line = lines[i]
            k = 0
            while k < indent and k < len(line) and line[k] == " ":
                k += 1
            body.append(line[k:])
            i += 1
        if i >= len(lines):
            problems.append(f"{path}:{fence_line}: fence never closed")
        i += 1
        words = info.split()
        if not words or words[0] != "sql":
            continue
        b = Block(path, fence_line, words[1:], body, heading)
        if b.mode is None:
            problems.append(f"{b.where}: unknown fence info string {info!r} "
                            "(use sql, sql norun, sql error or sql error SQLSTATE)")
            continue
        if b.expected_state and not re.fullmatch(r"[0-9A-Z]{5}", b.expected_state):
            problems.append(f"{b.where}: {b.expected_state!r} is not a SQLSTATE")
            continue
        blocks.append(b)
    return blocks, problems


def build_script(blocks):
    """A psql script for the runnable blocks, and script line -> (block, md line)."""
    out, where = [], {}

    def emit(text, block=None, md_line=None):
        out.append(text)
        if block is not None:
            where[len(out)] = (block, md_line)

    emit("\\set ON_ERROR_STOP 1")
    for n, b in enumerate(blocks):
        if b.mode == "norun":
            continue
        emit(f"\\echo '@@doc begin {n} {b.fence_line}'")
        if b.mode == "error":
            emit("\\set ON_ERROR_STOP 0")
            emit("\\set LAST_ERROR_SQLSTATE none")
            emit("\\set LAST_ERROR_MESSAGE none")
        for j, line in enumerate(b.body):
            emit(line, b, b.fence_line + 1 + j)
        # Ends a statement left without its semicolon, so that it cannot run
        # into the next block (an empty statement is not sent).
        emit(";", b, b.fence_line + len(b.body) + 1)
        if b.mode == "error":
            emit("\\set ON_ERROR_STOP 1")
            emit(f"\\echo '@@doc errstate {n}' :LAST_ERROR_SQLSTATE")
            emit(f"\\echo '@@doc errmsg {n}' :LAST_ERROR_MESSAGE")
        emit(f"\\echo '@@doc end {n}'")
    emit("\\echo '@@doc done'")
    return "\n".join(out) + "\n", where


def run(path, db):
    blocks, problems = parse(path)
    for p in problems:
        print("FAIL " + p)
    if problems:
        return 1
    script, where = build_script(blocks)
    with tempfile.NamedTemporaryFile("w", suffix=".sql", prefix="doc_", delete=False) as f:
        f.write(script)
        script_path = f.name
    try:
        psql = os.path.join(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"), "psql")
        p = subprocess.run([psql, "-X", "-d", db, "-f", script_path],
                           capture_output=True, text=True, timeout=120)
    finally:
        os.unlink(script_path)
    log = os.environ.get("DOC_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"===== {path}\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}\n")

    failed = 0
    ended = set()
    states = {}
    for line in p.stdout.split("\n"):
        m = re.match(r"^@@doc (end|errstate|errmsg) (\d+) ?(.*)$", line)
        if m:
            n = int(m.group(2))
            if m.group(1) == "end":
                ended.add(n)
            else:
                states.setdefault(n, {})[m.group(1)] = m.group(3)

    if p.returncode != 0:
        # ON_ERROR_STOP: the error that stopped psql is the last one (the
        # earlier ones belong to `sql error` blocks).
        errors = re.findall(r"^psql:[^\n]*?:(\d+): (?:ERROR|FATAL|error): +(.*)$", p.stderr, re.M)
        m = errors[-1] if errors else None
        if m and int(m[0]) in where:
            b, md_line = where[int(m[0])]
            print(f"FAIL {path}:{md_line}: {m[1]}")
            print(f"     (in the ```sql block at line {b.fence_line}; psql says:)")
        else:
            print(f"FAIL {path}: psql exited with {p.returncode}")
        tail = p.stderr.strip().split("\n")
        start = max(i for i, l in enumerate(tail) if l.startswith("psql:")) if m else max(0, len(tail) - 8)
        print("     " + "\n     ".join(tail[start:start + 8]))
        failed += 1
    elif "@@doc done" not in p.stdout:
        print(f"FAIL {path}: psql stopped before the last block")
        failed += 1

    for n, b in enumerate(blocks):
        if b.mode != "error" or n not in ended:
            continue
        state = states.get(n, {}).get("errstate", "none")
        msg = states.get(n, {}).get("errmsg", "")
        if state == "none":
            print(f"FAIL {b.where}: a ```sql error block that raised no error")
            failed += 1
        elif b.expected_state and state != b.expected_state:
            print(f"FAIL {b.where}: expected SQLSTATE {b.expected_state}, got {state}: {msg}")
            failed += 1
        elif not b.expected_state and state in SUSPECT:
            print(f"FAIL {b.where}: the expected error is a {SUSPECT[state]} ({state}): {msg}")
            failed += 1
        else:
            print(f"  {b.where}: raised {state} as documented: {msg}")
    counts = {m: sum(1 for b in blocks if b.mode == m) for m in ("run", "norun", "error")}
    ran = len([n for n, b in enumerate(blocks) if b.mode != "norun" and n in ended])
    print(f"  {path}: {counts['run']} run, {counts['error']} error, {counts['norun']} norun; "
          f"{ran} of {counts['run'] + counts['error']} executed to the end"
          + ("" if failed else ", ok"))
    return 1 if failed else 0


def main(argv):
    if len(argv) == 3 and argv[1] == "count":
        blocks, problems = parse(argv[2])
        c = [sum(1 for b in blocks if b.mode == m) for m in ("run", "norun", "error")]
        print(*c, len(problems))
        return 0
    if len(argv) == 4 and argv[1] == "run":
        return run(argv[2], argv[3])
    if len(argv) == 5 and argv[1] == "block":
        blocks, problems = parse(argv[2])
        under = [b for b in blocks if b.heading == argv[3]]
        n = int(argv[4])
        if problems or not 1 <= n <= len(under):
            print(f"{argv[2]}: no sql block {n} under the heading {argv[3]!r} "
                  f"({len(under)} there)", file=sys.stderr)
            return 1
        print("\n".join(under[n - 1].body))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
