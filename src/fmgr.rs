//! The boundary between PostgreSQL's function manager and idem's Rust code.
//! The SQL API is declared by hand in sql/*.sql (defaults, SECURITY DEFINER,
//! comments); each C symbol it names is made here by `sql_function!`.
//!
//! Safety, for every `unsafe fn` here: `fcinfo` is the live call record the
//! function manager passed to the current C function, and argument `n`
//! exists in it.
#![allow(clippy::missing_safety_doc)]

use crate::errors::IdemError;
use pgrx::pg_sys;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

/// Export `$symbol` (and its `pg_finfo_` record) as a version-1 C function
/// whose body is `$body(fcinfo) -> Datum`.
#[macro_export]
macro_rules! sql_function {
    ($symbol:ident, $finfo:ident, $body:path) => {
        #[no_mangle]
        #[doc(hidden)]
        pub extern "C" fn $finfo() -> &'static ::pgrx::pg_sys::Pg_finfo_record {
            const V1: ::pgrx::pg_sys::Pg_finfo_record = ::pgrx::pg_sys::Pg_finfo_record { api_version: 1 };
            &V1
        }
        #[no_mangle]
        #[doc(hidden)]
        pub unsafe extern "C-unwind" fn $symbol(fcinfo: ::pgrx::pg_sys::FunctionCallInfo) -> ::pgrx::pg_sys::Datum {
            unsafe { $crate::fmgr::entry(fcinfo, $body) }
        }
    };
}

/// Run a SQL function body. PostgreSQL errors and Rust panics go through
/// pgrx's guard as usual; an `IdemError` is raised here, after the body's
/// frames are gone, so that it keeps its own SQLSTATE.
pub unsafe fn entry(
    fcinfo: pg_sys::FunctionCallInfo,
    body: unsafe fn(pg_sys::FunctionCallInfo) -> pg_sys::Datum,
) -> pg_sys::Datum {
    let outcome: Result<pg_sys::Datum, IdemError> = unsafe {
        pg_sys::panic::pgrx_extern_c_guard(|| match catch_unwind(AssertUnwindSafe(|| body(fcinfo))) {
            Ok(d) => Ok(d),
            Err(payload) => match payload.downcast::<IdemError>() {
                Ok(e) => Err(*e),
                Err(other) => resume_unwind(other),
            },
        })
    };
    match outcome {
        Ok(d) => d,
        Err(e) => unsafe { e.raise_from_entry() },
    }
}

pub unsafe fn arg_is_null(fcinfo: pg_sys::FunctionCallInfo, n: usize) -> bool {
    unsafe { pgrx::fcinfo::pg_arg_is_null(fcinfo, n) }
}

pub unsafe fn arg_datum(fcinfo: pg_sys::FunctionCallInfo, n: usize) -> pg_sys::Datum {
    unsafe { pgrx::fcinfo::pg_getarg_datum_raw(fcinfo, n) }
}

/// A text argument's bytes (detoasted, valid for the call).
pub unsafe fn arg_text<'a>(fcinfo: pg_sys::FunctionCallInfo, n: usize) -> Option<&'a [u8]> {
    unsafe {
        if arg_is_null(fcinfo, n) {
            return None;
        }
        let v = pg_sys::pg_detoast_datum_packed(arg_datum(fcinfo, n).cast_mut_ptr());
        Some(pgrx::varlena::varlena_to_byte_slice(v))
    }
}

/// A text argument that must not be NULL (22004 otherwise).
pub unsafe fn arg_text_req<'a>(fcinfo: pg_sys::FunctionCallInfo, n: usize, name: &'static str) -> &'a [u8] {
    unsafe { arg_text(fcinfo, n) }.unwrap_or_else(|| IdemError::NullArgument(name).fail())
}

/// A jsonb argument as a plain (detoasted) datum, or None.
pub unsafe fn arg_jsonb(fcinfo: pg_sys::FunctionCallInfo, n: usize) -> Option<pg_sys::Datum> {
    unsafe {
        if arg_is_null(fcinfo, n) {
            return None;
        }
        let v = pg_sys::pg_detoast_datum(arg_datum(fcinfo, n).cast_mut_ptr());
        Some(pg_sys::Datum::from(v))
    }
}

pub unsafe fn arg_interval(fcinfo: pg_sys::FunctionCallInfo, n: usize) -> Option<pg_sys::Interval> {
    unsafe {
        if arg_is_null(fcinfo, n) {
            return None;
        }
        Some(*(arg_datum(fcinfo, n).cast_mut_ptr::<pg_sys::Interval>()))
    }
}

pub unsafe fn arg_bool(fcinfo: pg_sys::FunctionCallInfo, n: usize) -> Option<bool> {
    unsafe {
        if arg_is_null(fcinfo, n) {
            return None;
        }
        Some(arg_datum(fcinfo, n).value() != 0)
    }
}

