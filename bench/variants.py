"""The benchmark's variants: what each one runs (pgbench script or C driver
mode) and which sections run which. bench.py, its sections and the duration
estimate share them."""

# Variant id -> (driver, script or mode, description). The order is the
# first round's order; later rounds rotate it.
VARIANTS = {
    "B0": ("pgbench", "b0.sql", "business insert only"),
    "B1": ("pgbench", "b1.sql", "+ INSERT ... ON CONFLICT DO NOTHING (hand-written table)"),
    "B1r": ("pgbench", "b1r.sql", "+ ON CONFLICT DO NOTHING, then UPDATE of the stored result"),
    "B2": ("pgbench", "b2.sql", "+ PL/pgSQL EXCEPTION WHEN unique_violation"),
    "B3": ("redis", "b3", "+ Redis SET NX EX round trip before the transaction (C driver)"),
    "B0c": ("redis", "b0", "B0 through the C driver of B3 (calibration)"),
    "I1": ("pgbench", "i1.sql", "+ SELECT idem_claim(...) on a new key (plain form)"),
    "I1c": ("pgbench", "i1c.sql", "+ SELECT claimed FROM idem_claim(...) on a new key (recommended form)"),
    "I1f": ("pgbench", "i1f.sql", "+ SELECT (idem_claim(...)).claimed on a new key"),
    "I2": ("pgbench", "i2.sql", "+ idem_claim + idem_complete with a small result"),
    "I3": ("pgbench", "i3.sql", "idem_claim on an already claimed key (duplicate path, no business insert)"),
    "B1d": ("pgbench", "b1d.sql", "hand-written duplicate path: ON CONFLICT DO NOTHING on an existing key"),
}
MATRIX_VARIANTS = ["B0", "B1", "B1r", "B2", "I1", "I1c", "I1f", "I2", "I3"]  # + B3, B0c with redis
WAL_VARIANTS = ["B0", "B1", "B1d", "B1r", "B2", "I1", "I1c", "I2", "I3"]
LATENCY_VARIANTS = ["B1", "B1r", "I1", "I1c", "I2", "I3"]
SUSTAINED_VARIANTS = ["B1", "B1r", "I1c", "I2", "I3"]
# The table each variant's dedup step writes (sustained section: its growth)
STORE = {"B1": "dedup", "B1r": "dedup_r", "B2": "dedup_exc", "I1": "idem.claims",
         "I1c": "idem.claims", "I1f": "idem.claims", "I2": "idem.claims", "I3": "idem.claims"}
