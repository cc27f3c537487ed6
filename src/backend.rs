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

/// Call `forget` whenever what this backend's transaction wrote may be
/// undone: at the abort of a transaction or subtransaction, and at PREPARE
/// TRANSACTION (any session may roll a prepared transaction back). For a
/// cache that may hold what its own transaction wrote; called once per
/// backend and cache (the callbacks stay as long as the library).
pub fn on_undo(forget: fn()) {
    let arg = forget as *mut std::ffi::c_void;
    // SAFETY: plain registrations; `arg` is a function pointer of the
    // library, which is never unloaded once loaded.
    unsafe {
        pg_sys::RegisterXactCallback(Some(undo_xact_callback), arg);
        pg_sys::RegisterSubXactCallback(Some(undo_subxact_callback), arg);
    }
}

/// `arg`: the `fn()` given to `on_undo`.
unsafe fn call_forget(arg: *mut std::ffi::c_void) {
    // SAFETY: on_undo registered `arg` as a `fn()`.
    let forget: fn() = unsafe { std::mem::transmute::<*mut std::ffi::c_void, fn()>(arg) };
    forget();
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn undo_xact_callback(event: pg_sys::XactEvent::Type, arg: *mut std::ffi::c_void) {
    if matches!(
        event,
        pg_sys::XactEvent::XACT_EVENT_ABORT
            | pg_sys::XactEvent::XACT_EVENT_PARALLEL_ABORT
            | pg_sys::XactEvent::XACT_EVENT_PREPARE
    ) {
        // SAFETY: registered by on_undo.
        unsafe { call_forget(arg) };
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn undo_subxact_callback(
    event: pg_sys::SubXactEvent::Type,
    _my: pg_sys::SubTransactionId,
    _parent: pg_sys::SubTransactionId,
    arg: *mut std::ffi::c_void,
) {
    if event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB {
        // SAFETY: registered by on_undo.
        unsafe { call_forget(arg) };
    }
}
