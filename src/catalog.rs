//! Backend-local caches of what the claim path needs from the catalog: the
//! OIDs of idem's tables, the partitions of idem.claims, and the TTL of each
//! business type. The claim path runs no SQL when the caches are warm.
//!
//! Invalidation: a relcache callback drops the partition list whenever
//! idem.claims' relcache entry is invalidated (every partition created,
//! dropped, attached or detached does that), and the TTL cache whenever
//! idem_configure invalidates idem.biz_types (sent at commit, to every
//! backend). An abort after idem_configure in this backend drops the TTL
//! cache too, since it may hold the rolled-back value.
//!
//! SQL run here goes through `as_owner`: it runs with the extension owner's
//! rights, so nothing may resolve through the caller's search path.

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
    /// The index's IndexInfo, built on first insert (BuildIndexInfo copies
    /// the index expression: too dear to do per claim). Lives in the cache's
    /// memory context, which is reset whenever the list is reloaded.
    pub index_info: std::cell::Cell<*mut pg_sys::IndexInfo>,
    /// Seen with rows once: it is probed without asking its size again
    /// (believing a partition non-empty is always safe, the reverse never).
    pub seen_nonempty: std::cell::Cell<bool>,
    /// The memory context of the list this entry belongs to.
    mcx: pg_sys::MemoryContext,
}

/// One reading of the partition list. Shared (Rc) between the cache and the
/// callers that are using it, so that an invalidation arriving while a
/// caller walks the list (it can: taking a lock processes invalidations)
/// drops only the cache's reference, never the list under the caller.
pub struct PartitionList {
    pub parts: Vec<Partition>,
    /// Holds what the entries point to outside Rust (IndexInfos).
    mcx: pg_sys::MemoryContext,
}

impl Drop for PartitionList {
    fn drop(&mut self) {
        unsafe { pg_sys::MemoryContextDelete(self.mcx) };
    }
}

