//! Business types: their settings (TTL, owner role), how they are read,
//! cached and changed, and who may use a type.
//!
//! A type needs no row to be used: claims carry the type's name. A row in
//! idem.biz_types gives it a TTL (idem_configure) and/or an owner role
//! (idem_set_owner): then only members of that role may claim, finish,
//! look up or forget its keys (docs/design.md §8).
//!
//! Settings are cached per backend until idem.biz_types' relcache entry is
//! invalidated (catalog.rs's epoch moves on): idem_configure and
//! idem_set_owner invalidate it at commit, in every backend. Under Citus
//! they are read per call instead, from the relation storage/citus.rs
//! chooses (`settings` says why).

use crate::backend::BackendLocal;
use crate::catalog::{self, relation_name};
use crate::datum::text_datum;
use crate::errors::{internal, IdemError};
use crate::guc;
use crate::spi::Statement;
use pgrx::pg_sys;
use std::collections::HashMap;

/// A business type's settings (idem_configure, idem_set_owner).
#[derive(Clone, Copy, Default)]
pub struct BizType {
    /// Configured TTL in microseconds; None: idem.default_ttl applies.
    pub ttl_us: Option<i64>,
    /// The name of the role whose members alone may use the type; None:
    /// every role. Kept by name, not OID: a dump restored onto a server
    /// where the role is missing (or has another OID) keeps every other
    /// setting, and the type stays closed until a superuser names an owner
    /// again (`require_owner_member`).
    pub owner: Option<pg_sys::NameData>,
    /// on_failure = 'retry': the next arrival after a stored failure claims
    /// the key anew (protocol.rs); false: the failure is replayed.
    pub retry_failed: bool,
    /// retain_from = 'completion': a claim's expiry moves to its TTL after
    /// it was finished (protocol.rs); false: its TTL counts from the claim.
    pub retain_from_completion: bool,
}

/// The most business types a backend keeps settings of: a server with
/// 100,000 types must not cost every backend megabytes. Past it the cache
/// starts over (one SQL read per type brings it back).
const CACHE_MAX: usize = 4096;

#[derive(Default)]
struct Cache {
    /// catalog::epoch() when `settings` was last emptied: a later epoch
    /// means idem.biz_types (or the extension) changed.
    epoch: u64,
    settings: HashMap<Vec<u8>, BizType>,
    /// This backend changed business type settings since the last undo
    /// (below): the cache may hold one that an abort, or a ROLLBACK
    /// PREPARED in any session, takes back. (Still set after a commit, it
    /// costs the next undo one emptying of the cache.)
    configured: bool,
}

static CACHE: BackendLocal<Option<Cache>> = BackendLocal::new(None);

fn with_cache<R>(f: impl FnOnce(&mut Cache) -> R) -> R {
    if CACHE.with(|c| c.is_none()) {
        crate::backend::on_undo(forget_uncommitted);
    }
    CACHE.with(|c| f(c.get_or_insert_with(Cache::default)))
}

/// At an abort, a subtransaction's abort or a PREPARE (backend::on_undo):
/// drop what the cache may hold of settings written since the last one.
fn forget_uncommitted() {
    CACHE.with(|c| {
        if let Some(c) = c.as_mut().filter(|c| c.configured) {
            c.settings.clear();
            c.configured = false;
        }
    });
}

/// A business type's settings as a call must see them: cached until
/// idem_configure invalidates them, except under Citus, where they are read
/// per call from this node's placement of the reference table
/// idem.biz_types. (idem_configure writes every placement, but its cache
/// invalidation reaches only the backends of the node it ran on; a read per
/// call needs none.)
pub fn settings(name: &[u8]) -> BizType {
    if guc::citus_preloaded() {
        match crate::storage::citus::biz_types_placement() {
            None => {}
            Some(Some(relid)) => return read_in(relid, name),
            // No local placement (not expected: Citus copies reference
            // tables to every node): through Citus.
            Some(None) => return read(name),
        }
    }
    cached(name)
}

/// A business type's settings, cached until idem.biz_types is invalidated.
fn cached(name: &[u8]) -> BizType {
    catalog::biz_types_oid(); // so that catalog.rs's relcache callback recognises its invalidation
    let epoch = catalog::epoch();
    let hit = with_cache(|c| {
        if c.epoch != epoch {
            c.settings.clear();
            c.epoch = epoch;
        }
        c.settings.get(name).copied()
    });
    if let Some(found) = hit {
        return found;
    }
    let found = read(name);
    with_cache(|c| {
        if c.settings.len() >= CACHE_MAX {
            c.settings.clear();
        }
        c.settings.insert(name.to_vec(), found)
    });
    found
}

