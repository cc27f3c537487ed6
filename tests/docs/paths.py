#!/usr/bin/env python3
"""The files, links and commands the README and the development guide name exist.

    paths.py ROOT

In README.md and docs/development.md (the pages a newcomer follows to the
letter):

* every relative link `[...](path#anchor)` reaches a file or folder of the
  tree, and its anchor a heading of that page (GitHub's heading ids);
* every path in backquotes under one of the tree's top folders
  (`scripts/test.sh`, `tests/scenarios/examples_*.sh`) matches a file;
  paths the tree generates (`dist/`, `target/`, `bench/out/`) are exempt;
* every `bash FILE ...` names a file, and, when FILE dispatches on its first
  argument (`case "${1...`, or a file of scenarios), that argument is one of
  its cases (`bash scripts/cluster.sh psql`, `bash tests/scenarios/hardening.sh
  encodings`); every `make [VAR=...] TARGET` names a
  target of the Makefile;
* a "Project layout" section's block lists folders and files that
  exist: the top folders, and the files under src/ by indentation.

A README that sends its reader to a script that moved, a folder that no
longer exists or a section renamed fails here rather than on the reader's
machine.
"""
import glob
import os
import re
import sys

root = sys.argv[1]
PAGES = ["README.md", "docs/development.md"]
GENERATED = ("dist/", "target/", "bench/out/", ".cluster")
TOP = {n for n in os.listdir(root) if not n.startswith(".git")} - {"target", "dist"}

fails = 0
checked = {"links": 0, "paths": 0, "commands": 0, "layout": 0}


def fail(page, n, msg):
    global fails
    fails += 1
    print(f"FAIL {page}:{n}: {msg}")


def slug(heading):
    """GitHub's id for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


anchors_cache = {}


def anchors(path):
    if path not in anchors_cache:
        ids, fence = set(), False
        for line in open(path, encoding="utf-8"):
            if re.match(r"^ *(```|~~~)", line):
                fence = not fence
            m = None if fence else re.match(r"^#{1,6} +(.*)", line)
            if m:
                ids.add(slug(m.group(1)))
            ids.update(re.findall(r'<a (?:id|name)="([^"]+)"', line))
        anchors_cache[path] = ids
    return anchors_cache[path]


def make_targets():
    text = open(os.path.join(root, "Makefile"), encoding="utf-8").read()
    return set(re.findall(r"^([A-Za-z][A-Za-z0-9_-]*)\s*:(?!=)", text, re.M))


def dispatch_cases(script):
    """The words a script dispatches on (`case "${1:-start}" in` ... `word)`, or
    its scenario_NAME functions: tests/lib/scenarios.sh), or None."""
    text = open(script, encoding="utf-8").read()
    if re.search(r'^scenario_main "\$@"$', text, re.M):
        return set(re.findall(r"^scenario_([a-z0-9_]+)\(\) \{$", text, re.M))
    m = re.search(r'^case "\$\{?1[^"]*" in\n(.*?)^esac', text, re.M | re.S)
    if not m:
        return None
    return {w for label in re.findall(r"^([a-z][a-z|-]*)\)", m.group(1), re.M) for w in label.split("|")}


def check_command(page, n, words):
    global fails
    if not words:
        return
    if words[0] == "bash" and len(words) > 1 and not words[1].startswith("-"):
        script = words[1]
        checked["commands"] += 1
        path = os.path.join(root, script)
        if not os.path.isfile(path):
            fail(page, n, f"`bash {script}`: no such file")
            return
        cases = dispatch_cases(path)
        args = [w for w in words[2:] if not w.startswith("-")]
        if cases is not None and args and args[0] not in cases:
            fail(page, n, f"`bash {script} {args[0]}`: {script} knows {sorted(cases)}")
    elif words[0] == "make":
        checked["commands"] += 1
        targets = [w for w in words[1:] if "=" not in w and not w.startswith("-")]
        for t in targets[:1]:
            if t not in make_targets():
                fail(page, n, f"`make {t}`: no such target in the Makefile")


def commands_in(line):
    """The commands of a line: backquoted spans, or the line itself in a sh block."""
    for cmd in re.split(r"&&|;|\|", line):
        words = cmd.split()
        # a leading VAR=value (PG_CONFIG=... bash ...)
        while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
            words = words[1:]
        yield words


for page in PAGES:
    path = os.path.join(root, page)
    here = os.path.dirname(path)
    lines = open(path, encoding="utf-8").read().split("\n")
    fence = None
    want_layout, layout, parents = False, False, []
    for n, line in enumerate(lines, 1):
        if re.match(r"^#{2,4} ", line):
            want_layout = line.lstrip("# ").startswith("Project layout")
        m = re.match(r"^ *(```|~~~)\s*(\S*)", line)
        if m:
            if fence is None:
                fence = m.group(2) or "plain"
                layout = want_layout and fence == "plain"
            else:
                fence, layout = None, False
            continue
        if fence in ("sh", "bash", "console"):
            for words in commands_in(line.split("#")[0]):
                check_command(page, n, words)
            continue
        if layout:
            # The project layout: "name/  text" at the top, files indented
            # two spaces per level under their folder.
            lm = re.match(r"^( *)(\S+)( |$)", line)
            if lm and (lm.group(2).endswith("/") or re.search(r"\.(rs|sql|sh|py)$", lm.group(2))):
                parents = parents[:len(lm.group(1)) // 2]
                rel = os.path.join(*parents, lm.group(2))
                checked["layout"] += 1
                if not os.path.exists(os.path.join(root, rel)):
                    fail(page, n, f"the project layout lists {rel}, which does not exist")
                if lm.group(2).endswith("/"):
                    parents = parents + [lm.group(2).rstrip("/")]
            continue
        if fence is not None:
            continue
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if re.match(r"^[a-z]+:", target):
                continue  # https:, mailto:
            checked["links"] += 1
            file, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(here, file)) if file else path
            if not os.path.exists(dest):
                fail(page, n, f"link to {target}: no such file")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                fail(page, n, f"link to {target}: {os.path.relpath(dest, root)} has no heading #{anchor}")
        for span in re.findall(r"`([^`]+)`", line):
            for words in commands_in(span):
                check_command(page, n, words)
            for word in span.split():
                word = word.rstrip(".,;:)")
                top = word.split("/")[0]
                if "/" not in word or top not in TOP or word.startswith(GENERATED) or "…" in word:
                    continue
                checked["paths"] += 1
                if not glob.glob(os.path.join(root, word)):
                    fail(page, n, f"`{word}`: no such file in the tree")

print(f"{', '.join(f'{v} {k}' for k, v in checked.items())} checked in {', '.join(PAGES)}; {fails} failed")
if checked["commands"] == 0 or checked["layout"] == 0:
    sys.exit("FAIL: no command or no layout entry found: the parser broke")
sys.exit(1 if fails else 0)
