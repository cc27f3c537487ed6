//! Backend-local caches of what the claim path needs from the catalog: the
//! OIDs of idem's tables, the partitions of idem.claims (or, under Citus, of
//! a local shard of it: storage/citus.rs) with their ranges and indexes, and
//! each business type's settings. The claim path runs no SQL when the
//! caches are warm.
//!
//! Everything is read in binary: partition bounds come from each
//! partition's `relpartbound` node tree, never through text, so no session
//! setting (DateStyle, TimeZone, abbreviations) can change what a claim
//! reads (docs/design.md §5).
//!
//! Invalidation: a relcache callback drops the partition lists whenever the
//! relcache entry of a listed parent, of any of its partitions or of their
//! indexes is invalidated: a partition created, dropped, attached or
//! detached, REINDEX [CONCURRENTLY], VACUUM FULL, CLUSTER, ALTER TABLE. An
//! invalidation of idem.claims or idem.biz_types themselves (which DROP
//! EXTENSION, CREATE EXTENSION and ALTER EXTENSION UPDATE send) also drops
//! every cached OID, so a reinstalled extension is found at the next call.
//! idem_configure invalidates idem.biz_types at commit, in every backend.
//!
//! SQL run here goes through `as_owner`: it runs with the extension owner's
//! rights, under a search path that nothing the caller planted can enter.

use crate::backend::BackendLocal;
use crate::errors::{internal, IdemError};
use crate::spi;
use pgrx::pg_sys;
use std::cell::Cell;
use std::collections::HashMap;
use std::rc::Rc;

/// One partition of idem.claims.
pub struct Partition {
    pub relid: pg_sys::Oid,
    pub index: pg_sys::Oid,
    /// TTL class, and range of expires_at in PostgreSQL timestamp
    /// microseconds, lower bound inclusive, upper exclusive; `None` for the
    /// DEFAULT partition.
    pub bound: Option<Bound>,
    /// The index's IndexInfo, built on first insert (BuildIndexInfo copies
    /// the index expression: too dear to do per claim). Lives in the list's
    /// memory context.
    pub index_info: Cell<*mut pg_sys::IndexInfo>,
    /// Seen with rows once: it is probed without asking its size again
    /// (believing a partition non-empty is always safe, the reverse never).
    pub seen_nonempty: Cell<bool>,
}

/// What a partition of idem.claims holds: claims of one TTL class
/// (ttl_class.rs) expiring in [from, to). In 0.3.0's layout, class
/// `LEGACY_CLASS`.
pub const LEGACY_CLASS: i16 = -1;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Bound {
    pub class: i16,
    pub from: i64,
    pub to: i64,
}

/// One reading of the partition list. Shared (Rc) between the cache and the
/// callers that are using it, so that an invalidation arriving while a
/// caller walks the list (it can: taking a lock processes invalidations)
/// drops only the cache's reference, never the list under the caller.
pub struct PartitionList {
    /// The partitioned table listed: idem.claims, or a shard of it.
    pub parent: pg_sys::Oid,
    pub parts: Vec<Partition>,
    /// idem.claims or a partition whose updates and deletes a publication
    /// would refuse (docs/design.md §12), and why: writers on the direct
    /// path refuse before writing anything, as the executor would refuse
    /// the SQL path's UPDATE.
    pub unreplicable: Option<(pg_sys::Oid, &'static str)>,
    /// idem.claims still has 0.3.0's layout (partitioned by expires_at
    /// alone, no ttl_class column): this library is installed and ALTER
    /// EXTENSION idem UPDATE has not run yet. Every partition is looked into,
    /// and rows are written in that shape (storage/direct.rs, sql.rs).
    pub legacy: bool,
    /// Holds what the entries point to outside Rust (IndexInfos).
    mcx: pg_sys::MemoryContext,
}

impl Drop for PartitionList {
    fn drop(&mut self) {
        unsafe { pg_sys::MemoryContextDelete(self.mcx) };
    }
}

impl PartitionList {
    /// The IndexInfo of partition `i`'s index, built once per list.
    pub fn index_info(&self, i: usize, index: pg_sys::Relation) -> *mut pg_sys::IndexInfo {
        let p = &self.parts[i];
        if p.index_info.get().is_null() {
            unsafe {
                let old = pg_sys::MemoryContextSwitchTo(self.mcx);
                p.index_info.set(pg_sys::BuildIndexInfo(index));
                pg_sys::MemoryContextSwitchTo(old);
            }
        }
        p.index_info.get()
    }

