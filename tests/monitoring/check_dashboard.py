"""The Grafana dashboard uses only what the postgres_exporter queries file
exports: every idem_* metric in a panel's or variable's query is a metric
of monitoring/idem-queries.yaml (query name + "_" + a non-LABEL column),
and every label it selects, groups by or prints is a LABEL column of that
metric's query (or the exporter's own "server"). Also: the queries file is
well-formed (each query names its columns, each column has a known usage),
and each dashboard panel has an id, a position and at least one target.

    python3 tests/monitoring/check_dashboard.py QUERIES.yaml DASHBOARD.json [SCRAPE.txt]

With a scrape of /metrics (tests/scenarios/monitoring.sh prometheus), every metric the
dashboard uses must also be in the scrape. Exit status 0 when all holds."""
import json
import re
import sys

import yaml

queries_file, dashboard_file = sys.argv[1], sys.argv[2]
scrape_file = sys.argv[3] if len(sys.argv) > 3 else None
problems = []
queries = yaml.safe_load(open(queries_file))
metrics = {}  # metric name -> the labels of its query
for ns, q in queries.items():
    if not isinstance(q, dict) or "query" not in q or "metrics" not in q:
        problems.append(f"{ns}: not a query with 'query' and 'metrics'")
        continue
    labels, values = set(), []
    for m in q["metrics"]:
        ((col, spec),) = m.items()
        usage = spec.get("usage")
        if usage == "LABEL":
            labels.add(col)
        elif usage in ("COUNTER", "GAUGE", "HISTOGRAM", "MAPPEDMETRIC", "DURATION", "DISCARD"):
            values.append(col)
        else:
            problems.append(f"{ns}.{col}: unknown usage {usage!r}")
        if not spec.get("description"):
            problems.append(f"{ns}.{col}: no description")
        # Each column is selected by the query (as a name or an alias).
        if not re.search(rf'(\bAS\s+"?{re.escape(col)}"?|\b{re.escape(col)}\b)', q["query"]):
            problems.append(f"{ns}.{col}: the query does not select it")
    for col in values:
        metrics[f"{ns}_{col}"] = labels
print(f"{queries_file}: {len(queries)} queries, {len(metrics)} metrics")

dash = json.load(open(dashboard_file))
exprs = []  # (where, expression, legend)
for p in dash.get("panels", []):
    where = f"panel {p.get('id')} {p.get('title')!r}"
    if not isinstance(p.get("id"), int) or "gridPos" not in p:
        problems.append(f"{where}: no id or gridPos")
    if not p.get("targets"):
        problems.append(f"{where}: no targets")
    for t in p.get("targets", []):
        exprs.append((where, t.get("expr", ""), t.get("legendFormat", "")))
for v in dash.get("templating", {}).get("list", []):
    q = v.get("query")
    if isinstance(q, dict):
        q = q.get("query", "")
    if v.get("type") == "query":
        exprs.append((f"variable {v.get('name')}", q or "", ""))

used = set()
for where, expr, legend in exprs:
    names = set(re.findall(r"\bidem_[a-z0-9_]+\b", expr))
    if not names:
        problems.append(f"{where}: uses no idem metric: {expr}")
    allowed = {"server", "__name__"}
    for n in names:
        used.add(n)
        if n not in metrics:
            problems.append(f"{where}: {n} is not in {queries_file}")
        else:
            allowed |= metrics[n]
    # label names: in selectors {a=..}, by/without (...), label_values(.., a), legends {{a}}
    labels = set(re.findall(r"[{,]\s*([a-z_][a-z0-9_]*)\s*(?:=~|!~|!=|=)", expr))
    for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        labels |= {x.strip() for x in group.split(",") if x.strip()}
    labels |= set(re.findall(r"label_values\([^,]*,\s*([a-z_][a-z0-9_]*)\s*\)", expr))
    labels |= set(re.findall(r"\{\{\s*([a-z_][a-z0-9_]*)\s*\}\}", legend))
    for label in labels - allowed:
        problems.append(f"{where}: label {label} is not a label of {sorted(names)}")
print(f"{dashboard_file}: {len(dash.get('panels', []))} panels, {len(exprs)} queries, "
      f"{len(used)} metrics used: {' '.join(sorted(used))}")
unused = sorted(set(metrics) - used)
if unused:
    print("exported but not on the dashboard: " + " ".join(unused))

if scrape_file:
    scraped = set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{|\s)", open(scrape_file).read(), re.M))
    for n in sorted(used - scraped):
        problems.append(f"{n}: used by the dashboard, not in the scrape {scrape_file}")
    print(f"{scrape_file}: every metric the dashboard uses was scraped" if used <= scraped else "")

for p in problems:
    print("FAIL: " + p)
sys.exit(1 if problems else 0)
