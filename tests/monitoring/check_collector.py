#!/usr/bin/env python3
"""sql_exporter's collector files export what postgres_exporter's queries
file exports, and every query runs as sql_exporter would run it.

    check_collector.py QUERIES.yaml COLLECTOR.yml... -- PSQL-ARGS...

QUERIES.yaml is monitoring/idem-queries.yaml (postgres_exporter's format),
each COLLECTOR.yml a collector of sql_exporter
(https://github.com/burningalchemist/sql_exporter). PSQL-ARGS connect psql
to a live database with the extension, as the role the exporter would use.

The sql_exporter binary is not packaged where this project's machines get
their software, so this stands in for it and checks what it would trip on:

  * the same metric names as postgres_exporter makes (query name, "_",
    column), each with the same type (counter/gauge) and the same labels;
  * every query runs, and returns exactly the columns its metrics name as
    key_labels and values (sql_exporter fails a query with a missing column
    and warns about an extra one), with no NULL in them (it cannot scan
    NULL into a label string or a float64 value) and a number in every
    value column;
  * on the same database, each metric's samples (label values → value)
    equal those of the postgres_exporter query it mirrors;
  * every metric has at least one sample (the caller prepares a workload).

Exit status 1 on any failure, each one printed as "FAIL: ...".
"""
import csv
import io
import math
import subprocess
import sys

import yaml


def fail(msg):
    print(f"FAIL: {msg}")
    return 1


def run_queries(psql_args, queries):
    """Run every query in one REPEATABLE READ transaction, so that the two
    files' queries see the same now() and the same data: query text ->
    (columns, rows as dicts of column -> text, None for NULL), or an error
    message for a query that failed (then the others are not run)."""
    null = "\x01NULL\x01"  # a NULL marker that no value of these queries can equal
    args = ["-c", "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"]
    for i, q in enumerate(queries):
        args += ["-c", f"\\echo @@query {i}", "-c", q]
    args += ["-c", "COMMIT"]
    out = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "--csv", "-P", f"null={null}",
                          *psql_args, *args], capture_output=True, text=True)
    parts, current = {}, None
    for line in out.stdout.splitlines(keepends=True):
        if line.startswith("@@query "):
            current = int(line.split()[1])
            parts[current] = ""
        elif current is not None:
            parts[current] += line
    results = {}
    for i, q in enumerate(queries):
        if i not in parts or (out.returncode != 0 and i == max(parts)):
            results[q] = out.stderr.strip() or "not run"
            continue
        rows = list(csv.reader(io.StringIO(parts[i])))
        header = rows[0] if rows else []
        results[q] = (header, [{c: (None if v == null else v) for c, v in zip(header, r)} for r in rows[1:]])
    return results


def as_float(text):
    return float(text)  # accepts "NaN", "1e+09", "42"


def same_value(a, b):
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or abs(a - b) <= 1e-9 * max(abs(a), abs(b))


