#!/usr/bin/env python3
"""Plain '...' literals with a backslash in idem's SQL (sql/*.sql,
portable/*.sql). Function bodies are parsed when they run, under the
caller's standard_conforming_strings: with it off, a backslash in a plain
literal is an escape. Escape strings (E'...') mean the same either way;
dollar-quoted text is read as SQL (bodies, dynamic statements). Prints
file:line: literal for each; exits 1 if any. Updates to released versions
(sql/idem--A--B.sql with B older than Cargo.toml's version) are history
and not read.

    python3 tests/lib/plain_literals.py [FILE...]   (default: those above)"""
import glob, os, re, sys
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKEN = re.compile(r"--[^\n]*|/\*.*?\*/|(?<![\w$])[Ee]'(?:[^'\\]|\\.|'')*'|'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"", re.S)
VERSION = re.search(r'^version = "([^"]+)"', open(os.path.join(ROOT, "Cargo.toml")).read(), re.M).group(1)


def released_update(path):
    m = re.fullmatch(r"idem--[\d.]+--([\d.]+)\.sql", os.path.basename(path))
    return m is not None and m.group(1) != VERSION


bad = 0
for path in sys.argv[1:] or [p for p in sorted(glob.glob(os.path.join(ROOT, "sql", "*.sql")) + glob.glob(os.path.join(ROOT, "portable", "*.sql"))
                                                + glob.glob(os.path.join(ROOT, "portable", "updates", "*.sql")))
                             if not released_update(p)]:
    text = open(path, encoding="utf-8").read()
    for m in TOKEN.finditer(text):
        t = m.group(0)
        if t.startswith("'") and "\\" in t:
            line = text.count("\n", 0, m.start()) + 1
            print(f"{os.path.relpath(path, ROOT)}:{line}: {t[:80]}")
            bad += 1
sys.exit(1 if bad else 0)
