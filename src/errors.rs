//! Every error idem's Rust code raises, each with its SQLSTATE. The README's
//! SQLSTATE table is this enum written out, plus the codes the PL/pgSQL parts
//! raise (ID002 illegal transition, P0002 no such row, 25001, 42703); keep
//! them in step.

use pgrx::pg_sys;
use std::ffi::CString;

#[derive(Debug)]
pub enum IdemError {
    /// 22004: a required argument is NULL.
    NullArgument(&'static str),
    /// 22023: an argument is out of range or malformed.
    InvalidArgument(String),
    /// ID001: a duplicate carries a different fingerprint than the first claim.
    FingerprintMismatch { biz_type: String, key: String },
    /// ID003: finishing or checkpointing a claim this caller does not hold.
    NotClaimed { biz_type: String, key: String, why: &'static str },
    /// 40001: the caller's snapshot cannot see a claim committed concurrently.
    SerializationFailure { biz_type: String, key: String },
    /// 55000: the extension is not in the state an operation needs.
    ObjectNotInPrerequisiteState(String, Option<String>),
    /// 0A000: something idem does not support.
    FeatureNotSupported(String),
}

const fn sqlstate(code: &[u8; 5]) -> i32 {
    // MAKE_SQLSTATE from utils/elog.h: six bits per character.
    let mut v = 0i32;
    let mut i = 0;
    while i < 5 {
        v |= ((code[i] - b'0') as i32 & 0x3F) << (6 * i);
        i += 1;
    }
    v
}

impl IdemError {
    pub fn code(&self) -> &'static [u8; 5] {
        match self {
            IdemError::NullArgument(_) => b"22004",
            IdemError::InvalidArgument(_) => b"22023",
            IdemError::FingerprintMismatch { .. } => b"ID001",
            IdemError::NotClaimed { .. } => b"ID003",
            IdemError::SerializationFailure { .. } => b"40001",
            IdemError::ObjectNotInPrerequisiteState(..) => b"55000",
            IdemError::FeatureNotSupported(_) => b"0A000",
        }
    }

    fn message(&self) -> String {
        match self {
            IdemError::NullArgument(arg) => format!("idem: {arg} must not be NULL"),
            IdemError::InvalidArgument(m) => format!("idem: {m}"),
            IdemError::FingerprintMismatch { biz_type, key } => format!(
                "idem: key \"{key}\" of biz_type \"{biz_type}\" was first claimed with a different fingerprint"
            ),
            IdemError::NotClaimed { biz_type, key, why } => {
                format!("idem: key \"{key}\" of biz_type \"{biz_type}\" {why}")
            }
            IdemError::SerializationFailure { biz_type, key } => format!(
                "could not serialize access: key \"{key}\" of biz_type \"{biz_type}\" was claimed by a transaction this snapshot cannot see"
            ),
            IdemError::ObjectNotInPrerequisiteState(m, _) => format!("idem: {m}"),
            IdemError::FeatureNotSupported(m) => format!("idem: {m}"),
        }
    }

    fn hint(&self) -> Option<String> {
        match self {
            IdemError::FingerprintMismatch { .. } => Some(
                "The same idempotency key was reused for a different request; use a new key for a new intent.".into(),
            ),
            IdemError::NotClaimed { .. } => Some(
                "Call idem_claim in the same transaction first, and finish only a claim it returned claimed = true for.".into(),
            ),
            IdemError::SerializationFailure { .. } => Some(
                "Retry the transaction: the retry will see the first claim and get its result.".into(),
            ),
            IdemError::ObjectNotInPrerequisiteState(_, h) => h.clone(),
            _ => None,
        }
    }

    /// Abort the current SQL function with this error. The panic carries the
    /// error up to `fmgr::entry`, which raises it once every Rust frame of
    /// the call has been dropped.
    pub fn fail(self) -> ! {
        std::panic::panic_any(self)
    }

    /// ereport(ERROR) from the outermost frame of a SQL function (see
    /// `fmgr::entry`). Called anywhere else the longjmp would skip Rust
    /// destructors. pgrx's own error path cannot carry a SQLSTATE outside
    /// its enum (ID001..ID003), hence this.
    pub(crate) unsafe fn raise_from_entry(self) -> ! {
        unsafe extern "C-unwind" {
            fn errstart(elevel: std::ffi::c_int, domain: *const std::ffi::c_char) -> bool;
            fn errcode(sqlerrcode: std::ffi::c_int) -> std::ffi::c_int;
            fn errmsg(fmt: *const std::ffi::c_char, ...) -> std::ffi::c_int;
            fn errhint(fmt: *const std::ffi::c_char, ...) -> std::ffi::c_int;
            fn errfinish(filename: *const std::ffi::c_char, lineno: std::ffi::c_int, funcname: *const std::ffi::c_char);
        }
        let code = sqlstate(self.code());
        // Copy the texts into palloc'd memory, which the error cleanup frees,
        // and drop every Rust allocation before the longjmp.
        let msg = palloc_cstr(&self.message());
        let hint = self.hint().map(|h| palloc_cstr(&h));
        drop(self);
        unsafe {
            if errstart(pgrx::PgLogLevel::ERROR as _, std::ptr::null()) {
                errcode(code);
                errmsg(c"%s".as_ptr(), msg);
                if let Some(h) = hint {
                    errhint(c"%s".as_ptr(), h);
                }
                errfinish(c"idem".as_ptr(), 0, c"idem".as_ptr());
            }
        }
        unreachable!("ereport(ERROR) returned")
    }
}

fn palloc_cstr(s: &str) -> *const std::ffi::c_char {
    let c = CString::new(s.replace('\0', "")).unwrap();
    unsafe { pg_sys::pstrdup(c.as_ptr()) }
}

/// Shorthand for the most common error.
pub fn invalid(msg: impl Into<String>) -> ! {
    IdemError::InvalidArgument(msg.into()).fail()
}
