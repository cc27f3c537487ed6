//! The direct path: idem.claims reached by its partitions' heaps and
//! indexes, no SQL and no executor. A key's row is found by probing every
//! partition through its digest index with a dirty snapshot (which also
//! returns rows other transactions are still writing, and says which
//! transaction), under the short key lock; a row another transaction is
//! writing is waited for with the key lock released (docs/design.md §2).
//!
//! The partitioned table read is a `Target`: idem.claims itself, or under
//! Citus the local shard of it that holds the key (storage/citus.rs), which
//! is an ordinary partitioned table on this node.
//!
//! Tuples have the shape partitions.rs checks every partition for; the column
//! positions come from columns.rs.

use super::columns::{self, Positions};
use super::keylock::{self, KeyLock};
use super::partitions::{self, PartitionList};
use super::type_classes::{self, Registered};
use super::writer;
use super::{Found, Held, Intent, NewRow, Row, Seen, Store, Target, Writer};
use crate::backend::BackendLocal;
use crate::catalog;
use crate::compat;
use crate::datum::{text_datum, varlena_bytes, varlena_copy};
use crate::errors::IdemError;
use crate::key::ClaimKey;
use crate::metrics;
use crate::ttl_class;
use pgrx::pg_sys;
use std::cell::{Cell, RefCell};
use std::mem::MaybeUninit;
use std::rc::Rc;

/// Where each column is in a partition's tuple (columns.rs).
const COLUMNS: Positions = Positions::of(false);

/// 0.3.0's partitions (partitions::PartitionList::legacy): no ttl_class.
const LEGACY_COLUMNS: Positions = Positions::of(true);

/// The most columns a tuple has.
const NCOLS: usize = columns::CLAIMS.len();

/// The target's partitioned table and the partitions a key's row can be in,
/// locked and open. Partition `i` here is `list.parts[i]`.
pub struct Opened {
    /// Under Citus, the logical idem.claims, locked before the shard.
    shell: Option<pg_sys::Relation>,
    parent: pg_sys::Relation,
    lockmode: pg_sys::LOCKMODE,
    /// Each partition's heap (opened when a class it belongs to is looked
    /// into: null until then), and its index (opened on first use: empty
    /// partitions are never probed).
    parts: Vec<(Cell<pg_sys::Relation>, Cell<pg_sys::Relation>)>,
    list: Rc<PartitionList>,
    /// The registry the key's type is registered in, and what was read of
    /// it last (type_classes.rs).
    registry: Option<pg_sys::Oid>,
    registered: RefCell<Registered>,
    /// The columns of the partitions' tuples.
    cols: &'static Positions,
    /// The key's digest as the schema in place indexes it, read once
    /// idem.claims is locked (key::ClaimKey::hash says why then).
    hash: i64,
}

impl Drop for Opened {
    fn drop(&mut self) {
        self.close_parts();
        // SAFETY: the parent (and shell) were opened by `open`/`open_recent` and are closed once, here; their
        // locks stay until the transaction ends.
        unsafe {
            pg_sys::table_close(self.parent, pg_sys::NoLock as _);
            if let Some(shell) = self.shell {
                pg_sys::table_close(shell, pg_sys::NoLock as _);
            }
        }
    }
}

/// Open and lock the target's tables: under Citus the logical idem.claims
/// (the shell) and then the shard, else idem.claims. idem.claims is opened
/// by catalog::open_claims, which survives a concurrent DROP EXTENSION
/// (55000, never XX000 for a vanished OID).
///
/// # Safety
/// Inside a transaction; the caller closes both relations.
unsafe fn open_target(target: Target, lockmode: pg_sys::LOCKMODE) -> (Option<pg_sys::Relation>, pg_sys::Relation) {
    match target.shell {
        Some(_) => {
            let shell = catalog::open_claims(lockmode);
            // SAFETY: inside a transaction (this function's contract); the caller closes what it gets;
            // try_table_open reports a vanished OID as NULL.
            let shard = unsafe { pg_sys::try_table_open(target.parent, lockmode) };
            if shard.is_null() {
                // The shard looked up before the lock was dropped while we
                // waited for it (an ALTER EXTENSION idem UPDATE that rebuilt
                // idem.claims): 55000, as for a dropped extension, never XX000.
                // SAFETY: shell is open; its lock is kept until the transaction ends.
                unsafe { pg_sys::table_close(shell, pg_sys::NoLock as _) };
                IdemError::ObjectNotInPrerequisiteState(
                    "the shard of idem.claims this call looked up was dropped while it waited for its lock".into(),
                    Some(
                        "idem.claims was rebuilt meanwhile (ALTER EXTENSION idem UPDATE); run the transaction again."
                            .into(),
                    ),
                )
                .fail();
            }
            (Some(shell), shard)
        }
        None => (None, catalog::open_claims(lockmode)),
    }
}