/// The settings of a type, for a call by the current role: 42501 if the
/// type has an owner the role is not a member of.
pub fn admit(biz_type: &[u8]) -> BizType {
    let settings = settings(biz_type);
    require_owner_member(biz_type, &settings);
    settings
}

/// 42501 unless the current role may use a type with these settings: any
/// role when it has no owner, else the owner's members. An owner role that
/// no longer exists (dropped, or missing on a server a dump was restored
/// onto) admits superusers only, until one names an owner again.
fn require_owner_member(biz_type: &[u8], settings: &BizType) {
    let Some(owner) = settings.owner else { return };
    // SAFETY: NameData is always NUL-terminated within its 64 bytes.
    let name = unsafe { std::ffi::CStr::from_ptr(owner.data.as_ptr()) };
    // SAFETY: a catalog lookup by a NUL-terminated name; a missing role is InvalidOid.
    let role = unsafe { pg_sys::get_role_oid(name.as_ptr(), true) };
    let admitted = if role == pg_sys::InvalidOid {
        // SAFETY: reads the current user's catalog entry; no precondition.
        unsafe { pg_sys::superuser() }
    } else {
        // SAFETY: catalog lookups on two role OIDs; no pointer is involved.
        unsafe { pg_sys::has_privs_of_role(pg_sys::GetUserId(), role) }
    };
    if !admitted {
        IdemError::InsufficientPrivilege {
            biz_type: biz_type.to_vec(),
            owner: name.to_string_lossy().into_owned(),
            owner_exists: role != pg_sys::InvalidOid,
        }
        .fail();
    }
}

/// Set (or, with None, clear) a type's TTL, keeping its owner, and with
/// `on_failure` (idem_configure's three-argument form: Some(None) is the
/// default, replay) its policy for stored failures too. A type reserved for
/// a role is configured only by that role's members (whoever else may call
/// idem_configure).
pub fn configure(
    biz_type: &str,
    ttl: Option<pg_sys::Datum>,
    on_failure: Option<Option<&[u8]>>,
    retain_from: Option<Option<&[u8]>>,
) {
    require_owner_member(biz_type.as_bytes(), &settings(biz_type.as_bytes()));
    static UPSERT: Statement = Statement::new(
        c"INSERT INTO idem.biz_types AS b (biz_type, ttl, updated_at) VALUES ($1, $2, $3)
          ON CONFLICT (biz_type) DO UPDATE SET ttl = EXCLUDED.ttl, updated_at = EXCLUDED.updated_at",
        &[pg_sys::TEXTOID, pg_sys::INTERVALOID, pg_sys::TIMESTAMPTZOID],
    );
    static UPSERT_POLICY: Statement = Statement::new(
        c"INSERT INTO idem.biz_types AS b (biz_type, ttl, updated_at, on_failure) VALUES ($1, $2, $3, $4)
          ON CONFLICT (biz_type) DO UPDATE SET ttl = EXCLUDED.ttl, updated_at = EXCLUDED.updated_at,
                                               on_failure = EXCLUDED.on_failure",
        &[pg_sys::TEXTOID, pg_sys::INTERVALOID, pg_sys::TIMESTAMPTZOID, pg_sys::TEXTOID],
    );
    static UPSERT_RETAIN: Statement = Statement::new(
        c"INSERT INTO idem.biz_types AS b (biz_type, ttl, updated_at, on_failure, retain_from) VALUES ($1, $2, $3, $4, $5)
          ON CONFLICT (biz_type) DO UPDATE SET ttl = EXCLUDED.ttl, updated_at = EXCLUDED.updated_at,
                                               on_failure = EXCLUDED.on_failure, retain_from = EXCLUDED.retain_from",
        &[pg_sys::TEXTOID, pg_sys::INTERVALOID, pg_sys::TIMESTAMPTZOID, pg_sys::TEXTOID, pg_sys::TEXTOID],
    );
    let needs = |column: &std::ffi::CStr, what: &str| {
        if !has_column(catalog::biz_types_oid(), column) {
            IdemError::ObjectNotInPrerequisiteState(
                format!("idem_configure's {what} needs the 0.4.0 schema"),
                Some("Run ALTER EXTENSION idem UPDATE.".into()),
            )
            .fail();
        }
    };
    match (on_failure, retain_from) {
        (None, _) => write(&UPSERT, biz_type, ttl, &[]),
        (Some(policy), None) => {
            needs(c"on_failure", "on_failure");
            write(&UPSERT_POLICY, biz_type, ttl, &[policy.map(text_datum)])
        }
        (Some(policy), Some(retain)) => {
            needs(c"retain_from", "retain_from");
            write(&UPSERT_RETAIN, biz_type, ttl, &[policy.map(text_datum), retain.map(text_datum)])
        }
    }
}

