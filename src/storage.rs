//! Direct access to idem.claims: probe every live partition through its
//! index with a dirty snapshot (which sees other transactions' uncommitted
//! rows), insert into the one partition that covers the new claim's expiry,
//! and rewrite a row in place. No SQL and no executor on these paths.
//!
//! Column numbers follow sql/storage.sql.

use crate::catalog::{self, Partition};
use crate::errors::IdemError;
use pgrx::pg_sys;
use std::mem::MaybeUninit;

pub const COL_EXPIRES_AT: usize = 0;
pub const COL_CLAIMED_AT: usize = 1;
pub const COL_STATE: usize = 2;
pub const COL_BIZ_TYPE: usize = 3;
pub const COL_KEY: usize = 4;
pub const COL_FINGERPRINT: usize = 5;
pub const COL_RESULT: usize = 6;
pub const NCOLS: usize = 7;

pub const STATE_PENDING: u8 = b'p';
pub const STATE_COMPLETED: u8 = b'c';
pub const STATE_FAILED: u8 = b'f';
pub const STATE_LEASED: u8 = b'l';

/// The stable digest the index is built on: SipHash-1-3 with a fixed key over
/// the biz_type's length (one byte: it is at most 64), the biz_type and the
/// key. Changing it orphans every stored claim, so it never changes.
pub fn key_hash(biz_type: &[u8], key: &[u8]) -> i64 {
    use std::hash::Hasher;
    let mut h = siphasher::sip::SipHasher13::new_with_keys(0x6964_656d_5f6b_6579, 0x7632_5f73_6970_3133);
    h.write(&[biz_type.len() as u8]);
    h.write(biz_type);
    h.write(key);
    h.finish() as i64
}

/// One (biz_type, key), validated, with its digest.
#[derive(Clone, Copy)]
pub struct KeyRef<'a> {
    pub biz_type: &'a [u8],
    pub key: &'a [u8],
    pub hash: i64,
}

impl<'a> KeyRef<'a> {
    pub fn new(biz_type: &'a [u8], key: &'a [u8]) -> Self {
        KeyRef { biz_type, key, hash: key_hash(biz_type, key) }
    }
}

/// A live row of one key, as a probe found it.
pub struct Row {
    pub part: usize,
    pub tid: pg_sys::ItemPointerData,
    pub state: u8,
    pub claimed_at: i64,
    pub expires_at: i64,
    pub fingerprint: Option<Vec<u8>>,
    /// Detoasted copy in the caller's memory context.
    pub result: Option<pg_sys::Datum>,
    /// Written by this transaction (or one of its subtransactions).
    pub own: bool,
    /// Another transaction that is inserting, updating or deleting the row.
    pub busy: Option<pg_sys::TransactionId>,
    /// Visible to the caller's MVCC snapshot.
    pub visible: bool,
}

/// How the claim protocol (claim.rs) reads and writes a key's row: the
/// direct heap and index access below, or SQL on the logical table
/// (sqlstore.rs, for Citus).
pub trait Store {
    /// The live row of (biz_type, key) if there is one.
    fn probe(&self, k: KeyRef, now: i64) -> Option<Row>;
    /// Insert a new claim row; the caller holds the key lock.
    fn insert(
        &self,
        k: KeyRef,
        claimed_at: i64,
        expires_at: i64,
        state: u8,
        fingerprint: Option<&[u8]>,
        result: Option<pg_sys::Datum>,
    );
    /// Give a row found by probe a new state and result.
    fn rewrite(&self, row: &Row, k: KeyRef, state: u8, result: Option<pg_sys::Datum>);
}

impl Store for Opened {
    fn probe(&self, k: KeyRef, now: i64) -> Option<Row> {
        Opened::probe(self, k, now, true)
    }

