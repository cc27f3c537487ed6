#!/usr/bin/env python3
"""The update scripts of the unreleased version, generated: each
sql/idem--A--B.sql whose template sql/updates/A--B.sql exists is that
template with every marker line replaced by a statement of sql/*.sql,
named by its first line as written there:

    -- @create: CREATE FUNCTION name(args) ...    a new function or view: the
                 statement and the COMMENT ON, REVOKE and GRANT statements
                 that follow it in its module
    -- @replace: CREATE FUNCTION name(args) ...   a changed one: the same, as
                 CREATE OR REPLACE
    -- @replace-alone: CREATE FUNCTION ...         the CREATE OR REPLACE only
    -- @statement: COMMENT ON FUNCTION name(types) IS   any other statement
                 of sql/*.sql, by its first line (a changed comment)
 So a
function or view that the update restates is written once, in its module,
and an edit of it reaches the update when this runs; what only the update
does (new tables, moved data, dropped old forms, Citus paths) stays
hand-written in the template. Released updates have no template: they are
history and never change.

    python3 scripts/updates.py          write the generated files
    python3 scripts/updates.py --check  fail if one differs from its template's output
                                        (tests/scenarios/packaging.sh upgrade runs it)
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = re.compile(r"^-- @(create|replace|replace-alone|statement): (.*)\n", re.M)
HEAD = re.compile(r"^CREATE (?:OR REPLACE )?(?:FUNCTION|VIEW|PROCEDURE) [^\n]*$", re.M)
FOLLOWER = re.compile(r"(?:COMMENT ON|REVOKE|GRANT) ")


def die(msg):
    sys.exit(f"updates.py: {msg}")


def statement_end(text, start):
    """Index just past the statement starting at start: the first ';' at a
    line's end outside dollar quotes and single-quoted literals."""
    i, tag = start, None
    token = re.compile(r"\$[A-Za-z_]*\$|'|;\n|--[^\n]*")
    while True:
        m = token.search(text, i)
        if not m:
            die(f"no end of the statement at {text[start:start + 60]!r}")
        t = m.group(0)
        if tag is not None:
            if t == tag:
                tag = None
            i = m.end()
        elif t.startswith("$"):
            tag, i = t, m.end()
        elif t == "'":
            j = m.end()
            while True:  # a literal ends at a quote not doubled
                k = text.find("'", j)
                if k < 0:
                    die(f"unterminated literal at {text[m.start():m.start() + 60]!r}")
                if text[k + 1:k + 2] == "'":
                    j = k + 2
                    continue
                i = k + 1
                break
        elif t.startswith("--"):
            i = m.end()
        else:
            return m.end()


def install_blocks():
    """{first line: (statement, followers)} for every CREATE
    FUNCTION/VIEW/PROCEDURE of sql/*.sql (not the update files), with the
    COMMENT ON, REVOKE and GRANT statements right after it."""
    blocks = {}
    for name in sorted(os.listdir(os.path.join(ROOT, "sql"))):
        if not name.endswith(".sql") or name.startswith("idem--"):
            continue
        text = open(os.path.join(ROOT, "sql", name), encoding="utf-8").read()
        for m in HEAD.finditer(text):
            end = first = statement_end(text, m.start())
            while FOLLOWER.match(text, end):
                end = statement_end(text, end)
            head = m.group(0)
            if head in blocks:
                die(f"sql/{name}: two statements begin {head!r}")
            blocks[head] = (text[m.start():first], text[first:end])
    return blocks


def any_statement(head):
    """The statement of sql/*.sql (not the update files) whose first line is
    head; exactly one must begin so."""
    found = []
    for name in sorted(os.listdir(os.path.join(ROOT, "sql"))):
        if not name.endswith(".sql") or name.startswith("idem--"):
            continue
        text = open(os.path.join(ROOT, "sql", name), encoding="utf-8").read()
        for m in re.finditer("^" + re.escape(head) + "$", text, re.M):
            found.append(text[m.start():statement_end(text, m.start())])
    if len(found) != 1:
        die(f"@statement: {len(found)} statements of sql/*.sql begin {head!r}, not one")
    return found[0]


def generate(template, blocks):
    def restate(m):
        kind, head = m.group(1), m.group(2).strip()
        if kind == "statement":
            return any_statement(head)
        if head not in blocks:
            die(f"@{kind}: no statement of sql/*.sql begins {head!r}")
        statement, followers = blocks[head]
        if kind == "create":
            return statement + followers
        statement = re.sub(r"^CREATE (?!OR REPLACE )", "CREATE OR REPLACE ", statement, count=1)
        return statement + (followers if kind == "replace" else "")
    return MARKER.sub(restate, template)


def pairs():
    folder = os.path.join(ROOT, "sql", "updates")
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.endswith(".sql"):
            yield os.path.join(folder, name), os.path.join(ROOT, "sql", "idem--" + name)


def main():
    check = sys.argv[1:] == ["--check"]
    blocks = install_blocks()
    stale = []
    for src, dst in pairs():
        out = generate(open(src, encoding="utf-8").read(), blocks)
        old = open(dst, encoding="utf-8").read() if os.path.exists(dst) else None
        if out == old:
            continue
        if check:
            stale.append(os.path.relpath(dst, ROOT))
        else:
            open(dst, "w", encoding="utf-8").write(out)
            print(f"wrote {os.path.relpath(dst, ROOT)}")
    if stale:
        die(f"{', '.join(stale)} differ from what their templates in sql/updates/ give: run python3 scripts/updates.py (edit the template, not the generated file)")


if __name__ == "__main__":
    main()