    fn mentions(&self, relid: pg_sys::Oid) -> bool {
        self.parent == relid || self.parts.iter().any(|p| p.relid == relid || p.index == relid)
    }
}

/// A business type's settings (idem_configure, idem_set_owner).
#[derive(Clone, Copy, Default)]
pub struct BizType {
    /// Configured TTL in microseconds; None: idem.default_ttl applies.
    pub ttl_us: Option<i64>,
    /// The name of the role whose members alone may use the type; None:
    /// every role. Kept by name, not OID: a dump restored onto a server
    /// where the role is missing (or has another OID) keeps every other
    /// setting, and the type stays closed until a superuser names an owner
    /// again (biztype.rs).
    pub owner: Option<pg_sys::NameData>,
}

/// The most business types a backend keeps settings of: a server with
/// 100,000 types must not cost every backend megabytes. Past it the cache
/// starts over (one SQL read per type brings it back).
const BIZ_TYPE_CACHE_MAX: usize = 4096;

#[derive(Default)]
struct Cache {
    claims: Option<pg_sys::Oid>,
    biz_types: Option<pg_sys::Oid>,
    /// Some(None): idem.type_classes does not exist (0.3.0's schema).
    type_classes: Option<Option<pg_sys::Oid>>,
    owner: Option<pg_sys::Oid>,
    /// Per parent: idem.claims, and under Citus each local shard of it that
    /// a claim has used (a few dozen at most).
    partitions: HashMap<pg_sys::Oid, Rc<PartitionList>>,
    /// Bumped whenever `partitions` is dropped, so that a caller can tell
    /// the list it locked is still the current one.
    generation: u64,
    biz_type_settings: HashMap<Vec<u8>, BizType>,
    /// This transaction changed business type settings: the cache must not
    /// outlive an abort.
    configured_in_xact: bool,
    callbacks_registered: bool,
}

static CACHE: BackendLocal<Option<Cache>> = BackendLocal::new(None);

fn with_cache<R>(f: impl FnOnce(&mut Cache) -> R) -> R {
    let register = CACHE.with(|c| {
        let c = c.get_or_insert_with(Cache::default);
        !std::mem::replace(&mut c.callbacks_registered, true)
    });
    if register {
        unsafe {
            pg_sys::CacheRegisterRelcacheCallback(Some(relcache_callback), pg_sys::Datum::from(0));
            pg_sys::RegisterXactCallback(Some(xact_callback), std::ptr::null_mut());
            pg_sys::RegisterSubXactCallback(Some(subxact_callback), std::ptr::null_mut());
        }
    }
    CACHE.with(|c| f(c.as_mut().expect("initialised above")))
}

/// Forget everything: the OIDs may belong to a dropped extension.
fn reset(c: &mut Cache) {
    c.claims = None;
    c.biz_types = None;
    c.type_classes = None;
    c.owner = None;
    drop_partitions(c);
    c.biz_type_settings.clear();
}

fn drop_partitions(c: &mut Cache) {
    c.partitions.clear();
    c.generation += 1;
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn relcache_callback(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    CACHE.with(|c| {
        let Some(c) = c.as_mut() else { return };
        if relid == pg_sys::InvalidOid || Some(relid) == c.claims || Some(relid) == c.biz_types {
            reset(c);
        } else if c.partitions.values().any(|l| l.mentions(relid)) {
            // All of them: invalidations are rare (DDL on the partitions).
            drop_partitions(c);
        }
    });
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn xact_callback(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    match event {
        pg_sys::XactEvent::XACT_EVENT_ABORT | pg_sys::XactEvent::XACT_EVENT_PARALLEL_ABORT => forget_uncommitted(),
        pg_sys::XactEvent::XACT_EVENT_COMMIT | pg_sys::XactEvent::XACT_EVENT_PARALLEL_COMMIT => {
            CACHE.with(|c| c.iter_mut().for_each(|c| c.configured_in_xact = false))
        }
        _ => {}
    }
}

#[pgrx::pg_guard]
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
    CACHE.with(|c| {
        if let Some(c) = c.as_mut().filter(|c| c.configured_in_xact) {
            c.biz_type_settings.clear();
            c.configured_in_xact = false;
        }
    });
}

fn relation_oid(name: &std::ffi::CStr) -> pg_sys::Oid {
    unsafe {
        let nsp = pg_sys::get_namespace_oid(c"idem".as_ptr(), true);
        let rel =
            if nsp == pg_sys::InvalidOid { pg_sys::InvalidOid } else { pg_sys::get_relname_relid(name.as_ptr(), nsp) };
        if rel == pg_sys::InvalidOid {
            IdemError::ObjectNotInPrerequisiteState(
                format!("relation idem.{} does not exist", name.to_string_lossy()),
                Some("Is the extension installed in this database (CREATE EXTENSION idem), and its schema as new as its library (ALTER EXTENSION idem UPDATE)?".into()),
            )
            .fail();
        }
        rel
    }
}

fn cached_oid(get: fn(&mut Cache) -> &mut Option<pg_sys::Oid>, name: &std::ffi::CStr) -> pg_sys::Oid {
    if let Some(oid) = with_cache(|c| *get(c)) {
        return oid;
    }
    let oid = relation_oid(name);
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
        let rel = unsafe { pg_sys::try_table_open(claims_oid(), lockmode) };
        if !rel.is_null() {
            return rel;
        }
        with_cache(reset);
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
    let found = unsafe {
        let nsp = pg_sys::get_namespace_oid(c"idem".as_ptr(), true);
        let rel = pg_sys::get_relname_relid(c"type_classes".as_ptr(), nsp);
        (rel != pg_sys::InvalidOid).then_some(rel)
    };
    with_cache(|c| c.type_classes = Some(found));
    found
}

/// The partitions of `parent` (idem.claims, or a local shard of it), and
/// the generation they belong to. Call with `parent` locked, so that the
/// list cannot change under the caller (every change to it needs a lock that
/// conflicts with RowExclusiveLock).
pub fn partitions(parent: pg_sys::Oid) -> (u64, Rc<PartitionList>) {
    claims_oid(); // so that relcache_callback recognises idem.claims' invalidation
    if let Some(found) = with_cache(|c| c.partitions.get(&parent).cloned().map(|l| (c.generation, l))) {
        return found;
    }
    // The generation before reading: an invalidation processed while we read
    // bumps it, and the caller's check then makes it read again.
    let generation = with_cache(|c| c.generation);
    let list = Rc::new(load_partitions(parent));
    with_cache(|c| {
        if c.generation == generation {
            c.partitions.insert(parent, list.clone());
        }
    });
    (generation, list)
}

/// The generation `partitions` would report now.
pub fn partitions_generation() -> u64 {
    with_cache(|c| c.generation)
}

fn load_partitions(parent: pg_sys::Oid) -> PartitionList {
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
    let mut list = PartitionList { parent, parts: Vec::new(), unreplicable: None, legacy: false, mcx };
    unsafe {
        let rel = pg_sys::table_open(parent, pg_sys::AccessShareLock as _);
        list.legacy = pg_sys::get_attnum(parent, c"ttl_class".as_ptr()) == pg_sys::InvalidAttrNumber as i16;
        list.unreplicable = replication_gap(rel).map(|why| (parent, why));
        // Detached-pending partitions included: their rows still count.
        let desc = pg_sys::RelationGetPartitionDesc(rel, false);
        for i in 0..(*desc).nparts as usize {
            let relid = *(*desc).oids.add(i);
            let bound = partition_bound(relid)
                .unwrap_or_else(|| internal(format!("partition {} of idem.claims has no bound", relid.to_u32())));
            let (index, gap) = check_shape(relid, list.legacy);
            if list.unreplicable.is_none() {
                list.unreplicable = gap.map(|why| (relid, why));
            }
            list.parts.push(Partition {
                relid,
                index,
                bound,
                index_info: Cell::new(std::ptr::null_mut()),
                seen_nonempty: Cell::new(false),
            });
        }
        pg_sys::table_close(rel, pg_sys::NoLock as _);
    }
    // Newest range first: a duplicate is most often a recent claim, and
    // the probe stops at the first live row. The default partition last.
    list.parts.sort_by_key(|p| std::cmp::Reverse(p.bound.map(|b| b.from)));
    list
}

/// A partition's bound from its `relpartbound`, in binary: `Some(None)` for
/// the default partition, None if `relid` is not a partition.
pub fn partition_bound(relid: pg_sys::Oid) -> Option<Option<Bound>> {
    unsafe {
        let tup = pg_sys::SearchSysCache1(pg_sys::SysCacheIdentifier::RELOID as i32, pg_sys::Datum::from(relid));
        if tup.is_null() {
            return None;
        }
        let mut isnull = false;
        let raw = pg_sys::SysCacheGetAttr(
            pg_sys::SysCacheIdentifier::RELOID as i32,
            tup,
            pg_sys::Anum_pg_class_relpartbound as _,
            &mut isnull,
        );
        let bound = (!isnull).then(|| {
            let text = pg_sys::text_to_cstring(raw.cast_mut_ptr());
            pg_sys::stringToNode(text) as *mut pg_sys::PartitionBoundSpec
        });
        pg_sys::ReleaseSysCache(tup);
        let spec = bound?;
        if (*spec).is_default {
            return Some(None);
        }
        // PARTITION_STRATEGY_RANGE: a #define in 15, an enum member since 16.
        if (*spec).strategy as u8 != b'r' {
            internal("idem.claims is not partitioned by range");
        }
        let (lower, upper) = (range_datums((*spec).lowerdatums), range_datums((*spec).upperdatums));
        if lower.0 != upper.0 {
            internal("a partition of idem.claims spans more than one TTL class");
        }
        Some(Some(Bound { class: lower.0, from: lower.1, to: upper.1 }))
    }
}

/// The two values of a range bound list (idem.claims is partitioned by
/// ttl_class, expires_at): MINVALUE and MAXVALUE of expires_at as the ends
/// of the timestamp line.
///
/// # Safety
/// `list` is a bound list of a PartitionBoundSpec from `stringToNode`.
unsafe fn range_datums(list: *mut pg_sys::List) -> (i16, i64) {
    unsafe {
        if list.is_null() || !(1..=2).contains(&(*list).length) {
            internal("a partition bound of idem.claims does not have the columns (ttl_class, expires_at)");
        }
        // 0.3.0's layout: expires_at alone.
        let legacy = (*list).length == 1;
        let at = |i: usize, ty: pg_sys::Oid| -> Option<pg_sys::Datum> {
            let datum = (*(*list).elements.add(i)).ptr_value as *mut pg_sys::PartitionRangeDatum;
            match (*datum).kind {
                pg_sys::PartitionRangeDatumKind::PARTITION_RANGE_DATUM_MINVALUE => None,
                pg_sys::PartitionRangeDatumKind::PARTITION_RANGE_DATUM_MAXVALUE => None,
                _ => {
                    let value = (*datum).value as *mut pg_sys::Const;
                    if value.is_null() || (*value).consttype != ty || (*value).constisnull {
                        internal("a partition bound of idem.claims is not a constant of its column's type");
                    }
                    Some((*value).constvalue)
                }
            }
        };
        let class = if legacy {
            LEGACY_CLASS
        } else {
            at(0, pg_sys::INT2OID)
                .unwrap_or_else(|| internal("a partition bound of idem.claims has no TTL class"))
                .value() as i16
        };
        let e = if legacy { 0 } else { 1 };
        let kind1 = (*((*(*list).elements.add(e)).ptr_value as *mut pg_sys::PartitionRangeDatum)).kind;
        let expiry = match at(e, pg_sys::TIMESTAMPTZOID) {
            Some(d) => d.value() as i64,
            None if kind1 == pg_sys::PartitionRangeDatumKind::PARTITION_RANGE_DATUM_MINVALUE => i64::MIN,
            None => i64::MAX,
        };
        (class, expiry)
    }
}

/// The column types every partition of idem.claims must have, in order
/// (sql/storage.sql; storage/direct.rs forms tuples of exactly this shape).
const SHAPE: [(pg_sys::Oid, &str); 8] = [
    (pg_sys::TIMESTAMPTZOID, "expires_at"),
    (pg_sys::TIMESTAMPTZOID, "claimed_at"),
    (pg_sys::INT2OID, "ttl_class"),
    (pg_sys::CHAROID, "state"),
    (pg_sys::TEXTOID, "biz_type"),
    (pg_sys::TEXTOID, "key"),
    (pg_sys::TEXTOID, "fingerprint"),
    (pg_sys::JSONBOID, "result"),
];

fn unexpected_shape(relid: pg_sys::Oid, what: String) -> ! {
    IdemError::FeatureNotSupported(
        format!("partition {} of idem.claims {what}", relation_name(relid)),
        Some("idem writes its partitions directly and only in the shape it created them. Undo the change by hand, or reinstall the extension.".into()),
    )
    .fail()
}

fn relation_name(relid: pg_sys::Oid) -> String {
    unsafe {
        let name = pg_sys::get_rel_name(relid);
        if name.is_null() {
            format!("{}", relid.to_u32())
        } else {
            format!("idem.{}", std::ffi::CStr::from_ptr(name).to_string_lossy())
        }
    }
}

/// Why a publication would refuse (or lose) updates and deletes of `rel`,
/// by the executor's own rule (CheckCmdReplicaIdentity): published for
/// them, it needs a replica identity (idem's tables have no key: FULL), and
/// a column list must cover it. None when nothing publishes its changes.
///
/// # Safety
/// `rel` is open.
unsafe fn replication_gap(rel: pg_sys::Relation) -> Option<&'static str> {
    unsafe {
        let mut desc = pg_sys::PublicationDesc::default();
        pg_sys::RelationBuildPublicationDesc(rel, &mut desc);
        let a = desc.pubactions;
        if !(a.pubupdate || a.pubdelete) {
            None
        } else if (*(*rel).rd_rel).relreplident as u8 != pg_sys::REPLICA_IDENTITY_FULL {
            Some("has no REPLICA IDENTITY FULL")
        } else if (a.pubupdate && !(desc.cols_valid_for_update && desc.rf_valid_for_update))
            || (a.pubdelete && !(desc.cols_valid_for_delete && desc.rf_valid_for_delete))
        {
            Some("is published with a column list that leaves out some of its columns")
        } else {
            None
        }
    }
}

/// Refuse a write on the direct path, before anything is written, if a
/// publication would refuse or lose its updates (the SQL path's UPDATE is
/// refused by the executor itself).
pub fn check_replicable(list: &PartitionList) {
    if let Some((relid, why)) = list.unreplicable {
        let name = if relid == claims_oid() { "idem.claims".to_string() } else { relation_name(relid) };
        IdemError::ObjectNotInPrerequisiteState(
            format!("{name} {why}, and a publication includes it: its updates and deletes would not replicate"),
            Some("Run SELECT idem_maintain(): it sets REPLICA IDENTITY FULL on idem.claims and every partition. Publish idem.claims without a column list. See the view idem_publications.".into()),
        )
        .fail()
    }
}

/// Check that a partition has the columns and the one digest index idem
/// writes to (a column added by hand would make the direct path form
/// tuples of the wrong shape); return the index's OID, and what
/// `replication_gap` says of the partition.
fn check_shape(relid: pg_sys::Oid, legacy: bool) -> (pg_sys::Oid, Option<&'static str>) {
    // 0.3.0's partitions lack ttl_class.
    let shape: Vec<_> = SHAPE.iter().filter(|(_, name)| !(legacy && *name == "ttl_class")).collect();
    unsafe {
        let rel = pg_sys::table_open(relid, pg_sys::AccessShareLock as _);
        let desc = (*rel).rd_att;
        let natts = (*desc).natts as usize;
        let columns_ok = natts == shape.len()
            && shape.iter().enumerate().all(|(i, (ty, name))| {
                let a = &*crate::compat::tuple_desc_attr(desc, i);
                !a.attisdropped
                    && a.atttypid == *ty
                    && std::ffi::CStr::from_ptr(a.attname.data.as_ptr()).to_bytes() == name.as_bytes()
            });
        if !columns_ok {
            unexpected_shape(
                relid,
                "does not have the columns idem created it with (a column was added, dropped or changed)".into(),
            );
        }
        let indexes = pg_sys::RelationGetIndexList(rel);
        let n = if indexes.is_null() { 0 } else { (*indexes).length };
        if n != 1 {
            unexpected_shape(relid, format!("has {n} indexes; idem maintains exactly one"));
        }
        let index_oid = (*(*indexes).elements).oid_value;
        let index = pg_sys::index_open(index_oid, pg_sys::AccessShareLock as _);
        let exprs = pg_sys::RelationGetIndexExpressions(index);
        let ix = (*index).rd_index;
        let digest = (*ix).indnatts == 1
            && (*(*index).rd_rel).relam == pg_sys::BTREE_AM_OID
            && !exprs.is_null()
            && (*exprs).length == 1
            && {
                let e = (*(*exprs).elements).ptr_value as *mut pg_sys::Node;
                (*e).type_ == pg_sys::NodeTag::T_FuncExpr && is_key_hash((*(e as *mut pg_sys::FuncExpr)).funcid)
            }
            && pg_sys::RelationGetIndexPredicate(index).is_null();
        let valid = (*ix).indisvalid && (*ix).indisready;
        let gap = replication_gap(rel);
        // The locks go now: a claim locks the partitions it looks into
        // itself, and keeping one on every partition of every class would
        // cost each backend's first claim a lock per partition until its
        // transaction ends (lock table space that 100 sessions can exhaust).
        pg_sys::index_close(index, pg_sys::AccessShareLock as _);
        pg_sys::table_close(rel, pg_sys::AccessShareLock as _);
        if !digest {
            unexpected_shape(
                relid,
                "has an index that is not idem's digest index (btree on idem.key_hash(biz_type, key))".into(),
            );
        }
        if !valid {
            unexpected_shape(
                relid,
                "has its digest index marked invalid (an interrupted REINDEX CONCURRENTLY?)".into(),
            );
        }
        (index_oid, gap)
    }
}

fn is_key_hash(funcid: pg_sys::Oid) -> bool {
    unsafe {
        let name = pg_sys::get_func_name(funcid);
        let nsp = pg_sys::get_namespace_oid(c"idem".as_ptr(), true);
        !name.is_null()
            && std::ffi::CStr::from_ptr(name).to_bytes() == b"key_hash"
            && pg_sys::get_func_namespace(funcid) == nsp
    }
}

/// A business type's settings, cached until idem.biz_types is invalidated.
pub fn biz_type(name: &str) -> BizType {
    biz_types_oid(); // so that relcache_callback recognises its invalidation
    if let Some(found) = with_cache(|c| c.biz_type_settings.get(name.as_bytes()).copied()) {
        return found;
    }
    let found = read_biz_type(name);
    with_cache(|c| {
        if c.biz_type_settings.len() >= BIZ_TYPE_CACHE_MAX {
            c.biz_type_settings.clear();
        }
        c.biz_type_settings.insert(name.as_bytes().to_vec(), found)
    });
    found
}

/// A business type's settings, read now through SQL on idem.biz_types.
pub fn read_biz_type(name: &str) -> BizType {
    static READ: spi::Statement = spi::Statement::new(
        c"SELECT ttl, owner FROM idem.biz_types WHERE biz_type OPERATOR(pg_catalog.=) $1",
        &[pg_sys::TEXTOID],
    );
    // An older schema (the new library installed, ALTER EXTENSION UPDATE not
    // run yet): 0.3.0's owner is a regrole, 0.2.0 has none. Claims keep
    // working meanwhile.
    static READ_0_3: spi::Statement = spi::Statement::new(
        c"SELECT ttl, (SELECT r.rolname FROM pg_catalog.pg_roles r WHERE r.oid OPERATOR(pg_catalog.=) owner::pg_catalog.oid)
            FROM idem.biz_types WHERE biz_type OPERATOR(pg_catalog.=) $1",
        &[pg_sys::TEXTOID],
    );
    static READ_0_2: spi::Statement = spi::Statement::new(
        c"SELECT ttl, NULL::pg_catalog.name FROM idem.biz_types WHERE biz_type OPERATOR(pg_catalog.=) $1",
        &[pg_sys::TEXTOID],
    );
    let read = match owner_column_type(biz_types_oid()) {
        Some(t) if t == pg_sys::NAMEOID => &READ,
        Some(_) => &READ_0_3,
        None => &READ_0_2,
    };
    let rows = as_owner(|| read.query(&[Some(crate::datum::text_datum(name.as_bytes()))]));
    let Some(row) = rows.first() else { return BizType::default() };
    BizType {
        ttl_us: row[0].map(|d| crate::guc::interval_us(unsafe { &*d.cast_mut_ptr::<pg_sys::Interval>() }) as i64),
        owner: row[1].map(|d| unsafe { *d.cast_mut_ptr::<pg_sys::NameData>() }),
    }
}

/// The type of the owner column of a table of idem.biz_types' shape (name
/// since 0.4.0, regrole in 0.3.0); None without one (0.2.0).
pub fn owner_column_type(relid: pg_sys::Oid) -> Option<pg_sys::Oid> {
    let attnum = unsafe { pg_sys::get_attnum(relid, c"owner".as_ptr()) };
    (attnum != pg_sys::InvalidAttrNumber as i16).then(|| unsafe { pg_sys::get_atttype(relid, attnum) })
}

/// A role's name as NameData (a role named by an OID that no longer exists
/// reads as that number, which no role can be named).
fn role_name_data(role: pg_sys::Oid) -> pg_sys::NameData {
    let found = unsafe { pg_sys::GetUserNameFromId(role, true) };
    let text = if found.is_null() {
        std::ffi::CString::new(role.to_u32().to_string()).expect("digits have no NUL")
    } else {
        unsafe { std::ffi::CStr::from_ptr(found) }.to_owned()
    };
    let mut name = pg_sys::NameData::default();
    unsafe { pg_sys::namestrcpy(&mut name, text.as_ptr()) };
    name
}

/// A business type's settings read now, without SQL, from `relid`: a table
/// of idem.biz_types' shape (under Citus, this node's placement of the
/// reference table: storage/citus.rs), through its primary key, with the
/// caller's MVCC snapshot, as the SQL read would.
pub fn read_biz_type_in(relid: pg_sys::Oid, name: &str) -> BizType {
    unsafe {
        let rel = pg_sys::table_open(relid, pg_sys::AccessShareLock as _);
        let index_oid = crate::compat::primary_key_index(rel);
        if index_oid == pg_sys::InvalidOid {
            internal(format!("{} has no primary key", relation_name(relid)));
        }
        let index = pg_sys::index_open(index_oid, pg_sys::AccessShareLock as _);
        let column = |name: &std::ffi::CStr| pg_sys::get_attnum(relid, name.as_ptr());
        let (biz_type, ttl, owner) = (column(c"biz_type"), column(c"ttl"), column(c"owner"));
        if biz_type == pg_sys::InvalidAttrNumber as i16
            || ttl == pg_sys::InvalidAttrNumber as i16
            || (*(*index).rd_index).indnatts != 1
            || (*(*index).rd_index).indkey.values.as_slice(1)[0] != biz_type
        {
            internal(format!("{} does not have the shape of idem.biz_types", relation_name(relid)));
        }
        // The index's collation orders the search, whatever the database's.
        let mut key: pg_sys::ScanKeyData = std::mem::MaybeUninit::zeroed().assume_init();
        pg_sys::ScanKeyEntryInitialize(
            &mut key,
            0,
            1,
            pg_sys::BTEqualStrategyNumber as _,
            pg_sys::InvalidOid,
            *(*index).rd_indcollation,
            pg_sys::Oid::from(pg_sys::F_TEXTEQ),
            crate::datum::text_datum(name.as_bytes()),
        );
        let snapshot =
            if pg_sys::ActiveSnapshotSet() { pg_sys::GetActiveSnapshot() } else { pg_sys::GetTransactionSnapshot() };
        let scan = crate::compat::index_beginscan(rel, index, snapshot, 1);
        pg_sys::index_rescan(scan, &mut key, 1, std::ptr::null_mut(), 0);
        let slot = pg_sys::table_slot_create(rel, std::ptr::null_mut());
        let mut found = BizType::default();
        if pg_sys::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, slot) {
            let last = ttl.max(owner);
            pg_sys::slot_getsomeattrs_int(slot, last as i32);
            let values = std::slice::from_raw_parts((*slot).tts_values, last as usize);
            let nulls = std::slice::from_raw_parts((*slot).tts_isnull, last as usize);
            let at = |attnum: i16| {
                (attnum != pg_sys::InvalidAttrNumber as i16 && !nulls[attnum as usize - 1])
                    .then(|| values[attnum as usize - 1])
            };
            let owner_is_name = owner_column_type(relid) == Some(pg_sys::NAMEOID);
            found = BizType {
                ttl_us: at(ttl).map(|d| crate::guc::interval_us(&*d.cast_mut_ptr::<pg_sys::Interval>()) as i64),
                owner: at(owner).map(|d| {
                    if owner_is_name {
                        *d.cast_mut_ptr::<pg_sys::NameData>()
                    } else {
                        role_name_data(pg_sys::Oid::from(d.value() as u32))
                    }
                }),
            };
        }
        pg_sys::ExecDropSingleTupleTableSlot(slot);
        pg_sys::index_endscan(scan);
        pg_sys::index_close(index, pg_sys::NoLock as _);
        pg_sys::table_close(rel, pg_sys::NoLock as _);
        found
    }
}