    /// Insert a new claim row into the partition that covers `expires_at`.
    /// The caller holds the key lock, so no other claim of the key can
    /// probe between our probe and this insert.
    fn insert(
        &self,
        k: KeyRef,
        claimed_at: i64,
        expires_at: i64,
        state: u8,
        fingerprint: Option<&[u8]>,
        result: Option<pg_sys::Datum>,
    ) {
        let target = self
            .parts
            .iter()
            .position(|(_, _, p)| p.range.is_some_and(|(lo, hi)| lo <= expires_at && expires_at < hi))
            .or_else(|| self.parts.iter().position(|(_, _, p)| p.range.is_none()))
            .unwrap_or_else(|| {
                IdemError::ObjectNotInPrerequisiteState(
                    "no partition of idem.claims accepts the claim, and the default partition is missing".into(),
                    Some("Run SELECT idem_maintain(); it recreates idem.claims_default.".into()),
                )
                .fail()
            });
        let (heap, index, p) = (self.parts[target].0, self.index(target), self.parts[target].2);
        unsafe {
            let mut values = [pg_sys::Datum::from(0); NCOLS];
            let mut nulls = [false; NCOLS];
            values[COL_EXPIRES_AT] = pg_sys::Datum::from(expires_at);
            values[COL_CLAIMED_AT] = pg_sys::Datum::from(claimed_at);
            values[COL_STATE] = pg_sys::Datum::from(state as i8);
            values[COL_BIZ_TYPE] = crate::fmgr::text_datum(k.biz_type);
            values[COL_KEY] = crate::fmgr::text_datum(k.key);
            match fingerprint {
                Some(f) => values[COL_FINGERPRINT] = crate::fmgr::text_datum(f),
                None => nulls[COL_FINGERPRINT] = true,
            }
            match result {
                Some(r) => values[COL_RESULT] = r,
                None => nulls[COL_RESULT] = true,
            }
            let tuple = pg_sys::heap_form_tuple((*heap).rd_att, values.as_mut_ptr(), nulls.as_mut_ptr());
            pg_sys::heap_insert(heap, tuple, pg_sys::GetCurrentCommandId(true), 0, std::ptr::null_mut());
            index_insert(heap, index, catalog::index_info(p, index), k.hash, &mut (*tuple).t_self);
            remember(k.hash, p.relid, (*tuple).t_self);
        }
    }

    /// Rewrite a row with a new state and result. The caller holds the key
    /// lock and found the row not busy: every writer of a claim row (claims,
    /// finishes, checkpoints, idem_forget) does the same, and idem_maintain
    /// moves rows only under an exclusive lock on idem.claims, so no
    /// concurrent update can get in the way of simple_heap_update.
    fn rewrite(&self, row: &Row, k: KeyRef, state: u8, result: Option<pg_sys::Datum>) {
        let (heap, index, p) = (self.parts[row.part].0, self.index(row.part), self.parts[row.part].2);
        unsafe {
            let mut values = [pg_sys::Datum::from(0); NCOLS];
            let mut nulls = [false; NCOLS];
            values[COL_EXPIRES_AT] = pg_sys::Datum::from(row.expires_at);
            values[COL_CLAIMED_AT] = pg_sys::Datum::from(row.claimed_at);
            values[COL_STATE] = pg_sys::Datum::from(state as i8);
            values[COL_BIZ_TYPE] = crate::fmgr::text_datum(k.biz_type);
            values[COL_KEY] = crate::fmgr::text_datum(k.key);
            match &row.fingerprint {
                Some(f) => values[COL_FINGERPRINT] = crate::fmgr::text_datum(f),
                None => nulls[COL_FINGERPRINT] = true,
            }
            match result {
                Some(r) => values[COL_RESULT] = r,
                None => nulls[COL_RESULT] = true,
            }
            let tuple = pg_sys::heap_form_tuple((*heap).rd_att, values.as_mut_ptr(), nulls.as_mut_ptr());
            let mut otid = row.tid;
            // The row may have been written by this very command (a claim and
            // its completion in one statement): make it updatable.
            pg_sys::CommandCounterIncrement();
            pg_sys::simple_heap_update(heap, &mut otid, tuple);
            // A HOT update shares the old index entry; otherwise the new
            // version needs its own.
            if (*(*tuple).t_data).t_infomask2 as u32 & pg_sys::HEAP_ONLY_TUPLE == 0 {
                index_insert(heap, index, catalog::index_info(p, index), k.hash, &mut (*tuple).t_self);
            }
            if row.own {
                remember(k.hash, p.relid, (*tuple).t_self);
            }
        }
    }
}