def postgres_exporter_metrics(path):
    """name -> (type, labels, value column, query) from a queries file."""
    with open(path, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    metrics = {}
    for qname, q in doc.items():
        cols = [(col, spec["usage"]) for m in q["metrics"] for col, spec in m.items()]
        labels = tuple(sorted(c for c, u in cols if u == "LABEL"))
        for col, usage in cols:
            if usage == "LABEL":
                continue
            metrics[f"{qname}_{col}"] = (usage.lower(), labels, col, q["query"])
    return metrics


def collector_metrics(paths):
    """name -> (type, labels, value column, query, query name) from collector files."""
    metrics, problems = {}, []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
        if not doc.get("collector_name"):
            problems.append(f"{path}: no collector_name")
        queries = {q["query_name"]: q["query"] for q in doc.get("queries") or []}
        for m in doc.get("metrics") or []:
            name = m.get("metric_name")
            values = m.get("values") or []
            if len(values) != 1:
                problems.append(f"{path}: {name}: one value column expected, got {values}")
                continue
            if "query" in m and "query_ref" in m:
                problems.append(f"{path}: {name}: both query and query_ref")
                continue
            if "query_ref" in m and m["query_ref"] not in queries:
                problems.append(f"{path}: {name}: query_ref {m['query_ref']!r} names no query of the file")
                continue
            query = m.get("query") or queries.get(m.get("query_ref"))
            qname = m.get("query_ref") or f"{name} (inline)"
            if not query:
                problems.append(f"{path}: {name}: no query")
                continue
            if name in metrics:
                problems.append(f"{path}: {name} defined twice")
            if not m.get("help"):
                problems.append(f"{path}: {name}: no help")
            metrics[name] = (m.get("type"), tuple(sorted(m.get("key_labels") or [])), values[0], query,
                             f"{path}:{qname}")
    return metrics, problems


def samples(rows, labels, value_col):
    return {tuple(r[l] for l in labels): r[value_col] for r in rows}


def main(argv):
    if "--" not in argv or argv.index("--") < 3:
        print(__doc__)
        return 2
    sep = argv.index("--")
    queries_file, collector_files, psql_args = argv[1], argv[2:sep], argv[sep + 1:]
    failures = 0

    want = postgres_exporter_metrics(queries_file)
    have, problems = collector_metrics(collector_files)
    for p in problems:
        failures += fail(p)
    for name in sorted(set(want) - set(have)):
        failures += fail(f"{name}: exported by {queries_file}, missing from the collectors")
    for name in sorted(set(have) - set(want)):
        failures += fail(f"{name}: in the collectors, not exported by {queries_file}")

    # Run each query of both files once, all in one snapshot; check each
    # collector query's columns against what its metrics name.
    results, needs = {}, {}
    for name, (_, labels, value_col, query, qname) in have.items():
        needs.setdefault(qname, (query, set()))[1].update(labels + (value_col,))
    ran = run_queries(psql_args, sorted({q for q, _ in needs.values()} | {m[3] for m in want.values()}))
    for qname, (query, cols) in sorted(needs.items()):
        if isinstance(ran[query], str):
            failures += fail(f"{qname}: the query fails: {ran[query]}")
            continue
        header, rows = ran[query]
        missing, extra = cols - set(header), set(header) - cols
        if missing:
            failures += fail(f"{qname}: columns its metrics name are missing: {sorted(missing)}")
        if extra:
            failures += fail(f"{qname}: columns no metric uses (sql_exporter warns on every scrape): {sorted(extra)}")
        results[qname] = rows
        print(f"ok: {qname}: {len(rows)} rows, columns {', '.join(header)}")

    for name in sorted(set(want) & set(have)):
        wtype, wlabels, wcol, wquery = want[name]
        htype, hlabels, hcol, _, qname = have[name]
        if htype != wtype:
            failures += fail(f"{name}: type {htype}, postgres_exporter's is {wtype}")
        if hlabels != wlabels:
            failures += fail(f"{name}: labels {list(hlabels)}, postgres_exporter's are {list(wlabels)}")
            continue
        if qname not in results:
            continue
        rows = results[qname]
        if not rows:
            failures += fail(f"{name}: no sample (the workload should give every metric one)")
            continue
        bad = [r for r in rows if any(r.get(c) is None for c in hlabels + (hcol,))]
        if bad:
            failures += fail(f"{name}: NULL in a label or value column (sql_exporter cannot scan it): {bad[0]}")
            continue
        try:
            got = {k: as_float(v) for k, v in samples(rows, hlabels, hcol).items()}
        except ValueError as e:
            failures += fail(f"{name}: a value that is not a number: {e}")
            continue
        if isinstance(ran[wquery], str):
            failures += fail(f"{name}: postgres_exporter's query fails: {ran[wquery]}")
            continue
        expected = {k: (math.nan if v is None else as_float(v))
                    for k, v in samples(ran[wquery][1], wlabels, wcol).items()}
        if set(got) != set(expected):
            failures += fail(f"{name}: label sets {sorted(got)} != postgres_exporter's {sorted(expected)}")
            continue
        differ = [(k, got[k], expected[k]) for k in got if not same_value(got[k], expected[k])]
        if differ:
            failures += fail(f"{name}: values differ from postgres_exporter's: {differ}")
            continue
        print(f"ok: {name} ({htype}; {', '.join(hlabels)}): {len(got)} samples equal postgres_exporter's")

    print(f"collector checks failed: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
