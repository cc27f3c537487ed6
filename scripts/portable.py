#!/usr/bin/env python3
"""Generate the portable edition of idem (docs/portable.md) from the native
edition's SQL: the same sql/*.sql, in the same order, with each C function
(`LANGUAGE c AS 'MODULE_PATHNAME', 'SYMBOL'`) given the PL/pgSQL or SQL body
kept under portable/ (`-- @body SYMBOL` ... `-- @end`), and the helpers those
bodies use (`-- @helpers [after: TEXT]` ... `-- @end`) put in the module
after the statement starting with TEXT (else where the module's previous
helpers went, else at the module's start).

Writes, into dist/ (or --out):
  idem_pg_tle.sql              pgtle.install_extension('idem', VERSION, ...)
  idem_pg_tle_update.sql       for a database where an older version is
                               registered: registers VERSION and the update
                               paths, makes VERSION the default (then
                               ALTER EXTENSION idem UPDATE)
  idem_portable.sql            a plain script for a database owner
  idem_portable--A--B.sql      the plain script's update from A to B
  idem_portable_uninstall.sql  what removes the plain script's objects

Updates: each sql/idem--A--B.sql with A at or after FIRST_PORTABLE (the
first version with a portable edition) and B at most VERSION, with its C
functions given their portable bodies (the newest ones: a chain of updates
ends at this version's bodies) and portable/updates/idem--A--B.sql
appended when it exists (what changes in the portable edition only: its
helpers).

    python3 scripts/portable.py [--out DIR] [--schema SCHEMA]

--schema names the schema the plain script puts the API in (default
public); schema idem holds the storage as in the native edition.
"""
import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The order of src/lib.rs's extension_sql_file! chain.
MODULES = ["storage", "claim", "maintenance", "guards", "scaling", "replication", "metrics", "lease", "batch", "completer"]
C_FUNCTION = re.compile(r"LANGUAGE c AS 'MODULE_PATHNAME', '(\w+)'")
# Things a non-superuser cannot create; the portable edition goes without
# them (docs/portable.md).
SUPERUSER_ONLY = re.compile(r"^CREATE EVENT TRIGGER .*?;\n", re.S | re.M)
CONFIG_DUMP = re.compile(r"^SELECT pg_catalog\.pg_extension_config_dump\(.*?\);\n", re.M)
# An update file's first line, for psql users (the server drops it when it
# runs the file as an extension's script; psql would stop at it).
PSQL_GUARD = re.compile(r"^\\echo .*\n", re.M)
UPDATE_FILE = re.compile(r"^idem--(\d+\.\d+\.\d+)--(\d+\.\d+\.\d+)\.sql$")
FIRST_PORTABLE = "0.4.0"


def die(msg):
    sys.exit(f"portable.py: {msg}")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def portable_parts(module):
    """(helpers: [(anchor or None, text)], bodies: {symbol: text})."""
    path = os.path.join(ROOT, "portable", module + ".sql")
    if not os.path.exists(path):
        return [], {}
    text = read(path)
    helpers, bodies = [], {}
    for m in re.finditer(r"^-- @(helpers|body)([^\n]*)\n(.*?)^-- @end\n", text, re.S | re.M):
        kind, arg, block = m.group(1), m.group(2).strip(), m.group(3)
        if kind == "body":
            if not re.fullmatch(r"\w+", arg) or arg in bodies:
                die(f"portable/{module}.sql: bad or repeated body name {arg!r}")
            bodies[arg] = block.rstrip("\n")
        else:
            anchor = None
            if arg:
                if not arg.startswith("after:"):
                    die(f"portable/{module}.sql: @helpers takes 'after: TEXT', not {arg!r}")
                anchor = arg[len("after:"):].strip()
            helpers.append((anchor, block))
    return helpers, bodies


def statement_end(text, start):
    """The index just past the statement that begins at start (a line that
    ends with ';')."""
    m = re.compile(r";\n").search(text, start)
    if not m:
        die(f"no end of the statement at {text[start:start + 60]!r}")
    return m.end()


