//! Citus: idem.claims hash-distributed by `key` (idem_distribute,
//! docs/scaling.md). Each shard of it is an ordinary partitioned table on
//! the node that holds the shard's placement (`idem.claims_<shardid>`, with
//! partitions `idem.claims_<partition>_<shardid>`). Claims of one key
//! exclude each other only where they take the same key lock, on one node,
//! hence the invariants this module keeps:
//!
//! * Every idem call on a key runs on the node that holds the placement of
//!   the key's shard, and nowhere else. Anywhere else (the coordinator, a
//!   call form Citus does not delegate, a worker asked for a key of another
//!   worker) it is refused with 0A000 before anything is read or written.
//! * That stays true until the transaction ends. Before it reads the
//!   placement, the call takes the shard's Citus metadata lock in ShareLock
//!   (the tag of Citus's `LockShardDistributionMetadata`, which Citus's own
//!   writers take) and keeps it to the end of the transaction. A shard move
//!   takes that lock in ExclusiveLock on every node before it changes the
//!   placement: it waits for every transaction that checked, and a call that
//!   checks after a move reads the new placement (pg_dist_placement has no
//!   syscache, so every scan of it takes a new catalog snapshot, here after
//!   the lock).
//! * On that node the key's row is read and written directly in the shard's
//!   partitions (direct.rs: dirty snapshot, short key lock), without a
//!   statement for Citus to plan. That is the direct path's protocol,
//!   correct because every call on the key runs on this node and uses it.
//!
//! The shard is found as Citus finds it (FindShardInterval): the hash
//! function of text's default hash opclass under the key column's collation,
//! then the hash range that holds the hash. The ranges (pg_dist_shard) are
//! cached per backend until idem.claims' relcache entry is invalidated,
//! which Citus's triggers on pg_dist_partition, pg_dist_shard and
//! pg_dist_placement do at every change of its metadata (also on workers,
//! where metadata sync writes them); an invalidation that the lock lets in
//! is honoured before the check. The placement and this node's group are
//! read per call, after the lock.

use super::Target;
use crate::backend::BackendLocal;
use crate::catalog;
use crate::errors::{internal, IdemError};
use crate::key::ClaimKey;
use pgrx::pg_sys;
use std::cell::Cell;
use std::ffi::CStr;
use std::rc::Rc;

/// One shard of idem.claims: its hash range, both ends inclusive.
struct Shard {
    id: i64,
    min: i32,
    max: i32,
}

/// What the claim path needs of idem.claims' distribution.
struct Distribution {
    colocation: u32,
    /// Collation of the key column, under which Citus hashes it.
    collation: pg_sys::Oid,
    /// Sorted by range: a shard's position is Citus's shard index.
    shards: Vec<Shard>,
    /// The shard of the reference table idem.biz_types (one per table).
    biz_types_shard: Option<i64>,
    /// The shards of idem.type_classes, co-located with idem.claims (same
    /// hash ranges, same positions), each with whether its registrations
    /// were found complete (its anchor row, see `registry`); None when
    /// the registry is not distributed that way.
    registry: Option<Vec<(i64, Cell<bool>)>>,
}

/// The answer read at catalog epoch `epoch` (None: not distributed).
struct Known {
    epoch: u64,
    dist: Option<Rc<Distribution>>,
}

/// Current while catalog::epoch() is `Known::epoch`: the epoch moves on
/// whenever idem.claims' or idem.biz_types' relcache entry is invalidated
/// (catalog.rs), which is what every change of Citus's metadata for them
/// sends.
static KNOWN: BackendLocal<Option<Known>> = BackendLocal::new(None);

/// The cached answer, if it is current.
fn known() -> Option<Option<Rc<Distribution>>> {
    let epoch = catalog::epoch();
    KNOWN.with(|k| k.as_ref().filter(|k| k.epoch == epoch).map(|k| k.dist.clone()))
}

/// The distribution of idem.claims, if Citus distributes it in this database.
fn distribution() -> Option<Rc<Distribution>> {
    let claims = catalog::claims_oid();
    if let Some(found) = known() {
        return found;
    }
    let biz_types = catalog::biz_types_oid();
    // The epoch before reading: an answer read while an invalidation
    // arrived is not kept.
    let epoch = catalog::epoch();
    let dist = load(claims, biz_types).map(Rc::new);
    if catalog::epoch() == epoch {
        KNOWN.with(|k| *k = Some(Known { epoch, dist: dist.clone() }));
    }
    dist
}