pub struct Opened {
    parent: pg_sys::Relation,
    lockmode: pg_sys::LOCKMODE,
    /// Each live partition: its relation, its index (opened on first use:
    /// empty partitions are never probed) and its catalog entry, which
    /// `list` keeps alive (declared after `parts`, so dropped after it).
    parts: Vec<(pg_sys::Relation, std::cell::Cell<pg_sys::Relation>, &'static Partition)>,
    list: Option<std::rc::Rc<catalog::PartitionList>>,
}

/// An entry of a list the Opened holds an Rc to, as the Opened's field.
fn entry(p: &Partition) -> &'static Partition {
    // SAFETY: only stored next to the Rc<PartitionList> that owns it.
    unsafe { &*(p as *const Partition) }
}

/// Lock idem.claims, then open every partition that can hold a live claim
/// (upper bound after `now`, and the default partition). The parent is locked
/// first: idem_maintain changes partitions only under a lock that conflicts
/// with ours, so the set stays as read until the transaction ends. Anyone
/// else attaching a partition locks the default partition, which we lock
/// too: if taking that lock let invalidations in, read the list again.
pub fn open(now: i64, lockmode: pg_sys::LOCKMODE) -> Opened {
    unsafe {
        let parent = pg_sys::table_open(catalog::claims_oid(), lockmode);
        let mut opened = Opened { parent, lockmode, parts: Vec::new(), list: None };
        loop {
            let (generation, list) = catalog::partitions();
            opened.close_parts();
            opened.list = Some(list.clone());
            for p in list.parts.iter().filter(|p| p.range.is_none_or(|(_, hi)| hi > now)) {
                opened.parts.push((
                    pg_sys::table_open(p.relid, lockmode),
                    std::cell::Cell::new(std::ptr::null_mut()),
                    entry(p),
                ));
            }
            if catalog::partitions_generation() == generation {
                return opened;
            }
        }
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        self.close_parts();
        unsafe { pg_sys::table_close(self.parent, pg_sys::NoLock as _) };
    }
}

unsafe fn bytes_of(d: pg_sys::Datum) -> Vec<u8> {
    unsafe {
        let v = pg_sys::pg_detoast_datum_packed(d.cast_mut_ptr());
        pgrx::varlena::varlena_to_byte_slice(v).to_vec()
    }
}

impl Opened {
    /// Locks stay until the end of the transaction (NoLock here).
    fn close_parts(&mut self) {
        for (heap, index, _) in self.parts.drain(..) {
            unsafe {
                if !index.get().is_null() {
                    pg_sys::index_close(index.get(), pg_sys::NoLock as _);
                }
                pg_sys::table_close(heap, pg_sys::NoLock as _);
            }
        }
    }

    fn index(&self, i: usize) -> pg_sys::Relation {
        let (_, index, p) = &self.parts[i];
        if index.get().is_null() {
            index.set(unsafe { pg_sys::index_open(p.index, self.lockmode) });
        }
        index.get()
    }

