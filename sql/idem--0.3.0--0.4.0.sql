-- idem 0.3.0 → 0.4.0. Hand-written: every schema change between the two
-- versions, in the order a fresh 0.4.0 install makes it.
-- tests/scenarios/upgrade.sh installs 0.3.0 (tests/upgrade/idem--0.3.0.sql),
-- claims, runs this update, and checks that the claims survive and that the
-- schema equals a fresh 0.4.0 install's.
\echo Use "ALTER EXTENSION idem UPDATE TO '0.4.0'" to load this file. \quit