/// Whether idem.claims is distributed by Citus in this database.
pub fn distributed() -> bool {
    distribution().is_some()
}

fn load(claims: pg_sys::Oid, biz_types: pg_sys::Oid) -> Option<Distribution> {
    // No Citus in this database: no pg_dist_partition.
    catalog_table(c"pg_dist_partition")?;
    let mut method = None;
    let mut colocation = 0u32;
    scan(c"pg_dist_partition", c"pg_dist_partition_logical_relid_index", &[oid_key(c"logicalrelid", claims)], |r| {
        method = r.get(c"partmethod").map(|d| d.value() as u8);
        colocation = r.get(c"colocationid").map_or(0, |d| d.value() as u32);
    });
    match method? {
        b'h' => {}
        m => IdemError::FeatureNotSupported(
            format!(
                "idem.claims is distributed by Citus with method '{}'; idem needs hash distribution by key",
                m as char
            ),
            Some(
                "Undo it (SELECT undistribute_table('idem.claims')) and use SELECT idem_distribute('your_table')."
                    .into(),
            ),
        )
        .fail(),
    }
    let mut shards = Vec::new();
    scan(c"pg_dist_shard", c"pg_dist_shard_logical_relid_index", &[oid_key(c"logicalrelid", claims)], |r| {
        let bound = |col: &CStr| {
            r.get(col)
                // SAFETY: shardminvalue is a text column, so a non-NULL value is a varlena datum valid inside
                // `scan`'s closure.
                .and_then(|d| std::str::from_utf8(unsafe { crate::datum::varlena_bytes(d) }).ok()?.parse::<i32>().ok())
                .unwrap_or_else(|| internal("a shard of idem.claims in pg_dist_shard has no integer hash range"))
        };
        let id = r.get(c"shardid").map_or(0, |d| d.value() as i64);
        shards.push(Shard { id, min: bound(c"shardminvalue"), max: bound(c"shardmaxvalue") });
    });
    shards.sort_by_key(|s| s.min);
    let registry = catalog::type_classes_oid().and_then(|relid| registry_shards(relid, colocation, &shards));
    let mut biz_types_shard = None;
    scan(c"pg_dist_shard", c"pg_dist_shard_logical_relid_index", &[oid_key(c"logicalrelid", biz_types)], |r| {
        biz_types_shard = r.get(c"shardid").map(|d| d.value() as i64);
    });
    // SAFETY: catalog lookups on idem.claims (open: the caller reads its OID from the catalog), writing into
    // local variables.
    let collation = unsafe {
        let attnum = pg_sys::get_attnum(claims, c"key".as_ptr());
        let (mut typid, mut typmod, mut collation) = (pg_sys::InvalidOid, 0, pg_sys::InvalidOid);
        pg_sys::get_atttypetypmodcoll(claims, attnum, &mut typid, &mut typmod, &mut collation);
        collation
    };
    Some(Distribution { colocation, collation, shards, biz_types_shard, registry })
}

/// The shards of the registry `relid` (idem.type_classes), position by
/// position with idem.claims' `shards`, if Citus distributes it by hash in
/// idem.claims' co-location group (sql/scaling.sql: idem_distribute, idem.fill_registry).
fn registry_shards(relid: pg_sys::Oid, colocation: u32, shards: &[Shard]) -> Option<Vec<(i64, Cell<bool>)>> {
    let mut same_group = false;
    scan(c"pg_dist_partition", c"pg_dist_partition_logical_relid_index", &[oid_key(c"logicalrelid", relid)], |r| {
        same_group = r.get(c"partmethod").map(|d| d.value() as u8) == Some(b'h')
            && r.get(c"colocationid").map_or(0, |d| d.value() as u32) == colocation;
    });
    if !same_group {
        return None;
    }
    let mut found = Vec::new();
    scan(c"pg_dist_shard", c"pg_dist_shard_logical_relid_index", &[oid_key(c"logicalrelid", relid)], |r| {
        let bound = |col: &CStr| {
            // SAFETY: as in `load`: a text column's non-NULL datum, valid inside the closure.
            r.get(col)
                .and_then(|d| std::str::from_utf8(unsafe { crate::datum::varlena_bytes(d) }).ok()?.parse::<i32>().ok())
        };
        found.push((
            r.get(c"shardid").map_or(0, |d| d.value() as i64),
            bound(c"shardminvalue"),
            bound(c"shardmaxvalue"),
        ));
    });
    found.sort_by_key(|s| s.1);
    // Co-located: the same ranges, so the same positions.
    let aligned =
        found.len() == shards.len() && found.iter().zip(shards).all(|(f, s)| f.1 == Some(s.min) && f.2 == Some(s.max));
    aligned.then(|| found.into_iter().map(|f| (f.0, Cell::new(false))).collect())
}

