//! Backend-local caches of what the claim path needs from the catalog: the
//! OIDs of idem's tables, the live partitions of idem.claims, and business
//! types. The claim path runs no SQL when the caches are warm.
//!
//! Invalidation: a relcache callback drops the partition list whenever
//! idem.claims' relcache entry is invalidated (every partition created,
//! dropped, attached or detached does that), and the type cache whenever
//! idem_configure invalidates idem.biz_types. A transaction or
//! subtransaction abort drops the type cache, so that a type registered by
//! work that rolled back is never reused.

use crate::errors::{invalid, IdemError};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::collections::HashMap;

#[derive(Clone, Debug)]
pub struct Partition {
    pub relid: pg_sys::Oid,
    pub index: pg_sys::Oid,
    /// Range bounds in PostgreSQL timestamp microseconds; `None` for DEFAULT.
    pub range: Option<(i64, i64)>,
}

#[derive(Clone, Copy, Debug)]
pub struct BizType {
    pub type_id: i32,
    /// Configured TTL in microseconds; None means idem.default_ttl.
    pub ttl_us: Option<i64>,
}

#[derive(Default)]
struct Cache {
    claims: Option<pg_sys::Oid>,
    biz_types: Option<pg_sys::Oid>,
    partitions: Option<Vec<Partition>>,
    types: HashMap<Vec<u8>, BizType>,
    /// This transaction registered a type: its cache entry must not outlive
    /// an abort.
    registered_in_xact: bool,
    callbacks_registered: bool,
}

// PostgreSQL backends are single-threaded; the cache is only touched from the
// backend's main thread.
static mut CACHE: Option<Cache> = None;

