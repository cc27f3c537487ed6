//! The SQL path (`idem.storage_access = sql`): idem.claims reached through
//! SQL on the logical table, for storage that SQL reaches and the direct
//! path may not (a table another extension routes statements for). A
//! Citus-distributed idem.claims does not come here (citus.rs).
//!
//! SQL cannot see another transaction's uncommitted row (no dirty
//! snapshot), so here a transaction that writes a key's row keeps the key
//! lock until it ends: a second claimer of the key waits on the lock (or,
//! without wait, is told in_progress), then sees the first one's row if it
//! committed. A call that writes nothing releases the lock when it returns. That needs
//! READ COMMITTED, where every statement sees everything committed before
//! it (docs/design.md §9).
//!
//! Values go in and come out as datums (spi.rs): keys keep their exact
//! bytes in every database encoding.

use super::columns;
use super::keylock::{self, KeyLock};
use super::type_classes::{self, Registered};
use super::writer;
use super::{is_failure, Found, Held, Intent, NewRow, Row, Seen, Store, STATE_LEASED};
use crate::catalog;
use crate::datum::{text_datum, varlena_bytes};
use crate::errors::IdemError;
use crate::key::ClaimKey;
use crate::metrics;
use crate::spi::Statement;
use crate::ttl_class;
use pgrx::pg_sys;
use std::cell::RefCell;

/// Every row of the key, expired or not (this transaction's own expired
/// row still counts), found through the digest index as on the direct path.
/// Only in the TTL classes the key's type is registered in
/// (type_classes.rs): every row of the type, wherever it is, is of one.
/// Three classes at a time (a type is in at most three:
/// type_classes::MAX_CLASSES, more only across a change of
/// idem.partition_width), each up to the latest expiry registered in it:
/// the planner prunes to the partitions that can hold a claim of the type,
/// those the direct path opens, so a claim locks as few (docs/design.md
/// §1). Slots not needed repeat the first class.
const _: () = assert!(type_classes::MAX_CLASSES == 3, "PROBE has a slot per class");
static PROBE: Statement = Statement::new(
    c"SELECT state, claimed_at, expires_at, fingerprint, result, xmin, tableoid, ctid, ttl_class
        FROM idem.claims
       WHERE idem.key_hash(biz_type, key) OPERATOR(pg_catalog.=) $1
         AND biz_type OPERATOR(pg_catalog.=) $2
         AND key OPERATOR(pg_catalog.=) $3
         AND (ttl_class OPERATOR(pg_catalog.=) $4 AND expires_at OPERATOR(pg_catalog.<=) $5
              OR ttl_class OPERATOR(pg_catalog.=) $6 AND expires_at OPERATOR(pg_catalog.<=) $7
              OR ttl_class OPERATOR(pg_catalog.=) $8 AND expires_at OPERATOR(pg_catalog.<=) $9)",
    &[
        pg_sys::INT8OID,
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
        pg_sys::INT2OID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::INT2OID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::INT2OID,
        pg_sys::TIMESTAMPTZOID,
    ],
);

/// 0.3.0's schema (this library installed, ALTER EXTENSION idem UPDATE not
/// run yet): no TTL classes, every partition.
static PROBE_0_3: Statement = Statement::new(
    c"SELECT state, claimed_at, expires_at, fingerprint, result, xmin, tableoid, ctid, (-1)::pg_catalog.int2
        FROM idem.claims
       WHERE idem.key_hash(biz_type, key) OPERATOR(pg_catalog.=) $1
         AND biz_type OPERATOR(pg_catalog.=) $2
         AND key OPERATOR(pg_catalog.=) $3",
    &[pg_sys::INT8OID, pg_sys::TEXTOID, pg_sys::TEXTOID],
);

static INSERT_0_3: Statement = Statement::new(
    c"INSERT INTO idem.claims (expires_at, claimed_at, state, biz_type, key, fingerprint, result)
      VALUES ($1, $2, $3, $4, $5, $6, $7)",
    &INSERT_0_3_TYPES,
);
const INSERT_0_3_TYPES: [pg_sys::Oid; 7] = columns::types(true);

static INSERT: Statement = Statement::new(
    c"INSERT INTO idem.claims (expires_at, claimed_at, ttl_class, state, biz_type, key, fingerprint, result)
      VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    &INSERT_TYPES,
);
const INSERT_TYPES: [pg_sys::Oid; 8] = columns::types(false);