/// `k`'s row for `intent` (`Opened::find`), in the target opened for
/// writing.
pub fn find(target: Target, k: &ClaimKey, intent: Intent) -> (Opened, Found) {
    let opened = Opened::open(target, k, pg_sys::RowExclusiveLock as _);
    let found = opened.find(k, intent);
    (opened, found)
}

/// What a lookup sees of `k` in the target (`Opened::peek`).
pub fn peek(target: Target, k: &ClaimKey, now: i64) -> Seen {
    Opened::open(target, k, pg_sys::AccessShareLock as _).peek(k, now)
}

impl Opened {
    /// Nothing of the partitions opened yet; the columns as `list` says.
    fn new(
        shell: Option<pg_sys::Relation>,
        parent: pg_sys::Relation,
        lockmode: pg_sys::LOCKMODE,
        list: Rc<PartitionList>,
        registry: Option<pg_sys::Oid>,
        hash: i64,
    ) -> Opened {
        let cols = if list.legacy { &LEGACY_COLUMNS } else { &COLUMNS };
        Opened {
            shell,
            parent,
            lockmode,
            parts: Vec::new(),
            list,
            registry,
            registered: RefCell::new(Registered::default()),
            cols,
            hash,
        }
    }

    /// Lock the target's table, then its default partition; the partitions
    /// of TTL classes are opened by `look_into_classes`. The table is locked first:
    /// idem_maintain changes partitions only under a lock that conflicts
    /// with ours, so the set stays as read until the transaction ends.
    /// Anyone else attaching a partition locks the default partition, which
    /// we lock too: if taking a lock let an invalidation of the list in,
    /// read it again. Under Citus the logical idem.claims is locked before
    /// the shard, in the order Citus's own statements take: Citus's
    /// maintenance locks it on every node before it changes a shard
    /// (sql/maintenance.sql), so it never waits for a claim that waits for
    /// it. Opened for `k`, whose digest is read once the table is locked.
    fn open(target: Target, k: &ClaimKey, lockmode: pg_sys::LOCKMODE) -> Opened {
        // SAFETY: inside a transaction (every protocol call is); what is opened here is closed by Opened's
        // Drop.
        unsafe {
            let (shell, parent) = open_target(target, lockmode);
            let parent_oid = (*parent).rd_id;
            let list = partitions::list(parent_oid);
            // The registry read again now that idem.claims is locked: an
            // update that made it may have committed while we waited (off
            // Citus; a shard's registry is the shard's, storage/citus.rs).
            let registry = if target.shell.is_none() { catalog::type_classes_oid() } else { target.registry };
            let mut opened = Opened::new(shell, parent, lockmode, list, registry, k.hash());
            loop {
                // In 0.3.0's layout, every partition (as 0.3.0 did).
                let every = opened.list.legacy;
                for p in &opened.list.parts {
                    let open = every || p.bound.is_none();
                    let heap = if open { pg_sys::table_open(p.relid, lockmode) } else { std::ptr::null_mut() };
                    opened.parts.push((Cell::new(heap), Cell::new(std::ptr::null_mut())));
                }
                if !opened.list.stale.get() {
                    if lockmode == pg_sys::RowExclusiveLock as pg_sys::LOCKMODE {
                        check_replicable(&opened.list);
                    }
                    return opened;
                }
                opened.close_parts();
                opened.list = partitions::list(parent_oid);
                opened.cols = if opened.list.legacy { &LEGACY_COLUMNS } else { &COLUMNS };
            }
        }
    }

