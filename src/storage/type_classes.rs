//! Which TTL classes may hold claims of a business type (idem.type_classes,
//! sql/storage.sql): a claim looks into those classes' partitions only.
//!
//! The rule that keeps a key's rows found (docs/design.md §2): before a
//! claim's row goes into class k, a registration of its type in k that
//! covers the row's expiry exists and will commit with the row — one
//! already committed, or one this transaction writes. Registrations are
//! read with a dirty snapshot under the key lock, so a claimer of the key
//! also sees the class of a row another transaction is still writing
//! (its registration was written before that row, under the same key lock).
//! Reading more classes than needed costs a probe; missing one would let a
//! key be claimed twice.
//!
//! A type goes into at most MAX_CLASSES classes (docs/design.md §1, "At
//! most three classes per type"): a claim whose TTL's class would be one
//! more goes into the nearest wider class the type is in, or into the
//! class of the longest TTL, which is at least as wide as any claim's. Its
//! row lingers longer (up to that class's width), and expires when its TTL
//! says. So the partitions a claim locks are bounded whatever TTLs its type
//! has been claimed with.
//!
//! Registrations are cached per backend (`read`), and only what cannot
//! change under a claim's feet is: rows committed by other transactions or
//! written by this one, none of them being inserted or deleted by another
//! transaction (those are read anew at every call). What a cached entry
//! could miss is a registration another transaction writes later, and each
//! is written by `register` under a claim's key lock, which sends
//! idem.type_classes' relcache invalidation to every backend at once, not
//! at commit, before that claim writes the row the registration is for. A
//! claimer of the same key takes the key lock after that and processes
//! pending invalidations (AcceptInvalidationMessages) before it reads the
//! cache: the entry is gone and the registrations are read again, with a
//! dirty snapshot, so it finds the class and then the row. What a cached
//! entry could hold too many of: a registration rolled back (the cache is
//! dropped at every abort of a transaction or subtransaction and at every
//! PREPARE TRANSACTION, and another
//! transaction's registration is cached only once committed) or deleted by
//! idem_maintain (only registrations whose `until` is past when it runs,
//! which cover no claim made after it, so they cost a probe, never a row
//! left unregistered). Nothing is cached where registrations arrive
//! without that message: under Citus (a shard's registrations are written
//! by other nodes, whose invalidations never reach this one) and on a hot
//! standby (the primary's registrations arrive as replayed rows; its
//! sessions only look keys up, and read the registry at every call). The
//! message is sent by idem's own writer only: rows put into the table by
//! other means (by hand, a logical subscription's apply worker) reach a
//! session's cache at its next invalidation of the table, so a session
//! opened before them must reconnect before it claims (docs/operations.md,
//! logical replication).

use super::keylock::KeyLock;
use crate::backend::BackendLocal;
use crate::catalog;
use crate::datum::{text_datum, varlena_bytes};
use crate::key::ClaimKey;
use crate::errors::internal;
use crate::guc::MAX_TTL_US;
use crate::spi::Statement;
use crate::ttl_class;
use pgrx::pg_sys;
use std::collections::HashMap;
use std::mem::MaybeUninit;

/// The registrations of one type, as read.
#[derive(Default)]
pub struct Registered {
    /// Every class registered, committed or being written, with the latest
    /// expiry registered in it: the type's claims of that class expire no
    /// later. Sorted by class.
    pub classes: Vec<(i16, i64)>,
    /// Registrations that stand whatever other transactions do: committed,
    /// or written by this transaction. (class, until)
    settled: Vec<(i16, i64)>,
}

impl Registered {
    /// Whether a row of class `k` expiring at `expires_at` is covered.
    pub fn covers(&self, k: i16, expires_at: i64) -> bool {
        self.settled.iter().any(|&(c, until)| c == k && until >= expires_at)
    }
}

/// Under SERIALIZABLE: the predicate locks a scan of `k`'s type's
/// registrations with the caller's snapshot takes, so that a transaction
/// that registers the type in another class (to claim a key this caller
/// looked for) is a read-write conflict SSI sees.
pub fn predicate_lock(relid: pg_sys::Oid, k: &ClaimKey) {
    scan(relid, k.biz_type, k.biz_type_text, crate::backend::caller_snapshot(), |_, _, _| {});
}

/// The most business types whose registrations a backend keeps (as
/// biztype.rs's settings): past it the cache starts over.
const CACHE_MAX: usize = 4096;

#[derive(Default)]
struct Cache {
    /// catalog::registry_epoch() the entries were read at.
    registry_epoch: u64,
    /// Per type, its registrations (class, latest until), sorted by class,
    /// every one settled.
    types: HashMap<Vec<u8>, Vec<(i16, i64)>>,
}

