//! The boundary between PostgreSQL's function manager and idem's Rust code:
//! the C symbols sql/*.sql names, argument reading and result building.
//!
//! Why not `#[pg_extern]`: see docs/design.md §11. In short, idem raises
//! its own SQLSTATEs (ID001, ID003, ...), which pgrx's error type cannot
//! carry, and raises them only after every Rust frame of the call is gone
//! (`entry`); and the SQL surface (defaults, volatility, COMMENT, REVOKE) is
//! written out in sql/*.sql, next to the storage DDL it belongs with.

use crate::errors::IdemError;
use pgrx::pg_sys;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

/// Export `$symbol` (and its `pg_finfo_` record) as a version-1 C function
/// whose body is `$body(Args) -> Datum`. A function declared to return a
/// composite type or a set says so (`composite`, `rows`): its result type
/// is looked up before the body runs (`Returns`).
#[macro_export]
macro_rules! sql_function {
    ($symbol:ident, $finfo:ident, $body:path) => {
        $crate::sql_function!($symbol, $finfo, $body, Scalar);
    };
    ($symbol:ident, $finfo:ident, $body:path, composite) => {
        $crate::sql_function!($symbol, $finfo, $body, Composite);
    };
    ($symbol:ident, $finfo:ident, $body:path, rows) => {
        $crate::sql_function!($symbol, $finfo, $body, Rows);
    };
    ($symbol:ident, $finfo:ident, $body:path, $returns:ident) => {
        #[no_mangle]
        #[doc(hidden)]
        pub extern "C" fn $finfo() -> &'static ::pgrx::pg_sys::Pg_finfo_record {
            const V1: ::pgrx::pg_sys::Pg_finfo_record = ::pgrx::pg_sys::Pg_finfo_record { api_version: 1 };
            &V1
        }
        /// # Safety
        /// Called by PostgreSQL's function manager with a live call record.
        #[no_mangle]
        #[doc(hidden)]
        pub unsafe extern "C-unwind" fn $symbol(fcinfo: ::pgrx::pg_sys::FunctionCallInfo) -> ::pgrx::pg_sys::Datum {
            // SAFETY: the function manager calls this symbol with a live call record, which is entry's
            // contract.
            unsafe { $crate::fmgr::entry(fcinfo, $body, $crate::fmgr::Returns::$returns) }
        }
    };
}

/// What a SQL function is declared to return, as `sql_function!` is told.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Returns {
    /// A base type or void.
    Scalar,
    /// A composite type (built by `Args::composite`).
    Composite,
    /// A set (returned by `Args::return_rows`).
    Rows,
}

/// Run a SQL function body. PostgreSQL errors and Rust panics go through
/// pgrx's guard as usual; an `IdemError` is raised here, after the body's
/// frames are gone, so that it keeps its own SQLSTATE.
///
/// # Safety
/// `fcinfo` is the live call record the function manager passed.
pub unsafe fn entry<A: Answer>(
    fcinfo: pg_sys::FunctionCallInfo,
    body: fn(Args) -> A,
    returns: Returns,
) -> pg_sys::Datum {
    // SAFETY: `fcinfo` is live for the whole call (this function's contract); the guard turns a PostgreSQL
    // error inside `body` into a Rust unwind and back.
    let outcome: Result<pg_sys::Datum, IdemError> = unsafe {
        pg_sys::panic::pgrx_extern_c_guard(|| {
            match catch_unwind(AssertUnwindSafe(|| {
                let args = Args(fcinfo);
                if returns != Returns::Scalar {
                    args.result_type_first();
                }
                body(args).into_datum(args)
            })) {
                Ok(d) => Ok(d),
                Err(payload) => match payload.downcast::<IdemError>() {
                    Ok(e) => {
                        // Counted here, for every function: the errors the
                        // counters keep name their key's type (metrics.rs).
                        crate::metrics::count_error(&e);
                        Err(*e)
                    }
                    Err(other) => resume_unwind(other),
                },
            }
        })
    };
    match outcome {
        Ok(d) => d,
        // SAFETY: we are at the C entry point, outside pgrx's guard, where raising a PostgreSQL error (a
        // longjmp) skips no Rust frame with a destructor.
        Err(e) => unsafe { e.raise_from_entry() },
    }
}