    /// Read which classes hold `k`'s type (type_classes.rs), and open and
    /// lock every partition of those classes that can hold a row of `k`:
    /// those whose range starts before the latest expiry registered in the
    /// class. Partitions whose range has ended are among them: a claim whose
    /// transaction is still open blocks its key whatever its expiry, and
    /// maintenance cannot drop its partition meanwhile (our lock). Premade
    /// partitions further out hold no claim of the type.
    ///
    /// Under Citus the registry is this node's shard of it co-located with
    /// the key's shard (storage/citus.rs). Without one (`registry` is None:
    /// a shard whose registrations are not known complete, after a split)
    /// every class's partitions that can hold a claim made until now:
    /// those starting before now plus the class's longest TTL and a width.
    fn look_into_classes(&self, k: &ClaimKey, now: i64) {
        if self.list.legacy {
            return; // every partition is open
        }
        let Some(registry) = self.registry else {
            for (i, p) in self.list.parts.iter().enumerate() {
                if let Some(b) = p.bound {
                    let reach =
                        ttl_class::max_ttl(b.class).zip(ttl_class::width(b.class)).map(|(t, w)| t.saturating_add(w));
                    if reach.is_none_or(|reach| b.from <= now.saturating_add(reach)) {
                        self.heap(i);
                    }
                }
            }
            return;
        };
        let registered = type_classes::read(registry, k);
        for &(class, until) in &registered.classes {
            for (i, p) in self.list.parts.iter().enumerate() {
                if p.bound.is_some_and(|b| b.class == class && b.from <= until) {
                    self.heap(i);
                }
            }
        }
        *self.registered.borrow_mut() = registered;
    }

    /// Partition `i`'s heap, opened and locked on first use.
    fn heap(&self, i: usize) -> pg_sys::Relation {
        let heap = &self.parts[i].0;
        if heap.get().is_null() {
            // SAFETY: a partition of the list read under the parent's lock; closed by close_parts.
            heap.set(unsafe { pg_sys::table_open(self.list.parts[i].relid, self.lockmode) });
        }
        heap.get()
    }

    /// Locks stay until the end of the transaction (NoLock here).
    fn close_parts(&mut self) {
        for (heap, index) in self.parts.drain(..) {
            // SAFETY: each non-NULL relation here was opened by this Opened and is closed once, as the
            // entries are drained.
            unsafe {
                if !index.get().is_null() {
                    pg_sys::index_close(index.get(), pg_sys::NoLock as _);
                }
                if !heap.get().is_null() {
                    pg_sys::table_close(heap.get(), pg_sys::NoLock as _);
                }
            }
        }
    }

    fn index(&self, i: usize) -> pg_sys::Relation {
        let index = &self.parts[i].1;
        if index.get().is_null() {
            // SAFETY: the partition's digest index, checked by partitions.rs; closed by close_parts.
            index.set(unsafe { pg_sys::index_open(self.list.parts[i].index, self.lockmode) });
        }
        index.get()
    }

    /// The key's row for `intent`, under the short key lock; a row another
    /// transaction is writing is waited for (or reported) with the lock
    /// released, then the key is probed again.
    fn find(&self, k: &ClaimKey, intent: Intent) -> Found {
        loop {
            let lock = KeyLock::acquire(self.hash, true);
            let now = crate::backend::now();
            self.look_into_classes(k, now);
            let row = self.probe(k, now);
            self.predicate_lock(k);
            match row {
                Some(row) => match row.busy {
                    Some(writer) => {
                        drop(lock);
                        let waits = match intent {
                            Intent::Claim { wait, .. } => wait,
                            Intent::Update => true,
                            Intent::Forget => !writer.inserting,
                        };
                        if !waits {
                            return Found::Busy(Some(row));
                        }
                        let _timed = metrics::wait(k.biz_type);
                        keylock::wait_for(writer.xid);
                    }
                    None => return Found::Row(row, Held(lock)),
                },
                None => return Found::Absent(Held(lock)),
            }
        }
    }

    /// What a lookup sees: no lock, no wait.
    fn peek(&self, k: &ClaimKey, now: i64) -> Seen {
        self.look_into_classes(k, now);
        let row = self.probe(k, now);
        self.predicate_lock(k);
        match row {
            None => Seen::Absent,
            Some(row) if row.busy.is_some() => Seen::Busy(Some(row)),
            Some(row) => Seen::Row(row),
        }
    }

