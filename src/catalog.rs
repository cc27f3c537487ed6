//! Catalog lookups: the OIDs of idem's own relations (looked up by name in
//! schema idem, in one place: `relation_in_idem`) and of the extension's
//! owner, cached per backend, with the one relcache callback that keeps
//! them (and the caches built on them) true.
//!
//! Invalidation: an invalidation of idem.claims or idem.biz_types
//! themselves (which DROP EXTENSION, CREATE EXTENSION and ALTER EXTENSION
//! UPDATE send, and idem_configure at commit), or of the whole relcache,
//! drops every cached OID and moves the `epoch` on: the caches built on
//! these relations (business type settings in biztype.rs, the Citus
//! distribution in storage/citus.rs) compare the epoch they were read at.
//! An invalidation of idem.type_classes moves `registry_epoch` on, which
//! the registrations cached in storage/type_classes.rs compare.
//! Every invalidated relation is also passed to storage/partitions.rs,
//! whose lists depend on relations of their own (the partitions and their
//! indexes).

use crate::backend::BackendLocal;
use crate::errors::{internal, IdemError};
use pgrx::pg_sys;
use std::ffi::CStr;

#[derive(Default)]
struct Cache {
    claims: Option<pg_sys::Oid>,
    biz_types: Option<pg_sys::Oid>,
    /// Some(None): idem.type_classes does not exist (0.3.0's schema).
    type_classes: Option<Option<pg_sys::Oid>>,
    owner: Option<pg_sys::Oid>,
    /// Bumped whenever the OIDs are dropped.
    epoch: u64,
    /// Bumped with `epoch` and whenever idem.type_classes' relcache entry
    /// is invalidated (storage/type_classes.rs sends that invalidation at
    /// once when a claim registers a type in a class).
    registry_epoch: u64,
    callback_registered: bool,
}

static CACHE: BackendLocal<Option<Cache>> = BackendLocal::new(None);

fn with_cache<R>(f: impl FnOnce(&mut Cache) -> R) -> R {
    let register = CACHE.with(|c| {
        let c = c.get_or_insert_with(Cache::default);
        !std::mem::replace(&mut c.callback_registered, true)
    });
    if register {
        // SAFETY: registers a callback that lives as long as the library
        // (a loaded library is never unloaded).
        unsafe { pg_sys::CacheRegisterRelcacheCallback(Some(relcache_callback), pg_sys::Datum::from(0)) };
    }
    CACHE.with(|c| f(c.as_mut().expect("initialised above")))
}

/// Forget every OID: they may belong to a dropped extension.
fn reset(c: &mut Cache) {
    c.claims = None;
    c.biz_types = None;
    c.type_classes = None;
    c.owner = None;
    c.epoch += 1;
    c.registry_epoch += 1;
}