static REWRITE: Statement = Statement::new(
    c"UPDATE idem.claims SET state = $1, result = $2
       WHERE idem.key_hash(biz_type, key) OPERATOR(pg_catalog.=) $3
         AND biz_type OPERATOR(pg_catalog.=) $4
         AND key OPERATOR(pg_catalog.=) $5
         AND expires_at OPERATOR(pg_catalog.=) $6
         AND claimed_at OPERATOR(pg_catalog.=) $7",
    &[
        pg_sys::CHAROID,
        pg_sys::JSONBOID,
        pg_sys::INT8OID,
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::TIMESTAMPTZOID,
    ],
);

static DELETE: Statement = Statement::new(
    c"DELETE FROM idem.claims
       WHERE idem.key_hash(biz_type, key) OPERATOR(pg_catalog.=) $1
         AND biz_type OPERATOR(pg_catalog.=) $2
         AND key OPERATOR(pg_catalog.=) $3
         AND expires_at OPERATOR(pg_catalog.=) $4
         AND claimed_at OPERATOR(pg_catalog.=) $5",
    &[pg_sys::INT8OID, pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::TIMESTAMPTZOID, pg_sys::TIMESTAMPTZOID],
);

/// The SQL path for one call of one key: nothing to open (the statements
/// name the logical idem.claims), only the key's digest and what was read
/// of the registry of TTL classes for the key's type.
pub struct SqlStore {
    registered: RefCell<Registered>,
    /// The key's digest as the schema in place indexes it.
    hash: i64,
}

/// A new snapshot made the active one for as long as this lives.
struct FreshSnapshot;

impl FreshSnapshot {
    fn push() -> FreshSnapshot {
        // SAFETY: inside a transaction; popped by FreshSnapshot's Drop.
        unsafe { pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot()) };
        FreshSnapshot
    }
}

impl Drop for FreshSnapshot {
    fn drop(&mut self) {
        // SAFETY: pops the snapshot `push` pushed.
        unsafe { pg_sys::PopActiveSnapshot() };
    }
}

/// Under REPEATABLE READ or SERIALIZABLE, a snapshot taken before the key
/// lock wait could miss a claim committed after it, and nothing would
/// tell: refuse.
fn require_read_committed() {
    // SAFETY: a backend global of the current transaction, read on the backend's only thread.
    if unsafe { pg_sys::XactIsoLevel } >= pg_sys::XACT_REPEATABLE_READ as i32 {
        IdemError::FeatureNotSupported(
            "idem.storage_access = sql works under READ COMMITTED only: a REPEATABLE READ or SERIALIZABLE snapshot cannot see a claim committed after it was taken".into(),
            Some("Claim in a READ COMMITTED transaction.".into()),
        )
        .fail();
    }
}

/// The protocol keeps one live row per key; more means it was broken, which
/// mixing storage paths does (docs/design.md §9).
fn mixed(what: String) -> ! {
    IdemError::ObjectNotInPrerequisiteState(
        what,
        Some("Were claims of this key made with different idem.storage_access settings? Every session must use one path. (Or, if idem.claims was distributed by Citus under idem 0.2.0: calls Citus did not delegate, such as SELECT (idem_claim(...)).claimed, ran on another node; since 0.3.0 they are refused.)".into()),
    )
    .fail()
}

fn ts(us: i64) -> Option<pg_sys::Datum> {
    Some(pg_sys::Datum::from(us))
}

impl SqlStore {
    /// idem.claims locked (as the statements below would) before the key's
    /// digest is read: taking the lock brings in a catalog change that
    /// committed while we waited, such as an update that changed the digest
    /// (key::ClaimKey::hash). For writing (`RowExclusiveLock`), READ
    /// COMMITTED is required first.
    pub fn open(k: &ClaimKey, lockmode: pg_sys::LOCKMODE) -> SqlStore {
        if lockmode == pg_sys::RowExclusiveLock as pg_sys::LOCKMODE {
            require_read_committed();
        }
        // SAFETY: open_claims returns an open relation; closed at once, its
        // lock kept until the transaction ends.
        unsafe { pg_sys::table_close(catalog::open_claims(lockmode), pg_sys::NoLock as _) }
        SqlStore { registered: RefCell::new(Registered::default()), hash: k.hash() }
    }