/// Tell every backend (this one included, at the next command) that the
/// business type settings changed. Sent at commit, so a rolled-back change
/// sends nothing.
pub fn invalidate_biz_types() {
    unsafe { pg_sys::CacheInvalidateRelcacheByRelid(biz_types_oid()) };
    with_cache(|c| {
        c.biz_type_settings.clear();
        c.configured_in_xact = true;
    });
}

/// Run SQL for the extension: as the owner of schema idem (the API's C
/// functions are SECURITY INVOKER: their direct storage access needs no
/// rights, only the SQL they run does), with `search_path = pg_catalog,
/// pg_temp` set at a new GUC nest level (objects in pg_temp never resolve
/// functions or operators, and idem's SQL names its relations with their
/// schema), so that nothing the caller planted resolves. Both are undone
/// when `f` returns or fails.
pub fn as_owner<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(pg_sys::Oid, i32, i32);
    impl Drop for Restore {
        fn drop(&mut self) {
            unsafe {
                pg_sys::AtEOXact_GUC(true, self.2);
                pg_sys::SetUserIdAndSecContext(self.0, self.1);
            }
        }
    }
    let owner = storage_owner();
    let restore = unsafe {
        let (mut user, mut context) = (pg_sys::InvalidOid, 0);
        pg_sys::GetUserIdAndSecContext(&mut user, &mut context);
        let level = pg_sys::NewGUCNestLevel();
        let restore = Restore(user, context, level);
        pg_sys::SetUserIdAndSecContext(owner, context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32);
        pg_sys::set_config_option(
            c"search_path".as_ptr(),
            c"pg_catalog, pg_temp".as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_SAVE,
            true,
            0,
            false,
        );
        restore
    };
    let r = f();
    drop(restore);
    r
}

