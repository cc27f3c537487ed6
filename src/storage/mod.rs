//! Where claims live, and how a key's row is found, locked, waited for and
//! written. The protocol (protocol.rs) asks for a key's row and writes it;
//! everything that differs between the two ways of reaching idem.claims —
//! how the key is locked, when a writer is waited for, how rows are read
//! and written — is decided here, behind `find` and `Store`:
//!
//! * direct.rs: the partitions' heaps and indexes by OID, with a dirty
//!   snapshot and a short key lock (the fast path);
//! * sql.rs: SQL on the logical table under a key lock held to the end of
//!   the transaction (`idem.storage_access = sql`);
//! * citus.rs: when Citus distributes idem.claims, whatever
//!   idem.storage_access says: a call runs only on the node holding its
//!   key's shard (elsewhere it is refused), and there reaches the shard
//!   with direct.rs.
//!
//! keylock.rs is the lock all use. docs/design.md §2 and §9 say why each
//! path lets at most one claim of a key commit. Every session of a database
//! (of a node, under Citus) must take the same path: `path` depends only on
//! the server's settings and the catalog.

pub mod citus;
mod columns;
mod direct;
pub mod keylock;
pub mod partitions;
mod sql;
mod type_classes;
mod writer;

use crate::catalog;
use crate::guc;
use crate::key::ClaimKey;
use pgrx::pg_sys;

pub const STATE_PENDING: u8 = b'p';
pub const STATE_COMPLETED: u8 = b'c';
pub const STATE_FAILED: u8 = b'f';
pub const STATE_LEASED: u8 = b'l';
/// Failed again after a retry (a type with on_failure = retry): result is
/// {attempt, error}, so that the next retry knows which attempt it is.
pub const STATE_FAILED_RETRIED: u8 = b'r';

/// Whether a row's state is a stored failure (idem_fail).
pub fn is_failure(state: u8) -> bool {
    state == STATE_FAILED || state == STATE_FAILED_RETRIED
}

/// A live row of one key, as a probe found it.
pub struct Row {
    /// Where the row is: the direct path's partition (index into its list)
    /// and tuple; unused on the SQL path.
    pub part: usize,
    pub tid: pg_sys::ItemPointerData,
    pub state: u8,
    pub ttl_class: i16,
    pub claimed_at: i64,
    pub expires_at: i64,
    pub fingerprint: Option<Vec<u8>>,
    /// Detoasted copy in the caller's memory context.
    pub result: Option<pg_sys::Datum>,
    /// Written by this transaction (or one of its subtransactions).
    pub own: bool,
    /// Another transaction that is writing the row, if any.
    pub busy: Option<Writer>,
    /// Visible to the caller's MVCC snapshot.
    pub visible: bool,
}

/// A transaction still writing a row another transaction found.
#[derive(Clone, Copy)]
pub struct Writer {
    pub xid: pg_sys::TransactionId,
    /// It inserted the row (a claim not yet committed), rather than
    /// updating or deleting a committed one.
    pub inserting: bool,
}

/// What the caller means to do with the key's row.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Intent {
    /// Claim it: a committed final outcome may be answered as it is; absent
    /// or leased, the key must be locked against other claimers, and so
    /// must a committed failure when `retry_failed` (the type's policy:
    /// the claim then takes it anew).
    Claim { wait: bool, retry_failed: bool },
    /// Change the row (finish, checkpoint): always locked, always waiting
    /// for another writer.
    Update,
    /// Delete a committed row (idem_forget): as Update, except that a claim
    /// another transaction has not committed yet is not waited for (it is
    /// not forgettable; the caller is told Busy).
    Forget,
}

/// The key's row, found for an `Intent`.
pub enum Found {
    /// No live row. The key is locked against other claimers for as long as
    /// `Held` lives (direct path) or the transaction lasts (SQL path).
    Absent(Held),
    /// The key's live row (committed, or this transaction's own); locked as
    /// above unless it is a committed final outcome found for a claim.
    Row(Row, Held),
    /// Another transaction is writing the key and the caller would not wait
    /// (the row, when the path can see it).
    Busy(Option<Row>),
}