static CACHE: BackendLocal<Option<Cache>> = BackendLocal::new(None);

fn with_cache<R>(f: impl FnOnce(&mut Cache) -> R) -> R {
    if CACHE.with(|c| c.is_none()) {
        crate::backend::on_undo(forget);
    }
    CACHE.with(|c| f(c.get_or_insert_with(Cache::default)))
}

/// Drop every cached entry: one may hold what this transaction wrote
/// (called at an abort or PREPARE, and when this backend registers).
fn forget() {
    CACHE.with(|c| c.iter_mut().for_each(|c| c.types.clear()));
}

/// Whether `relid`'s registrations may be cached: it is this database's
/// idem.type_classes, off Citus and off a standby (see the module's
/// comment).
fn cacheable(relid: pg_sys::Oid) -> bool {
    // SAFETY: reads shared state, callable in any backend.
    let standby = unsafe { pg_sys::RecoveryInProgress() };
    !standby && !crate::guc::citus_preloaded() && catalog::type_classes_oid() == Some(relid)
}

/// Tell every backend of this database at once (not at commit) that
/// idem.type_classes changed: their cached registrations go
/// (catalog::registry_epoch), at their next AcceptInvalidationMessages.
fn announce(relid: pg_sys::Oid) {
    // SAFETY: a relcache invalidation message of this database, as
    // PostgreSQL's own inval.c builds one; receivers drop their relcache
    // entry of the table (rebuilt on next open) and run the relcache
    // callbacks (catalog.rs's).
    unsafe {
        let mut msg: pg_sys::SharedInvalidationMessage = MaybeUninit::zeroed().assume_init();
        msg.rc = pg_sys::SharedInvalRelcacheMsg {
            id: pg_sys::SHAREDINVALRELCACHE_ID as _,
            dbId: pg_sys::MyDatabaseId,
            relId: relid,
        };
        pg_sys::SendSharedInvalidMessages(&msg, 1);
    }
}

/// Read the registrations of `k`'s type in the registry table `relid`
/// (idem.type_classes), from the backend's cache when it holds them (see
/// the module's comment). The caller holds the key lock, when it takes
/// one: invalidations sent before its holder released it are processed
/// here, before the cache is read.
pub fn read(relid: pg_sys::Oid, k: &ClaimKey) -> Registered {
    let biz_type = k.biz_type;
    if !cacheable(relid) {
        return read_table(relid, k.biz_type, k.biz_type_text).0;
    }
    // SAFETY: processes pending invalidations, as every lock acquisition does.
    unsafe { pg_sys::AcceptInvalidationMessages() };
    let epoch = catalog::registry_epoch();
    let hit = with_cache(|c| {
        if c.registry_epoch != epoch {
            c.types.clear();
            c.registry_epoch = epoch;
        }
        c.types.get(biz_type).cloned()
    });
    if let Some(classes) = hit {
        return Registered { settled: classes.clone(), classes };
    }
    let (found, settled) = read_table(relid, k.biz_type, k.biz_type_text);
    // (Not if an invalidation came in while the table was read: the read
    // may predate what it announced.)
    if settled && catalog::registry_epoch() == epoch {
        with_cache(|c| {
            if c.types.len() >= CACHE_MAX {
                c.types.clear();
            }
            c.types.insert(biz_type.to_vec(), found.classes.clone());
        });
    }
    found
}

/// The registrations under `name` in `relid`, read from the table (no
/// cache): under Citus, a shard's anchor (storage/citus.rs).
pub fn read_uncached(relid: pg_sys::Oid, name: &[u8]) -> Registered {
    read_table(relid, name, text_datum(name)).0
}

/// Read the registrations of `biz_type` (and its text datum) in `relid`
/// from the table, and whether every one of them is settled and none is
/// being deleted by another transaction (what may be cached).
fn read_table(relid: pg_sys::Oid, biz_type: &[u8], text: pg_sys::Datum) -> (Registered, bool) {
    let mut found = Registered::default();
    let mut stable = true;
    // SAFETY: the dirty snapshot outlives the scan (which ends inside).
    let mut dirty: pg_sys::SnapshotData = unsafe { MaybeUninit::zeroed().assume_init() };
    dirty.snapshot_type = pg_sys::SnapshotType::SNAPSHOT_DIRTY;
    let snapshot: pg_sys::Snapshot = &mut dirty;
    scan(relid, biz_type, text, snapshot, |class, until, snap| {
        // Another transaction still inserting it: its registration may
        // yet roll back (with its rows).
        // SAFETY: `snap` is the dirty snapshot above, which the scan sets
        // for each tuple it returns.
        let being_written = unsafe { (*snap).xmin } != pg_sys::InvalidTransactionId;
        // SAFETY: as above.
        let being_deleted = unsafe { (*snap).xmax } != pg_sys::InvalidTransactionId;
        add(&mut found.classes, class, until);
        if !being_written {
            found.settled.push((class, until));
        }
        stable &= !being_written && !being_deleted;
    });
    (found, stable)
}