/// This node's shard of the registry next to the key's shard (position
/// `index`), if its registrations are known complete: it holds the anchor
/// row `('#<shard id>', -1, infinity)` that idem.fill_registry writes for
/// each shard once it has registered every claim in it (at idem_distribute,
/// at the update from 0.3.0, and at the first idem_maintain after a shard
/// split). A move carries the anchor with the shard; a split makes shards
/// with new ids and no anchor (their registrations were divided by the
/// registering claims' keys, not by the keys of the claims they cover), and
/// until maintenance fills them anew, claims on them look into every class.
fn registry(dist: &Distribution, index: usize) -> Option<pg_sys::Oid> {
    let (id, anchored) = dist.registry.as_ref()?.get(index)?;
    let relid = relation_in_idem(&format!("type_classes_{id}"))?;
    if !anchored.get() {
        let anchor = format!("#{id}");
        if !super::type_classes::read_uncached(relid, anchor.as_bytes()).covers(-1, i64::MAX) {
            return None;
        }
        // (Maintenance never removes an anchor; a refill writes it again
        // under a lock no claim gets past.)
        anchored.set(true);
    }
    Some(relid)
}

/// Citus's hash of a key (its text datum): text's default hash function,
/// under the key column's collation.
fn hash(key: pg_sys::Datum, collation: pg_sys::Oid) -> i32 {
    // SAFETY: the type cache entry lives for the backend; its hash function is checked to exist before it is
    // called on a text datum.
    unsafe {
        let tc = pg_sys::lookup_type_cache(pg_sys::TEXTOID, pg_sys::TYPECACHE_HASH_PROC_FINFO as i32);
        if tc.is_null() || (*tc).hash_proc_finfo.fn_oid == pg_sys::InvalidOid {
            internal("type text has no default hash function");
        }
        pg_sys::FunctionCall1Coll(&mut (*tc).hash_proc_finfo, collation, key).value() as i32
    }
}

/// The table to read and write `k`'s row in on this node: the local shard
/// of idem.claims that holds the key, with its metadata lock taken for the
/// rest of the transaction; None if idem.claims is not distributed. Refuses
/// (0A000) when the shard's placement is on another node.
pub fn local_shard(k: &ClaimKey) -> Option<Target> {
    loop {
        let dist = distribution()?;
        let h = hash(k.key_text, dist.collation);
        let index = dist.shards.partition_point(|s| s.max < h);
        let shard = match dist.shards.get(index) {
            Some(s) if s.min <= h => s,
            _ => internal(format!("no shard of idem.claims in pg_dist_shard covers hash {h}")),
        };
        lock_metadata(&dist, index, shard.id);
        // The lock may have waited for a change of the metadata (a move, a
        // split): take its invalidations in, and look again if they dropped
        // what was just used.
        // SAFETY: processes pending invalidations inside a transaction, as any lock acquisition does.
        unsafe { pg_sys::AcceptInvalidationMessages() };
        if !known().flatten().is_some_and(|d| Rc::ptr_eq(&d, &dist)) {
            continue;
        }
        let groups = placement_groups(shard.id);
        if !groups.contains(&local_group()) {
            not_here(k, shard.id, &groups);
        }
        let name = format!("claims_{}", shard.id);
        let relid = relation_in_idem(&name).unwrap_or_else(|| {
            internal(format!(
                "the placement of shard {} of idem.claims is on this node, but idem.{name} is missing",
                shard.id
            ))
        });
        // The registry of TTL classes next to the shard, on this node,
        // written here by the claims (type_classes.rs); without a complete
        // one a claim looks into every class (direct.rs).
        let registry = registry(&dist, index);
        return Some(Target { shell: Some(catalog::claims_oid()), parent: relid, registry });
    }
}

