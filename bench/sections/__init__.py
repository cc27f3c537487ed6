"""The benchmark's sections, one module each; every module has run(bench),
which measures into bench.raw (bench.py's Bench.section_X calls it).
The ttl, handwritten, kills and portable modules also carry their own
PROFILES (their parameters per profile), OPTIONS (their command-line
options), estimate(p, rates) (seconds) and report(report) (tables, CSV rows
and targets, called by report.py); the parameters, estimates and tables of
the others are in bench.py and report.py."""