/// Forget everything cached of idem's relations, here and in the caches
/// built on them.
fn forget_everything() {
    with_cache(reset);
    crate::storage::partitions::relation_invalidated(pg_sys::InvalidOid, true);
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn relcache_callback(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    let everything = CACHE.with(|c| {
        let Some(c) = c.as_mut() else { return false };
        let everything = relid == pg_sys::InvalidOid || Some(relid) == c.claims || Some(relid) == c.biz_types;
        if everything {
            reset(c);
        } else if c.type_classes == Some(Some(relid)) {
            c.registry_epoch += 1;
        }
        everything
    });
    crate::storage::partitions::relation_invalidated(relid, everything);
}

/// How many times the cached OIDs were dropped: a cache built on idem's
/// relations is current while the epoch it was read at is.
pub fn epoch() -> u64 {
    with_cache(|c| c.epoch)
}

/// Moves on whenever `epoch` does and whenever idem.type_classes' relcache
/// entry is invalidated: the registrations cached per backend
/// (storage/type_classes.rs) are current while it is.
pub fn registry_epoch() -> u64 {
    with_cache(|c| c.registry_epoch)
}

/// The relation `name` in schema idem, if there is one.
pub fn relation_in_idem(name: &CStr) -> Option<pg_sys::Oid> {
    // SAFETY: catalog lookups by name, which report a missing schema or
    // relation as InvalidOid rather than raising.
    let relid = unsafe {
        let nsp = pg_sys::get_namespace_oid(c"idem".as_ptr(), true);
        if nsp == pg_sys::InvalidOid {
            return None;
        }
        pg_sys::get_relname_relid(name.as_ptr(), nsp)
    };
    (relid != pg_sys::InvalidOid).then_some(relid)
}

/// The relation `name` in schema idem, which the installed extension has:
/// 55000 if it is missing.
fn required_relation(name: &CStr) -> pg_sys::Oid {
    relation_in_idem(name).unwrap_or_else(|| missing_relation(&name.to_string_lossy()))
}

fn missing_relation(name: &str) -> ! {
    IdemError::ObjectNotInPrerequisiteState(
        format!("relation idem.{name} does not exist"),
        Some("Is the extension installed in this database (CREATE EXTENSION idem), and its schema as new as its library (ALTER EXTENSION idem UPDATE)?".into()),
    )
    .fail()
}

/// Open and lock `relid`, a table of idem's schema found through a cached
/// OID (idem.biz_types, idem.type_classes): a concurrent DROP EXTENSION may
/// have dropped it after the lookup and before the lock. Then 55000, as
/// when the extension is not installed, never XX000 for a vanished OID;
/// the cache is forgotten, so that the next call looks the name up again.
pub fn open_table_of_idem(relid: pg_sys::Oid, lockmode: pg_sys::LOCKMODE, name: &str) -> pg_sys::Relation {
    // SAFETY: try_table_open reports a vanished OID as NULL.
    let rel = unsafe { pg_sys::try_table_open(relid, lockmode) };
    if rel.is_null() {
        forget_everything();
        missing_relation(name);
    }
    rel
}

fn cached_oid(get: fn(&mut Cache) -> &mut Option<pg_sys::Oid>, name: &CStr) -> pg_sys::Oid {
    if let Some(oid) = with_cache(|c| *get(c)) {
        return oid;
    }
    let oid = required_relation(name);
    with_cache(|c| *get(c) = Some(oid));
    oid
}

pub fn claims_oid() -> pg_sys::Oid {
    cached_oid(|c| &mut c.claims, c"claims")
}

/// Open and lock idem.claims. The cached OID may name a table that a
/// concurrent DROP EXTENSION dropped while we waited for its lock (taking
/// the lock processes the invalidation, which drops the cache): then look
/// the name up again, which finds the new table, or reports that the
/// extension is gone (55000) — never XX000 for a vanished OID.
pub fn open_claims(lockmode: pg_sys::LOCKMODE) -> pg_sys::Relation {
    loop {
        // SAFETY: try_table_open reports a vanished OID as NULL.
        let rel = unsafe { pg_sys::try_table_open(claims_oid(), lockmode) };
        if !rel.is_null() {
            return rel;
        }
        forget_everything();
    }
}

pub fn biz_types_oid() -> pg_sys::Oid {
    cached_oid(|c| &mut c.biz_types, c"biz_types")
}

/// idem.type_classes, or None in 0.3.0's schema (this library installed,
/// ALTER EXTENSION idem UPDATE not run yet), where claims look into every
/// partition.
pub fn type_classes_oid() -> Option<pg_sys::Oid> {
    claims_oid(); // so that relcache_callback recognises an update's invalidation
    if let Some(found) = with_cache(|c| c.type_classes) {
        return found;
    }
    let found = relation_in_idem(c"type_classes");
    with_cache(|c| c.type_classes = Some(found));
    found
}

/// The owner of schema idem: whoever created the extension.
pub fn extension_owner() -> pg_sys::Oid {
    if let Some(o) = with_cache(|c| c.owner) {
        return o;
    }
    // SAFETY: a syscache lookup, released before the block ends; the tuple
    // is checked for NULL before it is read.
    let owner = unsafe {
        let nsp = pg_sys::get_namespace_oid(c"idem".as_ptr(), false);
        let tup = pg_sys::SearchSysCache1(pg_sys::SysCacheIdentifier::NAMESPACEOID as i32, pg_sys::Datum::from(nsp));
        if tup.is_null() {
            internal("schema idem has no catalog entry");
        }
        let form = pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_namespace>(tup);
        let owner = (*form).nspowner;
        pg_sys::ReleaseSysCache(tup);
        owner
    };
    with_cache(|c| c.owner = Some(owner));
    owner
}

/// A relation's name for messages: idem.NAME, or its OID if it is gone.
pub fn relation_name(relid: pg_sys::Oid) -> String {
    // SAFETY: get_rel_name returns NULL or a palloc'd C string.
    unsafe {
        let name = pg_sys::get_rel_name(relid);
        if name.is_null() {
            format!("{}", relid.to_u32())
        } else {
            format!("idem.{}", CStr::from_ptr(name).to_string_lossy())
        }
    }
}
