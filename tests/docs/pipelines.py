#!/usr/bin/env python3
"""No pipeline in the shell code ends in a reader that may stop reading early.

    pipelines.py ROOT

The rule, and why (SIGPIPE under pipefail), is docs/development.md's
"Shell pipelines". This reads every shell file of the tree (*.sh, and the
files whose first line is a bash or sh shebang, as .ci/run; not target/,
dist/, node_modules/ and the like) with the quotes, comments and
here-documents told apart from the code (`$(...)` inside double quotes is
code; a here-document fed to bash or sh is read as code), and fails on
every `|` whose next command is such a reader: head; grep with -q, -m, -l,
-L or its output to /dev/null; sed with a q command; awk with exit; read.
Here-strings, process substitutions and readers of files are not
pipelines and pass.
"""
import os
import re
import shlex
import sys

root = sys.argv[1]
# generated or installed trees (bench/out, the private clusters, venvs)
SKIP_DIRS = {".git", "target", "dist", "node_modules", ".cluster", "out", "__pycache__", ".venv", "venv"}


def shell_files():
    for top, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(files):
            path = os.path.join(top, name)
            if name.endswith(".sh"):
                yield path
            elif "." not in name:
                try:
                    with open(path, "rb") as f:
                        first = f.readline(200)
                except OSError:
                    continue
                if re.match(rb"#!\s*/(usr/)?bin/(env\s+)?(ba)?sh\b", first):
                    yield path


def mask(text, outer="code"):
    """The code of a shell text: same length, with what is not code
    (the inside of quotes, comments, here-document bodies) replaced by
    spaces, newlines kept; `$(...)` inside double quotes or an unquoted
    here-document stays code. Also returns the text without its comments,
    and the bodies of here-documents fed to bash or sh, as (offset, text),
    to be read as code of their own. outer="hd": text is the body of an
    unquoted here-document."""
    out = list(text)
    bare = list(text)  # the text without its comments
    scripts = []
    # frames: ["code", depth, closes_with_paren] / ["dq"] / ["hd"] / ["bq"]
    stack = [["code", 0, False]] if outer == "code" else [["hd"]]
    heredocs = []  # (terminator, strip_tabs, quoted, is_script) waiting for the next newline
    i, n = 0, len(text)

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        frame = stack[-1]
        if frame[0] in ("dq", "hd"):
            if c == "\\":
                blank(i, min(i + 2, n))
                i += 2
            elif c == '"' and frame[0] == "dq":
                stack.pop()
                i += 1
            elif text.startswith("$(", i) and not text.startswith("$((", i):
                stack.append(["code", 0, True])
                i += 2
            elif c == "`":
                stack.append(["bq"])
                i += 1
            else:
                blank(i, i + 1)
                i += 1
            continue
        if frame[0] == "bq":
            if c == "`":
                stack.pop()
            i += 1
            continue
        # code
        if c == "\\":
            if i + 1 < n and text[i + 1] != "\n":
                blank(i + 1, i + 2)
            i += 2
        elif c == "'" or text.startswith("$'", i):
            j = i + (2 if c == "$" else 1)
            while j < n and text[j] != "'":
                j += 2 if (c == "$" and text[j] == "\\") else 1
            blank(i + 1, j)
            i = j + 1
        elif c == '"':
            stack.append(["dq"])
            i += 1
        elif c == "#" and (i == 0 or text[i - 1] in " \t\n;&|("):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            bare[i:j] = " " * (j - i)
            i = j
        elif c == "<" and text.startswith("<<", i) and not text.startswith("<<<", i):
            m = re.match(r"<<(-?)\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2", text[i:])
            if m:
                line_start = text.rfind("\n", 0, i) + 1
                before = text[line_start:i]
                is_script = re.search(r"(^|[\s;|&(])(ba)?sh(\s+-\S+)*\s*$", before) is not None
                heredocs.append((m.group(3), m.group(1) == "-", m.group(2) != "", is_script))
                i += m.end()
            else:
                i += 2
        elif c == "\n" and heredocs:
            i += 1
            for h, (term, strip, quoted, is_script) in enumerate(heredocs):
                start = i
                while i < n:
                    j = text.find("\n", i)
                    j = n if j < 0 else j
                    line = text[i:j]
                    if (line.lstrip("\t") if strip else line) == term:
                        body_end = i
                        i = j
                        break
                    i = j + 1
                else:
                    body_end = n
                if is_script:
                    scripts.append((start, text[start:body_end]))
                    blank(start, body_end)
                elif quoted:
                    blank(start, body_end)
                else:  # its $(...) run
                    sub_out, sub_bare, sub_scripts = mask(text[start:body_end], "hd")
                    out[start:body_end] = sub_out
                    bare[start:body_end] = sub_bare
                    scripts += [(start + o, t) for o, t in sub_scripts]
                if i < n and text[i] == "\n" and h < len(heredocs) - 1:
                    i += 1
            heredocs = []
        elif c == "(":
            frame[1] += 1
            i += 1
        elif c == ")":
            if frame[1] > 0:
                frame[1] -= 1
            elif frame[2]:
                stack.pop()
            i += 1
        else:
            i += 1
    return "".join(out), "".join(bare), scripts


