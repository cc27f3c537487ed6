//! The key lock: a heavyweight lock on a tag derived from the key's digest,
//! which serializes the probe-then-write of one key across sessions.
//!
//! The direct path holds it for microseconds (`KeyLock`, released when
//! dropped), never while waiting for another transaction: after its insert,
//! the row itself (seen by the next claimer's dirty probe) is what makes
//! later claimers wait. The SQL path cannot see uncommitted rows, so there
//! a transaction that wrote a key's row keeps its lock until it ends
//! (`hold_until_end`). Both use one tag, so a key is never locked two ways.
//!
//! pg_locks shows it as an advisory lock with objsubid = 18756 ('ID'); the
//! type lock (`KeyLock::for_type`) as one with objsubid = 18772 ('IT').

use pgrx::pg_sys;

const KEYLOCK_FIELD4: u16 = 0x4944;
const TYPELOCK_FIELD4: u16 = 0x4954;

fn tag(hash: i64, field4: u16) -> pg_sys::LOCKTAG {
    pg_sys::LOCKTAG {
        // SAFETY: a backend global, set once at connection, read on the backend's only thread.
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.into(),
        locktag_field2: ((hash as u64) >> 32) as u32,
        locktag_field3: hash as u32,
        locktag_field4: field4,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    }
}

/// The key lock, released on drop (one acquisition of it: PostgreSQL
/// counts a transaction's acquisitions of a lock, and `hold_until_end` adds
/// one that lasts until the transaction ends).
pub struct KeyLock(pg_sys::LOCKTAG);

impl KeyLock {
    /// The type lock of `biz_type`, in the same way: held for the moment a
    /// claim decides which TTL class its type goes into next and registers
    /// it there (type_classes.rs), so that two such decisions are made one
    /// after the other. Its holder waits for nothing else meanwhile.
    pub fn for_type(biz_type: &[u8]) -> KeyLock {
        let tag = tag(crate::key::key_hash(biz_type, b""), TYPELOCK_FIELD4);
        // SAFETY: a transaction-level lock on a fully initialised tag; KeyLock's Drop releases it.
        unsafe { pg_sys::LockAcquire(&tag, pg_sys::ExclusiveLock as _, false, false) };
        KeyLock(tag)
    }

    /// The key lock of the key digest `hash`; None if `wait` is off and
    /// another transaction holds it (with `wait`, always Some).
    pub fn acquire(hash: i64, wait: bool) -> Option<KeyLock> {
        let tag = tag(hash, KEYLOCK_FIELD4);
        // SAFETY: a transaction-level lock on a fully initialised tag; KeyLock's Drop releases it.
        let got = unsafe { pg_sys::LockAcquire(&tag, pg_sys::ExclusiveLock as _, false, !wait) };
        // (A closure: `then_some` would build the guard, whose drop releases
        // the lock, even when it was not granted.)
        (got != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL).then(|| KeyLock(tag))
    }
}

/// One more acquisition of a key lock the transaction holds, which no guard
/// releases: the key stays locked until the transaction ends (the SQL path,
/// once it has written the key's row).
pub fn hold_until_end(hash: i64) {
    let tag = tag(hash, KEYLOCK_FIELD4);
    // SAFETY: a transaction-level lock on a fully initialised tag, released by PostgreSQL at transaction end.
    unsafe { pg_sys::LockAcquire(&tag, pg_sys::ExclusiveLock as _, false, false) };
}

impl Drop for KeyLock {
    fn drop(&mut self) {
        // SAFETY: releases the acquisition this guard stands for, once.
        unsafe { pg_sys::LockRelease(&self.0, pg_sys::ExclusiveLock as _, false) };
    }
}

/// Whether another transaction holds the key lock (the SQL path's only sign
/// of a claim in progress, which no statement can see yet).
pub fn held_elsewhere(hash: i64) -> bool {
    // No claim runs on a hot standby, so nobody can hold it there.
    // SAFETY: reads shared state under PostgreSQL's own locking; no precondition.
    if unsafe { pg_sys::RecoveryInProgress() } {
        return false;
    }
    let tag = tag(hash, KEYLOCK_FIELD4);
    // SAFETY: a conditional acquisition that, when granted, is released at once.
    unsafe {
        if pg_sys::LockAcquire(&tag, pg_sys::ExclusiveLock as _, false, true)
            == pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL
        {
            return true;
        }
        // Undo this acquisition only: a lock this transaction already held
        // (its own claim) stays held.
        pg_sys::LockRelease(&tag, pg_sys::ExclusiveLock as _, false);
        false
    }
}

/// Whether another transaction holds the key lock now, so that asking for
/// it would wait (the SQL path's metrics; the holder may end a moment
/// later). Asks the lock table without requesting the lock.
pub fn contended(hash: i64) -> bool {
    let tag = tag(hash, KEYLOCK_FIELD4);
    let mut holders = 0;
    // SAFETY: GetLockConflicts returns a palloc'd array of `holders` valid entries (or NULL), read within
    // bounds and freed.
    unsafe {
        let vxids = pg_sys::GetLockConflicts(&tag, pg_sys::ExclusiveLock as _, &mut holders);
        if !vxids.is_null() {
            pg_sys::pfree(vxids.cast());
        }
    }
    holders > 0
}

/// Wait for another transaction to end (honours lock_timeout and
/// statement_timeout, and takes part in deadlock detection).
pub fn wait_for(xid: pg_sys::TransactionId) {
    // SAFETY: waits on a transaction id's lock inside a transaction; NULL relation and tid are allowed with
    // XLTW_None.
    unsafe { pg_sys::XactLockTableWait(xid, std::ptr::null_mut(), std::ptr::null_mut(), pg_sys::XLTW_Oper::XLTW_None) };
}