    /// A committed outcome other than a lease is final until it expires: a
    /// claim that finds one is answered without the lock, so duplicates of
    /// a committed claim never queue behind each other. Otherwise the key
    /// is locked (or, without wait, found held: in_progress) and probed
    /// again, now that whoever held it has ended.
    pub fn find(&self, k: &ClaimKey, intent: Intent) -> Found {
        if let Intent::Claim { retry_failed, .. } = intent {
            if let Some(row) = self.probe(k, crate::backend::now()) {
                let retried = retry_failed && is_failure(row.state);
                if row.state != STATE_LEASED && !retried && !row.own {
                    return Found::Row(row, Held(None));
                }
            }
        }
        let wait = !matches!(intent, Intent::Claim { wait: false, .. });
        let lock = {
            // A wait is counted (and timed) when another transaction holds
            // the key as we ask for it.
            let _timed = (wait && metrics::on() && keylock::contended(self.hash)).then(|| metrics::wait(k.biz_type));
            KeyLock::acquire(self.hash, wait)
        };
        let Some(lock) = lock else {
            return Found::Busy(None);
        };
        match self.probe(k, crate::backend::now()) {
            Some(row) => Found::Row(row, Held(Some(lock))),
            None => Found::Absent(Held(Some(lock))),
        }
    }

    pub fn peek(&self, k: &ClaimKey, now: i64) -> Seen {
        match self.probe(k, now) {
            Some(row) => Seen::Row(row),
            None if keylock::held_elsewhere(self.hash) => Seen::Busy(None),
            None => Seen::Absent,
        }
    }

    /// The key's live row: committed and unexpired, or this transaction's;
    /// else a committed row whose writer was running when the caller
    /// arrived, expired or not.
    fn probe(&self, k: &ClaimKey, now: i64) -> Option<Row> {
        // A read-only statement reads with the active snapshot, the calling
        // statement's, taken before any wait for the key lock. Read with a
        // new one instead (READ COMMITTED: it sees the claim the lock holder
        // committed). A statement that writes would take one too, but it
        // would take a transaction id, and a duplicate must write nothing.
        let arrival = crate::backend::caller_snapshot();
        let key = [Some(pg_sys::Datum::from(self.hash)), Some(k.biz_type_text), Some(k.key_text)];
        let rows = match catalog::type_classes_oid() {
            Some(registry) => {
                let registered = type_classes::read(registry, k);
                let slots: Vec<Vec<Option<pg_sys::Datum>>> = registered
                    .classes
                    .chunks(type_classes::MAX_CLASSES)
                    .map(|chunk| {
                        (0..type_classes::MAX_CLASSES)
                            .map(|i| chunk.get(i).unwrap_or(&chunk[0]))
                            .flat_map(|&(class, until)| [Some(pg_sys::Datum::from(class)), ts(until)])
                            .collect()
                    })
                    .collect();
                *self.registered.borrow_mut() = registered;
                let _fresh = FreshSnapshot::push();
                slots.iter().flat_map(|few| PROBE.query_as_owner(&[&key[..], &few[..]].concat())).collect()
            }
            None => {
                let _fresh = FreshSnapshot::push();
                PROBE_0_3.query_as_owner(&key)
            }
        };
        // Rows that are live by their expiry (or ours), and expired rows
        // whose writer was running when the caller arrived: the answer when
        // no row is live (writer.rs).
        let mut late = None;
        let mut live = rows.into_iter().filter_map(|r| {
            let expires_at = r[2].map_or(0, |d| d.value() as i64);
            // The raw xmin decides only when it cannot be this transaction's
            // or a running writer's; otherwise the row's header does
            // (writer.rs: a frozen row keeps its raw xmin).
            let raw = r[5].map_or(pg_sys::InvalidTransactionId, |d| pg_sys::TransactionId::from(d.value() as u32));
            let xmin = if writer::is_own(raw) || expires_at <= now && writer::was_running_at(raw, arrival) {
                let relid = r[6].map_or(pg_sys::InvalidOid, |d| pg_sys::Oid::from(d.value() as u32));
                // SAFETY: column 8 of PROBE is ctid, a tid datum passed by reference and copied into the
                // caller's context by spi.rs.
                let tid = r[7].map(|d| unsafe { *(d.cast_mut_ptr::<pg_sys::ItemPointerData>()) }).unwrap_or_default();
                writer::of_tuple(relid, tid)
            } else {
                raw
            };
            let own = writer::is_own(xmin);
            let row = Row {
                part: 0,
                tid: pg_sys::ItemPointerData::default(),
                state: r[0].map_or(b'p', |d| d.value() as u8),
                ttl_class: r[8].map_or(0, |d| d.value() as i16),
                claimed_at: r[1].map_or(0, |d| d.value() as i64),
                expires_at,
                // SAFETY: column 4 of PROBE is fingerprint, text: a non-NULL value is a varlena datum.
                fingerprint: r[3].map(|d| unsafe { varlena_bytes(d) }.to_vec()),
                result: r[4],
                own,
                // Only committed rows and our own are visible to a
                // statement, and under READ COMMITTED every committed row is.
                busy: None,
                visible: true,
            };
            if own || expires_at > now {
                Some(row)
            } else {
                if writer::was_running_at(xmin, arrival) {
                    late = Some(row);
                }
                None
            }
        });
        let first = live.next();
        let more = live.count();
        if more > 0 {
            mixed(format!("{} live claims of one key in idem.claims", more + 1));
        }
        first.or(late)
    }
}