    /// The live row of `k` if there is one: a committed row that has not
    /// expired, or one still being written (by another transaction, then
    /// `busy` is set, or by this one), whatever its expiry.
    fn probe(&self, k: &ClaimKey, now: i64) -> Option<Row> {
        // A key has at most one live row (that is what the protocol
        // guarantees), so the first one found is the answer.
        let arrival = crate::backend::caller_snapshot();
        for (i, (heap, _)) in self.parts.iter().enumerate() {
            let heap = heap.get();
            if heap.is_null() {
                continue; // not of a class the key's type is in
            }
            // An empty partition (the premade future ones, the default one)
            // cannot hold the key: the size check is much cheaper than an
            // index descent. Under the key lock no row of this key can
            // appear meanwhile.
            let p = &self.list.parts[i];
            if !p.seen_nonempty.get() {
                // SAFETY: `heap` is open and locked.
                if unsafe { pg_sys::RelationGetNumberOfBlocksInFork(heap, pg_sys::ForkNumber::MAIN_FORKNUM) } == 0 {
                    continue;
                }
                p.seen_nonempty.set(true);
            }
            if let Some(row) = self.probe_one(i, k, now, arrival) {
                return Some(row);
            }
        }
        None
    }

    /// Probe partition `i` through its index with a dirty snapshot;
    /// `arrival` is the caller's snapshot (writer.rs).
    fn probe_one(&self, i: usize, k: &ClaimKey, now: i64, arrival: pg_sys::Snapshot) -> Option<Row> {
        // SAFETY: partition i's heap and index are open and locked for as
        // long as self lives; the dirty snapshot and the slot outlive the
        // scan; the slot's values are a claims tuple of NCOLS columns (the
        // shape catalog.rs checked).
        unsafe {
            let heap = self.heap(i);
            let mut dirty: pg_sys::SnapshotData = MaybeUninit::zeroed().assume_init();
            dirty.snapshot_type = pg_sys::SnapshotType::SNAPSHOT_DIRTY;
            let scan = begin_key_scan(heap, self.index(i), &mut dirty, self.hash);
            let slot = pg_sys::table_slot_create(heap, std::ptr::null_mut());
            let mut found = None;
            while pg_sys::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, slot) {
                // dirty.xmin/xmax now describe this tuple's in-progress
                // writers: an updater or deleter first, else its inserter.
                let busy = if dirty.xmax != pg_sys::InvalidTransactionId {
                    Some(Writer { xid: dirty.xmax, inserting: false })
                } else if dirty.xmin != pg_sys::InvalidTransactionId {
                    Some(Writer { xid: dirty.xmin, inserting: true })
                } else {
                    None
                };
                let mut should_free = false;
                let tuple = pg_sys::ExecFetchSlotHeapTuple(slot, false, &mut should_free);
                let xmin = writer::of_header((*tuple).t_data);
                let own = writer::is_own(xmin);
                let n = self.cols.n;
                pg_sys::slot_getsomeattrs_int(slot, n as i32);
                let values = std::slice::from_raw_parts((*slot).tts_values, n);
                let nulls = std::slice::from_raw_parts((*slot).tts_isnull, n);
                let Some(mut row) = row_of(self.cols, values, nulls, k, i, (*slot).tts_tid) else {
                    continue; // a digest collision
                };
                if busy.is_none() && !own && row.expires_at <= now && !writer::was_running_at(xmin, arrival) {
                    // Committed and expired, and committed before the caller
                    // arrived: as good as absent.
                    continue;
                }
                row.own = own;
                row.busy = busy;
                row.visible = own || busy.is_none() && pg_sys::table_tuple_satisfies_snapshot(heap, slot, arrival);
                found = Some(row);
                break;
            }
            pg_sys::ExecDropSingleTupleTableSlot(slot);
            pg_sys::index_endscan(scan);
            found
        }
    }

    /// Under SERIALIZABLE, take the predicate locks an index scan for the
    /// key would take in every partition probed (the dirty probe takes none), so
    /// that SSI sees a reader of a key that another transaction then
    /// claims, exactly as with a SELECT on a unique index.
    fn predicate_lock(&self, k: &ClaimKey) {
        // SAFETY: a backend global of the current transaction, read on the backend's only thread.
        if unsafe { pg_sys::XactIsoLevel } != pg_sys::XACT_SERIALIZABLE as i32 {
            return;
        }
        for (i, (heap, _)) in self.parts.iter().enumerate() {
            let heap = heap.get();
            if heap.is_null() {
                continue;
            }
            // SAFETY: heap and index are open; the scan and slot are ended and dropped before the block ends.
            unsafe {
                let scan = begin_key_scan(heap, self.index(i), crate::backend::caller_snapshot(), self.hash);
                let slot = pg_sys::table_slot_create(heap, std::ptr::null_mut());
                while pg_sys::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, slot) {}
                pg_sys::ExecDropSingleTupleTableSlot(slot);
                pg_sys::index_endscan(scan);
            }
        }
        // And on the type's registrations: a claim of the key in a class
        // the type was not in writes one, which SSI then sees too.
        if let (Some(registry), false) = (self.registry, self.list.legacy) {
            type_classes::predicate_lock(registry, k);
        }
    }
}

