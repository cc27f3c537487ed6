//! Counters of what idem answered, per database and business type, in
//! shared memory: claims, duplicates, in_progress answers, waits, errors,
//! finishes. Statistics like pg_stat_*: counted when the outcome is
//! decided (a claim whose transaction later rolls back was still counted),
//! kept until the server restarts or `idem_metrics_reset()`, never written
//! to disk. The view `idem_metrics` reads them (sql/metrics.sql).
//!
//! They need `shared_preload_libraries = 'idem'`: shared memory can only be
//! reserved while the postmaster starts. Without it every `count` is a
//! null-pointer test and nothing else, and the view says how to turn the
//! counters on.
//!
//! Layout: a fixed table of SLOTS (database, biz_type) slots, filled in
//! order and never freed, with an open-addressing index over them, plus one
//! overflow slot that takes the counts of pairs that found the table full.
//! Counters are atomics (relaxed adds: no lock on the claim path); a slot
//! is created under the `idem_metrics` LWLock and published through the
//! index with release/acquire ordering, so lookups take no lock either.
//! Each backend remembers the slots of the types it used, so the claim path
//! pays a short comparison and one atomic add per event.

use crate::backend::BackendLocal;
use crate::key::ClaimKey;
use pgrx::pg_sys;
use std::sync::OnceLock;
use std::ptr::addr_of_mut;
use std::sync::atomic::{AtomicI64, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

/// (database, biz_type) pairs the table holds; more go to the overflow slot.
pub const SLOTS: usize = 1024;
const INDEX: usize = 2 * SLOTS; // a power of two, never more than half full
const MAX_NAME: usize = 64; // biz_type is at most 64 bytes (key.rs)
const OVERFLOW: u32 = u32::MAX;

/// One outcome the protocol decided, each a counter of its own.
#[derive(Clone, Copy)]
#[repr(usize)]
pub enum Event {
    /// A new claim (claimed = true, state = new).
    Claimed = 0,
    /// A lease that ran out, taken over (claimed = true).
    Takeover,
    /// A duplicate answered with a completed outcome.
    DuplicateCompleted,
    /// A duplicate answered with a failed outcome.
    DuplicateFailed,
    /// A claim answered in_progress (wait => false, a running lease, or
    /// the caller's own unfinished claim).
    InProgress,
    /// A wait for another transaction that held the key (its time goes to
    /// the wait-time counter).
    Wait,
    /// ID001 raised.
    FingerprintMismatch,
    /// ID003 raised.
    NotHeld,
    /// 40001 raised.
    SerializationFailure,
    /// idem_complete stored an outcome.
    Completed,
    /// idem_fail stored a failure.
    Failed,
    /// idem_checkpoint recorded a recovery point.
    Checkpointed,
}

const NEVENTS: usize = Event::Checkpointed as usize + 1;
const WAIT_US: usize = NEVENTS;
const NCOUNTERS: usize = NEVENTS + 1;

#[repr(C, align(64))]
struct Slot {
    counters: [AtomicU64; NCOUNTERS],
    /// When counting began for this slot (created or reset), PostgreSQL
    /// timestamp microseconds.
    since: AtomicI64,
    // Written once, before the slot is published in the index.
    dboid: u32,
    name_len: u8,
    name: [u8; MAX_NAME],
}

impl Slot {
    fn name(&self) -> &[u8] {
        &self.name[..self.name_len as usize]
    }

    fn add(&self, counter: usize, n: u64) {
        self.counters[counter].fetch_add(n, Ordering::Relaxed);
    }

    fn reset(&self, now: i64) {
        for c in &self.counters {
            c.store(0, Ordering::Relaxed);
        }
        self.since.store(now, Ordering::Relaxed);
    }

    fn is_zero(&self) -> bool {
        self.counters.iter().all(|c| c.load(Ordering::Relaxed) == 0)
    }
}

#[repr(C)]
struct Shared {
    lock: *mut pg_sys::LWLock,
    /// Slots in use: slots[..used] are published.
    used: AtomicU32,
    /// 0: empty; else 1 + the slot's position.
    index: [AtomicU32; INDEX],
    overflow: Slot,
    slots: [Slot; SLOTS],
}

/// The table in shared memory; null unless idem was preloaded.
static SHARED: AtomicPtr<Shared> = AtomicPtr::new(std::ptr::null_mut());

/// The hooks installed before ours, chained to first; set once, in
/// _PG_init while the postmaster preloads (before any backend exists).
static PREV_SHMEM_REQUEST_HOOK: OnceLock<pg_sys::shmem_request_hook_type> = OnceLock::new();
static PREV_SHMEM_STARTUP_HOOK: OnceLock<pg_sys::shmem_startup_hook_type> = OnceLock::new();
const SHMEM_NAME: &std::ffi::CStr = c"idem metrics";
const TRANCHE: &std::ffi::CStr = c"idem_metrics";

/// From _PG_init: reserve the table when the library is being preloaded.
pub fn init() {
    unsafe {
        if !pg_sys::process_shared_preload_libraries_in_progress {
            return;
        }
        if PREV_SHMEM_REQUEST_HOOK.set(pg_sys::shmem_request_hook).is_err()
            || PREV_SHMEM_STARTUP_HOOK.set(pg_sys::shmem_startup_hook).is_err()
        {
            return; // already chained (the library is preloaded once)
        }
        pg_sys::shmem_request_hook = Some(shmem_request);
        pg_sys::shmem_startup_hook = Some(shmem_startup);
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn shmem_request() {
    unsafe {
        if let Some(prev) = PREV_SHMEM_REQUEST_HOOK.get().copied().flatten() {
            prev();
        }
        pg_sys::RequestAddinShmemSpace(std::mem::size_of::<Shared>());
        pg_sys::RequestNamedLWLockTranche(TRANCHE.as_ptr(), 1);
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn shmem_startup() {
    unsafe {
        if let Some(prev) = PREV_SHMEM_STARTUP_HOOK.get().copied().flatten() {
            prev();
        }
        // AddinShmemInitLock (lwlocklist.h: 21 on every supported major).
        let init_lock = addr_of_mut!((*pg_sys::MainLWLockArray.add(21)).lock);
        pg_sys::LWLockAcquire(init_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        let mut found = false;
        let sh =
            pg_sys::ShmemInitStruct(SHMEM_NAME.as_ptr(), std::mem::size_of::<Shared>(), &mut found).cast::<Shared>();
        if !found {
            // All-zero is a valid empty table (atomics at 0, no slot used).
            std::ptr::write_bytes(sh.cast::<u8>(), 0, std::mem::size_of::<Shared>());
            addr_of_mut!((*sh).lock).write(addr_of_mut!((*pg_sys::GetNamedLWLockTranche(TRANCHE.as_ptr())).lock));
            (*sh).overflow.since.store(pg_sys::GetCurrentTimestamp(), Ordering::Relaxed);
        }
        pg_sys::LWLockRelease(init_lock);
        SHARED.store(sh, Ordering::Release);
    }
}

fn shared() -> Option<&'static Shared> {
    // SAFETY: set once at startup (inherited by every backend through
    // fork), to memory that lives as long as the server.
    unsafe { SHARED.load(Ordering::Relaxed).as_ref() }
}

/// Whether the counters run (idem was preloaded).
pub fn on() -> bool {
    shared().is_some()
}

/// Count `event` for `k`'s business type in this database.
#[inline]
pub fn count(k: &ClaimKey, event: Event) {
    if let Some(sh) = shared() {
        slot_of(sh, k.biz_type).add(event as usize, 1);
    }
}

/// A wait for another transaction, counted when it begins and timed until
/// this is dropped (also when the wait ends in an error: lock_timeout,
/// statement_timeout, a deadlock, a cancel).
pub struct Wait(Option<(&'static Slot, Instant)>);

pub fn wait(k: &ClaimKey) -> Wait {
    Wait(shared().map(|sh| {
        let slot = slot_of(sh, k.biz_type);
        slot.add(Event::Wait as usize, 1);
        (slot, Instant::now())
    }))
}

impl Drop for Wait {
    fn drop(&mut self) {
        // No call into PostgreSQL here: this may run while an error unwinds.
        if let Some((slot, started)) = self.0 {
            slot.add(WAIT_US, started.elapsed().as_micros() as u64);
        }
    }
}

/// The slots this backend has used, by biz_type (its database never changes).
static KNOWN: BackendLocal<Vec<(Box<[u8]>, u32)>> = BackendLocal::new(Vec::new());
const KNOWN_MAX: usize = 64;

fn slot_of(sh: &'static Shared, biz_type: &[u8]) -> &'static Slot {
    let known = KNOWN.with(|k| k.iter().find(|(name, _)| **name == *biz_type).map(|(_, s)| *s));
    let s = known.unwrap_or_else(|| {
        let s = find_or_add(sh, biz_type);
        KNOWN.with(|k| {
            if k.len() < KNOWN_MAX {
                k.push((biz_type.into(), s))
            }
        });
        s
    });
    if s == OVERFLOW {
        &sh.overflow
    } else {
        &sh.slots[s as usize]
    }
}

fn database() -> u32 {
    unsafe { pg_sys::MyDatabaseId }.to_u32()
}

/// FNV-1a of the database and the name.
fn hash(db: u32, name: &[u8]) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in db.to_le_bytes().iter().chain(name) {
        h = (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    h as usize
}

/// The slot of (db, name), or the index position where it would go.
fn lookup(sh: &Shared, db: u32, name: &[u8]) -> Result<u32, usize> {
    let mut pos = hash(db, name) & (INDEX - 1);
    loop {
        let e = sh.index[pos].load(Ordering::Acquire);
        if e == 0 {
            return Err(pos);
        }
        let slot = &sh.slots[(e - 1) as usize];
        if slot.dboid == db && slot.name() == name {
            return Ok(e - 1);
        }
        pos = (pos + 1) & (INDEX - 1);
    }
}

fn find_or_add(sh: &Shared, name: &[u8]) -> u32 {
    let db = database();
    if let Ok(s) = lookup(sh, db, name) {
        return s;
    }
    unsafe {
        pg_sys::LWLockAcquire(sh.lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        let s = match lookup(sh, db, name) {
            Ok(s) => s,
            Err(pos) => {
                let used = sh.used.load(Ordering::Relaxed);
                if used as usize >= SLOTS || name.len() > MAX_NAME {
                    OVERFLOW
                } else {
                    // Fill the slot, then publish it: readers that find it
                    // through the index (acquire) or `used` see it whole.
                    let slot = std::ptr::addr_of!(sh.slots[used as usize]).cast_mut();
                    addr_of_mut!((*slot).dboid).write(db);
                    addr_of_mut!((*slot).name_len).write(name.len() as u8);
                    std::ptr::copy_nonoverlapping(name.as_ptr(), addr_of_mut!((*slot).name).cast::<u8>(), name.len());
                    (*slot).reset(pg_sys::GetCurrentTimestamp());
                    sh.index[pos].store(used + 1, Ordering::Release);
                    sh.used.store(used + 1, Ordering::Release);
                    used
                }
            }
        };
        pg_sys::LWLockRelease(sh.lock);
        s
    }
}

/// One row of idem_metrics: a business type of this database (or, with
/// `biz_type` None, the overflow slot, shared by all databases).
pub struct Row {
    pub biz_type: Option<Vec<u8>>,
    pub counters: [u64; NEVENTS],
    pub wait_us: u64,
    pub since: i64,
}

fn row_of(slot: &Slot, biz_type: Option<Vec<u8>>) -> Row {
    let mut counters = [0; NEVENTS];
    for (c, v) in slot.counters[..NEVENTS].iter().zip(counters.iter_mut()) {
        *v = c.load(Ordering::Relaxed);
    }
    Row {
        biz_type,
        counters,
        wait_us: slot.counters[WAIT_US].load(Ordering::Relaxed),
        since: slot.since.load(Ordering::Relaxed),
    }
}

/// This database's counters, by business type in the order first used;
/// then the overflow slot if anything was counted in it. None when the
/// counters are off.
pub fn rows() -> Option<Vec<Row>> {
    let sh = shared()?;
    let db = database();
    let used = sh.used.load(Ordering::Acquire) as usize;
    let mut rows: Vec<Row> =
        sh.slots[..used].iter().filter(|s| s.dboid == db).map(|s| row_of(s, Some(s.name().to_vec()))).collect();
    if !sh.overflow.is_zero() {
        rows.push(row_of(&sh.overflow, None));
    }
    Some(rows)
}

/// Slots in use (all databases) and whether any pair went to the overflow
/// slot since it was last reset; None when the counters are off.
pub fn usage() -> Option<(usize, bool)> {
    let sh = shared()?;
    Some((sh.used.load(Ordering::Acquire) as usize, !sh.overflow.is_zero()))
}

/// Zero this database's counters (and the overflow slot's); false when the
/// counters are off.
pub fn reset() -> bool {
    let Some(sh) = shared() else { return false };
    let db = database();
    let now = unsafe { pg_sys::GetCurrentTimestamp() };
    let used = sh.used.load(Ordering::Acquire) as usize;
    for s in sh.slots[..used].iter().filter(|s| s.dboid == db) {
        s.reset(now);
    }
    sh.overflow.reset(now);
    true
}
