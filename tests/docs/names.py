#!/usr/bin/env python3
"""The settings and SQLSTATEs the documentation names exist.

    names.py ROOT DB     (PGHOST/PGPORT/PGUSER from the environment, PG_BIN
                          for psql; DB has CREATE EXTENSION idem)

Read from README.md, docs/*.md and examples/*.md (prose, tables and SQL;
not the JavaScript / Python blocks, whose `idem.` is a client object):

* every `idem.NAME` is a setting (pg_settings once the library is loaded,
  with the value it has there) or an object idem makes in schema idem
  (a `CREATE ... idem.NAME` in sql/*.sql or portable/*.sql); a name that
  is neither (a setting renamed or never made, an object dropped) fails;
* every SQLSTATE in backquotes (`55P03`, `ID001`) is idem's own (the
  README's SQLSTATE table, src/errors.rs) or one of PostgreSQL's
  (errcodes.h of the server's headers).

A documented page that names a setting the code does not have sends the
reader to a SET that PostgreSQL refuses (42602 once the library is loaded).
"""
import glob
import os
import re
import subprocess
import sys

root, db = sys.argv[1], sys.argv[2]
psql = os.path.join(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"), "psql")
pg_config = os.environ.get("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config")


def sql(query):
    p = subprocess.run([psql, "-X", "-At", "-v", "ON_ERROR_STOP=1", "-d", db, "-c", "LOAD 'idem'", "-c", query],
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"FAIL: psql: {p.stderr.strip()}")
    return [line for line in p.stdout.splitlines() if line]


settings = set(sql("SELECT name FROM pg_settings WHERE name LIKE 'idem.%'"))
if len(settings) < 5:
    sys.exit(f"FAIL: only {len(settings)} idem.* settings in pg_settings with the library loaded: {sorted(settings)}")

made = set()
for path in glob.glob(f"{root}/sql/*.sql") + glob.glob(f"{root}/portable/*.sql") + [f"{root}/scripts/portable.py"]:
    text = open(path, encoding="utf-8").read()
    made.update(re.findall(r"\b(?:TABLE|VIEW|FUNCTION|PROCEDURE|INDEX|TYPE|SEQUENCE|AGGREGATE)\s+"
                           r"(?:IF\s+NOT\s+EXISTS\s+)?idem\.([a-z_][a-z0-9_]*)", text, re.I))
    # Transaction-local settings the SQL sets for itself (the portable
    # edition's): placeholders, not in pg_settings.
    settings.update("idem." + n for n in re.findall(r"set_config\('idem\.([a-z_][a-z0-9_]*)'", text))
# The middleware's objects (idem.express, idem.fastify, ...), named in the
# README's client sections.
client = set()
for path in glob.glob(f"{root}/clients/*/*.d.ts"):
    client.update(re.findall(r"^\s+(?:readonly\s+)?([a-z_][a-zA-Z0-9_]*)\??\s*[(:]",
                             open(path, encoding="utf-8").read(), re.M))

# Names that are neither, on purpose (each says why).
NOT_NAMES = {
    "so": "the library's file name, idem.so",
    "control": "the control file's name, idem.control",
    "defualt_ttl": "operations.md's example of a misspelt setting that is refused",
    "claims_0_3": "0.3.0's idem.claims while the update to 0.4.0 copies it",
    "http": "the Java starter's Spring properties, idem.http.* (clients/java/README.md)",
}


def prose(path):
    """The page without the fenced blocks of other languages."""
    out, skip, fence = [], False, None
    for line in open(path, encoding="utf-8").read().splitlines():
        m = re.match(r"^ *(`{3,}|~{3,})\s*(\S*)", line)
        if m and fence is None:
            fence = m.group(1)
            skip = m.group(2) not in ("", "sql", "psql", "text", "console", "sh", "bash", "conf", "ini")
            out.append("")
            continue
        if m and fence and line.strip().startswith(fence):
            fence, skip = None, False
            out.append("")
            continue
        out.append("" if skip else line)
    return out


errcodes_h = os.path.join(subprocess.run([pg_config, "--includedir-server"], capture_output=True, text=True).stdout.strip(),
                          "utils", "errcodes.h")
postgres_codes = set(re.findall(r"MAKE_SQLSTATE\('(.)','(.)','(.)','(.)','(.)'\)", open(errcodes_h).read()))
postgres_codes = {"".join(c) for c in postgres_codes}
if "40P01" not in postgres_codes:
    sys.exit(f"FAIL: could not read PostgreSQL's SQLSTATEs from {errcodes_h}")
readme = open(f"{root}/README.md", encoding="utf-8").read()
table = readme[readme.index("### SQLSTATEs"):]
table = table[:table.index("\n\n", table.index("| SQLSTATE |"))]
idem_codes = set(re.findall(r"`([0-9A-Z]{5})`", table))
idem_codes |= set(re.findall(r'=> b"([0-9A-Z]{5})"', open(f"{root}/src/errors.rs", encoding="utf-8").read()))

fails = 0
named_settings, named_codes = set(), set()
pages = [f"{root}/README.md"] + sorted(glob.glob(f"{root}/docs/*.md")) + sorted(glob.glob(f"{root}/examples/*.md"))
for path in pages:
    rel = os.path.relpath(path, root)
    for n, line in enumerate(prose(path), 1):
        for m in re.finditer(r"\bidem\.([a-z_][A-Za-z0-9_]*)(\S?)", line):
            name, after = m.group(1), m.group(2)
            if after in ("<", "*") or name in NOT_NAMES:
                continue  # a pattern (idem.claims_<shardid>, idem.metrics_*), or named above
            shard = re.fullmatch(r"(.*)_[0-9]+", name)  # a Citus shard: idem.biz_types_102040
            if f"idem.{name}" in settings:
                named_settings.add(name)
            elif name not in made and name not in client and not (shard and shard.group(1) in made):
                print(f"FAIL {rel}:{n}: idem.{name} is neither a setting (pg_settings) nor an object idem makes")
                fails += 1
        for code in re.findall(r"`([0-9A-Z]{5})`", line):
            if not re.search(r"[0-9]", code) or re.fullmatch(r"P(?:T?[0-9]+[YMWDHS])+", code):
                continue  # a word in capitals, or an ISO 8601 interval (PT15M), not a code
            named_codes.add(code)
            if code not in idem_codes and code not in postgres_codes:
                print(f"FAIL {rel}:{n}: SQLSTATE {code} is neither idem's (README's table, src/errors.rs) nor PostgreSQL's")
                fails += 1
print(f"docs name {len(named_settings)} of the {len(settings)} idem settings and {len(named_codes)} SQLSTATEs; {fails} unknown")
sys.exit(1 if fails else 0)