/// Proof that the key is locked; dropping it ends the direct path's short
/// lock (the SQL path's lasts until the transaction ends).
pub struct Held(#[allow(dead_code)] Option<keylock::KeyLock>);

/// What a lookup sees, without locking or waiting.
pub enum Seen {
    Absent,
    Row(Row),
    /// A claim in progress in another transaction (its row, when visible).
    Busy(Option<Row>),
}

/// The partitioned table the direct path reads and writes: idem.claims, or
/// under Citus the local shard of it that holds the key, with the logical
/// idem.claims (the shell) locked first.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub shell: Option<pg_sys::Oid>,
    pub parent: pg_sys::Oid,
    /// Under Citus this node's placement of idem.type_classes; None in
    /// 0.3.0's schema (partitions::PartitionList::legacy). Off Citus,
    /// direct::Opened::open looks idem.type_classes up once idem.claims is
    /// locked (an update may make it meanwhile), so the target carries none.
    pub registry: Option<pg_sys::Oid>,
}

/// How this node reaches idem.claims.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Path {
    Direct,
    Sql,
    Citus,
}

impl Path {
    pub fn now() -> Path {
        if guc::citus_preloaded() && citus::distributed() {
            Path::Citus
        } else if guc::sql_access() {
            Path::Sql
        } else {
            Path::Direct
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Path::Direct => "direct",
            Path::Sql => "sql",
            Path::Citus => "citus",
        }
    }

    /// Where the direct path finds `k` (None: the SQL path). Under Citus,
    /// this takes the shard's metadata lock, or refuses the call here.
    fn target(self, k: &ClaimKey) -> Option<Target> {
        match self {
            Path::Sql => None,
            Path::Direct => Some(Target { shell: None, parent: catalog::claims_oid(), registry: None }),
            Path::Citus => Some(citus::local_shard(k).expect("Path::Citus: idem.claims is distributed")),
        }
    }
}

/// idem.claims, opened the way this server reaches it (direct.rs's
/// `Opened`, sql.rs's `SqlStore`), with a key's row found by `find`: the
/// protocol writes through it, without asking which path it is on. A call
/// writes a key's row once (an outcome stored late is a delete, then that
/// insert), so an insert or a rewrite is the last use of the store and
/// closes it.
pub trait Store {
    /// Insert a new claim row; the key is locked (`Found::Absent`).
    fn insert(self: Box<Self>, k: &ClaimKey, new: &NewRow);
    /// Give a row found locked a new state and result.
    fn rewrite(self: Box<Self>, row: &Row, k: &ClaimKey, state: u8, result: Option<pg_sys::Datum>);
    /// Delete a row found locked.
    fn delete(&self, row: &Row, k: &ClaimKey);
}

/// Find `k`'s row for `intent`, opening storage for writing.
pub fn find(k: &ClaimKey, intent: Intent) -> (Box<dyn Store>, Found) {
    let path = Path::now();
    if path == Path::Sql {
        let store = sql::SqlStore::open(k, pg_sys::RowExclusiveLock as _);
        let found = store.find(k, intent);
        return (Box::new(store), found);
    }
    if matches!(intent, Intent::Update | Intent::Forget) {
        // The claim this transaction just made: found without a probe
        // (under Citus, where the claim found it: on this node, under
        // the metadata lock it took).
        if let Some((opened, row)) = direct::open_recent(k) {
            return (Box::new(opened), Found::Row(row, Held(None)));
        }
    }
    let (opened, found) = direct::find(path.target(k).expect("not the SQL path"), k, intent);
    (Box::new(opened), found)
}

/// What a lookup sees of `k` now.
pub fn peek(k: &ClaimKey, now: i64) -> Seen {
    match Path::now().target(k) {
        None => sql::SqlStore::open(k, pg_sys::AccessShareLock as _).peek(k, now),
        Some(target) => direct::peek(target, k, now),
    }
}

/// A claim row to insert.
pub struct NewRow<'a> {
    pub claimed_at: i64,
    pub expires_at: i64,
    pub state: u8,
    pub fingerprint: Option<&'a [u8]>,
    pub result: Option<pg_sys::Datum>,
}