/// Citus's shard metadata lock on `shard` (index `index` in the sorted
/// shard list), in ShareLock, until the transaction ends: the tag of
/// `SetLocktagForShardDistributionMetadata` (citus/utils/resource_lock.c)
/// — per colocation group and shard index for hash-distributed tables.
fn lock_metadata(dist: &Distribution, index: usize, shard: i64) {
    const ADV_LOCKTAG_CLASS_CITUS_SHARD_METADATA: u16 = 4;
    const ADV_LOCKTAG_CLASS_CITUS_COLOCATED_SHARDS_METADATA: u16 = 8;
    let (field2, field3, field4) = if dist.colocation == 0 {
        ((shard >> 32) as u32, shard as u32, ADV_LOCKTAG_CLASS_CITUS_SHARD_METADATA)
    } else {
        (index as u32, dist.colocation, ADV_LOCKTAG_CLASS_CITUS_COLOCATED_SHARDS_METADATA)
    };
    let tag = pg_sys::LOCKTAG {
        // SAFETY: a backend global, set once at connection, read on the backend's only thread.
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.into(),
        locktag_field2: field2,
        locktag_field3: field3,
        locktag_field4: field4,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    };
    // SAFETY: a transaction-level lock on a fully initialised tag, released by PostgreSQL at transaction end.
    unsafe { pg_sys::LockAcquire(&tag, pg_sys::ShareLock as _, false, false) };
}

/// The groups (nodes) holding an active placement of `shard`.
fn placement_groups(shard: i64) -> Vec<i32> {
    const SHARD_STATE_ACTIVE: i32 = 1;
    let mut groups = Vec::new();
    scan(c"pg_dist_placement", c"pg_dist_placement_shardid_index", &[int8_key(c"shardid", shard)], |r| {
        if r.get(c"shardstate").map_or(SHARD_STATE_ACTIVE, |d| d.value() as i32) == SHARD_STATE_ACTIVE {
            if let Some(g) = r.get(c"groupid") {
                groups.push(g.value() as i32);
            }
        }
    });
    groups
}

/// This node's group (0 on the coordinator).
fn local_group() -> i32 {
    let mut group = None;
    scan(c"pg_dist_local_group", c"", &[], |r| group = r.get(c"groupid").map(|d| d.value() as i32));
    group.unwrap_or_else(|| internal("pg_dist_local_group is empty"))
}

fn not_here(k: &ClaimKey, shard: i64, groups: &[i32]) -> ! {
    let mut nodes = Vec::new();
    scan(c"pg_dist_node", c"", &[], |r| {
        let group = r.get(c"groupid").map(|d| d.value() as i32);
        if group.is_some_and(|g| groups.contains(&g)) {
            let name = r
                .get(c"nodename")
                // SAFETY: nodename is a text column, so a non-NULL value is a varlena datum valid inside
                // `scan`'s closure.
                .map(|d| String::from_utf8_lossy(unsafe { crate::datum::varlena_bytes(d) }).into_owned());
            let port = r.get(c"nodeport").map_or(0, |d| d.value() as i32);
            nodes.push(format!("{}:{port}", name.unwrap_or_default()));
        }
    });
    let node = if nodes.is_empty() { "no active node".to_string() } else { nodes.join(", ") };
    IdemError::NotOnShardNode { key: k.name(), shard, node }.fail()
}

/// Where this node reads business type settings under Citus (biztype.rs
/// reads them per call): its placement of the reference table
/// idem.biz_types, or Some(None) without one. None when idem.claims is not
/// distributed.
pub fn biz_types_placement() -> Option<Option<pg_sys::Oid>> {
    let dist = distribution()?;
    Some(dist.biz_types_shard.and_then(|shard| {
        if !placement_groups(shard).contains(&local_group()) {
            return None;
        }
        relation_in_idem(&format!("biz_types_{shard}"))
    }))
}