    /// The live row of (biz_type, key) if there is one. A row another
    /// transaction is still writing is returned with `busy` set.
    pub fn probe(&self, k: KeyRef, now: i64, want_result: bool) -> Option<Row> {
        let mut found: Option<Row> = None;
        // A key has at most one live row (that is what the protocol
        // guarantees), so the first one found is the answer.
        for (i, (heap, _, p)) in self.parts.iter().enumerate() {
            // An empty partition (the premade future ones, the default one)
            // cannot hold the key: the size check is much cheaper than an
            // index descent. Under the key lock no row of this key can
            // appear meanwhile.
            if !p.seen_nonempty.get() {
                if unsafe { pg_sys::RelationGetNumberOfBlocksInFork(*heap, pg_sys::ForkNumber::MAIN_FORKNUM) } == 0 {
                    continue;
                }
                p.seen_nonempty.set(true);
            }
            unsafe { self.probe_one(i, *heap, self.index(i), k, now, want_result, &mut found) };
            if found.is_some() {
                break;
            }
        }
        found
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn probe_one(
        &self,
        part: usize,
        heap: pg_sys::Relation,
        index: pg_sys::Relation,
        k: KeyRef,
        now: i64,
        want_result: bool,
        found: &mut Option<Row>,
    ) {
        unsafe {
            let mut dirty: pg_sys::SnapshotData = MaybeUninit::zeroed().assume_init();
            dirty.snapshot_type = pg_sys::SnapshotType::SNAPSHOT_DIRTY;
            let mut skey: pg_sys::ScanKeyData = MaybeUninit::zeroed().assume_init();
            pg_sys::ScanKeyInit(
                &mut skey,
                1,
                pg_sys::BTEqualStrategyNumber as _,
                pg_sys::Oid::from(pg_sys::F_INT8EQ),
                pg_sys::Datum::from(k.hash),
            );
            let scan = pg_sys::index_beginscan(heap, index, &mut dirty, 1, 0);
            pg_sys::index_rescan(scan, &mut skey, 1, std::ptr::null_mut(), 0);
            let slot = pg_sys::table_slot_create(heap, std::ptr::null_mut());
            while pg_sys::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, slot) {
                // dirty.xmin/xmax now describe this tuple's in-progress writers.
                let (busy_xmin, busy_xmax) = (dirty.xmin, dirty.xmax);
                pg_sys::slot_getsomeattrs_int(slot, NCOLS as i32);
                let values = std::slice::from_raw_parts((*slot).tts_values, NCOLS);
                let nulls = std::slice::from_raw_parts((*slot).tts_isnull, NCOLS);
                let expires_at = values[COL_EXPIRES_AT].value() as i64;
                if expires_at <= now {
                    continue; // expired: as good as absent
                }
                let stored_type = pg_sys::pg_detoast_datum_packed(values[COL_BIZ_TYPE].cast_mut_ptr());
                let stored_key = pg_sys::pg_detoast_datum_packed(values[COL_KEY].cast_mut_ptr());
                if pgrx::varlena::varlena_to_byte_slice(stored_key) != k.key
                    || pgrx::varlena::varlena_to_byte_slice(stored_type) != k.biz_type
                {
                    continue; // digest collision
                }
                let mut should_free = false;
                let tuple = pg_sys::ExecFetchSlotHeapTuple(slot, false, &mut should_free);
                let raw_xmin = (*(*tuple).t_data).t_choice.t_heap.t_xmin;
                let own = pg_sys::TransactionIdIsCurrentTransactionId(raw_xmin);
                let busy = if busy_xmax != pg_sys::InvalidTransactionId {
                    Some(busy_xmax)
                } else if busy_xmin != pg_sys::InvalidTransactionId {
                    Some(busy_xmin)
                } else {
                    None
                };
                let visible = own
                    || busy.is_none() && {
                        let snap = if pg_sys::ActiveSnapshotSet() {
                            pg_sys::GetActiveSnapshot()
                        } else {
                            pg_sys::GetTransactionSnapshot()
                        };
                        pg_sys::table_tuple_satisfies_snapshot(heap, slot, snap)
                    };
                let row = Row {
                    part,
                    tid: (*slot).tts_tid,
                    state: values[COL_STATE].value() as u8,
                    claimed_at: values[COL_CLAIMED_AT].value() as i64,
                    expires_at,
                    fingerprint: (!nulls[COL_FINGERPRINT]).then(|| bytes_of(values[COL_FINGERPRINT])),
                    result: (want_result && !nulls[COL_RESULT])
                        .then(|| pg_sys::Datum::from(pg_sys::pg_detoast_datum_copy(values[COL_RESULT].cast_mut_ptr()))),
                    own,
                    busy,
                    visible,
                };
                *found = Some(row);
                break;
            }
            pg_sys::ExecDropSingleTupleTableSlot(slot);
            pg_sys::index_endscan(scan);
        }
    }