/// The writes, under the rules of storage/mod.rs's `Store`.
impl Store for Opened {
    /// Insert a new claim row into the partition of its TTL class (the one
    /// type_classes::place picks) whose range holds its expiry (else the
    /// default partition), its type registered in that class first. The
    /// key is locked, so no other claim of the key can probe between our
    /// probe and this insert.
    fn insert(self: Box<Self>, k: &ClaimKey, new: &NewRow) {
        let class = match self.registry {
            _ if self.list.legacy => partitions::LEGACY_CLASS,
            Some(registry) => {
                let natural = ttl_class::of_ttl(new.expires_at - new.claimed_at);
                // (Under Citus, the registry is this node's shard of it: the
                // registration goes there with the key.)
                let on_shard = self.shell.is_some();
                let mut registered = self.registered.borrow_mut();
                type_classes::place(registry, on_shard, &mut registered, k, natural, new.expires_at)
            }
            None => ttl_class::of_ttl(new.expires_at - new.claimed_at),
        };
        let target = self
            .list
            .parts
            .iter()
            .position(|p| {
                p.bound.is_some_and(|b| b.class == class && b.from <= new.expires_at && new.expires_at < b.to)
            })
            .or_else(|| self.list.parts.iter().position(|p| p.bound.is_none()))
            .unwrap_or_else(|| {
                IdemError::ObjectNotInPrerequisiteState(
                    "no partition of idem.claims accepts the claim, and the default partition is missing".into(),
                    Some("Run SELECT idem_maintain(); it recreates idem.claims_default.".into()),
                )
                .fail()
            });
        let heap = self.heap(target);
        // SAFETY: `heap` is open and locked, the key is locked (Found::Absent), and the tuple is formed with
        // the heap's own descriptor.
        unsafe {
            let tuple =
                form(heap, self.cols, k, class, new.claimed_at, new.expires_at, new.state, new.fingerprint, new.result);
            pg_sys::heap_insert(heap, tuple, pg_sys::GetCurrentCommandId(true), 0, std::ptr::null_mut());
            self.index_insert(target, &mut (*tuple).t_self);
            self.remember(target, (*tuple).t_self);
        }
    }

    /// Rewrite a row with a new state and result. The key is locked and the
    /// row was found not busy: every writer of a claim row (claims,
    /// finishes, checkpoints, idem_forget) does the same, and idem_maintain
    /// moves rows only under an exclusive lock on idem.claims, so no
    /// concurrent update can get in the way of the update.
    fn rewrite(self: Box<Self>, row: &Row, k: &ClaimKey, state: u8, result: Option<pg_sys::Datum>) {
        let heap = self.heap(row.part);
        // SAFETY: the row was found (and its key locked) in this open partition; the new tuple is formed with
        // its descriptor.
        unsafe {
            let fingerprint = row.fingerprint.as_deref();
            let tuple =
                form(heap, self.cols, k, row.ttl_class, row.claimed_at, row.expires_at, state, fingerprint, result);
            let mut otid = row.tid;
            // The row may have been written by this very command (a claim and
            // its completion in one statement): make it updatable.
            pg_sys::CommandCounterIncrement();
            if compat::heap_update(heap, &mut otid, tuple) {
                self.index_insert(row.part, &mut (*tuple).t_self);
            }
            if row.own {
                self.remember(row.part, (*tuple).t_self);
            }
        }
    }