/// Set (or, with None, clear) a type's owner role, keeping its TTL; stored
/// by name (`BizType::owner` says why). A type reserved for a role is handed on
/// only by that role's members.
pub fn set_owner(biz_type: &str, owner: Option<pg_sys::Oid>) {
    static UPSERT: Statement = Statement::new(
        c"INSERT INTO idem.biz_types AS b (biz_type, owner, updated_at) VALUES ($1, $2, $3)
          ON CONFLICT (biz_type) DO UPDATE SET owner = EXCLUDED.owner, updated_at = EXCLUDED.updated_at",
        &[pg_sys::TEXTOID, pg_sys::NAMEOID, pg_sys::TIMESTAMPTZOID],
    );
    // 0.3.0's schema (this library installed, ALTER EXTENSION UPDATE not run
    // yet) keeps the owner as a regrole.
    static UPSERT_0_3: Statement = Statement::new(
        c"INSERT INTO idem.biz_types AS b (biz_type, owner, updated_at) VALUES ($1, $2, $3)
          ON CONFLICT (biz_type) DO UPDATE SET owner = EXCLUDED.owner, updated_at = EXCLUDED.updated_at",
        &[pg_sys::TEXTOID, pg_sys::REGROLEOID, pg_sys::TIMESTAMPTZOID],
    );
    require_owner_member(biz_type.as_bytes(), &settings(biz_type.as_bytes()));
    if owner_column_type(catalog::biz_types_oid()) != Some(pg_sys::NAMEOID) {
        return write(&UPSERT_0_3, biz_type, owner.map(pg_sys::Datum::from), &[]);
    }
    let mut name = pg_sys::NameData::default();
    // SAFETY: GetUserNameFromId raises for a missing role (regrole input checked it exists) and returns a
    // NUL-terminated name; `name` outlives the datum's use below.
    let datum = owner.map(|role| unsafe {
        // (regrole input checked that the role exists.)
        pg_sys::namestrcpy(&mut name, pg_sys::GetUserNameFromId(role, false));
        pg_sys::Datum::from(&raw mut name)
    });
    write(&UPSERT, biz_type, datum, &[]);
}

/// Upsert a type's settings row: `value` is $2, `more` (what the statement
/// has of them) $4 on.
fn write(upsert: &Statement, biz_type: &str, value: Option<pg_sys::Datum>, more: &[Option<pg_sys::Datum>]) {
    // The time is passed in rather than written as now(): Citus refuses
    // non-immutable functions in the DO UPDATE SET of a reference table.
    // It is SQL's now(), the transaction's start, not backend::now(): the
    // clock claims are judged by.
    // SAFETY: reads the current transaction's start time; no precondition.
    let now = unsafe { pg_sys::GetCurrentTransactionStartTimestamp() };
    let mut params = vec![Some(text_datum(biz_type.as_bytes())), value, Some(pg_sys::Datum::from(now))];
    params.extend_from_slice(more);
    let (n, _) = upsert.execute_as_owner(&params);
    if n != 1 {
        internal(format!("writing the settings of biz_type {biz_type} touched {n} rows"));
    }
    invalidate();
}