def module_sql(module):
    text = read(os.path.join(ROOT, "sql", module + ".sql"))
    helpers, bodies = portable_parts(module)
    used = set()

    def body(m):
        symbol = m.group(1)
        if symbol not in bodies:
            die(f"sql/{module}.sql: no portable body for C function {symbol} (add -- @body {symbol} to portable/{module}.sql)")
        used.add(symbol)
        return bodies[symbol]

    text = C_FUNCTION.sub(body, text)
    unused = set(bodies) - used
    if unused:
        die(f"portable/{module}.sql: bodies for no C function of sql/{module}.sql: {sorted(unused)}")
    # Helpers go in at their anchors, latest position first so that earlier
    # insertions do not move later ones.
    inserts, pos = [], 0
    for anchor, block in helpers:
        if anchor is not None:
            i = text.find("\n" + anchor)
            i = 0 if text.startswith(anchor) else (i + 1 if i >= 0 else -1)
            if i < 0:
                die(f"portable/{module}.sql: anchor {anchor!r} not found in sql/{module}.sql")
            pos = statement_end(text, i)
        inserts.append((pos, block))
    for pos, _, block in sorted(((p, i, b) for i, (p, b) in enumerate(inserts)), reverse=True):
        text = text[:pos] + "\n-- (portable edition: helpers from portable/%s.sql)\n" % module + block + "\n" + text[pos:]
    text = SUPERUSER_ONLY.sub(lambda m: "-- (portable edition: no event trigger: creating one needs a superuser)\n", text)
    if re.search(r"MODULE_PATHNAME|LANGUAGE c\b", text):
        die(f"sql/{module}.sql: a C function is left")
    return f"-- ==== sql/{module}.sql ====\n" + text


def all_bodies():
    """{symbol: body} over every module (an update may restate any C
    function)."""
    bodies = {}
    for module in MODULES:
        for symbol, body in portable_parts(module)[1].items():
            if symbol in bodies:
                die(f"portable/{module}.sql: body {symbol} is also in another module")
            bodies[symbol] = body
    return bodies


def vkey(v):
    return tuple(int(x) for x in v.split("."))


def updates(current):
    """[(A, B, path)] of the update files the portable edition ships, oldest
    first."""
    found = []
    for name in os.listdir(os.path.join(ROOT, "sql")):
        m = UPDATE_FILE.match(name)
        if m and vkey(m.group(1)) >= vkey(FIRST_PORTABLE) and vkey(m.group(2)) <= vkey(current):
            found.append((m.group(1), m.group(2), os.path.join(ROOT, "sql", name)))
    return sorted(found, key=lambda u: (vkey(u[0]), vkey(u[1])))


def update_sql(src, dst, path):
    """The portable edition's update from src to dst: the native update with
    the portable bodies in place of the C functions, then what
    portable/updates/ adds."""
    name = os.path.basename(path)
    text = PSQL_GUARD.sub("", read(path))
    bodies = all_bodies()

    def body(m):
        if m.group(1) not in bodies:
            die(f"sql/{name}: no portable body for C function {m.group(1)}")
        return bodies[m.group(1)]

    text = C_FUNCTION.sub(body, text)
    text = SUPERUSER_ONLY.sub(lambda m: "-- (portable edition: no event trigger: creating one needs a superuser)\n", text)
    if re.search(r"MODULE_PATHNAME|LANGUAGE c\b", text):
        die(f"sql/{name}: a C function is left")
    extra = os.path.join(ROOT, "portable", "updates", name)
    text = f"-- ==== sql/{name} ====\n" + text
    if os.path.exists(extra):
        text += f"\n-- ==== portable/updates/{name} ====\n" + read(extra)
    return text


def version():
    m = re.search(r'^version\s*=\s*"([^"]+)"', read(os.path.join(ROOT, "Cargo.toml")), re.M)
    return m.group(1)


def description():
    m = re.search(r"^comment\s*=\s*'((?:[^']|'')*)'", read(os.path.join(ROOT, "idem.control")), re.M)
    return m.group(1).replace("''", "'")


def quote_literal(s):
    return "'" + s.replace("'", "''") + "'"