    /// Delete a row (idem_forget), under the same rule as `rewrite`.
    fn delete(&self, row: &Row, _k: &ClaimKey) {
        let mut tid = row.tid;
        // SAFETY: the row was found (and its key locked) in this open partition, at `tid`.
        unsafe {
            pg_sys::CommandCounterIncrement();
            pg_sys::simple_heap_delete(self.heap(row.part), &mut tid);
        }
    }
}

impl Opened {
    /// Where this transaction's own row of the key now is (partition `i`):
    /// RECENT, below.
    fn remember(&self, i: usize, tid: pg_sys::ItemPointerData) {
        if !RECENT_CALLBACK.get() {
            RECENT_CALLBACK.set(true);
            // SAFETY: registers, once per backend, a callback that lives as long as the library.
            unsafe { pg_sys::RegisterSubXactCallback(Some(forget_recent_on_abort), std::ptr::null_mut()) };
        }
        let target = Target {
            // SAFETY: the shell relation is open for as long as `self` lives.
            shell: self.shell.map(|r| unsafe { (*r).rd_id }),
            // SAFETY: the parent relation is open for as long as `self` lives.
            parent: unsafe { (*self.parent).rd_id },
            registry: self.registry,
        };
        // SAFETY: reads the current transaction's state; no pointer is involved.
        let xid = unsafe { pg_sys::GetTopFullTransactionIdIfAny() };
        let relid = self.list.parts[i].relid;
        RECENT.set(Some(Recent { xid, hash: self.hash, target, relid, tid, list: self.list.clone() }));
    }

    /// The digest index entry of the heap tuple at `tid` in partition `i`.
    fn index_insert(&self, i: usize, tid: *mut pg_sys::ItemPointerData) {
        // SAFETY: partition i's heap and index are open and locked; `tid`
        // points to the TID of a tuple just inserted into that heap.
        unsafe {
            let index = self.index(i);
            let mut v = [pg_sys::Datum::from(self.hash)];
            let mut n = [false];
            pg_sys::index_insert(
                index,
                v.as_mut_ptr(),
                n.as_mut_ptr(),
                tid,
                self.heap(i),
                pg_sys::IndexUniqueCheck::UNIQUE_CHECK_NO,
                false,
                index_info(&self.list, i, index),
            );
        }
    }

    /// This transaction's own live row of `k` at `tid` in partition `i`, or
    /// None if it is not (any more) there. Prunes the page on the way, as
    /// an executor's read of the page would: the completion of a claim
    /// leaves the claim's first version dead on this very page.
    fn fetch_own(&self, i: usize, tid: pg_sys::ItemPointerData, k: &ClaimKey) -> Option<Row> {
        // SAFETY: partition i's heap is open and locked; `tid` names a tuple
        // this transaction wrote in it and did not roll back (RECENT is
        // forgotten on any subtransaction abort), so its block exists.
        unsafe {
            let heap = self.heap(i);
            let mut dirty: pg_sys::SnapshotData = MaybeUninit::zeroed().assume_init();
            dirty.snapshot_type = pg_sys::SnapshotType::SNAPSHOT_DIRTY;
            let mut tuple: pg_sys::HeapTupleData = MaybeUninit::zeroed().assume_init();
            tuple.t_self = tid;
            let mut buffer: pg_sys::Buffer = 0;
            if !pg_sys::heap_fetch(heap, &mut dirty, &mut tuple, &mut buffer, true) {
                if buffer != 0 {
                    pg_sys::ReleaseBuffer(buffer);
                }
                return None;
            }
            let mut values = [pg_sys::Datum::from(0); NCOLS];
            let mut nulls = [false; NCOLS];
            pg_sys::heap_deform_tuple(&mut tuple, (*heap).rd_att, values.as_mut_ptr(), nulls.as_mut_ptr());
            let own = writer::is_own(writer::of_header(tuple.t_data));
            let row = row_of(self.cols, &values, &nulls, k, i, tid).filter(|_| own).map(|mut row| {
                row.own = true;
                row.visible = true;
                row
            });
            pg_sys::heap_page_prune_opt(heap, buffer);
            pg_sys::ReleaseBuffer(buffer);
            row
        }
    }
}

