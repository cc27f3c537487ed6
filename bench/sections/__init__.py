"""Sections of the benchmark that live outside bench.py: each module has
PROFILES (its parameters per profile), OPTIONS (its command-line options),
estimate(p, rates) (seconds), run(bench) (measures, into bench.raw) and
report(report) (tables, CSV rows and targets, called by report.py)."""
