//! Which transaction wrote a claim row, as both storage paths must judge
//! it: the one rule for "this transaction's own row" and for "a row whose
//! writer was still running when the caller arrived".
//!
//! A row's raw `xmin` is not its writer once the row is frozen: freezing
//! sets hint bits and keeps the raw field, and after the 32-bit xid counter
//! wraps (every ~4 billion transactions, days on a busy server) a new
//! transaction can be given that very number. Compared raw, a long-lived
//! claim would then read as the new transaction's own (it could finish
//! another worker's lease without its token), or as written by a
//! transaction still running. PostgreSQL's own reading
//! (`HeapTupleHeaderGetXmin`) gives a frozen row `FrozenTransactionId`,
//! which is nobody's and committed before every snapshot.

use pgrx::pg_sys;
use std::mem::MaybeUninit;

/// The transaction that wrote this version of a row, frozen rows reading as
/// `FrozenTransactionId`.
///
/// # Safety
/// `header` points to a valid heap tuple header on a pinned page.
pub unsafe fn of_header(header: pg_sys::HeapTupleHeader) -> pg_sys::TransactionId {
    // (Named by its module: PostgreSQL 18's bindings also export a C shim of
    // the same name, which makes the short name ambiguous.)
    // SAFETY: `header` is a valid tuple header (this function's contract).
    unsafe { pg_sys::submodules::htup::HeapTupleHeaderGetXmin(header) }
}

/// The writer of the tuple at `tid` in the heap `relid` (already locked by
/// the caller's statement), read from its header as `of_header` does;
/// `InvalidTransactionId` if no tuple is there. For the SQL path, whose
/// statements return only the raw `xmin`.
pub fn of_tuple(relid: pg_sys::Oid, tid: pg_sys::ItemPointerData) -> pg_sys::TransactionId {
    // SAFETY: the relation is open and locked for the scan; SnapshotAny
    // fetches whatever tuple is at `tid` (the statement just returned it,
    // and the caller's lock keeps VACUUM from removing it); the buffer is
    // pinned while the header is read and released after.
    unsafe {
        let rel = pg_sys::table_open(relid, pg_sys::AccessShareLock as _);
        let mut tuple: pg_sys::HeapTupleData = MaybeUninit::zeroed().assume_init();
        tuple.t_self = tid;
        let mut buffer: pg_sys::Buffer = 0;
        let any = std::ptr::addr_of_mut!(pg_sys::SnapshotAnyData);
        let xmin = if pg_sys::heap_fetch(rel, any, &mut tuple, &mut buffer, true) {
            of_header(tuple.t_data)
        } else {
            pg_sys::InvalidTransactionId
        };
        if buffer != 0 {
            pg_sys::ReleaseBuffer(buffer);
        }
        pg_sys::table_close(rel, pg_sys::NoLock as _);
        xmin
    }
}

/// Written by this transaction or one of its live subtransactions. `xmin`
/// must come from `of_header` / `of_tuple`, never a raw `xmin`.
pub fn is_own(xmin: pg_sys::TransactionId) -> bool {
    // SAFETY: reads the current transaction's state; no pointer is involved.
    unsafe { pg_sys::TransactionIdIsCurrentTransactionId(xmin) }
}

/// Whether the row's writer had not committed when the caller arrived: a
/// duplicate that arrived while a claim was in progress is a duplicate of
/// that claim, and gets its outcome even if the claim's transaction
/// outlived its TTL (docs/design.md §2, "A claim that outlives its TTL").
/// `xmin` as for `is_own`.
pub fn was_running_at(xmin: pg_sys::TransactionId, arrival: pg_sys::Snapshot) -> bool {
    if !pg_sys::TransactionIdIsNormal(xmin) {
        return false; // frozen or bootstrap: committed before every snapshot
    }
    // SAFETY: `arrival` is the caller's snapshot, live for the call.
    unsafe { pg_sys::XidInMVCCSnapshot(xmin, arrival) }
}