pub unsafe fn return_null(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    unsafe { pgrx::fcinfo::pg_return_null(fcinfo) }
}

/// A Rust byte string as a palloc'd text datum.
pub fn text_datum(bytes: &[u8]) -> pg_sys::Datum {
    unsafe {
        let len = bytes.len() + pg_sys::VARHDRSZ;
        let p = pg_sys::palloc(len) as *mut pg_sys::varlena;
        pgrx::varlena::set_varsize_4b(p, len as i32);
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), pgrx::varlena::vardata_4b(p) as *mut u8, bytes.len());
        pg_sys::Datum::from(p)
    }
}

/// The composite row type the calling function was declared to return,
/// looked up once per call site (kept in fn_extra).
pub unsafe fn result_tupdesc(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::TupleDesc {
    unsafe {
        let flinfo = (*fcinfo).flinfo;
        if (*flinfo).fn_extra.is_null() {
            let mut desc: pg_sys::TupleDesc = std::ptr::null_mut();
            let kind = pg_sys::get_call_result_type(fcinfo, std::ptr::null_mut(), &mut desc);
            if kind != pg_sys::TypeFuncClass::TYPEFUNC_COMPOSITE {
                IdemError::FeatureNotSupported("function must be declared to return a composite type".into()).fail();
            }
            let old = pg_sys::MemoryContextSwitchTo((*flinfo).fn_mcxt);
            let kept = pg_sys::CreateTupleDescCopy(desc);
            pg_sys::MemoryContextSwitchTo(old);
            (*flinfo).fn_extra = pg_sys::BlessTupleDesc(kept).cast();
        }
        (*flinfo).fn_extra.cast()
    }
}

pub unsafe fn form_composite(
    desc: pg_sys::TupleDesc,
    values: &mut [pg_sys::Datum],
    nulls: &mut [bool],
) -> pg_sys::Datum {
    unsafe {
        let tup = pg_sys::heap_form_tuple(desc, values.as_mut_ptr(), nulls.as_mut_ptr());
        pg_sys::Datum::from((*tup).t_data)
    }
}

/// A jsonb datum's text form: exact (numerics keep every digit, any depth),
/// unlike a round trip through serde_json.
pub fn jsonb_text(d: pg_sys::Datum) -> String {
    unsafe {
        let out = pg_sys::OidOutputFunctionCall(pg_sys::Oid::from(pg_sys::F_JSONB_OUT), d);
        std::ffi::CStr::from_ptr(out).to_string_lossy().into_owned()
    }
}

/// Parse jsonb text (in the current memory context).
pub fn jsonb_from_text(s: &str) -> pg_sys::Datum {
    let c = std::ffi::CString::new(s).unwrap_or_else(|_| crate::errors::invalid("JSON text contains a NUL byte"));
    unsafe {
        pg_sys::OidInputFunctionCall(pg_sys::Oid::from(pg_sys::F_JSONB_IN), c.as_ptr().cast_mut(), pg_sys::JSONBOID, -1)
    }
}

/// jsonb -> key, or None when the object has no such key.
pub fn jsonb_field(doc: pg_sys::Datum, key: &str) -> Option<pg_sys::Datum> {
    let k = text_datum(key.as_bytes());
    unsafe {
        let has = pg_sys::OidFunctionCall2Coll(pg_sys::Oid::from(pg_sys::F_JSONB_EXISTS), pg_sys::InvalidOid, doc, k);
        has.value() != 0
    }
    .then(|| unsafe {
        pg_sys::OidFunctionCall2Coll(pg_sys::Oid::from(pg_sys::F_JSONB_OBJECT_FIELD), pg_sys::InvalidOid, doc, k)
    })
}

/// jsonb - key.
pub fn jsonb_without(doc: pg_sys::Datum, key: &str) -> pg_sys::Datum {
    let k = text_datum(key.as_bytes());
    unsafe {
        pg_sys::OidFunctionCall2Coll(pg_sys::Oid::from(pg_sys::F_JSONB_DELETE_JSONB_TEXT), pg_sys::InvalidOid, doc, k)
    }
}

/// A JSON object made of `fields` plus `key` holding `raw` (a jsonb datum,
/// kept exactly; JSON null when None).
pub fn jsonb_with_raw(
    fields: serde_json::Map<String, serde_json::Value>,
    key: &str,
    raw: Option<pg_sys::Datum>,
) -> pg_sys::Datum {
    let mut text = serde_json::to_string(&serde_json::Value::Object(fields)).unwrap();
    text.pop(); // the closing brace
    if text.len() > 1 {
        text.push(',');
    }
    text.push_str(&serde_json::to_string(key).unwrap());
    text.push(':');
    match raw {
        Some(d) => text.push_str(&jsonb_text(d)),
        None => text.push_str("null"),
    }
    text.push('}');
    jsonb_from_text(&text)
}
