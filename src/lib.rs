//! idem: idempotency keys enforced inside PostgreSQL, in the caller's
//! transaction. The SQL API is declared in sql/*.sql; this file wires the
//! modules together.

use pgrx::prelude::*;

mod catalog;
mod claim;
mod errors;
pub mod fmgr;
mod guc;
mod lease;
mod sqlstore;
mod storage;

::pgrx::pg_module_magic!(name, version);

extension_sql_file!("../sql/storage.sql", name = "storage", bootstrap);
extension_sql_file!("../sql/claim.sql", name = "claim", requires = ["storage"]);
extension_sql_file!("../sql/maintenance.sql", name = "maintenance", requires = ["claim"]);
extension_sql_file!("../sql/guards.sql", name = "guards", requires = ["maintenance"]);
extension_sql_file!("../sql/scaling.sql", name = "scaling", requires = ["guards"]);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    guc::init();
}

#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