/// A business type's settings, read now through SQL on idem.biz_types.
fn read(name: &[u8]) -> BizType {
    static READ: Statement = Statement::new(
        c"SELECT ttl, owner, on_failure OPERATOR(pg_catalog.=) 'retry', retain_from OPERATOR(pg_catalog.=) 'completion'
            FROM idem.biz_types WHERE biz_type OPERATOR(pg_catalog.=) $1",
        &[pg_sys::TEXTOID],
    );
    // 0.4.0 before retention from completion: from the claim.
    static READ_NO_RETAIN: Statement = Statement::new(
        c"SELECT ttl, owner, on_failure OPERATOR(pg_catalog.=) 'retry', false FROM idem.biz_types WHERE biz_type OPERATOR(pg_catalog.=) $1",
        &[pg_sys::TEXTOID],
    );
    // 0.4.0 before the failure policy: replay.
    static READ_NO_POLICY: Statement = Statement::new(
        c"SELECT ttl, owner, false, false FROM idem.biz_types WHERE biz_type OPERATOR(pg_catalog.=) $1",
        &[pg_sys::TEXTOID],
    );
    // An older schema (the new library installed, ALTER EXTENSION UPDATE not
    // run yet): 0.3.0's owner is a regrole, 0.2.0 has none. Claims keep
    // working meanwhile.
    static READ_0_3: Statement = Statement::new(
        c"SELECT ttl, (SELECT r.rolname FROM pg_catalog.pg_roles r WHERE r.oid OPERATOR(pg_catalog.=) owner::pg_catalog.oid), false, false
            FROM idem.biz_types WHERE biz_type OPERATOR(pg_catalog.=) $1",
        &[pg_sys::TEXTOID],
    );
    static READ_0_2: Statement = Statement::new(
        c"SELECT ttl, NULL::pg_catalog.name, false, false FROM idem.biz_types WHERE biz_type OPERATOR(pg_catalog.=) $1",
        &[pg_sys::TEXTOID],
    );
    let relid = catalog::biz_types_oid();
    let read = match owner_column_type(relid) {
        Some(t) if t == pg_sys::NAMEOID && has_column(relid, c"retain_from") => &READ,
        Some(t) if t == pg_sys::NAMEOID && has_column(relid, c"on_failure") => &READ_NO_RETAIN,
        Some(t) if t == pg_sys::NAMEOID => &READ_NO_POLICY,
        Some(_) => &READ_0_3,
        None => &READ_0_2,
    };
    let rows = read.query_as_owner(&[Some(text_datum(name))]);
    let Some(row) = rows.first() else { return BizType::default() };
    BizType {
        // SAFETY: column 1 of READ is ttl, an interval datum (by reference) in this memory context.
        ttl_us: row[0].map(|d| guc::interval_us(unsafe { &*d.cast_mut_ptr::<pg_sys::Interval>() }) as i64),
        // SAFETY: column 2 of READ is a name datum (by reference) in this memory context.
        owner: row[1].map(|d| unsafe { *d.cast_mut_ptr::<pg_sys::NameData>() }),
        retry_failed: row[2].is_some_and(|d| d.value() != 0),
        retain_from_completion: row[3].is_some_and(|d| d.value() != 0),
    }
}

/// Whether a table of idem.biz_types' shape has a column (one a newer
/// schema added).
fn has_column(relid: pg_sys::Oid, name: &std::ffi::CStr) -> bool {
    // SAFETY: a catalog lookup by a NUL-terminated name.
    unsafe { pg_sys::get_attnum(relid, name.as_ptr()) != pg_sys::InvalidAttrNumber as i16 }
}

/// The type of the owner column of a table of idem.biz_types' shape (name
/// since 0.4.0, regrole in 0.3.0); None without one (0.2.0).
fn owner_column_type(relid: pg_sys::Oid) -> Option<pg_sys::Oid> {
    // SAFETY: a catalog lookup by a static NUL-terminated name.
    let attnum = unsafe { pg_sys::get_attnum(relid, c"owner".as_ptr()) };
    // SAFETY: a catalog lookup of an attribute that exists (checked).
    (attnum != pg_sys::InvalidAttrNumber as i16).then(|| unsafe { pg_sys::get_atttype(relid, attnum) })
}

/// A role's name as NameData (a role named by an OID that no longer exists
/// reads as that number, which no role can be named).
fn role_name_data(role: pg_sys::Oid) -> pg_sys::NameData {
    // SAFETY: with noerr = true a missing role gives NULL, handled below.
    let found = unsafe { pg_sys::GetUserNameFromId(role, true) };
    let text = if found.is_null() {
        std::ffi::CString::new(role.to_u32().to_string()).expect("digits have no NUL")
    } else {
        // SAFETY: `found` is a non-NULL, NUL-terminated palloc'd name.
        unsafe { std::ffi::CStr::from_ptr(found) }.to_owned()
    };
    let mut name = pg_sys::NameData::default();
    // SAFETY: `text` is NUL-terminated; namestrcpy truncates to NAMEDATALEN.
    unsafe { pg_sys::namestrcpy(&mut name, text.as_ptr()) };
    name
}