/// Scan `biz_type`'s registrations (`text`: its text datum) in `relid` with
/// `snapshot`, calling `each(class, until, snapshot)` per row.
fn scan(
    relid: pg_sys::Oid,
    biz_type: &[u8],
    text: pg_sys::Datum,
    snapshot: pg_sys::Snapshot,
    mut each: impl FnMut(i16, i64, pg_sys::Snapshot),
) {
    // SAFETY: the table and its one index are opened and locked here and
    // closed before returning; the dirty snapshot and the slot outlive the
    // scan; the slot's first three columns are (biz_type, ttl_class,
    // until), the shape sql/storage.sql gives the table (checked below:
    // four columns, the last one the key that places a row under Citus).
    unsafe {
        let rel = crate::catalog::open_table_of_idem(relid, pg_sys::AccessShareLock as _, "type_classes");
        let indexes = pg_sys::RelationGetIndexList(rel);
        if indexes.is_null() || (*indexes).length != 1 || (*(*rel).rd_att).natts != 4 {
            internal("idem.type_classes does not have the shape idem created it with");
        }
        let index = pg_sys::index_open((*(*indexes).elements).oid_value, pg_sys::AccessShareLock as _);
        let mut key: pg_sys::ScanKeyData = MaybeUninit::zeroed().assume_init();
        pg_sys::ScanKeyEntryInitialize(
            &mut key,
            0,
            1,
            pg_sys::BTEqualStrategyNumber as _,
            pg_sys::InvalidOid,
            *(*index).rd_indcollation,
            pg_sys::Oid::from(pg_sys::F_TEXTEQ),
            text,
        );
        let scan = crate::compat::index_beginscan(rel, index, snapshot, 1);
        pg_sys::index_rescan(scan, &mut key, 1, std::ptr::null_mut(), 0);
        let slot = pg_sys::table_slot_create(rel, std::ptr::null_mut());
        while pg_sys::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, slot) {
            pg_sys::slot_getsomeattrs_int(slot, 3);
            let values = std::slice::from_raw_parts((*slot).tts_values, 3);
            if varlena_bytes(values[0]) != biz_type {
                continue;
            }
            each(values[1].value() as i16, values[2].value() as i64, snapshot);
        }
        pg_sys::ExecDropSingleTupleTableSlot(slot);
        pg_sys::index_endscan(scan);
        pg_sys::index_close(index, pg_sys::NoLock as _);
        pg_sys::table_close(rel, pg_sys::NoLock as _);
    }
}

fn add(classes: &mut Vec<(i16, i64)>, class: i16, until: i64) {
    match classes.binary_search_by_key(&class, |c| c.0) {
        Ok(i) => classes[i].1 = classes[i].1.max(until),
        Err(i) => classes.insert(i, (class, until)),
    }
}

/// The most TTL classes a type's claims go into.
pub const MAX_CLASSES: usize = 3;

/// The class a claim of `k`'s type whose TTL is of class `natural` goes
/// into, registered there (for its expiry `expires_at`) when no committed
/// or own registration covers it. `registered` is what the claim read of
/// the registry `relid` under its key lock. A class the type is not in is
/// decided under the type lock, on the registrations read again (another
/// claim of the type may have just added one), so that claims of one type
/// add classes one at a time and MAX_CLASSES holds. `on_shard`: under
/// Citus, `relid` is this node's shard of the registry (co-located with
/// the claim's shard of idem.claims, where the claim runs; the type lock
/// is this node's, which every claim on that shard takes).
pub fn place(
    relid: pg_sys::Oid,
    on_shard: bool,
    registered: &mut Registered,
    k: &ClaimKey,
    natural: i16,
    expires_at: i64,
) -> i16 {
    let _decided;
    let class = if registered.classes.iter().any(|c| c.0 == natural) {
        natural
    } else {
        _decided = KeyLock::for_type(k.biz_type);
        *registered = read_table(relid, k.biz_type, k.biz_type_text).0;
        let top = ttl_class::of_ttl(MAX_TTL_US as i64);
        choose(&registered.classes.iter().map(|c| c.0).collect::<Vec<_>>(), natural, top)
    };
    if !registered.covers(class, expires_at) {
        register(relid, on_shard, registered, k, class, expires_at);
    }
    class
}

