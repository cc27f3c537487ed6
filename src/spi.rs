//! The SQL idem runs itself (business type settings, the SQL storage path):
//! statements prepared once per backend, with their arguments and results
//! passed as datums, so that text keeps its exact bytes in every database
//! encoding and no value goes through a text form.
//!
//! Every statement runs as the extension's owner (`as_owner`), which the
//! names of its two entries, `query_as_owner` and `execute_as_owner`, say.

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

    /// Run a read-only statement as the extension's owner, with the active
    /// snapshot; every row.
    pub fn query_as_owner(&self, args: &[Option<pg_sys::Datum>]) -> Vec<Row> {
        as_owner(|| self.run(args, true).1)
    }

    /// Run a statement that writes as the extension's owner (with a
    /// snapshot of its own, as any statement); the number of rows it
    /// processed and the rows it returned.
    pub fn execute_as_owner(&self, args: &[Option<pg_sys::Datum>]) -> (u64, Vec<Row>) {
        as_owner(|| self.run(args, false))
    }

    fn run(&self, args: &[Option<pg_sys::Datum>], read_only: bool) -> (u64, Vec<Row>) {
        // SAFETY: called between SPI_connect and SPI_finish (run_plan's contract).
        run_plan(self.argtypes, args, read_only, || unsafe { self.plan() }, || self.name())
    }
}

/// Run `sql` once (prepared, not kept) as the extension's owner: a
/// statement whose text names a relation known only at run time (under
/// Citus, this node's shard of idem.type_classes).
pub fn execute_once_as_owner(sql: &std::ffi::CStr, argtypes: &[pg_sys::Oid], args: &[Option<pg_sys::Datum>]) -> u64 {
    let name = || format!("idem's statement \"{}\"", sql.to_string_lossy());
    as_owner(|| {
        run_plan(
            argtypes,
            args,
            false,
            // SAFETY: called between SPI_connect and SPI_finish (run_plan's contract); the plan lives in SPI's
            // procedure context and goes with SPI_finish.
            || unsafe {
                let plan = pg_sys::SPI_prepare(sql.as_ptr(), argtypes.len() as i32, argtypes.as_ptr().cast_mut());
                if plan.is_null() {
                    let code = pg_sys::SPI_result;
                    internal(format!("preparing {} failed (SPI code {code})", name()));
                }
                plan
            },
            name,
        )
        .0
    })
}

/// Connect SPI, run the plan `plan()` gives with `args`, copy the rows out
/// and finish SPI.
fn run_plan(
    argtypes: &[pg_sys::Oid],
    args: &[Option<pg_sys::Datum>],
    read_only: bool,
    plan: impl FnOnce() -> pg_sys::SPIPlanPtr,
    name: impl Fn() -> String,
) -> (u64, Vec<Row>) {
    assert_eq!(args.len(), argtypes.len(), "argument count of an idem statement");
    // SAFETY: SPI is connected first and finished last; the plan is made and used between the two;
    // arguments are as many as the plan's types (asserted above), and results are copied out
    // before SPI_finish frees them.
    unsafe {
        if pg_sys::SPI_connect() != pg_sys::SPI_OK_CONNECT as i32 {
            internal("SPI_connect failed");
        }
        let plan = plan();
        let mut values: Vec<pg_sys::Datum> = args.iter().map(|a| a.unwrap_or(pg_sys::Datum::from(0))).collect();
        let nulls: Vec<std::ffi::c_char> = args.iter().map(|a| if a.is_some() { b' ' } else { b'n' } as _).collect();
        let rc = pg_sys::SPI_execute_plan(plan, values.as_mut_ptr(), nulls.as_ptr(), read_only, 0);
        if rc < 0 {
            internal(format!("{} failed (SPI code {rc})", name()));
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

impl Statement {
    /// The kept plan, prepared on first use.
    ///
    /// # Safety
    /// Call between SPI_connect and SPI_finish.
    unsafe fn plan(&self) -> pg_sys::SPIPlanPtr {
        // SAFETY: called between SPI_connect and SPI_finish (this function's contract); the kept plan lives
        // in SPI's top memory context for the backend's life.
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

    /// The statement's text, for tests that check it against what it names.
    #[cfg(any(test, feature = "pg_test"))]
    pub fn text(&self) -> &'static std::ffi::CStr {
        self.sql
    }

    /// The statement's first words, for error messages.
    fn name(&self) -> String {
        let text = self.sql.to_string_lossy();
        let words: Vec<&str> = text.split_whitespace().take(4).collect();
        format!("idem's statement \"{} ...\"", words.join(" "))
    }
}

/// Run SQL for the extension: as the owner of schema idem (the API's C
/// functions are SECURITY INVOKER: their direct storage access needs no
/// rights, only the SQL they run does), with `search_path = pg_catalog,
/// pg_temp` set at a new GUC nest level (objects in pg_temp never resolve
/// functions or operators, and idem's SQL names its relations with their
/// schema), so that nothing the caller planted resolves. Both are undone
/// when `f` returns or fails.
fn as_owner<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(pg_sys::Oid, i32, i32);
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: undoes exactly what `as_owner` set, with the nest level and user it saved.
            unsafe {
                pg_sys::AtEOXact_GUC(true, self.2);
                pg_sys::SetUserIdAndSecContext(self.0, self.1);
            }
        }
    }
    let owner = crate::catalog::extension_owner();
    // SAFETY: the user and security context are saved before they change, and restored by `Restore` whatever
    // `f` does; the GUC is set at a new nest level that `Restore` pops.
    let restore = unsafe {
        let (mut user, mut context) = (pg_sys::InvalidOid, 0);
        pg_sys::GetUserIdAndSecContext(&mut user, &mut context);
        let level = pg_sys::NewGUCNestLevel();
        let restore = Restore(user, context, level);
        pg_sys::SetUserIdAndSecContext(owner, context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32);
        pg_sys::set_config_option(
            c"search_path".as_ptr(),
            c"pg_catalog, pg_temp".as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_SAVE,
            true,
            0,
            false,
        );
        restore
    };
    let r = f();
    drop(restore);
    r
}