/// A business type's settings read now, without SQL, from `relid`: a table
/// of idem.biz_types' shape (under Citus, this node's placement of the
/// reference table: storage/citus.rs), through its primary key, with the
/// caller's MVCC snapshot, as the SQL read would.
fn read_in(relid: pg_sys::Oid, name: &[u8]) -> BizType {
    // SAFETY: the table and its primary key are opened and locked before the scan and closed after it; the
    // zeroed ScanKeyData is fully initialised by ScanKeyEntryInitialize; the slot's values are read below
    // `last`, which slot_getsomeattrs filled.
    unsafe {
        let rel = crate::catalog::open_table_of_idem(relid, pg_sys::AccessShareLock as _, "biz_types");
        let index_oid = crate::compat::primary_key_index(rel);
        if index_oid == pg_sys::InvalidOid {
            internal(format!("{} has no primary key", relation_name(relid)));
        }
        let index = pg_sys::index_open(index_oid, pg_sys::AccessShareLock as _);
        let column = |name: &std::ffi::CStr| pg_sys::get_attnum(relid, name.as_ptr());
        let (biz_type, ttl, owner, on_failure, retain_from) =
            (column(c"biz_type"), column(c"ttl"), column(c"owner"), column(c"on_failure"), column(c"retain_from"));
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
            text_datum(name),
        );
        let snapshot = crate::backend::caller_snapshot();
        let scan = crate::compat::index_beginscan(rel, index, snapshot, 1);
        pg_sys::index_rescan(scan, &mut key, 1, std::ptr::null_mut(), 0);
        let slot = pg_sys::table_slot_create(rel, std::ptr::null_mut());
        let mut found = BizType::default();
        if pg_sys::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, slot) {
            let last = ttl.max(owner).max(on_failure).max(retain_from);
            pg_sys::slot_getsomeattrs_int(slot, last as i32);
            let values = std::slice::from_raw_parts((*slot).tts_values, last as usize);
            let nulls = std::slice::from_raw_parts((*slot).tts_isnull, last as usize);
            let at = |attnum: i16| {
                (attnum != pg_sys::InvalidAttrNumber as i16 && !nulls[attnum as usize - 1])
                    .then(|| values[attnum as usize - 1])
            };
            let owner_is_name = owner_column_type(relid) == Some(pg_sys::NAMEOID);
            found = BizType {
                ttl_us: at(ttl).map(|d| guc::interval_us(&*d.cast_mut_ptr::<pg_sys::Interval>()) as i64),
                owner: at(owner).map(|d| {
                    if owner_is_name {
                        *d.cast_mut_ptr::<pg_sys::NameData>()
                    } else {
                        role_name_data(pg_sys::Oid::from(d.value() as u32))
                    }
                }),
                retry_failed: at(on_failure).is_some_and(|d| crate::datum::varlena_bytes(d) == b"retry"),
                retain_from_completion: at(retain_from)
                    .is_some_and(|d| crate::datum::varlena_bytes(d) == b"completion"),
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
fn invalidate() {
    // SAFETY: queues an invalidation of an existing relation inside a transaction.
    unsafe { pg_sys::CacheInvalidateRelcacheByRelid(catalog::biz_types_oid()) };
    with_cache(|c| {
        c.settings.clear();
        c.configured = true;
    });
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
        // SAFETY: inside the test's transaction; popped below.
        unsafe {
            pgrx::pg_sys::CommandCounterIncrement();
            pgrx::pg_sys::PushActiveSnapshot(pgrx::pg_sys::GetTransactionSnapshot());
        }
        for i in 1..=n {
            let settings = super::cached(format!("cache.{i}").as_bytes());
            assert_eq!(settings.ttl_us, Some(i * 1_000_000), "cache.{i}");
        }
        // SAFETY: pops the snapshot pushed above.
        unsafe { pgrx::pg_sys::PopActiveSnapshot() };
        let cached = super::with_cache(|c| c.settings.len());
        assert!(cached > 0 && cached <= super::CACHE_MAX, "{cached} types cached");
    }
}