SHORT_WITH_ARG = set("efmABCdD")


def grep_stops_early(words):
    skip = False
    for w in words[1:]:
        if skip:
            skip = False
            continue
        if w in ("--quiet", "--silent", "--files-with-matches", "--files-without-match") or w.startswith("--max-count"):
            return True
        if w == "--":
            break
        if w.startswith("-") and not w.startswith("--") and len(w) > 1:
            for pos, ch in enumerate(w[1:], 2):
                if ch in "qlLm":
                    return True
                if ch in SHORT_WITH_ARG:
                    skip = pos == len(w)  # its argument is the next word
                    break
    # GNU grep stops at the first match when its output is /dev/null
    return any(re.match(r"^(\d?>|&>)\s*/dev/null$", w) for w in joined_redirects(words))


def joined_redirects(words):
    for k, w in enumerate(words):
        if w in (">", "1>", "&>") and k + 1 < len(words):
            yield w + words[k + 1]
        else:
            yield w


def sed_quits(words):
    for w in words[1:]:
        if w.startswith("-") and not w.startswith("-e"):
            continue
        # a q or Q command: at the script's start, after ; { }, or an address
        if re.search(r"(^|[;{}\n]|[0-9$/])\s*[qQ]\s*[0-9]*\s*($|[;}\n])", w):
            return True
    return False


def reader_problem(words):
    """Why this command may stop reading its input early, or None."""
    while words and (re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]) or words[0] in ("{", "(", "!", "command", "exec", "env", "nice", "stdbuf")):
        words = words[1:]
    if words and words[0] == "timeout":
        words = words[2:]
    if not words:
        return None
    cmd = os.path.basename(words[0])
    if cmd == "head":
        return "head stops reading after its lines"
    if cmd in ("grep", "egrep", "fgrep") and grep_stops_early(words):
        return "grep -q/-m/-l/-L (or to /dev/null) stops at a match"
    if cmd == "sed" and sed_quits(words):
        return "sed's q command stops reading"
    if cmd in ("awk", "gawk", "mawk") and any(re.search(r"\bexit\b", w) for w in words[1:]):
        return "awk's exit stops reading"
    if cmd == "read":
        return "read takes a line and leaves the rest"
    return None


def command_after(text, code, i):
    """The words of the command that starts after position i (a pipe)."""
    j = i
    n = len(code)
    while j < n and (code[j] in " \t\n" or code.startswith("\\\n", j)):
        j += 2 if code[j] == "\\" else 1
    k = j
    while k < n and code[k] not in "|;&)\n" and not (code[k] == "}" and code[k - 1] in " \t;"):
        if code.startswith("\\\n", k):
            k += 2
            continue
        k += 1
    # redirections like >/dev/null and 2>&1 contain & and >: take them along
    while k < n and code[k] == "&" and k > 0 and code[k - 1] == ">":
        k += 1
        while k < n and code[k] not in "|;&)\n":
            k += 1
    span = text[j:k].replace("\\\n", " ")
    try:
        return shlex.split(span, comments=False)
    except ValueError:
        return span.split()


def problems(text):
    global pipes
    code, bare, scripts = mask(text)
    found = []
    for m in re.finditer(r"(?<![|>])\|&?(?!\|)", code):
        pipes += 1
        words = command_after(bare, code, m.end())
        why = reader_problem(words)
        if why:
            found.append((text.count("\n", 0, m.start()) + 1, " ".join(words), why))
    for offset, body in scripts:
        base = text.count("\n", 0, offset)
        for line, cmd, why in problems(body):
            found.append((base + line, cmd, why))
    return sorted(found)


total = files = pipes = 0
for path in shell_files():
    files += 1
    text = open(path, encoding="utf-8", errors="replace").read()
    rel = os.path.relpath(path, root)
    for line, cmd, why in problems(text):
        total += 1
        print(f"FAIL {rel}:{line}: | {cmd}: {why}, so its writer may die of SIGPIPE under pipefail")

print(f"{files} shell files, {pipes} pipes read; {total} into a reader that may stop early"
      + (" (docs/development.md, Shell pipelines: a here-string, sed -n 1p after the pipe, grep -m on the file)" if total else ""))
if files == 0 or pipes == 0:
    sys.exit("FAIL: no shell file or no pipe found: the walk or the parser broke")
sys.exit(1 if total else 0)
