//! Backend-local state: what one PostgreSQL backend remembers between calls
//! (catalog caches, the claim just made, parsed settings).
//!
//! A backend runs one thread, and idem starts none, so a `static` holding a
//! `RefCell` is enough, except that Rust requires statics to be `Sync`.
//! `BackendLocal` supplies that promise. The `RefCell` is kept on purpose:
//! PostgreSQL calls back into idem (relcache and transaction callbacks) from
//! inside almost any call into PostgreSQL, so a borrow held across such a
//! call would alias the callback's. Every access goes through `with`, whose
//! closure must not call into PostgreSQL; a violation panics (a bug report)
//! instead of corrupting memory.

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
