# make && make install, the way PGXS extensions build, which is what
# `pgxn install idem` runs (tests/scenarios/packaging.sh pgxn runs it). idem is written
# in Rust: this drives cargo-pgrx, which must be installed first, with a
# Rust toolchain (1.89 or newer; rustup):
#   cargo install cargo-pgrx --version 0.18.1 --locked
# (bash scripts/setup.sh installs it, and Debian's PostgreSQL with it.)
#
#   make [PG_CONFIG=/path/to/pg_config]                   release build for that PostgreSQL
#   make install [PG_CONFIG=...] [DESTDIR=...]            install it where pg_config says
#   make uninstall [PG_CONFIG=...]
#   make portable [PORTABLE_SCHEMA=public]                the portable edition into dist/ (docs/portable.md)
#   make updates                                          the unreleased update scripts from their
#                                                         templates (sql/updates/, scripts/updates.py)
#   make installcheck [PG_CONFIG=...]                     the regression and isolation tests against a
#                                                         running server with idem installed (below)
#   make installcheck-portable [PG_CONFIG=...]            the same on the portable edition, through
#                                                         pg_tle, against a server that preloads it
# PostgreSQL 15 to 18 (the cargo feature pgNN follows pg_config).
# CARGO_TARGET_DIR, when set, is where cargo builds (and this finds the
# result).

