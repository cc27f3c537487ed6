//! The partitions of idem.claims (or, under Citus, of a local shard of it:
//! citus.rs) as the direct path needs them: their ranges and digest
//! indexes, read once per backend and kept until an invalidation says they
//! changed, each checked for the shape idem created it with and for what a
//! publication would refuse.
//!
//! Everything is read in binary: partition bounds come from each
//! partition's `relpartbound` node tree, never through text, so no session
//! setting (DateStyle, TimeZone, abbreviations) can change what a claim
//! reads (docs/design.md §5).
//!
//! Invalidation: catalog.rs's relcache callback passes every invalidated
//! relation here (`relation_invalidated`); the lists are dropped whenever
//! the relcache entry of a listed parent, of any of its partitions or of
//! their indexes is invalidated: a partition created, dropped, attached or
//! detached, REINDEX [CONCURRENTLY], VACUUM FULL, CLUSTER, ALTER TABLE; and
//! with every cached OID when idem.claims or idem.biz_types themselves are
//! (DROP EXTENSION, CREATE EXTENSION, ALTER EXTENSION UPDATE).

use super::columns;
use crate::backend::BackendLocal;
use crate::catalog::{self, relation_name};
use crate::errors::{internal, IdemError};
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
    /// Dropped from the cache by an invalidation (or read while one came
    /// in): a caller that locked the partitions of this reading reads the
    /// list again.
    pub stale: Cell<bool>,
    /// Holds what the entries point to outside Rust (the IndexInfos
    /// storage/direct.rs builds).
    pub mcx: pg_sys::MemoryContext,
}

impl Drop for PartitionList {
    fn drop(&mut self) {
        // SAFETY: the list owns `mcx`, created for it in `load` and deleted once, here.
        unsafe { pg_sys::MemoryContextDelete(self.mcx) };
    }
}

impl PartitionList {
    fn mentions(&self, relid: pg_sys::Oid) -> bool {
        self.parent == relid || self.parts.iter().any(|p| p.relid == relid || p.index == relid)
    }
}

#[derive(Default)]
struct Cache {
    /// Per parent: idem.claims, and under Citus each local shard of it that
    /// a claim has used (a few dozen at most).
    lists: HashMap<pg_sys::Oid, Rc<PartitionList>>,
    /// Bumped whenever `lists` is dropped, so that `list` can tell that
    /// an invalidation came in while it read one.
    generation: u64,
}

static CACHE: BackendLocal<Option<Cache>> = BackendLocal::new(None);

fn with_cache<R>(f: impl FnOnce(&mut Cache) -> R) -> R {
    CACHE.with(|c| f(c.get_or_insert_with(Cache::default)))
}

/// Called by catalog.rs's relcache callback for every invalidated relation
/// (`everything`: idem's own OIDs were dropped too).
pub fn relation_invalidated(relid: pg_sys::Oid, everything: bool) {
    CACHE.with(|c| {
        let Some(c) = c.as_mut() else { return };
        // All of them: invalidations are rare (DDL on the partitions).
        if everything || c.lists.values().any(|l| l.mentions(relid)) {
            c.lists.values().for_each(|l| l.stale.set(true));
            c.lists.clear();
            c.generation += 1;
        }
    });
}

/// The partitions of `parent` (idem.claims, or a local shard of it). Call
/// with `parent` locked, so that the list cannot change under the caller
/// (every change to it needs a lock that conflicts with RowExclusiveLock);
/// a caller that takes more locks meanwhile checks `stale` after them.
pub fn list(parent: pg_sys::Oid) -> Rc<PartitionList> {
    catalog::claims_oid(); // so that catalog.rs's relcache callback recognises idem.claims' invalidation
    if let Some(found) = with_cache(|c| c.lists.get(&parent).cloned()) {
        return found;
    }
    // The generation before reading: an invalidation processed while we read
    // bumps it, and the reading is then stale at once.
    let generation = with_cache(|c| c.generation);
    let list = Rc::new(load(parent));
    with_cache(|c| {
        if c.generation == generation {
            c.lists.insert(parent, list.clone());
        } else {
            list.stale.set(true);
        }
    });
    list
}

fn load(parent: pg_sys::Oid) -> PartitionList {
    // SAFETY: a child of TopMemoryContext with a static name, owned by the PartitionList built next.
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
    let mut list =
        PartitionList { parent, parts: Vec::new(), unreplicable: None, legacy: false, stale: Cell::new(false), mcx };
    // SAFETY: the parent is opened before its partition descriptor is read and closed after; the descriptor
    // is read within its `nparts`.
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
    // SAFETY: the syscache tuple is checked for NULL and released before the block ends; the node tree is
    // parsed from its own copy of the text.
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
    // SAFETY: `list` is a bound list from stringToNode (this function's contract); its length is checked
    // before elements are read.
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

fn unexpected_shape(relid: pg_sys::Oid, what: String) -> ! {
    IdemError::FeatureNotSupported(
        format!("partition {} of idem.claims {what}", relation_name(relid)),
        Some("idem writes its partitions directly and only in the shape it created them. Undo the change by hand, or reinstall the extension.".into()),
    )
    .fail()
}

/// Why a publication would refuse (or lose) updates and deletes of `rel`,
/// by the executor's own rule (CheckCmdReplicaIdentity): published for
/// them, it needs a replica identity (idem's tables have no key: FULL), and
/// a column list must cover it. None when nothing publishes its changes.
///
/// # Safety
/// `rel` is open.
unsafe fn replication_gap(rel: pg_sys::Relation) -> Option<&'static str> {
    // SAFETY: `rel` is open (this function's contract).
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

/// Check that a partition has the columns and the one digest index idem
/// writes to (a column added by hand would make the direct path form
/// tuples of the wrong shape); return the index's OID, and what
/// `replication_gap` says of the partition.
fn check_shape(relid: pg_sys::Oid, legacy: bool) -> (pg_sys::Oid, Option<&'static str>) {
    // 0.3.0's partitions lack ttl_class.
    let shape: Vec<_> = columns::layout(legacy).collect();
    // SAFETY: the partition and its index are opened and locked before they are read and closed before the
    // block ends; attributes are read below `natts`, list elements below `length`.
    unsafe {
        let rel = pg_sys::table_open(relid, pg_sys::AccessShareLock as _);
        let desc = (*rel).rd_att;
        let natts = (*desc).natts as usize;
        let columns_ok = natts == shape.len()
            && shape.iter().enumerate().all(|(i, column)| {
                let a = &*crate::compat::tuple_desc_attr(desc, i);
                !a.attisdropped
                    && a.atttypid == column.type_oid
                    && std::ffi::CStr::from_ptr(a.attname.data.as_ptr()).to_bytes() == column.name.as_bytes()
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
    // SAFETY: catalog lookups; get_func_name's result is checked for NULL before it is read.
    unsafe {
        let name = pg_sys::get_func_name(funcid);
        let nsp = pg_sys::get_namespace_oid(c"idem".as_ptr(), true);
        !name.is_null()
            && std::ffi::CStr::from_ptr(name).to_bytes() == b"key_hash"
            && pg_sys::get_func_namespace(funcid) == nsp
    }
}