#[derive(Default)]
struct Cache {
    claims: Option<pg_sys::Oid>,
    biz_types: Option<pg_sys::Oid>,
    owner: Option<pg_sys::Oid>,
    partitions: Option<std::rc::Rc<PartitionList>>,
    /// Bumped whenever `partitions` is dropped, so that a caller can tell
    /// the list it locked is still the current one.
    generation: u64,
    /// Configured TTL in microseconds per type; None: no TTL configured.
    ttls: HashMap<Vec<u8>, Option<i64>>,
    /// This transaction ran idem_configure: the TTL cache must not outlive
    /// an abort.
    configured_in_xact: bool,
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
        c.owner = None;
        c.generation += 1;
        c.ttls.clear();
        if relid == pg_sys::InvalidOid {
            c.claims = None;
            c.biz_types = None;
            c.owner = None;
        }
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn xact_callback(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    match event {
        pg_sys::XactEvent::XACT_EVENT_ABORT | pg_sys::XactEvent::XACT_EVENT_PARALLEL_ABORT => forget_uncommitted(),
        pg_sys::XactEvent::XACT_EVENT_COMMIT | pg_sys::XactEvent::XACT_EVENT_PARALLEL_COMMIT => {
            #[allow(static_mut_refs)]
            if let Some(c) = unsafe { CACHE.as_mut() } {
                c.configured_in_xact = false;
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
        if c.configured_in_xact {
            c.ttls.clear();
            c.configured_in_xact = false;
        }
    }
}

fn relation_oid(name: &std::ffi::CStr) -> pg_sys::Oid {
    unsafe {
        let nsp = pg_sys::get_namespace_oid(c"idem".as_ptr(), true);
        let rel =
            if nsp == pg_sys::InvalidOid { pg_sys::InvalidOid } else { pg_sys::get_relname_relid(name.as_ptr(), nsp) };
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
    *c.biz_types.get_or_insert_with(|| relation_oid(c"biz_types"))
}

/// The partitions of idem.claims. Call with idem.claims locked, so that the
/// list cannot change under the caller (every change to it needs a lock that
/// conflicts with RowExclusiveLock).
pub fn partitions() -> (u64, std::rc::Rc<PartitionList>) {
    let parent = claims_oid();
    let c = cache();
    if let Some(list) = &c.partitions {
        return (c.generation, list.clone());
    }
    // The generation before reading: an invalidation processed while we read
    // bumps it, and the caller's check then makes it read again.
    let generation = c.generation;
    {
        let mcx = unsafe {
            pg_sys::AllocSetContextCreateInternal(
                pg_sys::TopMemoryContext,
                c"idem partitions".as_ptr(),
                0,
                1024,
                8 * 1024 * 1024,
            )
        };
        // Owns mcx from here on, also if loading fails.
        let mut list = PartitionList { parts: Vec::new(), mcx };
        list.parts = as_owner(|| load_partitions(parent, mcx));
        // Newest range first: a duplicate is most often a recent claim, and
        // the probe stops at the first live row. The default partition last.
        list.parts.sort_by_key(|p| std::cmp::Reverse(p.range.map(|(lo, _)| lo)));
        let list = std::rc::Rc::new(list);
        let c = cache();
        if c.generation == generation {
            c.partitions = Some(list.clone());
        }
        (generation, list)
    }
}

/// The generation `partitions` would report now.
pub fn partitions_generation() -> u64 {
    cache().generation
}

fn load_partitions(parent: pg_sys::Oid, mcx: pg_sys::MemoryContext) -> Vec<Partition> {
    // Read with the latest snapshot, not the statement's: a claim that waited
    // for idem_maintain's lock must see the partitions it committed (the same
    // reason ri_triggers.c checks with GetLatestSnapshot()).
    // pg_get_expr prints the bounds with the session's DateStyle and
    // TimeZone, and the cast reads them back with the same settings.
    const SQL: &std::ffi::CStr = cr#"
        SELECT c.oid,
               (SELECT pg_catalog.count(*) FROM pg_catalog.pg_index i
                 WHERE i.indrelid OPERATOR(pg_catalog.=) c.oid)::pg_catalog.int4 AS n_indexes,
               (SELECT pg_catalog.min(i.indexrelid) FROM pg_catalog.pg_index i
                 WHERE i.indrelid OPERATOR(pg_catalog.=) c.oid) AS index,
               m[1]::pg_catalog.timestamptz AS lo,
               m[2]::pg_catalog.timestamptz AS hi
          FROM pg_catalog.pg_inherits h
          JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) h.inhrelid
          LEFT JOIN LATERAL pg_catalog.regexp_match(
                pg_catalog.pg_get_expr(c.relpartbound, c.oid),
                $re$^FOR VALUES FROM \('([^']*)'\) TO \('([^']*)'\)$$re$) AS m ON true
         WHERE h.inhparent OPERATOR(pg_catalog.=) $1"#;
    let mut out = Vec::new();
    unsafe {
        if pg_sys::SPI_connect() != pg_sys::SPI_OK_CONNECT as i32 {
            invalid("SPI_connect failed");
        }
        let mut argtypes = [pg_sys::OIDOID];
        let plan = pg_sys::SPI_prepare(SQL.as_ptr(), 1, argtypes.as_mut_ptr());
        let mut values = [pg_sys::Datum::from(parent)];
        let nulls = [b' ' as std::ffi::c_char];
        let rc = pg_sys::SPI_execute_snapshot(
            plan,
            values.as_mut_ptr(),
            nulls.as_ptr(),
            pg_sys::GetLatestSnapshot(),
            std::ptr::null_mut(),
            true,
            false,
            0,
        );
        if rc != pg_sys::SPI_OK_SELECT as i32 {
            invalid(format!("reading the partitions of idem.claims failed (SPI code {rc})"));
        }
        let table = &*pg_sys::SPI_tuptable;
        for n in 0..pg_sys::SPI_processed as usize {
            let tuple = *table.vals.add(n);
            let col = |c: i32| {
                let mut isnull = false;
                let d = pg_sys::SPI_getbinval(tuple, table.tupdesc, c, &mut isnull);
                (!isnull).then_some(d)
            };
            let relid = pg_sys::Oid::from(col(1).unwrap().value() as u32);
            let n_indexes = col(2).unwrap().value() as i32;
            if n_indexes != 1 {
                IdemError::FeatureNotSupported(format!(
                    "partition {relid:?} of idem.claims has {n_indexes} indexes; idem maintains exactly one"
                ))
                .fail();
            }
            let index = pg_sys::Oid::from(col(3).unwrap().value() as u32);
            let range = match (col(4), col(5)) {
                (Some(lo), Some(hi)) => Some((lo.value() as i64, hi.value() as i64)),
                _ => None,
            };
            out.push(Partition {
                relid,
                index,
                range,
                index_info: std::cell::Cell::new(std::ptr::null_mut()),
                seen_nonempty: std::cell::Cell::new(false),
                mcx,
            });
        }
        pg_sys::SPI_finish();
    }
    out
}

/// The TTL configured for a business type, in microseconds.
pub fn configured_ttl(biz_type: &[u8]) -> Option<i64> {
    biz_types_oid(); // so that relcache_callback recognises its invalidation
    let c = cache();
    if let Some(t) = c.ttls.get(biz_type) {
        return *t;
    }
    let name = std::str::from_utf8(biz_type).expect("biz_type is validated ASCII");
    let ttl = as_owner(|| {
        Spi::connect(|client| {
            let rows = client
                .select(
                    "SELECT (pg_catalog.date_part('epoch', ttl) OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8
                       FROM idem.biz_types WHERE biz_type OPERATOR(pg_catalog.=) $1",
                    Some(1),
                    &[name.into()],
                )
                .unwrap_or_else(|e| invalid(format!("{e}")));
            rows.into_iter().next().and_then(|r| r.get::<i64>(1).ok().flatten())
        })
    });
    c.ttls.insert(biz_type.to_vec(), ttl);
    ttl
}

/// Tell every backend (this one included, at the next command) that the TTL
/// cache is stale. Sent at commit, so a rolled-back change sends nothing.
pub fn invalidate_biz_types() {
    unsafe { pg_sys::CacheInvalidateRelcacheByRelid(biz_types_oid()) };
    let c = cache();
    c.ttls.clear();
    c.configured_in_xact = true;
}

/// Run SQL for the extension: as the owner of schema idem (the API's C
/// functions are SECURITY INVOKER: their direct storage access needs no
/// rights, only the SQL they run on cold paths does), and with the search
/// path reduced to pg_catalog (no temp schema), so that nothing the caller
/// planted resolves.
pub fn as_owner<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(pg_sys::Oid, i32);
    impl Drop for Restore {
        fn drop(&mut self) {
            unsafe {
                pg_sys::PopOverrideSearchPath();
                pg_sys::SetUserIdAndSecContext(self.0, self.1);
            }
        }
    }
    let owner = storage_owner();
    let restore = unsafe {
        let (mut user, mut context) = (pg_sys::InvalidOid, 0);
        pg_sys::GetUserIdAndSecContext(&mut user, &mut context);
        pg_sys::SetUserIdAndSecContext(owner, context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32);
        let path =
            pg_sys::palloc0(std::mem::size_of::<pg_sys::OverrideSearchPath>()) as *mut pg_sys::OverrideSearchPath;
        (*path).schemas = std::ptr::null_mut();
        (*path).addCatalog = true;
        (*path).addTemp = false;
        pg_sys::PushOverrideSearchPath(path);
        Restore(user, context)
    };
    let r = f();
    drop(restore);
    r
}

/// The owner of schema idem: whoever created the extension.
fn storage_owner() -> pg_sys::Oid {
    let c = cache();
    if let Some(o) = c.owner {
        return o;
    }
    let owner = unsafe {
        let nsp = pg_sys::get_namespace_oid(c"idem".as_ptr(), false);
        let tup = pg_sys::SearchSysCache1(pg_sys::SysCacheIdentifier::NAMESPACEOID as i32, pg_sys::Datum::from(nsp));
        if tup.is_null() {
            invalid("schema idem disappeared");
        }
        let form =
            ((*tup).t_data as *mut u8).add((*(*tup).t_data).t_hoff as usize) as *mut pg_sys::FormData_pg_namespace;
        let owner = (*form).nspowner;
        pg_sys::ReleaseSysCache(tup);
        owner
    };
    c.owner = Some(owner);
    owner
}

/// The IndexInfo of a partition's index, built once per partition list.
pub fn index_info(p: &Partition, index: pg_sys::Relation) -> *mut pg_sys::IndexInfo {
    if p.index_info.get().is_null() {
        unsafe {
            let old = pg_sys::MemoryContextSwitchTo(p.mcx);
            p.index_info.set(pg_sys::BuildIndexInfo(index));
            pg_sys::MemoryContextSwitchTo(old);
        }
    }
    p.index_info.get()
}