/// The owner of schema idem: whoever created the extension.
fn storage_owner() -> pg_sys::Oid {
    if let Some(o) = with_cache(|c| c.owner) {
        return o;
    }
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

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    /// A backend that uses more business types than the cache holds keeps
    /// reading their settings right, and its cache stays bounded.
    #[pg_test]
    fn biz_type_settings_cache_is_bounded() {
        let n = 5000;
        Spi::run(&format!(
            "INSERT INTO idem.biz_types (biz_type, ttl) SELECT 'cache.' || g, g * interval '1 second' FROM generate_series(1, {n}) g"
        ))
        .unwrap();
        // The reads below use the active snapshot: one that sees the rows.
        unsafe {
            pgrx::pg_sys::CommandCounterIncrement();
            pgrx::pg_sys::PushActiveSnapshot(pgrx::pg_sys::GetTransactionSnapshot());
        }
        for i in 1..=n {
            let settings = super::biz_type(&format!("cache.{i}"));
            assert_eq!(settings.ttl_us, Some(i * 1_000_000), "cache.{i}");
        }
        unsafe { pgrx::pg_sys::PopActiveSnapshot() };
        let cached = super::with_cache(|c| c.biz_type_settings.len());
        assert!(cached > 0 && cached <= super::BIZ_TYPE_CACHE_MAX, "{cached} types cached");
    }
}