/// The writes, under the rules of storage/mod.rs's `Store`.
impl Store for SqlStore {
    /// (Each writer below keeps the key locked until the transaction ends:
    /// nobody else can see the row before then, so the lock is what makes
    /// them wait. The caller holds the lock already: this adds the
    /// acquisition that outlives its guard.)
    fn insert(self: Box<Self>, k: &ClaimKey, new: &NewRow) {
        keylock::hold_until_end(self.hash);
        let Some(registry) = catalog::type_classes_oid() else {
            INSERT_0_3.execute_as_owner(&[
                ts(new.expires_at),
                ts(new.claimed_at),
                Some(pg_sys::Datum::from(new.state as i8)),
                Some(k.biz_type_text),
                Some(k.key_text),
                new.fingerprint.map(text_datum),
                new.result,
            ]);
            return;
        };
        let natural = ttl_class::of_ttl(new.expires_at - new.claimed_at);
        let class = type_classes::place(registry, false, &mut self.registered.borrow_mut(), k, natural, new.expires_at);
        INSERT.execute_as_owner(&[
            ts(new.expires_at),
            ts(new.claimed_at),
            Some(pg_sys::Datum::from(class)),
            Some(pg_sys::Datum::from(new.state as i8)),
            Some(k.biz_type_text),
            Some(k.key_text),
            new.fingerprint.map(text_datum),
            new.result,
        ]);
    }

    fn rewrite(self: Box<Self>, row: &Row, k: &ClaimKey, state: u8, result: Option<pg_sys::Datum>) {
        keylock::hold_until_end(self.hash);
        let (n, _) = REWRITE.execute_as_owner(&[
            Some(pg_sys::Datum::from(state as i8)),
            result,
            Some(pg_sys::Datum::from(self.hash)),
            Some(k.biz_type_text),
            Some(k.key_text),
            ts(row.expires_at),
            ts(row.claimed_at),
        ]);
        if n != 1 {
            mixed(format!("the claim row to update was found {n} times, not once"));
        }
    }

    fn delete(&self, row: &Row, k: &ClaimKey) {
        keylock::hold_until_end(self.hash);
        let (n, _) = DELETE.execute_as_owner(&[
            Some(pg_sys::Datum::from(self.hash)),
            Some(k.biz_type_text),
            Some(k.key_text),
            ts(row.expires_at),
            ts(row.claimed_at),
        ]);
        if n != 1 {
            mixed(format!("the claim row to delete was found {n} times, not once"));
        }
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    /// The INSERTs name idem.claims' columns in the order their parameter
    /// types (columns.rs) follow.
    #[pg_test]
    fn inserts_name_the_columns_in_order() {
        for (statement, legacy) in [(&super::INSERT, false), (&super::INSERT_0_3, true)] {
            let text = statement.text().to_str().unwrap();
            let list = text.split_once("idem.claims (").unwrap().1.split_once(')').unwrap().0;
            let named: Vec<&str> = list.split(", ").collect();
            let declared: Vec<&str> = super::columns::layout(legacy).map(|c| c.name).collect();
            assert_eq!(named, declared, "{text}");
        }
    }
}