/// What a SQL function body answers: a datum as it is, or the columns of a
/// composite result, which `entry` turns into the tuple of the declared
/// type (the body passes the values; it does not call back to build them).
pub trait Answer {
    fn into_datum(self, args: Args) -> pg_sys::Datum;
}

impl Answer for pg_sys::Datum {
    fn into_datum(self, _args: Args) -> pg_sys::Datum {
        self
    }
}

/// The values and nulls of a composite result, in the declared type's
/// column order.
pub struct Composite(pub Vec<pg_sys::Datum>, pub Vec<bool>);

impl Answer for Composite {
    fn into_datum(mut self, args: Args) -> pg_sys::Datum {
        args.composite(&mut self.0, &mut self.1)
    }
}

/// The arguments of the current call. Only `entry` makes one, from the live
/// call record; positions are named in api.rs next to each SQL signature.
#[derive(Clone, Copy)]
pub struct Args(pg_sys::FunctionCallInfo);

impl Args {
    fn nargs(&self) -> usize {
        // SAFETY: `self.0` is the live call record `entry` was given.
        unsafe { (*self.0).nargs as usize }
    }

    pub fn is_null(&self, n: usize) -> bool {
        // A C function declared with fewer arguments than asked for (an old
        // SQL definition) reads as NULL rather than past the record.
        // SAFETY: `n < nargs` (checked first), and `self.0` is the live call record.
        n >= self.nargs() || unsafe { pgrx::fcinfo::pg_arg_is_null(self.0, n) }
    }

    /// An argument's raw datum (to pass on as it is), or None if NULL.
    pub fn datum(&self, n: usize) -> Option<pg_sys::Datum> {
        // SAFETY: argument `n` exists and is not NULL (checked), in the live call record.
        (!self.is_null(n)).then(|| unsafe { pgrx::fcinfo::pg_getarg_datum_raw(self.0, n) })
    }

    /// A text argument's exact bytes (detoasted, valid for the call).
    pub fn text<'a>(&self, n: usize) -> Option<&'a [u8]> {
        // SAFETY: a text argument is a valid varlena for the whole call.
        self.datum(n).map(|d| unsafe { crate::datum::varlena_bytes(d) })
    }