/// The class for a claim of class `natural` of a type in `classes`
/// (sorted): its own while the type has room for it, leaving room for the
/// widest one (`top`, the class of the longest TTL); else the nearest wider
/// one the type is in, or `top`. A class at least as wide as its own always
/// holds the claim within about 7 of its partitions (a claim's expiry is
/// at most its class's longest TTL away).
fn choose(classes: &[i16], natural: i16, top: i16) -> i16 {
    if classes.contains(&natural) || classes.len() + 1 < MAX_CLASSES {
        return natural;
    }
    classes.iter().copied().find(|&c| c >= natural).unwrap_or(top.max(natural))
}

/// Register `key`'s type in class `class` for claims expiring up to the end of
/// the width-aligned slot of the class that holds `expires_at` (so a type
/// claiming steadily writes one registration per width of its class, and a
/// claim looks at most a width beyond the latest expiry), in this
/// transaction, through SQL run as the extension's owner (an INSERT, so
/// that what PostgreSQL attaches to the table, a publication for one,
/// sees it). The caller holds the key lock, so a claimer of
/// its key reads it before looking for the row that follows it. Under
/// Citus (`on_shard`) the row goes into the shard `relid` itself, with
/// the claim's key as its distribution value, so that Citus keeps it with
/// the claim's shard of idem.claims (moves carry both).
fn register(
    relid: pg_sys::Oid,
    on_shard: bool,
    registered: &mut Registered,
    key: &ClaimKey,
    class: i16,
    expires_at: i64,
) {
    static INSERT: Statement = Statement::new(
        c"INSERT INTO idem.type_classes (biz_type, ttl_class, until) VALUES ($1, $2, $3)",
        &[pg_sys::TEXTOID, pg_sys::INT2OID, pg_sys::TIMESTAMPTZOID],
    );
    let span = ttl_class::width(class).expect("a class that exists").max(1);
    let until = expires_at.div_euclid(span).saturating_add(1).saturating_mul(span);
    let args = [Some(key.biz_type_text), Some(pg_sys::Datum::from(class)), Some(pg_sys::Datum::from(until))];
    if !on_shard {
        INSERT.execute_as_owner(&args);
        // Before the claim's row is written and the key lock released.
        forget();
        announce(relid);
    } else {
        // SAFETY: a catalog lookup of a relation this transaction has open and locked (read scanned it).
        let name = unsafe { pg_sys::get_rel_name(relid) };
        if name.is_null() {
            internal("this node's shard of idem.type_classes is missing");
        }
        // SAFETY: `name` is a NUL-terminated relation name from the catalog.
        let name = unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy();
        let sql = format!("INSERT INTO idem.\"{name}\" (biz_type, ttl_class, until, key) VALUES ($1, $2, $3, $4)");
        let sql = std::ffi::CString::new(sql).expect("no NUL in a shard's name");
        let mut with_key = args.to_vec();
        with_key.push(Some(key.key_text));
        crate::spi::execute_once_as_owner(
            &sql,
            &[pg_sys::TEXTOID, pg_sys::INT2OID, pg_sys::TIMESTAMPTZOID, pg_sys::TEXTOID],
            &with_key,
        );
    }
    registered.settled.push((class, until));
    add(&mut registered.classes, class, until);
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::*;
    use pgrx::prelude::*;

    #[pg_test]
    fn a_type_goes_into_at_most_three_classes() {
        let top = 34;
        // Whatever order a type is claimed with TTLs of every class in,
        // it ends up in at most MAX_CLASSES classes, each claim in a class
        // at least as wide as its own.
        let orders: [Vec<i16>; 4] = [
            (0..=top).collect(),
            (0..=top).rev().collect(),
            (0..=top).map(|k| (k * 7) % (top + 1)).collect(),
            [16, 26, 34, 0, 5, 30].into(),
        ];
        for order in orders {
            let mut classes: Vec<i16> = Vec::new();
            for natural in order {
                let k = choose(&classes, natural, top);
                assert!(k >= natural, "class {natural} went into narrower {k}");
                if let Err(i) = classes.binary_search(&k) {
                    classes.insert(i, k);
                }
                assert!(classes.len() <= MAX_CLASSES, "{classes:?}");
            }
        }
        // The first two classes a type is claimed in are its own; a third
        // that is wider than both is the widest.
        assert_eq!(choose(&[], 16, top), 16);
        assert_eq!(choose(&[16], 10, top), 10);
        assert_eq!(choose(&[10, 16], 12, top), 16);
        assert_eq!(choose(&[10, 16], 20, top), top);
        assert_eq!(choose(&[10, 16, 34], 3, top), 10);
    }
}
