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
use crate::errors::IdemError;
use pgrx::pg_sys;
use std::ptr::addr_of_mut;
use std::sync::atomic::{fence, AtomicBool, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// (database, biz_type) slots the table holds, all databases together.
pub const SLOTS: usize = 1024;
/// Slots one database may hold, its `(other types)` row included: no
/// database (nor a role in it) can take the table from the others.
pub const SHARE: usize = SLOTS / 4;
const INDEX: usize = 2 * SLOTS; // a power of two, never more than half full of entries
const MAX_NAME: usize = 64; // biz_type is at most 64 bytes (key.rs)
/// The name of a database's row for the counts no type of its own holds.
pub const OTHER_TYPES: &str = "(other types)";
/// Index entries: 0 empty, TOMBSTONE a freed slot's entry, else 1 + slot.
const TOMBSTONE: u32 = u32::MAX;
/// Where a backend counts: a slot of the table, the global overflow slot.
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

pub const NEVENTS: usize = Event::Checkpointed as usize + 1;
const WAIT_US: usize = NEVENTS;
/// In a database's (other types) slot: counts that went there because the
/// database's share was full (not because their type does not exist).
const NO_ROOM: usize = NEVENTS + 1;
const NCOUNTERS: usize = NEVENTS + 2;

/// Events that show a claim of the type exists once the transaction that
/// counted them commits: it wrote one, or found one.
fn shows_a_claim(event: usize) -> bool {
    event != Event::Wait as usize
        && event != Event::NotHeld as usize
        && event != Event::FingerprintMismatch as usize
        && event != Event::SerializationFailure as usize
}

#[repr(C, align(64))]
struct Slot {
    counters: [AtomicU64; NCOUNTERS],
    /// When counting began for this slot (created or reset), PostgreSQL
    /// timestamp microseconds.
    since: AtomicI64,
    /// A seqlock over the fields below: odd while they are being written
    /// (under the table's lock), bumped by every (re)use and every release,
    /// so that a backend's remembered (slot, generation) goes stale when
    /// the slot changes hands.
    generation: AtomicU32,
    /// 0: a free slot.
    dboid: AtomicU32,
    /// 0: the database's (other types) slot.
    name_len: u8,
    name: [u8; MAX_NAME],
}

impl Slot {
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

    /// Whether this is (db, name), read without the lock: false while the
    /// slot is being written, or if it changed while being read. Returns
    /// the generation the answer holds for.
    fn holds(&self, db: u32, name: &[u8]) -> Option<u32> {
        let g = self.generation.load(Ordering::Acquire);
        if g & 1 == 1 || self.dboid.load(Ordering::Relaxed) != db {
            return None;
        }
        // SAFETY: plain bytes in shared memory; a torn read is caught by
        // the generation check after it.
        let (len, bytes) = unsafe {
            let len = std::ptr::read_volatile(&self.name_len) as usize;
            (len, std::ptr::read_volatile(&self.name))
        };
        let same = len == name.len() && bytes[..len] == *name;
        fence(Ordering::Acquire);
        (same && self.generation.load(Ordering::Relaxed) == g).then_some(g)
    }

    /// The name, read under the table's lock or by a reader that checks
    /// the generation after.
    fn name(&self) -> Vec<u8> {
        self.name[..self.name_len as usize].to_vec()
    }

    /// (Re)write the slot's identity, under the table's lock.
    ///
    /// # Safety
    /// The caller holds the table's lock exclusively: no other writer, and
    /// readers detect the write through the generation (`holds`).
    unsafe fn write(&self, db: u32, name: &[u8]) {
        // SAFETY: the caller holds the table's lock (this function's contract), so no other backend writes
        // the slot; `name` fits (MAX_NAME is checked by every caller), and readers see the generation odd
        // while it changes.
        unsafe {
            let this = (self as *const Slot).cast_mut();
            self.generation.fetch_add(1, Ordering::Relaxed); // odd: being written
            fence(Ordering::Release);
            self.dboid.store(db, Ordering::Relaxed);
            addr_of_mut!((*this).name_len).write_volatile(name.len() as u8);
            let dst = addr_of_mut!((*this).name).cast::<u8>();
            for (i, b) in name.iter().enumerate() {
                dst.add(i).write_volatile(*b);
            }
            self.generation.fetch_add(1, Ordering::Release); // even: stable
        }
    }
}

#[repr(C)]
struct Shared {
    lock: *mut pg_sys::LWLock,
    /// Slots in use (all databases).
    used: AtomicU32,
    /// Tombstones in the index; rebuilt (under the lock) when they pile up.
    tombstones: AtomicU32,
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
    // SAFETY: _PG_init runs on the backend's (or postmaster's) only thread; the previous hooks are saved
    // before ours replace them.
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
    // SAFETY: called by the postmaster while shared memory is requested, the only time RequestAddinShmemSpace
    // and RequestNamedLWLockTranche are allowed.
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
    // SAFETY: called once per process at shared memory startup, under AddinShmemInitLock as ShmemInitStruct
    // requires; the segment is sized by shmem_request.
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
            // All-zero is a valid empty table (atomics at 0, every slot free).
            std::ptr::write_bytes(sh.cast::<u8>(), 0, std::mem::size_of::<Shared>());
            addr_of_mut!((*sh).lock).write(addr_of_mut!((*pg_sys::GetNamedLWLockTranche(TRANCHE.as_ptr())).lock));
            (*sh).overflow.since.store(crate::backend::now(), Ordering::Relaxed);
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

fn database() -> u32 {
    // SAFETY: a backend global, set once at connection, read on the backend's only thread.
    unsafe { pg_sys::MyDatabaseId }.to_u32()
}

fn slot_at(sh: &'static Shared, s: u32) -> &'static Slot {
    if s == OVERFLOW {
        &sh.overflow
    } else {
        &sh.slots[s as usize]
    }
}

// ---------------------------------------------------------------------------
// Counting: the claim path.

/// Count `event` for `biz_type` in this database. Called at the API
/// boundary (api.rs, fmgr.rs), once per call and key, from what the call
/// answered or raised; only a wait is counted where it happens (`wait`).
#[inline]
pub fn count(biz_type: &[u8], event: Event) {
    if let Some(sh) = shared() {
        match known_slot(sh, biz_type) {
            Some(slot) => slot.add(event as usize, 1),
            None => {
                count_unplaced(sh, biz_type, event as usize, 1);
            }
        }
    }
}

/// Count an error a call raised, if it is one the counters keep
/// (fmgr::entry, for every SQL function).
pub fn count_error(e: &IdemError) {
    let (name, event) = match e {
        IdemError::FingerprintMismatch(name) => (name, Event::FingerprintMismatch),
        IdemError::NotClaimed { key: name, .. } => (name, Event::NotHeld),
        IdemError::SerializationFailure(name) => (name, Event::SerializationFailure),
        _ => return,
    };
    count(&name.biz_type, event);
}

/// A wait for another transaction, counted when it begins and timed until
/// this is dropped (also when the wait ends in an error: lock_timeout,
/// statement_timeout, a deadlock, a cancel).
pub struct Wait(Option<(Target, Instant)>);

enum Target {
    Slot(&'static Slot),
    /// A type with no slot yet: its counts wait in the backend (`PENDING`).
    Pending(Box<[u8]>),
}

pub fn wait(biz_type: &[u8]) -> Wait {
    Wait(shared().map(|sh| {
        let target = match known_slot(sh, biz_type) {
            Some(slot) => {
                slot.add(Event::Wait as usize, 1);
                Target::Slot(slot)
            }
            None => match count_unplaced(sh, biz_type, Event::Wait as usize, 1) {
                Some(slot) => Target::Slot(slot),
                None => Target::Pending(biz_type.into()),
            },
        };
        (target, Instant::now())
    }))
}

fn target_add(target: &Target, counter: usize, n: u64) {
    match target {
        Target::Slot(slot) => slot.add(counter, n),
        Target::Pending(name) => {
            // No call into PostgreSQL: the entry exists (wait() made it).
            PENDING.with(|p| {
                if let Some(e) = p.iter_mut().find(|e| *e.name == **name) {
                    e.counters[counter] += n;
                }
            })
        }
    }
}

impl Drop for Wait {
    fn drop(&mut self) {
        // No call into PostgreSQL here: this may run while an error unwinds.
        if let Some((target, started)) = &self.0 {
            target_add(target, WAIT_US, started.elapsed().as_micros() as u64);
        }
    }
}

/// The slots this backend has used, by biz_type (its database never
/// changes), with the generation each had: a slot released and reused
/// since is looked up again.
/// (biz_type, slot, the slot's generation when looked up).
type Known = (Box<[u8]>, u32, u32);
static KNOWN: BackendLocal<Vec<Known>> = BackendLocal::new(Vec::new());
const KNOWN_MAX: usize = 64;

/// The slot of (this database, biz_type) if it has one. The hot path: a
/// type this backend counted before costs a comparison of names and one
/// atomic load; no lock, no catalog.
#[inline]
fn known_slot(sh: &'static Shared, biz_type: &[u8]) -> Option<&'static Slot> {
    let remembered = KNOWN.with(|k| k.iter().find(|(name, _, _)| **name == *biz_type).map(|(_, s, g)| (*s, *g)));
    if let Some((s, g)) = remembered {
        let slot = &sh.slots[s as usize];
        if slot.generation.load(Ordering::Relaxed) == g {
            return Some(slot);
        }
        KNOWN.with(|k| k.retain(|(_, cached, _)| *cached != s));
    }
    let (s, g) = lookup(sh, database(), biz_type).ok()?;
    KNOWN.with(|k| {
        if k.len() < KNOWN_MAX {
            k.push((biz_type.into(), s, g))
        }
    });
    Some(&sh.slots[s as usize])
}

/// A count for a type that has no slot: kept in the backend until the
/// transaction ends (the slot is made then if the transaction commits
/// having written or found a claim of the type), or, when the backend
/// already keeps PENDING_MAX types, put in the database's (other types)
/// row. Returns that row's slot when it was used.
fn count_unplaced(sh: &'static Shared, biz_type: &[u8], counter: usize, n: u64) -> Option<&'static Slot> {
    register_callbacks();
    // SAFETY: called inside a transaction (a counted protocol call).
    let subxact = unsafe { pg_sys::GetCurrentSubTransactionId() };
    let kept = PENDING.with(|p| {
        let i = match p.iter().position(|e| *e.name == *biz_type) {
            Some(i) => i,
            None if p.len() < PENDING_MAX => {
                p.push(Pending { name: biz_type.into(), counters: [0; NCOUNTERS], shown_in: 0 });
                ANY_PENDING.store(true, Ordering::Relaxed);
                p.len() - 1
            }
            None => return false,
        };
        let e = &mut p[i];
        e.counters[counter] += n;
        if shows_a_claim(counter) && (e.shown_in == 0 || subxact < e.shown_in) {
            e.shown_in = subxact;
        }
        true
    });
    if kept {
        return None;
    }
    // More new types in one transaction than a database's share holds (if
    // the kept ones exist, some of them find no room at commit, which
    // flags the database's share as full).
    let other = slot_at(sh, with_lock(sh, |sh| other_types(sh, database(), true)));
    other.add(counter, n);
    Some(other)
}

/// Counts of one type with no slot, kept until the transaction ends.
struct Pending {
    name: Box<[u8]>,
    counters: [u64; NCOUNTERS],
    /// The (sub)transaction that first showed a claim of the type exists
    /// (shows_a_claim); 0: none did, or they all rolled back.
    shown_in: pg_sys::SubTransactionId,
}

static PENDING: BackendLocal<Vec<Pending>> = BackendLocal::new(Vec::new());
/// More new types than one database can hold go to (other types) at once.
const PENDING_MAX: usize = SHARE;

static CALLBACKS: BackendLocal<bool> = BackendLocal::new(false);

fn register_callbacks() {
    if !CALLBACKS.get() {
        // SAFETY: registers callbacks that live as long as the library (a loaded library is never unloaded),
        // once per backend.
        unsafe {
            pg_sys::RegisterXactCallback(Some(xact_callback), std::ptr::null_mut());
            pg_sys::RegisterSubXactCallback(Some(subxact_callback), std::ptr::null_mut());
        }
        CALLBACKS.set(true);
    }
}

/// Whether PENDING holds anything: the callbacks run at the end of every
/// transaction of the backend once registered, and return at once when
/// nothing waits (one load, no borrow, no pg_guard frame).
static ANY_PENDING: AtomicBool = AtomicBool::new(false);

unsafe extern "C-unwind" fn xact_callback(event: pg_sys::XactEvent::Type, arg: *mut std::ffi::c_void) {
    if ANY_PENDING.load(Ordering::Relaxed) {
        // SAFETY: forwarded from PostgreSQL's transaction callback, with its arguments.
        unsafe { flush_pending(event, arg) }
    }
}

unsafe extern "C-unwind" fn subxact_callback(
    event: pg_sys::SubXactEvent::Type,
    my_subid: pg_sys::SubTransactionId,
    parent: pg_sys::SubTransactionId,
    arg: *mut std::ffi::c_void,
) {
    if ANY_PENDING.load(Ordering::Relaxed) {
        // SAFETY: forwarded from PostgreSQL's subtransaction callback, with its arguments.
        unsafe { forget_rolled_back(event, my_subid, parent, arg) }
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn flush_pending(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    let committing = match event {
        // Before the commit (or PREPARE): the catalog can still be read.
        XACT_EVENT_PRE_COMMIT | XACT_EVENT_PARALLEL_PRE_COMMIT | XACT_EVENT_PRE_PREPARE => true,
        XACT_EVENT_ABORT | XACT_EVENT_PARALLEL_ABORT => false,
        _ => return,
    };
    let pending = PENDING.with(std::mem::take);
    ANY_PENDING.store(false, Ordering::Relaxed);
    if pending.is_empty() {
        return;
    }
    let Some(sh) = shared() else { return };
    let db = database();
    with_lock(sh, |sh| {
        for e in &pending {
            // A type that got its slot meanwhile (another transaction's
            // commit made it) counts there, committed or not.
            let s = match lookup(sh, db, &e.name) {
                Ok((s, _)) => s,
                Err(_) if committing && e.shown_in != 0 => find_or_add(sh, db, &e.name),
                Err(_) => other_types(sh, db, committing),
            };
            let slot = slot_at(sh, s);
            for (c, n) in e.counters.iter().enumerate() {
                if *n > 0 {
                    slot.add(c, *n);
                }
            }
        }
    });
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn forget_rolled_back(
    event: pg_sys::SubXactEvent::Type,
    my_subid: pg_sys::SubTransactionId,
    _parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    if event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB {
        // What a rolled-back subtransaction (or one of its children, whose
        // ids are larger) wrote is gone: it shows no claim any more.
        PENDING.with(|p| {
            for e in p.iter_mut().filter(|e| e.shown_in >= my_subid) {
                e.shown_in = 0;
            }
        });
    }
}

// ---------------------------------------------------------------------------
// The table: lookups without the lock, changes under it.

/// FNV-1a of the database and the name.
fn hash(db: u32, name: &[u8]) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in db.to_le_bytes().iter().chain(name) {
        h = (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    h as usize
}

/// The slot of (db, name) and its generation, or the index position where
/// it would go (the first tombstone or empty entry on its probe path).
/// Without the lock a miss is not final (a concurrent rebuild or reuse):
/// callers that would create the slot look again under the lock.
fn lookup(sh: &Shared, db: u32, name: &[u8]) -> Result<(u32, u32), usize> {
    let mut pos = hash(db, name) & (INDEX - 1);
    let mut free = None;
    for _ in 0..INDEX {
        match sh.index[pos].load(Ordering::Acquire) {
            0 => return Err(free.unwrap_or(pos)),
            TOMBSTONE => {
                free.get_or_insert(pos);
            }
            e => {
                if let Some(g) = sh.slots[(e - 1) as usize].holds(db, name) {
                    return Ok((e - 1, g));
                }
            }
        }
        pos = (pos + 1) & (INDEX - 1);
    }
    Err(free.unwrap_or(usize::MAX))
}

fn with_lock<R>(sh: &'static Shared, f: impl FnOnce(&'static Shared) -> R) -> R {
    // SAFETY: `sh.lock` is the named tranche's lock, set up in shmem_startup.
    unsafe { pg_sys::LWLockAcquire(sh.lock, pg_sys::LWLockMode::LW_EXCLUSIVE) };
    // Nothing in `f` raises an error: the lock is released below.
    let r = f(sh);
    // SAFETY: this backend acquired `sh.lock` just above.
    unsafe { pg_sys::LWLockRelease(sh.lock) };
    r
}

/// Slots database `db` holds (its (other types) slot included). Under the lock.
fn held_by(sh: &Shared, db: u32) -> usize {
    sh.slots.iter().filter(|s| s.dboid.load(Ordering::Relaxed) == db).count()
}

/// Under the lock: the slot of (db, name), made if the database's share
/// and the table have room (slots of dropped databases are released for
/// it first when the table is full); else the database's (other types)
/// slot, whose NO_ROOM counter then says a type found no room.
fn find_or_add(sh: &'static Shared, db: u32, name: &[u8]) -> u32 {
    if let Ok((s, _)) = lookup(sh, db, name) {
        return s;
    }
    let held = held_by(sh, db);
    let has_other = lookup(sh, db, b"").is_ok();
    // The database keeps room for its (other types) slot.
    let room = held + usize::from(!has_other) < SHARE;
    let made = if room { add(sh, db, name, true) } else { None };
    made.unwrap_or_else(|| {
        let other = other_types(sh, db, true);
        slot_at(sh, other).add(NO_ROOM, 1);
        other
    })
}

/// Under the lock: database `db`'s (other types) slot, made if missing;
/// the global overflow slot when the table is full. `catalog`: whether the
/// catalog may be read (not while a transaction aborts) to release the
/// slots of dropped databases when the table is full.
fn other_types(sh: &'static Shared, db: u32, catalog: bool) -> u32 {
    match lookup(sh, db, b"") {
        Ok((s, _)) => s,
        Err(_) => add(sh, db, b"", catalog).unwrap_or(OVERFLOW),
    }
}

/// Under the lock: a free slot for (db, name) (absent, checked by the
/// caller), or None when the table is full.
fn add(sh: &'static Shared, db: u32, name: &[u8], catalog: bool) -> Option<u32> {
    if name.len() > MAX_NAME {
        return None;
    }
    let mut free = sh.slots.iter().position(|s| s.dboid.load(Ordering::Relaxed) == 0);
    if free.is_none() && catalog {
        release_dropped_databases(sh);
        free = sh.slots.iter().position(|s| s.dboid.load(Ordering::Relaxed) == 0);
    }
    let s = free? as u32;
    if sh.tombstones.load(Ordering::Relaxed) as usize > SLOTS / 2 {
        rebuild_index(sh);
    }
    let Err(pos) = lookup(sh, db, name) else { unreachable!("the caller checked that (db, name) has no slot") };
    let slot = &sh.slots[s as usize];
    // SAFETY: called under the table's lock (with_lock).
    unsafe { slot.write(db, name) };
    slot.reset(crate::backend::now());
    if sh.index[pos].swap(s + 1, Ordering::Release) == TOMBSTONE {
        sh.tombstones.fetch_sub(1, Ordering::Relaxed);
    }
    sh.used.fetch_add(1, Ordering::Relaxed);
    Some(s)
}

/// Under the lock: free slot `s`; its counts go to `fold_into` if given.
fn release(sh: &'static Shared, s: u32, fold_into: Option<u32>) {
    let slot = &sh.slots[s as usize];
    if let Some(into) = fold_into {
        let into = slot_at(sh, into);
        for (c, v) in slot.counters.iter().enumerate() {
            into.add(c, v.load(Ordering::Relaxed));
        }
    }
    if let Some(pos) = (0..INDEX).find(|&p| sh.index[p].load(Ordering::Relaxed) == s + 1) {
        sh.index[pos].store(TOMBSTONE, Ordering::Release);
        sh.tombstones.fetch_add(1, Ordering::Relaxed);
    }
    // SAFETY: called under the table's lock (with_lock).
    unsafe { slot.write(0, b"") };
    slot.reset(0);
    sh.used.fetch_sub(1, Ordering::Relaxed);
}

/// Under the lock: the index without tombstones. Readers without the lock
/// may miss a slot meanwhile, which only sends them to the locked path.
fn rebuild_index(sh: &Shared) {
    for e in &sh.index {
        e.store(0, Ordering::Release);
    }
    for (s, slot) in sh.slots.iter().enumerate() {
        let db = slot.dboid.load(Ordering::Relaxed);
        if db != 0 {
            let mut pos = hash(db, &slot.name()) & (INDEX - 1);
            while sh.index[pos].load(Ordering::Relaxed) != 0 {
                pos = (pos + 1) & (INDEX - 1);
            }
            sh.index[pos].store(s as u32 + 1, Ordering::Release);
        }
    }
    sh.tombstones.store(0, Ordering::Relaxed);
}

/// Under the lock: release the slots of databases that no longer exist
/// (a syscache probe per database). How many were released.
fn release_dropped_databases(sh: &'static Shared) -> usize {
    let mut alive: Vec<(u32, bool)> = Vec::new();
    let mut n = 0;
    for s in 0..SLOTS {
        let db = sh.slots[s].dboid.load(Ordering::Relaxed);
        if db == 0 {
            continue;
        }
        let exists = match alive.iter().find(|(d, _)| *d == db) {
            Some((_, e)) => *e,
            None => {
                // SAFETY: a syscache existence check by OID: no pointer is kept.
                let e = unsafe {
                    pg_sys::SearchSysCacheExists(
                        pg_sys::SysCacheIdentifier::DATABASEOID as _,
                        pg_sys::Datum::from(db),
                        pg_sys::Datum::from(0),
                        pg_sys::Datum::from(0),
                        pg_sys::Datum::from(0),
                    )
                };
                alive.push((db, e));
                e
            }
        };
        if !exists {
            release(sh, s as u32, None);
            n += 1;
        }
    }
    n
}

// ---------------------------------------------------------------------------
// Reading, resetting, reclaiming (SQL functions in api.rs).

/// One row of idem_metrics: a business type of this database, its
/// (other types) row, or (`biz_type` None) the global overflow slot.
pub struct Row {
    pub biz_type: Option<Vec<u8>>,
    pub counters: [u64; NEVENTS],
    pub wait_us: u64,
    pub since: i64,
    pub note: Option<String>,
}

fn row_of(slot: &Slot, biz_type: Option<Vec<u8>>, note: Option<String>) -> Row {
    let mut counters = [0; NEVENTS];
    for (c, v) in slot.counters[..NEVENTS].iter().zip(counters.iter_mut()) {
        *v = c.load(Ordering::Relaxed);
    }
    Row {
        biz_type,
        counters,
        wait_us: slot.counters[WAIT_US].load(Ordering::Relaxed),
        since: slot.since.load(Ordering::Relaxed),
        note,
    }
}

/// This database's counters by business type (in slot order), then its
/// (other types) row, then the overflow slot if anything was counted in
/// it. None when the counters are off.
pub fn rows() -> Option<Vec<Row>> {
    let sh = shared()?;
    let db = database();
    let mut rows = Vec::new();
    let mut other = None;
    for slot in &sh.slots {
        // A consistent read of the slot's identity, or it is skipped (it
        // is being reused this very moment).
        let g = slot.generation.load(Ordering::Acquire);
        if g & 1 == 1 || slot.dboid.load(Ordering::Relaxed) != db {
            continue;
        }
        let name = slot.name();
        if slot.holds(db, &name) != Some(g) {
            continue;
        }
        if name.is_empty() {
            let no_room = slot.counters[NO_ROOM].load(Ordering::Relaxed);
            other = Some(row_of(slot, Some(OTHER_TYPES.as_bytes().to_vec()), Some(other_types_note(no_room))));
        } else {
            rows.push(row_of(slot, Some(name), None));
        }
    }
    rows.extend(other);
    if !sh.overflow.is_zero() {
        rows.push(row_of(&sh.overflow, None, Some(format!(
            "overflow: all {SLOTS} (database, biz_type) slots of the server were in use; the counts that found no room, all databases together"
        ))));
    }
    Some(rows)
}

fn other_types_note(no_room: u64) -> String {
    let mut note = String::from("counts of calls on types that do not exist here (the call's transaction rolled back, or it wrote and found no claim of the type), and of types whose row was reclaimed");
    if no_room > 0 {
        note += &format!("; existing types found this database's share of {SHARE} slots full ({no_room} times)");
    }
    note
}

/// Slots in use (all databases) and whether anything went to the global
/// overflow slot since it was last reset; None when the counters are off.
pub fn usage() -> Option<(usize, bool)> {
    let sh = shared()?;
    Some((sh.used.load(Ordering::Relaxed) as usize, !sh.overflow.is_zero()))
}

/// This database's slots (its (other types) slot included) and the counts
/// of existing types that found its share full; None when the counters
/// are off.
pub fn database_usage() -> Option<(usize, u64)> {
    let sh = shared()?;
    let db = database();
    Some(with_lock(sh, |sh| {
        let no_room =
            lookup(sh, db, b"").map_or(0, |(s, _)| sh.slots[s as usize].counters[NO_ROOM].load(Ordering::Relaxed));
        (held_by(sh, db), no_room)
    }))
}

/// Zero this database's counters (and the overflow slot's); false when the
/// counters are off.
pub fn reset() -> bool {
    let Some(sh) = shared() else { return false };
    let db = database();
    let now = crate::backend::now();
    with_lock(sh, |sh| {
        for s in sh.slots.iter().filter(|s| s.dboid.load(Ordering::Relaxed) == db) {
            s.reset(now);
        }
        sh.overflow.reset(now);
    });
    true
}

/// The business types of this database that hold a slot, with their
/// stats_since (for idem.metrics_reclaim); empty when the counters are off.
pub fn types() -> Vec<(Vec<u8>, i64)> {
    let Some(sh) = shared() else { return Vec::new() };
    let db = database();
    with_lock(sh, |sh| {
        sh.slots
            .iter()
            .filter(|s| s.dboid.load(Ordering::Relaxed) == db && s.name_len > 0)
            .map(|s| (s.name(), s.since.load(Ordering::Relaxed)))
            .collect()
    })
}

/// Release this database's slot of `biz_type`, its counts added to the
/// database's (other types) row (so that the database's totals never go
/// back). Whether it had one.
pub fn release_type(biz_type: &[u8]) -> bool {
    let Some(sh) = shared() else { return false };
    if biz_type.is_empty() {
        return false;
    }
    let db = database();
    with_lock(sh, |sh| match lookup(sh, db, biz_type) {
        Ok((s, _)) => {
            let other = other_types(sh, db, true);
            release(sh, s, Some(other));
            true
        }
        Err(_) => false,
    })
}

/// Release the slots of dropped databases; how many.
pub fn release_dropped() -> usize {
    match shared() {
        Some(sh) => with_lock(sh, release_dropped_databases),
        None => 0,
    }
}