    /// This transaction's own live row of `k` at `tid` in partition `part`,
    /// or None if it is not (any more) there.
    unsafe fn fetch_own(&self, part: usize, tid: pg_sys::ItemPointerData, k: KeyRef, now: i64) -> Option<Row> {
        unsafe {
            let heap = self.parts[part].0;
            let mut dirty: pg_sys::SnapshotData = MaybeUninit::zeroed().assume_init();
            dirty.snapshot_type = pg_sys::SnapshotType::SNAPSHOT_DIRTY;
            let mut tuple: pg_sys::HeapTupleData = MaybeUninit::zeroed().assume_init();
            tuple.t_self = tid;
            let mut buffer: pg_sys::Buffer = 0;
            if !pg_sys::heap_fetch(heap, &mut dirty, &mut tuple, &mut buffer, false) {
                return None;
            }
            let mut values = [pg_sys::Datum::from(0); NCOLS];
            let mut nulls = [false; NCOLS];
            pg_sys::heap_deform_tuple(&mut tuple, (*heap).rd_att, values.as_mut_ptr(), nulls.as_mut_ptr());
            let own = pg_sys::TransactionIdIsCurrentTransactionId((*tuple.t_data).t_choice.t_heap.t_xmin);
            let expires_at = values[COL_EXPIRES_AT].value() as i64;
            let same = bytes_of(values[COL_BIZ_TYPE]) == k.biz_type && bytes_of(values[COL_KEY]) == k.key;
            let row = (own && same && expires_at > now).then(|| Row {
                part,
                tid,
                state: values[COL_STATE].value() as u8,
                claimed_at: values[COL_CLAIMED_AT].value() as i64,
                expires_at,
                fingerprint: (!nulls[COL_FINGERPRINT]).then(|| bytes_of(values[COL_FINGERPRINT])),
                result: (!nulls[COL_RESULT])
                    .then(|| pg_sys::Datum::from(pg_sys::pg_detoast_datum_copy(values[COL_RESULT].cast_mut_ptr()))),
                own: true,
                busy: None,
                visible: true,
            });
            pg_sys::ReleaseBuffer(buffer);
            row
        }
    }
}

/// Where this backend last wrote a claim row of its own, so that finishing
/// the claim just made (the common idem_claim ... idem_complete pattern)
/// needs no probe of every partition and no key lock: a row this
/// transaction has not committed is invisible to every other writer.
struct Recent {
    xid: pg_sys::TransactionId,
    hash: i64,
    relid: pg_sys::Oid,
    tid: pg_sys::ItemPointerData,
}

static mut RECENT: Option<Recent> = None;

fn remember(hash: i64, relid: pg_sys::Oid, tid: pg_sys::ItemPointerData) {
    let xid = unsafe { pg_sys::GetTopTransactionIdIfAny() };
    unsafe { RECENT = Some(Recent { xid, hash, relid, tid }) };
}

/// This transaction's own live row of `k`, if it is the one remembered,
/// with idem.claims and its partition locked and open.
pub fn open_recent(k: KeyRef, now: i64) -> Option<(Opened, Row)> {
    #[allow(static_mut_refs)]
    let r = unsafe { RECENT.as_ref() }?;
    let xid = unsafe { pg_sys::GetTopTransactionIdIfAny() };
    if r.hash != k.hash || xid == pg_sys::InvalidTransactionId || r.xid != xid {
        return None;
    }
    let (relid, tid) = (r.relid, r.tid);
    unsafe {
        let lockmode = pg_sys::RowExclusiveLock as pg_sys::LOCKMODE;
        let parent = pg_sys::table_open(catalog::claims_oid(), lockmode);
        let (_, list) = catalog::partitions();
        let mut opened = Opened { parent, lockmode, parts: Vec::new(), list: Some(list.clone()) };
        let p = entry(list.parts.iter().find(|p| p.relid == relid)?);
        opened.parts.push((pg_sys::table_open(p.relid, lockmode), std::cell::Cell::new(std::ptr::null_mut()), p));
        let row = opened.fetch_own(0, tid, k, now)?;
        Some((opened, row))
    }
}

unsafe fn index_insert(
    heap: pg_sys::Relation,
    index: pg_sys::Relation,
    info: *mut pg_sys::IndexInfo,
    hash: i64,
    tid: *mut pg_sys::ItemPointerData,
) {
    unsafe {
        let mut v = [pg_sys::Datum::from(hash)];
        let mut n = [false];
        pg_sys::index_insert(
            index,
            v.as_mut_ptr(),
            n.as_mut_ptr(),
            tid,
            heap,
            pg_sys::IndexUniqueCheck::UNIQUE_CHECK_NO,
            false,
            info,
        );
    }
}

