//! Every error idem's Rust code raises, each with its SQLSTATE. The README's
//! SQLSTATE table is this enum written out, plus the codes the PL/pgSQL parts
//! raise (ID002 illegal transition, P0002 no such row, 42703, ...);
//! tests/scenarios/hardening.sh sqlstates checks the table against both.
//!
//! Keys appear in messages with their exact bytes (they are text in the
//! database's encoding, which is what a message must be in), never through
//! a lossy UTF-8 conversion.

use crate::key::KeyName;
use pgrx::pg_sys;

#[derive(Debug)]
pub enum IdemError {
    /// 22004: a required argument is NULL.
    NullArgument(&'static str),
    /// 22023: an argument is out of range or malformed.
    InvalidArgument(String),
    /// 22023: a text argument breaks a rule; the value is shown as given.
    InvalidValue { what: &'static str, value: Vec<u8>, rule: &'static str },
    /// ID001: a duplicate carries a different fingerprint than the first claim.
    FingerprintMismatch(KeyName),
    /// ID003: finishing or checkpointing a claim this caller does not hold.
    NotClaimed { key: KeyName, why: &'static str },
    /// 40001: the caller's snapshot cannot see a claim committed concurrently.
    SerializationFailure(KeyName),
    /// 55000: the extension is not in the state an operation needs.
    ObjectNotInPrerequisiteState(String, Option<String>),
    /// 0A000: something idem does not support.
    FeatureNotSupported(String, Option<String>),
    /// 0A000: under Citus, a call on a key that runs on another node than
    /// the one holding the key's shard (storage/citus.rs).
    NotOnShardNode { key: KeyName, shard: i64, node: String },
    /// 25006: a write in a read-only transaction or on a hot standby.
    ReadOnly { what: &'static str, standby: bool },
    /// 25000: a write during a parallel operation (a parallel worker, or
    /// its leader while workers run), as INSERT refuses there.
    ParallelMode { what: &'static str },
    /// 42501: the caller's role may not use this business type (its owner
    /// role, which may no longer exist).
    InsufficientPrivilege { biz_type: Vec<u8>, owner: String, owner_exists: bool },
    /// XX000: something inside idem or PostgreSQL failed that no argument
    /// explains (an SPI failure, a damaged stored document). Never for a
    /// caller's mistake.
    Internal(String),
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

/// `idem: key "K" of biz_type "T" ` followed by `rest`, as bytes.
fn about_key(name: &KeyName, rest: &str) -> Vec<u8> {
    let mut m = b"idem: key \"".to_vec();
    m.extend_from_slice(&name.key);
    m.extend_from_slice(b"\" of biz_type \"");
    m.extend_from_slice(&name.biz_type);
    m.extend_from_slice(b"\" ");
    m.extend_from_slice(rest.as_bytes());
    m
}

impl IdemError {
    pub fn code(&self) -> &'static [u8; 5] {
        match self {
            IdemError::NullArgument(_) => b"22004",
            IdemError::InvalidArgument(_) | IdemError::InvalidValue { .. } => b"22023",
            IdemError::FingerprintMismatch(_) => b"ID001",
            IdemError::NotClaimed { .. } => b"ID003",
            IdemError::SerializationFailure(_) => b"40001",
            IdemError::ObjectNotInPrerequisiteState(..) => b"55000",
            IdemError::FeatureNotSupported(..) | IdemError::NotOnShardNode { .. } => b"0A000",
            IdemError::ReadOnly { .. } => b"25006",
            IdemError::ParallelMode { .. } => b"25000",
            IdemError::InsufficientPrivilege { .. } => b"42501",
            IdemError::Internal(_) => b"XX000",
        }
    }

    fn message(&self) -> Vec<u8> {
        match self {
            IdemError::NullArgument(arg) => format!("idem: {arg} must not be NULL").into_bytes(),
            IdemError::InvalidArgument(m) => format!("idem: {m}").into_bytes(),
            IdemError::InvalidValue { what, value, rule } => {
                let mut m = format!("idem: {what} \"").into_bytes();
                m.extend_from_slice(value);
                m.extend_from_slice(format!("\" is not valid: {rule}").as_bytes());
                m
            }
            IdemError::FingerprintMismatch(key) => about_key(key, "was first claimed with a different fingerprint"),
            IdemError::NotClaimed { key, why } => about_key(key, why),
            IdemError::SerializationFailure(key) => {
                let mut m = b"could not serialize access: ".to_vec();
                m.extend(about_key(key, "was claimed by a transaction this snapshot cannot see").drain(6..));
                m
            }
            IdemError::ObjectNotInPrerequisiteState(m, _) => format!("idem: {m}").into_bytes(),
            IdemError::FeatureNotSupported(m, _) => format!("idem: {m}").into_bytes(),
            IdemError::NotOnShardNode { key, node, .. } => about_key(
                key,
                &format!("lives on {node}: a call on the key runs only there, and this is another node"),
            ),
            IdemError::ReadOnly { what, .. } => {
                format!("cannot execute {what} in a read-only transaction").into_bytes()
            }
            IdemError::ParallelMode { what } => {
                format!("cannot execute {what} during a parallel operation").into_bytes()
            }
            IdemError::InsufficientPrivilege { biz_type, owner, owner_exists } => {
                let mut m = b"idem: permission denied for biz_type \"".to_vec();
                m.extend_from_slice(biz_type);
                if *owner_exists {
                    m.extend_from_slice(format!("\": only members of role \"{owner}\" may use it").as_bytes());
                } else {
                    m.extend_from_slice(
                        format!("\": it is reserved for role \"{owner}\", which does not exist on this server")
                            .as_bytes(),
                    );
                }
                m
            }
            IdemError::Internal(m) => format!("idem: internal error: {m}").into_bytes(),
        }
    }

    fn hint(&self) -> Option<String> {
        match self {
            IdemError::FingerprintMismatch(_) => Some(
                "The same idempotency key was reused for a different request; use a new key for a new intent.".into(),
            ),
            IdemError::NotClaimed { .. } => Some(
                "Finish a claim in the transaction that made it, or pass the lease_token that idem_claim returned with the lease.".into(),
            ),
            IdemError::SerializationFailure(_) => Some(
                "Retry the transaction: the retry will see the first claim and get its result.".into(),
            ),
            IdemError::ObjectNotInPrerequisiteState(_, h) | IdemError::FeatureNotSupported(_, h) => h.clone(),
            IdemError::NotOnShardNode { shard, .. } => Some(format!(
                "The key is in shard {shard} of idem.claims. Citus runs a call on the node of its key only when it delegates it: SELECT idem_claim(...), SELECT * FROM idem_claim(...) or SELECT claimed, state FROM idem_claim(...) as the whole statement (also inside BEGIN ... COMMIT, in a prepared statement, and in PL/pgSQL as SELECT ... INTO ... FROM idem_claim(...)), and the same for idem_complete, idem_fail, idem_checkpoint, idem_release, idem_lookup and idem_forget. It does not delegate SELECT (idem_claim(...)).claimed, a WHERE clause, a CTE, or PL/pgSQL's := and PERFORM: call those inside a function distributed with the key (docs/scaling.md). Right after a shard move, a retry succeeds."
            )),
            IdemError::ReadOnly { standby: true, .. } => Some(
                "This server is a hot standby: claim on the primary. idem_lookup works here.".into(),
            ),
            IdemError::ParallelMode { .. } => Some(
                "A function that calls it must be PARALLEL UNSAFE (the default for CREATE FUNCTION): a parallel worker cannot write.".into(),
            ),
            IdemError::InsufficientPrivilege { owner, owner_exists: true, .. } => Some(format!(
                "The business type is reserved for role \"{owner}\" (idem_set_owner); GRANT that role, or use another biz_type."
            )),
            IdemError::InsufficientPrivilege { owner_exists: false, .. } => Some(
                "The role was dropped or renamed, or a dump was restored onto a server without it: until then only superusers may use the type. A superuser names its owner again with SELECT idem_set_owner(biz_type, role), or opens it to every role with idem_set_owner(biz_type, NULL).".into(),
            ),
            IdemError::Internal(_) => {
                Some("This is a bug or a damaged installation; please report it with the server log.".into())
            }
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
    /// `fmgr::entry`).
    ///
    /// # Safety
    /// Call only where no Rust frame with a destructor lies between here and
    /// the C caller: the ereport longjmps out. pgrx's own error path cannot
    /// carry a SQLSTATE outside its enum (ID001..ID003), hence this.
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
        let hint = self.hint().map(|h| palloc_cstr(h.as_bytes()));
        drop(self);
        // SAFETY: called at the C entry point (this function's contract): every Rust value was dropped above,
        // so the longjmp skips no destructor; the strings are palloc'd and outlive the report.
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

/// A NUL-terminated palloc'd copy (text cannot hold NUL bytes; none get in).
fn palloc_cstr(s: &[u8]) -> *const std::ffi::c_char {
    // SAFETY: the palloc'd block has `s.len() + 1` bytes: at most `s.len()` copied and the NUL.
    unsafe {
        let p = pg_sys::palloc(s.len() + 1) as *mut u8;
        let mut n = 0;
        for &b in s.iter().filter(|&&b| b != 0) {
            *p.add(n) = b;
            n += 1;
        }
        *p.add(n) = 0;
        p as *const std::ffi::c_char
    }
}

/// Shorthand for the most common error: a caller's argument is wrong.
pub fn invalid(msg: impl Into<String>) -> ! {
    IdemError::InvalidArgument(msg.into()).fail()
}

/// Something failed that no argument explains (XX000), naming what.
pub fn internal(msg: impl Into<String>) -> ! {
    IdemError::Internal(msg.into()).fail()
}