/// The IndexInfo of partition `i`'s index (for index_insert), built once
/// per list, in the list's memory context (BuildIndexInfo copies the index
/// expression: too dear to do per claim).
fn index_info(list: &PartitionList, i: usize, index: pg_sys::Relation) -> *mut pg_sys::IndexInfo {
    let p = &list.parts[i];
    if p.index_info.get().is_null() {
        // SAFETY: `index` is the open index of partition `i`; the IndexInfo is built in the list's own
        // context, which is switched back at once.
        unsafe {
            let old = pg_sys::MemoryContextSwitchTo(list.mcx);
            p.index_info.set(pg_sys::BuildIndexInfo(index));
            pg_sys::MemoryContextSwitchTo(old);
        }
    }
    p.index_info.get()
}

/// Refuse a write on the direct path, before anything is written, if a
/// publication would refuse or lose its updates (the SQL path's UPDATE is
/// refused by the executor itself).
fn check_replicable(list: &PartitionList) {
    if let Some((relid, why)) = list.unreplicable {
        let name =
            if relid == catalog::claims_oid() { "idem.claims".to_string() } else { catalog::relation_name(relid) };
        IdemError::ObjectNotInPrerequisiteState(
            format!("{name} {why}, and a publication includes it: its updates and deletes would not replicate"),
            Some("Run SELECT idem_maintain(): it sets REPLICA IDENTITY FULL on idem.claims and every partition. Publish idem.claims without a column list. See the view idem_publications.".into()),
        )
        .fail()
    }
}

/// A scan of `index` for the key digest `hash`.
///
/// # Safety
/// `heap` and `index` are open and locked; `snapshot` outlives the scan.
unsafe fn begin_key_scan(
    heap: pg_sys::Relation,
    index: pg_sys::Relation,
    snapshot: pg_sys::Snapshot,
    hash: i64,
) -> pg_sys::IndexScanDesc {
    // SAFETY: heap and index are open (this function's contract); the zeroed ScanKeyData is fully initialised
    // by ScanKeyInit before use.
    unsafe {
        let mut skey: pg_sys::ScanKeyData = MaybeUninit::zeroed().assume_init();
        pg_sys::ScanKeyInit(
            &mut skey,
            1,
            pg_sys::BTEqualStrategyNumber as _,
            pg_sys::Oid::from(pg_sys::F_INT8EQ),
            pg_sys::Datum::from(hash),
        );
        let scan = compat::index_beginscan(heap, index, snapshot, 1);
        pg_sys::index_rescan(scan, &mut skey, 1, std::ptr::null_mut(), 0);
        scan
    }
}

/// A stored row's columns as a `Row` of key `k`, or None if the row is of
/// another key (a digest collision). Writer fields are left for the caller.
///
/// # Safety
/// `values` and `nulls` are a deformed claims tuple (NCOLS columns).
unsafe fn row_of(
    cols: &Positions,
    values: &[pg_sys::Datum],
    nulls: &[bool],
    k: &ClaimKey,
    part: usize,
    tid: pg_sys::ItemPointerData,
) -> Option<Row> {
    // SAFETY: `values` and `nulls` are a deformed claims tuple in `cols`' layout (this function's contract).
    unsafe {
        if varlena_bytes(values[cols.key]) != k.key || varlena_bytes(values[cols.biz_type]) != k.biz_type {
            return None;
        }
        Some(Row {
            part,
            tid,
            state: values[cols.state].value() as u8,
            ttl_class: cols.ttl_class.map_or(partitions::LEGACY_CLASS, |c| values[c].value() as i16),
            claimed_at: values[cols.claimed_at].value() as i64,
            expires_at: values[cols.expires_at].value() as i64,
            fingerprint: (!nulls[cols.fingerprint]).then(|| varlena_bytes(values[cols.fingerprint]).to_vec()),
            result: (!nulls[cols.result]).then(|| varlena_copy(values[cols.result])),
            own: false,
            busy: None,
            visible: false,
        })
    }
}

