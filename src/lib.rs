//! idem: idempotency keys enforced inside PostgreSQL, in the caller's
//! transaction. The layers, from the SQL call down:
//!
//! * api.rs: the SQL functions written in Rust (fmgr.rs is the call
//!   boundary; the SQL declarations are sql/*.sql);
//! * protocol.rs: claim, lookup, finish, forget; with key.rs (what a claim
//!   is of), biztype.rs (settings and who may use a type), lease.rs;
//! * storage/: how a key's row is found, locked, waited for and written
//!   (direct.rs: heaps and indexes; sql.rs: SQL, when idem.storage_access
//!   says so and Citus does not distribute idem.claims; citus.rs: the shard
//!   of a distributed idem.claims, reached with direct.rs, never SQL;
//!   partitions.rs: the partition lists and their checks; columns.rs:
//!   idem.claims' columns; keylock.rs; type_classes.rs: which TTL classes
//!   hold a type's claims), with ttl_class.rs (the classes);
//! * completer.rs: leases that ran out, handed to a re-drive job;
//! * metrics.rs: counters of the protocol's outcomes in shared memory
//!   (with shared_preload_libraries = 'idem'), read by idem_metrics;
//! * catalog.rs (OIDs of idem's relations, the relcache callback), spi.rs
//!   (the SQL idem runs, as the extension owner), datum.rs, guc.rs,
//!   errors.rs, backend.rs (backend-local state, the clock, the caller's
//!   snapshot), compat.rs (PostgreSQL majors).

use pgrx::prelude::*;

mod api;
mod backend;
mod biztype;
mod catalog;
mod compat;
mod completer;
mod datum;
mod errors;
pub mod fmgr;
mod guc;
mod key;
mod lease;
mod metrics;
mod protocol;
mod spi;
mod storage;
mod ttl_class;

::pgrx::pg_module_magic!(name, version);

extension_sql_file!("../sql/storage.sql", name = "storage", bootstrap);
extension_sql_file!("../sql/claim.sql", name = "claim", requires = ["storage"]);
extension_sql_file!("../sql/maintenance.sql", name = "maintenance", requires = ["claim"]);
extension_sql_file!("../sql/guards.sql", name = "guards", requires = ["maintenance"]);
extension_sql_file!("../sql/scaling.sql", name = "scaling", requires = ["guards"]);
extension_sql_file!("../sql/replication.sql", name = "replication", requires = ["scaling"]);
extension_sql_file!("../sql/metrics.sql", name = "metrics", requires = ["replication"]);
extension_sql_file!("../sql/lease.sql", name = "lease", requires = ["metrics"]);
extension_sql_file!("../sql/batch.sql", name = "batch", requires = ["lease"]);
extension_sql_file!("../sql/completer.sql", name = "completer", requires = ["batch"]);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    // No Rust backtrace ever reaches a client: pgrx attaches one to an
    // error's DETAIL whenever RUST_BACKTRACE is set in the server's
    // environment. RUST_LIB_BACKTRACE takes precedence for captured
    // backtraces; this backend's std reads it once, at the first capture.
    // SAFETY: a backend is single-threaded (backend.rs).
    unsafe { std::env::set_var("RUST_LIB_BACKTRACE", "0") };
    guc::init();
    // Shared memory for the counters, when preloaded (else they stay off).
    metrics::init();
}

#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