    /// A text argument that must not be NULL (22004 otherwise).
    pub fn text_req<'a>(&self, n: usize, name: &'static str) -> &'a [u8] {
        self.text(n).unwrap_or_else(|| IdemError::NullArgument(name).fail())
    }

    /// A text argument that must not be NULL (22004 otherwise), as a text
    /// datum and its exact bytes, detoasted (`datum::detoasted`: no copy of
    /// an argument that was not compressed or out of line), valid for the
    /// call.
    pub fn text_datum_req<'a>(&self, n: usize, name: &'static str) -> (pg_sys::Datum, &'a [u8]) {
        let d = self.datum(n).unwrap_or_else(|| IdemError::NullArgument(name).fail());
        // SAFETY: a text argument is a valid varlena for the whole call.
        unsafe { crate::datum::detoasted(d) }
    }

    /// A jsonb argument as a (detoasted) datum.
    pub fn jsonb(&self, n: usize) -> Option<pg_sys::Datum> {
        // SAFETY: a non-NULL argument declared jsonb is a varlena datum.
        self.datum(n).map(|d| unsafe { pg_sys::Datum::from(pg_sys::pg_detoast_datum(d.cast_mut_ptr())) })
    }

    pub fn interval(&self, n: usize) -> Option<pg_sys::Interval> {
        // SAFETY: an interval argument points to an Interval for the call.
        self.datum(n).map(|d| unsafe { *d.cast_mut_ptr::<pg_sys::Interval>() })
    }

    pub fn int4(&self, n: usize) -> Option<i32> {
        self.datum(n).map(|d| d.value() as i32)
    }

    pub fn bool(&self, n: usize) -> Option<bool> {
        self.datum(n).map(|d| d.value() != 0)
    }

    pub fn oid(&self, n: usize) -> Option<pg_sys::Oid> {
        self.datum(n).map(|d| pg_sys::Oid::from(d.value() as u32))
    }

    pub fn return_null(&self) -> pg_sys::Datum {
        // SAFETY: `self.0` is the live call record.
        unsafe { pgrx::fcinfo::pg_return_null(self.0) }
    }

    /// A composite result of the type the function was declared to return;
    /// its descriptor is looked up once per call site (kept in fn_extra).
    fn composite(&self, values: &mut [pg_sys::Datum], nulls: &mut [bool]) -> pg_sys::Datum {
        let desc = self.result_tupdesc();
        // SAFETY: values and nulls have as many entries as desc has
        // attributes (checked just below).
        unsafe {
            if (*desc).natts as usize != values.len() {
                crate::errors::internal("the SQL result type does not match the C function");
            }
            let tup = pg_sys::heap_form_tuple(desc, values.as_mut_ptr(), nulls.as_mut_ptr());
            pg_sys::Datum::from((*tup).t_data)
        }
    }

    /// Return a set of rows of the declared result type (materialize mode:
    /// the rows go into a tuplestore the executor reads after the call).
    pub fn return_rows(&self, rows: Vec<(Vec<pg_sys::Datum>, Vec<bool>)>) -> pg_sys::Datum {
        // SAFETY: `Args` holds the live call record (see `entry`); the
        // function is declared to return a set, so resultinfo is a
        // ReturnSetInfo, and every row has the descriptor's width (checked).
        unsafe {
            let rsinfo = (*self.0).resultinfo.cast::<pg_sys::ReturnSetInfo>();
            if (*rsinfo).setResult.is_null() {
                pg_sys::InitMaterializedSRF(self.0, 0);
            }
            for (mut values, mut nulls) in rows {
                if (*(*rsinfo).setDesc).natts as usize != values.len() {
                    crate::errors::internal("the SQL result type does not match the C function");
                }
                pg_sys::tuplestore_putvalues(
                    (*rsinfo).setResult,
                    (*rsinfo).setDesc,
                    values.as_mut_ptr(),
                    nulls.as_mut_ptr(),
                );
            }
            pg_sys::Datum::from(0)
        }
    }

    /// Look the declared result type up now, before the call waits for a
    /// lock: a DROP EXTENSION that commits meanwhile removes this function's
    /// catalog entry, and the lookup after the wait failed with XX000
    /// ("cache lookup failed for function") where the call had answered
    /// from the new install's tables. (A set-returning function's
    /// tuplestore is made now, for return_rows; a composite's descriptor is
    /// kept for composite.) `entry` calls it for every function declared
    /// to return one.
    fn result_type_first(&self) {
        // SAFETY: `Args` holds the live call record (see `entry`); a
        // function declared to return a set is called with a ReturnSetInfo.
        // (A function in FROM gets one too, so fn_retset decides.)
        unsafe {
            if (*(*self.0).flinfo).fn_retset {
                if (*(*self.0).resultinfo.cast::<pg_sys::ReturnSetInfo>()).setResult.is_null() {
                    pg_sys::InitMaterializedSRF(self.0, 0);
                }
            } else {
                self.result_tupdesc();
            }
        }
    }

    fn result_tupdesc(&self) -> pg_sys::TupleDesc {
        // SAFETY: `Args` holds the live call record (see `entry`); fn_extra
        // is ours to keep per call site, in fn_mcxt.
        unsafe {
            let flinfo = (*self.0).flinfo;
            if (*flinfo).fn_extra.is_null() {
                let mut desc: pg_sys::TupleDesc = std::ptr::null_mut();
                let kind = pg_sys::get_call_result_type(self.0, std::ptr::null_mut(), &mut desc);
                if kind != pg_sys::TypeFuncClass::TYPEFUNC_COMPOSITE {
                    crate::errors::internal("function must be declared to return a composite type");
                }
                let old = pg_sys::MemoryContextSwitchTo((*flinfo).fn_mcxt);
                let kept = pg_sys::CreateTupleDescCopy(desc);
                pg_sys::MemoryContextSwitchTo(old);
                (*flinfo).fn_extra = pg_sys::BlessTupleDesc(kept).cast();
            }
            (*flinfo).fn_extra.cast()
        }
    }
}