/// A claims tuple with these columns, in `heap`'s descriptor.
///
/// # Safety
/// `heap` is an open partition of idem.claims (its shape checked).
#[allow(clippy::too_many_arguments)]
unsafe fn form(
    heap: pg_sys::Relation,
    cols: &Positions,
    k: &ClaimKey,
    ttl_class: i16,
    claimed_at: i64,
    expires_at: i64,
    state: u8,
    fingerprint: Option<&[u8]>,
    result: Option<pg_sys::Datum>,
) -> pg_sys::HeapTuple {
    let mut values = [pg_sys::Datum::from(0); NCOLS];
    let mut nulls = [false; NCOLS];
    values[cols.expires_at] = pg_sys::Datum::from(expires_at);
    values[cols.claimed_at] = pg_sys::Datum::from(claimed_at);
    if let Some(c) = cols.ttl_class {
        values[c] = pg_sys::Datum::from(ttl_class);
    }
    values[cols.state] = pg_sys::Datum::from(state as i8);
    values[cols.biz_type] = k.biz_type_text;
    values[cols.key] = k.key_text;
    match fingerprint {
        Some(f) => values[cols.fingerprint] = text_datum(f),
        None => nulls[cols.fingerprint] = true,
    }
    match result {
        Some(r) => values[cols.result] = r,
        None => nulls[cols.result] = true,
    }
    // SAFETY: `heap` is open, and `values`/`nulls` have one entry per column of its descriptor (partitions.rs
    // checked the shape).
    unsafe { pg_sys::heap_form_tuple((*heap).rd_att, values.as_mut_ptr(), nulls.as_mut_ptr()) }
}

/// Where this backend last wrote a claim row of its own, so that finishing
/// the claim just made (the common idem_claim ... idem_complete pattern)
/// needs no probe of every partition and no key lock: a row this
/// transaction has not committed is invisible to every other writer.
/// Forgotten when any subtransaction aborts (the row may be dead, and its
/// page vacuumed away), and worthless in any other transaction.
#[derive(Clone)]
struct Recent {
    /// The 64-bit id, which never repeats (a 32-bit one does once the
    /// counter wraps, and a pooled backend can live that long).
    xid: pg_sys::FullTransactionId,
    hash: i64,
    /// The table the row was found in, and its partition.
    target: Target,
    relid: pg_sys::Oid,
    tid: pg_sys::ItemPointerData,
    /// The partition list the row was written with: the cache's own
    /// reading until an invalidation makes it stale.
    list: Rc<PartitionList>,
}

static RECENT: BackendLocal<Option<Recent>> = BackendLocal::new(None);
static RECENT_CALLBACK: BackendLocal<bool> = BackendLocal::new(false);

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn forget_recent_on_abort(
    event: pg_sys::SubXactEvent::Type,
    _my: pg_sys::SubTransactionId,
    _parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    if event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB {
        RECENT.set(None);
    }
}

/// This transaction's own live row of `k`, if it is the one remembered,
/// with its table and partition locked and open. (Under Citus: the claim
/// that wrote it took the shard's metadata lock and checked the placement,
/// and both hold until this transaction ends.)
pub fn open_recent(k: &ClaimKey) -> Option<(Opened, Row)> {
    let r = RECENT.get()?;
    // SAFETY: reads the current transaction's state; no pointer is involved.
    let xid = unsafe { pg_sys::GetTopFullTransactionIdIfAny() };
    if r.hash != k.hash() || xid.value == 0 || r.xid.value != xid.value {
        return None;
    }
    // SAFETY: inside the transaction that wrote the remembered row; what is opened is closed by Opened's
    // Drop.
    unsafe {
        let lockmode = pg_sys::RowExclusiveLock as pg_sys::LOCKMODE;
        let (shell, parent) = open_target(r.target, lockmode);
        // The list the claim used, unless the partitions changed since
        // (then the cache has a new reading).
        let list = if r.list.parent == (*parent).rd_id && !r.list.stale.get() {
            r.list
        } else {
            partitions::list((*parent).rd_id)
        };
        let mut opened = Opened::new(shell, parent, lockmode, list, r.target.registry, r.hash);
        let i = opened.list.parts.iter().position(|p| p.relid == r.relid)?;
        // Only partition i is opened (by fetch_own); the others' stay
        // closed (never touched: the row is in partition i).
        opened.parts = opened
            .list
            .parts
            .iter()
            .map(|_| (Cell::new(std::ptr::null_mut()), Cell::new(std::ptr::null_mut())))
            .collect();
        let row = opened.fetch_own(i, r.tid, k)?;
        Some((opened, row))
    }
}