def api_objects(script):
    """(functions, views, types) the script creates outside schema idem."""
    fns = re.findall(r"^CREATE FUNCTION (idem_\w+)\(", script, re.M)
    views = re.findall(r"^CREATE VIEW (idem_\w+)", script, re.M)
    types = re.findall(r"^CREATE TYPE (idem_\w+)", script, re.M)
    return fns, views, types


def portable_version_sql(ver):
    """The plain script's record of its version (an extension has
    pg_extension.extversion; the plain script has this)."""
    return (f"CREATE OR REPLACE FUNCTION idem.portable_version() RETURNS text\n"
            f"    IMMUTABLE LANGUAGE sql AS $v$ SELECT {quote_literal(ver)}::text $v$;\n"
            f"COMMENT ON FUNCTION idem.portable_version() IS 'The version of idem the plain script installed or last updated to.';\n")


def main():
    global ROOT
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "dist"))
    ap.add_argument("--schema", default="public")
    ap.add_argument("--root", help="the checkout to read sql/, portable/, Cargo.toml and idem.control from (default: this one)")
    args = ap.parse_args()
    if args.root:
        ROOT = os.path.abspath(args.root)
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", args.schema) or args.schema == "idem":
        die("--schema must be a plain lower-case identifier other than idem")
    ver = version()
    header = (f"-- idem {ver}, portable edition: generated by scripts/portable.py from sql/*.sql and\n"
              f"-- portable/*.sql. Do not edit; see docs/portable.md.\n")
    body = "\n".join(module_sql(m) for m in MODULES)
    os.makedirs(args.out, exist_ok=True)

    # pg_tle: the extension script as pgtle.install_extension stores it.
    tag = "$idem_portable_sql$"
    if tag in body:
        die(f"the script contains {tag}")
    tle = (header + "-- Run by a role with pgtle_admin, then CREATE EXTENSION idem.\n"
           + f"SELECT pgtle.install_extension(\n    'idem',\n    {quote_literal(ver)},\n"
           + f"    {quote_literal(description() + ' (portable edition: PL/pgSQL, no library)')},\n"
           + f"    {tag}\n{body}\n{tag},\n    '{{}}'\n);\n")
    with open(os.path.join(args.out, "idem_pg_tle.sql"), "w", encoding="utf-8") as f:
        f.write(tle)

    # Plain script: not an extension, so @extschema@ is the chosen schema
    # and there is nothing to mark for pg_dump (it dumps every object).
    plain_body = CONFIG_DUMP.sub("", body).replace("@extschema@", args.schema)
    plain = (header
             + f"-- Run as the database's owner (no superuser needed): psql -v ON_ERROR_STOP=1 -f idem_portable.sql\n"
             + f"-- Storage goes into schema idem, the API into schema {args.schema}.\n"
             + "BEGIN;\n"
             + ("" if args.schema == "public" else f"CREATE SCHEMA IF NOT EXISTS {args.schema};\n")
             + f"SET LOCAL search_path = {args.schema}, pg_catalog;\n"
             + "SET LOCAL check_function_bodies = on;\n"
             + plain_body + "\n" + portable_version_sql(ver) + "COMMIT;\n")
    with open(os.path.join(args.out, "idem_portable.sql"), "w", encoding="utf-8") as f:
        f.write(plain)

    # pg_tle, a database where an older version is registered: this
    # version and every update path, each unless registered already (the
    # file may run twice), and this version as the default.
    paths = [(a, b, update_sql(a, b, p)) for a, b, p in updates(ver)]
    for a, b, text in paths:
        if tag in text:
            die(f"sql/idem--{a}--{b}.sql contains {tag}")
    steps = [f"    IF NOT EXISTS (SELECT FROM pgtle.available_extensions() WHERE name = 'idem') THEN\n"
             f"        RAISE EXCEPTION 'idem is not registered with pg_tle in this database: run idem_pg_tle.sql instead'\n"
             f"            USING ERRCODE = '55000';\n    END IF;\n",
             f"    IF NOT EXISTS (SELECT FROM pgtle.available_extension_versions() WHERE name = 'idem' AND version = {quote_literal(ver)}) THEN\n"
             f"        PERFORM pgtle.install_extension_version_sql('idem', {quote_literal(ver)}, {tag}\n{body}\n{tag});\n    END IF;\n"]
    for a, b, text in paths:
        steps.append(f"    IF NOT EXISTS (SELECT FROM pgtle.extension_update_paths('idem') WHERE source = {quote_literal(a)}\n"
                     f"                   AND target = {quote_literal(b)} AND path = {quote_literal(a + '--' + b)}) THEN\n"
                     f"        PERFORM pgtle.install_update_path('idem', {quote_literal(a)}, {quote_literal(b)}, {tag}\n{text}\n{tag});\n    END IF;\n")
    steps.append(f"    PERFORM pgtle.set_default_version('idem', {quote_literal(ver)});\n")
    do_tag = "$idem_register$"
    if do_tag in body or any(do_tag in text for _, _, text in paths):
        die(f"the scripts contain {do_tag}")
    tle_update = (header + f"-- Run by a role with pgtle_admin in a database where an older version of\n"
                  f"-- idem is registered, then ALTER EXTENSION idem UPDATE (to {ver}).\n"
                  f"DO {do_tag}\nBEGIN\n" + "".join(steps) + f"END\n{do_tag};\n")
    with open(os.path.join(args.out, "idem_pg_tle_update.sql"), "w", encoding="utf-8") as f:
        f.write(tle_update)

    # Plain script updates: the plain edition records its version in
    # idem.portable_version(); an update runs on its from-version only.
    for a, b, text in paths:
        plain_update = (header
                        + f"-- Updates what idem_portable.sql {a} installed to {b}, as the database's owner:\n"
                        + f"-- psql -v ON_ERROR_STOP=1 -f idem_portable--{a}--{b}.sql\n"
                        + "BEGIN;\n"
                        + f"SET LOCAL search_path = {args.schema}, pg_catalog;\n"
                        + "SET LOCAL check_function_bodies = on;\n"
                        + "DO $v$\nBEGIN\n"
                        + f"    IF to_regprocedure('idem.portable_version()') IS NULL OR idem.portable_version() <> {quote_literal(a)} THEN\n"
                        + f"        RAISE EXCEPTION 'idem: this update is from the plain script''s version {a}; installed: %',\n"
                        + "            CASE WHEN to_regprocedure('idem.portable_version()') IS NULL THEN 'none' ELSE idem.portable_version() END\n"
                        + "            USING ERRCODE = '55000';\n    END IF;\nEND\n$v$;\n"
                        + CONFIG_DUMP.sub("", text).replace("@extschema@", args.schema)
                        + "\n" + portable_version_sql(b) + "COMMIT;\n")
        with open(os.path.join(args.out, f"idem_portable--{a}--{b}.sql"), "w", encoding="utf-8") as f:
            f.write(plain_update)

    fns, views, types = api_objects(body)
    lines = [header.rstrip("\n"), "-- Removes what idem_portable.sql created: schema idem with every claim,", "-- and the API.",
             "BEGIN;", "SET LOCAL client_min_messages = warning;"]
    lines += [f"DROP VIEW IF EXISTS {args.schema}.{v} CASCADE;" for v in views]
    # Every signature of each name (idem_configure has two): a DROP by the
    # bare name refuses a name that is not unique.
    names = ", ".join(quote_literal(fn) for fn in sorted(set(fns)))
    lines += ["DO $u$", "DECLARE", "    f regprocedure;", "BEGIN",
              f"    FOR f IN SELECT p.oid FROM pg_proc p WHERE p.pronamespace = {quote_literal(args.schema)}::regnamespace",
              f"                AND p.proname = ANY (ARRAY[{names}]) LOOP",
              "        EXECUTE format('DROP FUNCTION IF EXISTS %s CASCADE', f);",
              "    END LOOP;", "END", "$u$;"]
    lines += [f"DROP TYPE IF EXISTS {args.schema}.{t} CASCADE;" for t in types]
    lines += ["DROP SCHEMA IF EXISTS idem CASCADE;", "COMMIT;", ""]
    with open(os.path.join(args.out, "idem_portable_uninstall.sql"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main()
