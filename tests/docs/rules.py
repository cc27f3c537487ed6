#!/usr/bin/env python3
"""Every restatement of idem's input rules agrees with the rule's home.

    rules.py ROOT

Each rule is defined once, in Rust (src/guc.rs, src/key.rs), and restated
where Rust cannot reach: the SQL of both editions (sql/*.sql, the update
templates in sql/updates/, portable/*.sql) and the README's tables. This
reads each home's value from the Rust source and fails on any literal of
the rule, in those files, that says something else, and on a rule whose
restatements are no longer found (a pattern below that went stale).
Released update scripts (sql/idem--A--B.sql) are frozen history and not
read.
"""
import glob
import os
import re
import sys

root = sys.argv[1]


def read(path):
    with open(os.path.join(root, path), encoding="utf-8") as f:
        return f.read()


def rust_int(src, name):
    """The value of `const NAME: T = <int expression>;` (digits, _, *)."""
    m = re.search(r"\b%s\s*:\s*\w+\s*=\s*([0-9_ *]+);" % name, src)
    if not m:
        sys.exit(f"FAIL: {name} not found in the Rust source")
    value = 1
    for factor in m.group(1).replace("_", "").split("*"):
        value *= int(factor)
    return value


guc = read("src/guc.rs")
key = read("src/key.rs")
MIN_TTL_US = rust_int(guc, "MIN_TTL_US")
MAX_TTL_US = rust_int(guc, "MAX_TTL_US")
MAX_KEY_BYTES = rust_int(key, "MAX_KEY_BYTES")
DEFAULT_TTL = re.search(r"DEFAULT_TTL: GucSetting<[^=]+= GucSetting::<[^>]+>>::new\(Some\(c\"([^\"]+)\"\)\)", guc).group(1)
DEFAULT_WIDTH = re.search(r"PARTITION_WIDTH: GucSetting<[^=]+= GucSetting::<[^>]+>>::new\(Some\(c\"([^\"]+)\"\)\)", guc).group(1)
MIN_WIDTH_US = int(re.search(r"interval_check_hook!\(check_width, ([0-9_]+),", guc).group(1).replace("_", ""))
BIZ_MAX = int(re.search(r"\(1\.\.=(\d+)\)\.contains\(&b\.len\(\)\)", key).group(1))
BIZ_RULE = re.search(r'rule: "it must match (\^[^"]+\$)"', key).group(1)
if BIZ_RULE != "^[A-Za-z0-9_.:-]{1,%d}$" % BIZ_MAX:
    sys.exit(f"FAIL: src/key.rs: the stated rule {BIZ_RULE} is not the checked length 1..{BIZ_MAX}")
DAYS = MAX_TTL_US // 86_400_000_000

sql_files = sorted(set(glob.glob(os.path.join(root, "sql", "*.sql")))
                   - set(glob.glob(os.path.join(root, "sql", "idem--*--*.sql"))))
sql_files += sorted(glob.glob(os.path.join(root, "sql", "updates", "*.sql")))
sql_files += sorted(glob.glob(os.path.join(root, "portable", "*.sql")))
texts = {os.path.relpath(p, root): open(p, encoding="utf-8").read() for p in sql_files}
texts["README.md"] = read("README.md")

# (what, pattern, check of the match's groups): every match in every file
# must pass its check, and every rule must be found at least once.
RULES = [
    ("biz_type pattern", r"\^\[A-Za-z0-9_\.:-\]\{1,(\d+)\}\$", lambda g: int(g[0]) == BIZ_MAX),
    ("TTL range as epoch seconds", r"extract\(epoch FROM ttl\) < (\d+) OR extract\(epoch FROM ttl\) > (\d+) \* 86400",
     lambda g: int(g[0]) * 1_000_000 == MIN_TTL_US and int(g[1]) == DAYS),
    ("TTL range in microseconds", r"us < (\d+) OR us > (\d+) THEN", lambda g: (int(g[0]), int(g[1])) == (MIN_TTL_US, MAX_TTL_US)),
    ("the default TTL and its range", r"setting_us\('idem\.default_ttl', interval '([^']+)', (\d+), (\d+)\)",
     lambda g: (g[0], int(g[1]), int(g[2])) == (DEFAULT_TTL, MIN_TTL_US, MAX_TTL_US)),
    ("the default TTL", r"setting_interval\('idem\.default_ttl', '([^']+)'\)", lambda g: g[0] == DEFAULT_TTL),
    ("the partition width's default and range", r"setting_us\('idem\.partition_width', interval '([^']+)', (\d+), (\d+)\)",
     lambda g: (g[0], int(g[1]), int(g[2])) == (DEFAULT_WIDTH, MIN_WIDTH_US, MAX_TTL_US)),
    ("the longest TTL in microseconds (every literal of 13 digits or more)", r"(?<![\w.])(\d{13,})(?![\w.])",
     lambda g: int(g[0]) == MAX_TTL_US),
    ("the key length", r"octet_length\((?:u\.)?k(?:ey)?\) > (\d+)", lambda g: int(g[0]) == MAX_KEY_BYTES),
    ("README: the key length", r"key over (\d+) bytes", lambda g: int(g[0]) == MAX_KEY_BYTES),
    ("README: the TTL range", r"ttl or lease outside 1 second \.\. (\d+) days", lambda g: int(g[0]) == DAYS),
    ("README: a type's TTL", r"TTL of a business type \(1 s to (\d+) days\)", lambda g: int(g[0]) == DAYS),
    ("README: the default TTL", r"the setting `idem\.default_ttl` \(([^)]+)\)", lambda g: g[0] == DEFAULT_TTL),
]

failed = 0
for what, pattern, ok in RULES:
    seen = 0
    for name, text in texts.items():
        for m in re.finditer(pattern, text):
            seen += 1
            if not ok([" ".join(x.split()) if x else x for x in m.groups()]):
                line = text.count("\n", 0, m.start()) + 1
                print(f"FAIL: {name}:{line}: {what}: {m.group(0)!r} disagrees with src/ "
                      f"(ttl {MIN_TTL_US}..{MAX_TTL_US} us, default {DEFAULT_TTL}, width {DEFAULT_WIDTH} from {MIN_WIDTH_US} us, "
                      f"biz_type 1..{BIZ_MAX}, key {MAX_KEY_BYTES} bytes)")
                failed += 1
    if seen == 0:
        print(f"FAIL: {what}: no restatement found (the pattern in tests/docs/rules.py is stale)")
        failed += 1
    else:
        print(f"ok: {what}: {seen} restatements agree with src/")
sys.exit(1 if failed else 0)
