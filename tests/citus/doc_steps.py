#!/usr/bin/env python3
"""The Citus steps of docs/scaling.md, verbatim, as one psql script.

    doc_steps.py FILE            print the script (on stdout)

A step is a ```sql norun block (Citus-only: the docs test runs the docs on a
plain PostgreSQL) whose opening fence comes right after a line
`<!-- citus-scenario: NAME -->`. tests/scenarios/scaling.sh citus runs the steps in
their order, in one psql session on the coordinator, so that the page and
the test cannot differ. A marker that is not followed by such a block, or a
page without markers, is an error (exit 1): the test must not silently run
nothing.
"""
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs"))
from sql_blocks import parse  # noqa: E402

MARK = re.compile(r"^<!-- citus-scenario: ([a-z0-9_-]+) -->$")


def main(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    blocks, problems = parse(path)
    by_fence = {b.fence_line: b for b in blocks}
    steps, bad = [], list(problems)
    for i, line in enumerate(lines):
        m = MARK.match(line.strip())
        if not m:
            continue
        b = by_fence.get(i + 2)  # the fence is the next line (1-based)
        if b is None or b.mode != "norun":
            bad.append(f"{path}:{i + 1}: marker {m.group(1)!r} is not followed by a ```sql norun block")
            continue
        steps.append((m.group(1), b))
    if not steps:
        bad.append(f"{path}: no <!-- citus-scenario: ... --> marker")
    for p in bad:
        print("FAIL " + p, file=sys.stderr)
    if bad:
        return 1
    print("\\set ON_ERROR_STOP 1")
    for name, b in steps:
        print(f"\\echo '@@step {name} ({path}:{b.fence_line})'")
        print("\n".join(b.body))
        print(";")
    print("\\echo '@@steps done'")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