#[allow(static_mut_refs)]
fn cache() -> &'static mut Cache {
    unsafe {
        let c = CACHE.get_or_insert_with(Cache::default);
        if !c.callbacks_registered {
            pg_sys::CacheRegisterRelcacheCallback(Some(relcache_callback), pg_sys::Datum::from(0));
            pg_sys::RegisterXactCallback(Some(xact_callback), std::ptr::null_mut());
            pg_sys::RegisterSubXactCallback(Some(subxact_callback), std::ptr::null_mut());
            c.callbacks_registered = true;
        }
        c
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn relcache_callback(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    #[allow(static_mut_refs)]
    let Some(c) = (unsafe { CACHE.as_mut() }) else {
        return;
    };
    if relid == pg_sys::InvalidOid || Some(relid) == c.claims || Some(relid) == c.biz_types {
        c.partitions = None;
        c.types.clear();
        if relid == pg_sys::InvalidOid {
            c.claims = None;
            c.biz_types = None;
        }
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn xact_callback(
    event: pg_sys::XactEvent::Type,
    _arg: *mut std::ffi::c_void,
) {
    match event {
        pg_sys::XactEvent::XACT_EVENT_ABORT | pg_sys::XactEvent::XACT_EVENT_PARALLEL_ABORT => {
            forget_uncommitted()
        }
        pg_sys::XactEvent::XACT_EVENT_COMMIT | pg_sys::XactEvent::XACT_EVENT_PARALLEL_COMMIT =>
        {
            #[allow(static_mut_refs)]
            if let Some(c) = unsafe { CACHE.as_mut() } {
                c.registered_in_xact = false;
            }
        }
        _ => {}
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn subxact_callback(
    event: pg_sys::SubXactEvent::Type,
    _my: pg_sys::SubTransactionId,
    _parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    if event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB {
        forget_uncommitted();
    }
}

/// Partitions need nothing here: on abort PostgreSQL replays the aborted
/// work's relcache invalidations locally, which reaches relcache_callback.
fn forget_uncommitted() {
    #[allow(static_mut_refs)]
    if let Some(c) = unsafe { CACHE.as_mut() } {
        if c.registered_in_xact {
            c.types.clear();
            c.registered_in_xact = false;
        }
    }
}

fn relation_oid(name: &std::ffi::CStr) -> pg_sys::Oid {
    unsafe {
        let nsp = pg_sys::get_namespace_oid(c"idem".as_ptr(), true);
        let rel = if nsp == pg_sys::InvalidOid {
            pg_sys::InvalidOid
        } else {
            pg_sys::get_relname_relid(name.as_ptr(), nsp)
        };
        if rel == pg_sys::InvalidOid {
            IdemError::ObjectNotInPrerequisiteState(
                format!("relation idem.{} does not exist", name.to_string_lossy()),
                Some("Is the extension installed in this database? CREATE EXTENSION idem;".into()),
            )
            .fail();
        }
        rel
    }
}

pub fn claims_oid() -> pg_sys::Oid {
    let c = cache();
    *c.claims.get_or_insert_with(|| relation_oid(c"claims"))
}

pub fn biz_types_oid() -> pg_sys::Oid {
    let c = cache();
    *c.biz_types
        .get_or_insert_with(|| relation_oid(c"biz_types"))
}

/// The partitions of idem.claims. Call with idem.claims locked, so that the
/// list cannot change under the caller (every change to it needs a lock that
/// conflicts with RowExclusiveLock).
pub fn partitions() -> &'static [Partition] {
    let parent = claims_oid();
    let c = cache();
    if c.partitions.is_none() {
        c.partitions = Some(load_partitions(parent));
    }
    c.partitions.as_deref().unwrap()
}

fn load_partitions(parent: pg_sys::Oid) -> Vec<Partition> {
    // pg_get_expr prints the bounds with the session's DateStyle and
    // TimeZone, and the cast reads them back with the same settings.
    const SQL: &str = r#"
        SELECT c.oid,
               (SELECT pg_catalog.array_agg(i.indexrelid ORDER BY i.indexrelid)
                  FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid) AS indexes,
               m[1]::pg_catalog.timestamptz AS lo,
               m[2]::pg_catalog.timestamptz AS hi
          FROM pg_catalog.pg_inherits h
          JOIN pg_catalog.pg_class c ON c.oid = h.inhrelid
          CROSS JOIN LATERAL pg_catalog.regexp_match(
                pg_catalog.pg_get_expr(c.relpartbound, c.oid),
                $re$^FOR VALUES FROM \('([^']*)'\) TO \('([^']*)'\)$$re$) AS m
         WHERE h.inhparent = $1
         ORDER BY lo NULLS FIRST"#;
    Spi::connect(|client| {
        let rows = client
            .select(SQL, None, &[parent.into()])
            .unwrap_or_else(|e| invalid(format!("{e}")));
        let mut out = Vec::new();
        for row in rows {
            let relid: pg_sys::Oid = row.get(1).ok().flatten().unwrap();
            let indexes: Vec<pg_sys::Oid> = row
                .get::<Vec<pg_sys::Oid>>(2)
                .ok()
                .flatten()
                .unwrap_or_default();
            let lo: Option<TimestampWithTimeZone> = row.get(3).ok().flatten();
            let hi: Option<TimestampWithTimeZone> = row.get(4).ok().flatten();
            if indexes.len() != 1 {
                IdemError::FeatureNotSupported(format!(
                    "partition {relid:?} of idem.claims has {} indexes; idem maintains exactly one",
                    indexes.len()
                ))
                .fail();
            }
            let range = match (lo, hi) {
                (Some(lo), Some(hi)) => Some((timestamp_us(lo), timestamp_us(hi))),
                _ => None,
            };
            out.push(Partition {
                relid,
                index: indexes[0],
                range,
            });
        }
        out
    })
}

fn timestamp_us(t: TimestampWithTimeZone) -> i64 {
    use pgrx::datum::IntoDatum;
    t.into_datum().unwrap().value() as i64
}

/// Look up a business type; with `register`, create it when unknown.
/// `None` only when unknown and not registering.
pub fn biz_type(name: &[u8], register: bool) -> Option<BizType> {
    let c = cache();
    if let Some(t) = c.types.get(name) {
        return Some(*t);
    }
    let name_str = std::str::from_utf8(name).expect("biz_type is validated ASCII");
    let found = load_biz_type(name_str).or_else(|| {
        if !register {
            return None;
        }
        // ON CONFLICT: a concurrent first use of the same type waits for the
        // other transaction and then reads its row.
        Spi::run_with_args(
            "INSERT INTO idem.biz_types (biz_type) VALUES ($1) ON CONFLICT (biz_type) DO NOTHING",
            &[name_str.into()],
        )
        .unwrap_or_else(|e| invalid(format!("{e}")));
        cache().registered_in_xact = true;
        load_biz_type(name_str)
    });
    if let Some(t) = found {
        c.types.insert(name.to_vec(), t);
    }
    found
}

fn load_biz_type(name: &str) -> Option<BizType> {
    let row = Spi::get_two_with_args::<i32, i64>(
        "SELECT type_id, (pg_catalog.date_part('epoch', ttl) * 1000000)::pg_catalog.int8
           FROM idem.biz_types WHERE biz_type OPERATOR(pg_catalog.=) $1",
        &[name.into()],
    );
    match row {
        Ok((Some(type_id), ttl_us)) => Some(BizType { type_id, ttl_us }),
        Ok((None, _)) => None,
        Err(pgrx::spi::SpiError::InvalidPosition) => None,
        Err(e) => invalid(format!("{e}")),
    }
}

/// Tell every backend (this one included, at the next command) that the
/// type cache is stale. Sent at commit, so a rolled-back change sends nothing.
pub fn invalidate_biz_types() {
    unsafe { pg_sys::CacheInvalidateRelcacheByRelid(biz_types_oid()) };
    cache().types.clear();
}
