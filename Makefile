# make && make install, the way PGXS extensions build, which is what
# `pgxn install idem` runs (tests/scenarios/pgxn.sh runs it). idem is written
# in Rust: this drives cargo-pgrx, which must be installed first, with a
# Rust toolchain (1.89 or newer; rustup):
#   cargo install cargo-pgrx --version 0.18.1 --locked
# (bash scripts/setup.sh installs it, and Debian's PostgreSQL with it.)
#
#   make [PG_CONFIG=/path/to/pg_config]                   release build for that PostgreSQL
#   make install [PG_CONFIG=...] [DESTDIR=...]            install it where pg_config says
#   make uninstall [PG_CONFIG=...]
#   make portable [PORTABLE_SCHEMA=public]                the portable edition into dist/ (docs/portable.md)
# PostgreSQL 15 to 18 (the cargo feature pgNN follows pg_config).
# CARGO_TARGET_DIR, when set, is where cargo builds (and this finds the
# result).

PG_CONFIG ?= pg_config
CARGO ?= cargo
PGRX_VERSION := 0.18.1
PG_MAJOR := $(shell $(PG_CONFIG) --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
PKGLIBDIR := $(shell $(PG_CONFIG) --pkglibdir)
EXTDIR := $(shell $(PG_CONFIG) --sharedir)/extension
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
# cargo pgrx package lays the files out under their final paths here.
STAGE := $(TARGET_DIR)/release/idem-pg$(PG_MAJOR)

all:
	@$(CARGO) pgrx --version 2>/dev/null | grep -q ' $(PGRX_VERSION)$$' \
	  || { echo "cargo-pgrx $(PGRX_VERSION) is needed: cargo install cargo-pgrx --version $(PGRX_VERSION) --locked" >&2; exit 1; }
	rm -rf '$(STAGE)'
	$(CARGO) pgrx package --pg-config '$(PG_CONFIG)' --no-default-features --features pg$(PG_MAJOR)

install:
	@test -f '$(STAGE)$(PKGLIBDIR)/idem.so' || { echo "nothing built for PostgreSQL $(PG_MAJOR) in $(STAGE): run make first" >&2; exit 1; }
	install -d '$(DESTDIR)$(PKGLIBDIR)' '$(DESTDIR)$(EXTDIR)'
	install -m 755 '$(STAGE)$(PKGLIBDIR)/idem.so' '$(DESTDIR)$(PKGLIBDIR)/'
	install -m 644 '$(STAGE)$(EXTDIR)/idem.control' '$(DESTDIR)$(EXTDIR)/'
	install -m 644 '$(STAGE)$(EXTDIR)'/idem--*.sql '$(DESTDIR)$(EXTDIR)/'

uninstall:
	rm -f '$(DESTDIR)$(PKGLIBDIR)/idem.so' '$(DESTDIR)$(EXTDIR)/idem.control' '$(DESTDIR)$(EXTDIR)'/idem--*.sql

# The portable edition (docs/portable.md): PL/pgSQL, no library, for managed
# PostgreSQL. Writes dist/idem_pg_tle.sql, dist/idem_portable.sql,
# dist/idem_portable_uninstall.sql and the updates (idem_pg_tle_update.sql,
# idem_portable--A--B.sql); PORTABLE_SCHEMA is where the plain script puts
# the API.
PORTABLE_SCHEMA ?= public
portable:
	python3 scripts/portable.py --out dist --schema '$(PORTABLE_SCHEMA)'

.PHONY: all install uninstall portable