/// Serializes the probe-then-insert of one key across sessions. Held for
/// microseconds, never while waiting for another transaction: after the
/// insert, the row itself (seen by the next claimer's dirty probe) is what
/// makes later claimers wait. So one transaction can claim any number of
/// keys without filling the lock table.
pub struct KeyLock(pg_sys::LOCKTAG);

/// pg_locks shows it as an advisory lock with objsubid = 18756 ('ID').
const KEYLOCK_FIELD4: u16 = 0x4944;

fn key_lock_tag(hash: i64) -> pg_sys::LOCKTAG {
    pg_sys::LOCKTAG {
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.into(),
        locktag_field2: ((hash as u64) >> 32) as u32,
        locktag_field3: hash as u32,
        locktag_field4: KEYLOCK_FIELD4,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    }
}

impl KeyLock {
    pub fn acquire(hash: i64) -> KeyLock {
        let tag = key_lock_tag(hash);
        unsafe { pg_sys::LockAcquire(&tag, pg_sys::ExclusiveLock as _, false, false) };
        KeyLock(tag)
    }
}

/// The key lock of the SQL path (sqlstore.rs): the same lock, kept until the
/// transaction ends, because there the row cannot make later claimers wait
/// (they cannot see it before it commits). False if `wait` is off and
/// another transaction holds it.
pub fn key_lock_until_end(hash: i64, wait: bool) -> bool {
    let tag = key_lock_tag(hash);
    let got = unsafe { pg_sys::LockAcquire(&tag, pg_sys::ExclusiveLock as _, false, !wait) };
    got != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL
}

impl Drop for KeyLock {
    fn drop(&mut self) {
        unsafe { pg_sys::LockRelease(&self.0, pg_sys::ExclusiveLock as _, false) };
    }
}

/// Whether another transaction holds the key lock (the SQL path's sign of
/// a claim in progress that no statement can see yet).
pub fn key_lock_held_elsewhere(hash: i64) -> bool {
    let tag = key_lock_tag(hash);
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

/// Wait for another transaction to end (honours lock_timeout and
/// statement_timeout, and takes part in deadlock detection).
pub fn wait_for(xid: pg_sys::TransactionId) {
    unsafe { pg_sys::XactLockTableWait(xid, std::ptr::null_mut(), std::ptr::null_mut(), pg_sys::XLTW_Oper::XLTW_None) };
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::key_hash;
    use pgrx::prelude::*;

    #[pg_test]
    fn key_hash_is_stable() {
        // On disk: these values must never change.
        assert_eq!(key_hash(b"payment", b"req-42"), key_hash(b"payment", b"req-42"));
        let pinned = key_hash(b"payment", b"req-42");
        let sql = Spi::get_one::<i64>("SELECT idem.key_hash('payment', 'req-42')").unwrap().unwrap();
        assert_eq!(pinned, sql, "SQL and claim path must agree");
        assert_eq!(pinned, 0xa92d_befc_b3a3_fdeb_u64 as i64, "the digest of a stored key changed");
    }

    #[pg_test]
    fn key_hash_separates_type_from_key() {
        // ("ab", "c") and ("a", "bc") must not collide by construction.
        assert_ne!(key_hash(b"ab", b"c"), key_hash(b"a", b"bc"));
        assert_ne!(key_hash(b"t", b"k"), key_hash(b"u", b"k"));
    }

    #[pg_test]
    fn claim_and_duplicate_in_one_transaction() {
        let first = Spi::get_two::<bool, String>("SELECT claimed, state FROM idem_claim('u1', 'unit')").unwrap();
        assert_eq!(first, (Some(true), Some("new".into())));
        let again = Spi::get_two::<bool, String>("SELECT claimed, state FROM idem_claim('u1', 'unit')").unwrap();
        assert_eq!(again, (Some(false), Some("in_progress".into())));
        Spi::run("SELECT idem_complete('u1', 'unit', '{\"n\": 1}')").unwrap();
        let done = Spi::get_two::<String, pgrx::JsonB>("SELECT state, result FROM idem_lookup('u1', 'unit')").unwrap();
        assert_eq!(done.0.as_deref(), Some("completed"));
        assert_eq!(done.1.unwrap().0, serde_json::json!({"n": 1}));
    }
}