/// A shard's relation in schema idem, by its name.
fn relation_in_idem(name: &str) -> Option<pg_sys::Oid> {
    catalog::relation_in_idem(&std::ffi::CString::new(name).expect("no NUL in a relation name"))
}

fn catalog_table(name: &CStr) -> Option<pg_sys::Oid> {
    // SAFETY: a catalog lookup by a NUL-terminated name; a missing relation is InvalidOid.
    let relid = unsafe { pg_sys::get_relname_relid(name.as_ptr(), pg_sys::Oid::from(pg_sys::PG_CATALOG_NAMESPACE)) };
    (relid != pg_sys::InvalidOid).then_some(relid)
}

/// An equality on one column of a Citus catalog table.
struct Key {
    column: &'static CStr,
    procedure: u32,
    value: pg_sys::Datum,
}

fn oid_key(column: &'static CStr, value: pg_sys::Oid) -> Key {
    Key { column, procedure: pg_sys::F_OIDEQ, value: pg_sys::Datum::from(value) }
}

fn int8_key(column: &'static CStr, value: i64) -> Key {
    Key { column, procedure: pg_sys::F_INT8EQ, value: pg_sys::Datum::from(value) }
}

/// One row of a Citus catalog table, columns by name.
struct CatalogRow {
    relid: pg_sys::Oid,
    tuple: pg_sys::HeapTuple,
    desc: pg_sys::TupleDesc,
}

impl CatalogRow {
    fn get(&self, column: &CStr) -> Option<pg_sys::Datum> {
        // SAFETY: `tuple` and `desc` belong to the scan that is calling `each`, which is still open.
        unsafe {
            let attnum = pg_sys::get_attnum(self.relid, column.as_ptr());
            if attnum == pg_sys::InvalidAttrNumber as i16 {
                internal(format!("Citus's catalog table has no column {}", column.to_string_lossy()));
            }
            let mut isnull = false;
            let d = pg_sys::heap_getattr(self.tuple, attnum as i32, self.desc, &mut isnull);
            (!isnull).then_some(d)
        }
    }
}

/// Every row of pg_catalog.`table` matching `keys` (through `index` when it
/// exists), read with a new catalog snapshot. Datums are valid inside `each`
/// only.
fn scan(table: &CStr, index: &CStr, keys: &[Key], mut each: impl FnMut(&CatalogRow)) {
    let Some(relid) = catalog_table(table) else {
        internal(format!("Citus's catalog table pg_catalog.{} is missing", table.to_string_lossy()))
    };
    // SAFETY: the table is opened and locked before the scan and closed after it; the scan keys outlive the
    // scan; each tuple is used only inside `each`.
    unsafe {
        let rel = pg_sys::table_open(relid, pg_sys::AccessShareLock as _);
        let mut skeys: Vec<pg_sys::ScanKeyData> = Vec::with_capacity(keys.len());
        for k in keys {
            let mut s: pg_sys::ScanKeyData = std::mem::MaybeUninit::zeroed().assume_init();
            let attnum = pg_sys::get_attnum(relid, k.column.as_ptr());
            pg_sys::ScanKeyInit(
                &mut s,
                attnum,
                pg_sys::BTEqualStrategyNumber as _,
                pg_sys::RegProcedure::from(k.procedure),
                k.value,
            );
            skeys.push(s);
        }
        let index_oid = if index.is_empty() { None } else { catalog_table(index) };
        let scan = pg_sys::systable_beginscan(
            rel,
            index_oid.unwrap_or(pg_sys::InvalidOid),
            index_oid.is_some(),
            std::ptr::null_mut(),
            skeys.len() as i32,
            skeys.as_mut_ptr(),
        );
        loop {
            let tuple = pg_sys::systable_getnext(scan);
            if tuple.is_null() {
                break;
            }
            each(&CatalogRow { relid, tuple, desc: (*rel).rd_att });
        }
        pg_sys::systable_endscan(scan);
        pg_sys::table_close(rel, pg_sys::AccessShareLock as _);
    }
}
