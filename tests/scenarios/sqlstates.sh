#!/usr/bin/env bash
# The README's SQLSTATE table against the code: every SQLSTATE idem raises
# itself (src/errors.rs, and ERRCODE in sql/*.sql) has a row, and every row
# is either raised by idem or is one of the PostgreSQL errors the table
# explains (waits, casts, privileges), listed below with the reason. A code
# added to the code without a README row, or a row left behind, fails here.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
python3 - "$ROOT" <<'PY'
import glob, re, sys
root = sys.argv[1]
readme = open(f"{root}/README.md", encoding="utf-8").read()
table = readme[readme.index("### SQLSTATEs"):]
table = table[:table.index("\n\n", table.index("| SQLSTATE |"))]
documented = set()
for line in table.splitlines():
    if line.startswith("| `"):
        documented.update(re.findall(r"`([0-9A-Z]{5})`", line.split("|")[1]))
raised = {}
errors_rs = open(f"{root}/src/errors.rs", encoding="utf-8").read()
for code in re.findall(r'=> b"([0-9A-Z]{5})"', errors_rs):
    raised.setdefault(code, set()).add("src/errors.rs")
for path in glob.glob(f"{root}/sql/*.sql"):
    if re.search(r"idem--[0-9.]+--", path):
        continue  # upgrade scripts restate what the install scripts raise
    for code in re.findall(r"ERRCODE\s*=\s*'([0-9A-Z]{5})'", open(path, encoding="utf-8").read()):
        raised.setdefault(code, set()).add(path[len(root) + 1:])
# Raised by PostgreSQL inside idem's calls, and documented on purpose.
by_postgres = {
    "40P01": "deadlock detector, waiting for another claimer",
    "55P03": "lock_timeout while waiting for another claimer",
    "57014": "statement_timeout while waiting for another claimer",
    "53200": "the lock table, SQL path",
    "22P02": "idem_transition's cast of id / to_state",
    "22003": "idem_transition's cast of id / to_state",
    "42501": "privilege checks on idem's functions and schema",
}
missing = sorted(set(raised) - documented)
stale = sorted(documented - set(raised) - set(by_postgres))
for code in missing:
    print(f"FAIL: {code} is raised by {', '.join(sorted(raised[code]))} but has no row in the README's SQLSTATE table")
for code in stale:
    print(f"FAIL: the README's SQLSTATE table lists {code}, which nothing raises")
print(f"README rows: {len(documented)} SQLSTATEs; raised by idem: {len(raised)}; by PostgreSQL, documented: {len(by_postgres)}")
sys.exit(1 if missing or stale else 0)
PY
