//! The SQL idem runs itself (business type settings, the SQL storage path):
//! statements prepared once per backend, with their arguments and results
//! passed as datums, so that text keeps its exact bytes in every database
//! encoding and no value goes through a text form.
//!
//! Call `query` / `execute` inside `catalog::as_owner`.

use crate::errors::internal;
use pgrx::pg_sys;
use std::cell::Cell;

/// A statement prepared on first use and kept for the backend's life. The
/// plan cache re-plans it by itself when what it names changes (also after
/// DROP and CREATE EXTENSION).
pub struct Statement {
    sql: &'static std::ffi::CStr,
    argtypes: &'static [pg_sys::Oid],
    plan: PlanSlot,
}

/// The kept plan of one statement.
struct PlanSlot(Cell<pg_sys::SPIPlanPtr>);

// SAFETY: a backend is single-threaded (see backend.rs).
unsafe impl Sync for PlanSlot {}

/// One result row: a datum per column (NULL as None), copied into the
/// caller's memory context.
pub type Row = Vec<Option<pg_sys::Datum>>;

impl Statement {
    pub const fn new(sql: &'static std::ffi::CStr, argtypes: &'static [pg_sys::Oid]) -> Statement {
        Statement { sql, argtypes, plan: PlanSlot(Cell::new(std::ptr::null_mut())) }
    }

    /// Run a read-only statement with the active snapshot; every row.
    pub fn query(&self, args: &[Option<pg_sys::Datum>]) -> Vec<Row> {
        self.run(args, true).1
    }

    /// Run a statement that writes (with a snapshot of its own, as any
    /// statement); the number of rows it processed and the rows it returned.
    pub fn execute(&self, args: &[Option<pg_sys::Datum>]) -> (u64, Vec<Row>) {
        self.run(args, false)
    }

    fn run(&self, args: &[Option<pg_sys::Datum>], read_only: bool) -> (u64, Vec<Row>) {
        assert_eq!(args.len(), self.argtypes.len(), "argument count of an idem statement");
        unsafe {
            if pg_sys::SPI_connect() != pg_sys::SPI_OK_CONNECT as i32 {
                internal("SPI_connect failed");
            }
            let plan = self.plan();
            let mut values: Vec<pg_sys::Datum> = args.iter().map(|a| a.unwrap_or(pg_sys::Datum::from(0))).collect();
            let nulls: Vec<std::ffi::c_char> =
                args.iter().map(|a| if a.is_some() { b' ' } else { b'n' } as _).collect();
            let rc = pg_sys::SPI_execute_plan(plan, values.as_mut_ptr(), nulls.as_ptr(), read_only, 0);
            if rc < 0 {
                internal(format!("{} failed (SPI code {rc})", self.name()));
            }
            let processed = pg_sys::SPI_processed;
            let mut rows = Vec::new();
            if !pg_sys::SPI_tuptable.is_null() {
                let table = &*pg_sys::SPI_tuptable;
                let natts = (*table.tupdesc).natts as usize;
                for n in 0..processed as usize {
                    let tuple = *table.vals.add(n);
                    let row = (0..natts)
                        .map(|c| {
                            let mut isnull = false;
                            let d = pg_sys::SPI_getbinval(tuple, table.tupdesc, c as i32 + 1, &mut isnull);
                            let att = &*crate::compat::tuple_desc_attr(table.tupdesc, c);
                            // Into the caller's memory context: SPI's goes
                            // away with SPI_finish.
                            (!isnull).then(|| pg_sys::SPI_datumTransfer(d, att.attbyval, att.attlen as i32))
                        })
                        .collect();
                    rows.push(row);
                }
            }
            pg_sys::SPI_finish();
            (processed, rows)
        }
    }

    /// The kept plan, prepared on first use.
    ///
    /// # Safety
    /// Call between SPI_connect and SPI_finish.
    unsafe fn plan(&self) -> pg_sys::SPIPlanPtr {
        unsafe {
            let kept = self.plan.0.get();
            if !kept.is_null() {
                return kept;
            }
            let plan =
                pg_sys::SPI_prepare(self.sql.as_ptr(), self.argtypes.len() as i32, self.argtypes.as_ptr().cast_mut());
            if plan.is_null() {
                let code = pg_sys::SPI_result;
                internal(format!("preparing {} failed (SPI code {code})", self.name()));
            }
            if pg_sys::SPI_keepplan(plan) != 0 {
                internal(format!("keeping the plan of {} failed", self.name()));
            }
            self.plan.0.set(plan);
            plan
        }
    }

    /// The statement's first words, for error messages.
    fn name(&self) -> String {
        let text = self.sql.to_string_lossy();
        let words: Vec<&str> = text.split_whitespace().take(4).collect();
        format!("idem's statement \"{} ...\"", words.join(" "))
    }
}