PG_CONFIG ?= pg_config
CARGO ?= cargo
PGRX_VERSION := 0.18.1
PG_MAJOR = $(shell $(PG_CONFIG) --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
PKGLIBDIR = $(shell $(PG_CONFIG) --pkglibdir)
EXTDIR = $(shell $(PG_CONFIG) --sharedir)/extension
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
# cargo pgrx package lays the files out under their final paths here.
# (These ask pg_config when a target uses them: make portable needs none.)
STAGE = $(TARGET_DIR)/release/idem-pg$(PG_MAJOR)

# cargo-pgrx reads the pg_config of each major from $PGRX_HOME/config.toml
# (~/.pgrx), which `cargo pgrx init` writes.
PGRX_CONFIG := $(or $(PGRX_HOME),$(HOME)/.pgrx)/config.toml

all:
	@$(CARGO) pgrx --version 2>/dev/null | grep -q ' $(PGRX_VERSION)$$' \
	  || { echo "cargo-pgrx $(PGRX_VERSION) is needed: cargo install cargo-pgrx --version $(PGRX_VERSION) --locked" >&2; exit 1; }
	@grep -qs '^pg$(PG_MAJOR) = ' '$(PGRX_CONFIG)' \
	  || { echo "cargo-pgrx does not know PostgreSQL $(PG_MAJOR) ($(PGRX_CONFIG)): cargo pgrx init --pg$(PG_MAJOR) $(PG_CONFIG)" >&2; exit 1; }
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

# The update scripts of the unreleased version (sql/idem--A--B.sql) from
# their templates in sql/updates/: what they restate of sql/*.sql is
# written there once (scripts/updates.py; tests/scenarios/packaging.sh upgrade fails
# when one is stale).
updates:
	python3 scripts/updates.py

# make installcheck: the regression (tests/pg_regress) and isolation
# (tests/isolation) schedules against a running server that has idem
# installed (make install, the package), the PGXS way: the pg_regress and
# pg_isolation_regress of PG_CONFIG's PostgreSQL, which drop and create their
# database (contrib_regression, isolation_regression: the connecting role
# needs CREATEDB, and superuser for CREATE EXTENSION idem) on the server
# that PGHOST, PGPORT and PGUSER name. REGRESS / ISOLATION: test names to
# run instead of the schedules; REGRESS_OPTS / ISOLATION_OPTS: more options
# for the runners (--host, --port, --user, --launcher...). Results and
# diffs go to REGRESS_OUT/regress and REGRESS_OUT/isolation.
# scripts/test.sh runs the schedules through these targets on every major.
PGXS_TEST = $(shell $(PG_CONFIG) --pkglibdir)/pgxs/src/test
PG_BINDIR = $(shell $(PG_CONFIG) --bindir)
REGRESS_OUT ?= target/installcheck
REGRESS_SCHEDULE ?= tests/pg_regress/schedule
ISOLATION_SCHEDULE ?= tests/isolation/schedule

installcheck: installcheck-regress installcheck-isolation

# (The isolation specs start from a database with the extension; the
# regression tests create it themselves.)
installcheck-regress:
	@mkdir -p '$(REGRESS_OUT)/regress'
	'$(PGXS_TEST)/regress/pg_regress' --inputdir=tests/pg_regress --outputdir='$(REGRESS_OUT)/regress' \
	  --bindir='$(PG_BINDIR)' --dbname=contrib_regression $(REGRESS_OPTS) \
	  $(or $(REGRESS),--schedule=$(REGRESS_SCHEDULE))

installcheck-isolation:
	@mkdir -p '$(REGRESS_OUT)/isolation'
	'$(PGXS_TEST)/isolation/pg_isolation_regress' --inputdir=tests/isolation --outputdir='$(REGRESS_OUT)/isolation' \
	  --bindir='$(PG_BINDIR)' --dbname=isolation_regression --load-extension=idem $(ISOLATION_OPTS) \
	  $(or $(ISOLATION),--schedule=$(ISOLATION_SCHEDULE))

# make installcheck-portable: the portable edition's schedules
# (tests/portable/regress_schedule, isolation_schedule: the native tests
# that apply, and its own) against a running server whose
# shared_preload_libraries has pg_tle and which has no idem library
# loaded. The edition is generated into REGRESS_OUT/portable/dist and
# registered through pg_tle by PGUSER (a superuser, or a pgtle_admin with
# CREATEDB) in three databases it makes anew, portable_regression,
# portable_widths and portable_isolation. partition_widths runs alone in
# portable_widths (tests/portable/widths_schedule), as it runs last in the
# native schedule: every claim of the portable edition locks every
# partition, and after the other tests' partitions its grid of claims and
# maintenance runs cost some ten times the CPU while testing nothing more.
# The native expected outputs are used where the
# edition answers alike; where it does not, tests/portable/expected_diffs
# holds the difference as a patch of the native file (it keeps applying
# while the rest of the test changes), and tests/portable/expected the
# outputs of its own tests. psql runs with PL/pgSQL's error context off, as
# the native tests' C functions have none.
PORTABLE_OUT = $(REGRESS_OUT)/portable
PSQL = '$(PG_BINDIR)/psql' -X -q -v ON_ERROR_STOP=1
installcheck-portable:
	rm -rf '$(PORTABLE_OUT)'
	mkdir -p '$(PORTABLE_OUT)/regress-input' '$(PORTABLE_OUT)/isolation-input'
	python3 scripts/portable.py --out '$(PORTABLE_OUT)/dist' > /dev/null
	cp -r tests/pg_regress/sql tests/pg_regress/expected '$(PORTABLE_OUT)/regress-input/'
	cp tests/portable/expected/*.out '$(PORTABLE_OUT)/regress-input/expected/'
	cp tests/portable/sql/*.sql '$(PORTABLE_OUT)/regress-input/sql/'
	cp -r tests/isolation/specs tests/isolation/expected '$(PORTABLE_OUT)/isolation-input/'
	@set -e; for d in tests/portable/expected_diffs/*.diff; do \
	  patch -s -d '$(PORTABLE_OUT)/regress-input' -p0 < "$$d" || { echo "$$d no longer applies to tests/pg_regress/expected" >&2; exit 1; }; done; \
	for d in tests/portable/expected_diffs/isolation/*.diff; do \
	  patch -s -d '$(PORTABLE_OUT)/isolation-input' -p0 < "$$d" || { echo "$$d no longer applies to tests/isolation/expected" >&2; exit 1; }; done
	printf '#!/bin/sh\nexec "$$@" -v SHOW_CONTEXT=never\n' > '$(PORTABLE_OUT)/psql_launcher'
	chmod +x '$(PORTABLE_OUT)/psql_launcher'
	chmod -R a+rX '$(PORTABLE_OUT)'
	@set -e; for db in portable_regression portable_widths portable_isolation; do \
	  $(PSQL) -d postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $$db WITH (FORCE)" -c "CREATE DATABASE $$db"; \
	  $(PSQL) -d $$db -c "SET client_min_messages = warning" -c "CREATE EXTENSION IF NOT EXISTS pg_tle" -f '$(PORTABLE_OUT)/dist/idem_pg_tle.sql' > /dev/null; done
	$(PSQL) -d portable_isolation -c "CREATE EXTENSION idem"
	@rc=0; \
	'$(PGXS_TEST)/regress/pg_regress' --use-existing --dbname=portable_regression --bindir='$(PG_BINDIR)' \
	  --inputdir='$(PORTABLE_OUT)/regress-input' --outputdir='$(PORTABLE_OUT)/regress' \
	  --launcher='$(PORTABLE_OUT)/psql_launcher' $(REGRESS_OPTS) --schedule=tests/portable/regress_schedule || rc=1; \
	'$(PGXS_TEST)/regress/pg_regress' --use-existing --dbname=portable_widths --bindir='$(PG_BINDIR)' \
	  --inputdir='$(PORTABLE_OUT)/regress-input' --outputdir='$(PORTABLE_OUT)/widths' \
	  --launcher='$(PORTABLE_OUT)/psql_launcher' $(REGRESS_OPTS) --schedule=tests/portable/widths_schedule || rc=1; \
	'$(PGXS_TEST)/isolation/pg_isolation_regress' --use-existing --dbname=portable_isolation --bindir='$(PG_BINDIR)' \
	  --inputdir='$(PORTABLE_OUT)/isolation-input' --outputdir='$(PORTABLE_OUT)/isolation' \
	  $(ISOLATION_OPTS) --schedule=tests/portable/isolation_schedule || rc=1; \
	exit $$rc

.PHONY: all install uninstall portable updates installcheck installcheck-regress installcheck-isolation installcheck-portable
