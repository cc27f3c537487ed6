//! Backend-local state: what one PostgreSQL backend remembers between calls
//! (catalog caches, the claim just made, parsed settings), and the two
//! readings every module takes of the backend's moment: the clock (`now`)
//! and the caller's snapshot (`caller_snapshot`).
//!
//! A backend runs one thread, and idem starts none, so a `static` holding a
//! `RefCell` is enough, except that Rust requires statics to be `Sync`.
//! `BackendLocal` supplies that promise. The `RefCell` is kept on purpose:
//! PostgreSQL calls back into idem (relcache and transaction callbacks) from
//! inside almost any call into PostgreSQL, so a borrow held across such a
//! call would alias the callback's. Every access goes through `with`, whose
//! closure must not call into PostgreSQL; a violation panics (a bug report)
//! instead of corrupting memory.

use pgrx::pg_sys;
use std::cell::RefCell;

pub struct BackendLocal<T>(RefCell<T>);

// SAFETY: a PostgreSQL backend is single-threaded and idem spawns no
// threads; every access happens on the backend's main thread.
unsafe impl<T> Sync for BackendLocal<T> {}

impl<T> BackendLocal<T> {
    pub const fn new(value: T) -> Self {
        BackendLocal(RefCell::new(value))
    }

    /// Run `f` on the value. `f` must not call into PostgreSQL (see above).
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut self.0.borrow_mut())
    }
}

impl<T: Clone> BackendLocal<T> {
    pub fn get(&self) -> T {
        self.0.borrow().clone()
    }

    pub fn set(&self, value: T) {
        *self.0.borrow_mut() = value;
    }
}

/// The clock claims are judged by: the current time (not the transaction's
/// start), in PostgreSQL timestamp microseconds. Expiry, leases and the
/// counters' times all read it here.
pub fn now() -> i64 {
    // SAFETY: reads the system clock; no precondition.
    unsafe { pg_sys::GetCurrentTimestamp() }
}

/// The caller's MVCC snapshot: the statement's, else the transaction's.
/// Taken before the call started, so it also marks the caller's arrival: a
/// writer it shows as running was running when the caller arrived (or
/// started since).
pub fn caller_snapshot() -> pg_sys::Snapshot {
    // SAFETY: called inside a transaction (every idem function is), where
    // both calls are valid; the active snapshot is used only if there is one.
    unsafe {
        if pg_sys::ActiveSnapshotSet() {
            pg_sys::GetActiveSnapshot()
        } else {
            pg_sys::GetTransactionSnapshot()
        }
    }
}
