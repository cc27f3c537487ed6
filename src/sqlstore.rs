//! The claim storage reached through SQL on the logical table idem.claims,
//! for `idem.storage_access = sql`.
//!
//! The direct path (storage.rs) opens the partitions by OID and reads and
//! writes their heaps and indexes itself. Under Citus the storage is a
//! distributed table: on a worker, idem.claims is a shell and the rows live
//! in shard tables the direct path knows nothing of. Statements on the
//! logical table are routed by Citus to the local shard when the calling
//! function is delegated, so this path works there (docs/scaling.md).
//!
//! What it cannot do is see another transaction's uncommitted row (no dirty
//! snapshot in SQL). The protocol makes up for it with a key lock held until
//! the transaction ends (claim.rs, claim_via_sql), and it needs READ
//! COMMITTED, where every statement sees everything committed before it.

use crate::catalog;
use crate::errors::{invalid, IdemError};
use crate::fmgr::{jsonb_from_text, jsonb_text};
use crate::storage::{KeyRef, Row, Store};
use pgrx::datum::{DatumWithOid, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::spi::Spi;

/// The key's live row is found by the same digest index the direct path uses.
const PROBE: &str = "
    SELECT state::pg_catalog.text, claimed_at, expires_at, fingerprint, result::pg_catalog.text, xmin::pg_catalog.text
      FROM idem.claims
     WHERE idem.key_hash(biz_type, key) OPERATOR(pg_catalog.=) $1
       AND biz_type OPERATOR(pg_catalog.=) $2
       AND key OPERATOR(pg_catalog.=) $3
       AND expires_at OPERATOR(pg_catalog.>) $4";

const INSERT: &str = "
    INSERT INTO idem.claims (expires_at, claimed_at, state, biz_type, key, fingerprint, result)
    VALUES ($1, $2, $3::pg_catalog.\"char\", $4, $5, $6, $7::pg_catalog.jsonb)";

const REWRITE: &str = "
    UPDATE idem.claims SET state = $1::pg_catalog.\"char\", result = $2::pg_catalog.jsonb
     WHERE idem.key_hash(biz_type, key) OPERATOR(pg_catalog.=) $3
       AND biz_type OPERATOR(pg_catalog.=) $4
       AND key OPERATOR(pg_catalog.=) $5
       AND expires_at OPERATOR(pg_catalog.=) $6
       AND claimed_at OPERATOR(pg_catalog.=) $7";

pub struct SqlStore;

fn ts(us: i64) -> TimestampWithTimeZone {
    TimestampWithTimeZone::try_from(us).unwrap_or_else(|_| invalid("timestamp out of range"))
}

/// A text argument with exactly these bytes (no UTF-8 round trip).
fn text_arg(b: &[u8]) -> DatumWithOid<'static> {
    unsafe { DatumWithOid::new(crate::fmgr::text_datum(b), pg_sys::TEXTOID) }
}

fn run<R>(f: impl FnOnce() -> Result<R, pgrx::spi::SpiError>) -> R {
    catalog::as_owner(f).unwrap_or_else(|e| invalid(format!("{e}")))
}

/// A new snapshot made the active one for as long as this lives.
struct FreshSnapshot;

impl FreshSnapshot {
    fn push() -> FreshSnapshot {
        unsafe { pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot()) };
        FreshSnapshot
    }
}

impl Drop for FreshSnapshot {
    fn drop(&mut self) {
        unsafe { pg_sys::PopActiveSnapshot() };
    }
}

/// The protocol keeps one live row per key; more means it was broken, which
/// mixing storage paths does (docs/design.md §9).
fn mixed(what: String) -> ! {
    IdemError::ObjectNotInPrerequisiteState(
        what,
        Some("Were claims of this key made with different idem.storage_access settings? Every session must use one path.".into()),
    )
    .fail()
}

struct Found {
    state: String,
    claimed_at: i64,
    expires_at: i64,
    fingerprint: Option<String>,
    result: Option<String>,
    xmin: u32,
}

impl Store for SqlStore {
    fn probe(&self, k: KeyRef, now: i64) -> Option<Row> {
        // Rows come back through pgrx's String, which is UTF-8.
        if unsafe { pg_sys::GetDatabaseEncoding() } != pg_sys::pg_enc::PG_UTF8 as i32 {
            IdemError::FeatureNotSupported("idem.storage_access = sql needs a UTF8 database".into()).fail();
        }
        let found: Option<Found> = run(|| {
            // A read-only SPI statement reads with the active snapshot, the
            // calling statement's, taken before any wait for the key lock.
            // Read with a new one instead (READ COMMITTED: it sees the claim
            // the lock holder committed). A read-write statement would take
            // one too, but pgrx assigns a transaction id for those, and a
            // duplicate must write nothing.
            let _fresh = FreshSnapshot::push();
            Spi::connect(|client| {
                let args = [k.hash.into(), text_arg(k.biz_type), text_arg(k.key), ts(now).into()];
                let rows = client.select(PROBE, None, &args)?;
                // The protocol keeps one live row per key; a second would be
                // the very duplicate idem exists to prevent.
                if rows.len() > 1 {
                    mixed(format!("{} live claims of one key in idem.claims", rows.len()));
                }
                let Some(r) = rows.into_iter().next() else { return Ok(None) };
                let tstz = |i| -> Result<i64, pgrx::spi::SpiError> {
                    Ok(r.get::<TimestampWithTimeZone>(i)?.map(i64::from).unwrap_or_default())
                };
                Ok(Some(Found {
                    state: r.get::<String>(1)?.unwrap_or_default(),
                    claimed_at: tstz(2)?,
                    expires_at: tstz(3)?,
                    fingerprint: r.get::<String>(4)?,
                    result: r.get::<String>(5)?,
                    xmin: r.get::<String>(6)?.and_then(|x| x.parse().ok()).unwrap_or(0),
                }))
            })
        });
        found.map(|f| Row {
            part: 0,
            tid: pg_sys::ItemPointerData::default(),
            state: f.state.bytes().next().unwrap_or(b'p'),
            claimed_at: f.claimed_at,
            expires_at: f.expires_at,
            fingerprint: f.fingerprint.map(String::into_bytes),
            result: f.result.as_deref().map(jsonb_from_text),
            own: unsafe { pg_sys::TransactionIdIsCurrentTransactionId(pg_sys::TransactionId::from(f.xmin)) },
            // Only committed rows and our own are visible to a statement, and
            // under READ COMMITTED every committed row is.
            busy: None,
            visible: true,
        })
    }

    fn insert(
        &self,
        k: KeyRef,
        claimed_at: i64,
        expires_at: i64,
        state: u8,
        fingerprint: Option<&[u8]>,
        result: Option<pg_sys::Datum>,
    ) {
        let result = result.map(jsonb_text);
        run(|| {
            Spi::connect_mut(|client| {
                let args = [
                    ts(expires_at).into(),
                    ts(claimed_at).into(),
                    String::from(state as char).into(),
                    text_arg(k.biz_type),
                    text_arg(k.key),
                    match fingerprint {
                        Some(f) => text_arg(f),
                        None => DatumWithOid::null_oid(pg_sys::TEXTOID),
                    },
                    result.into(),
                ];
                client.update(INSERT, None, &args).map(|_| ())
            })
        })
    }

    fn rewrite(&self, row: &Row, k: KeyRef, state: u8, result: Option<pg_sys::Datum>) {
        let result = result.map(jsonb_text);
        let n = run(|| {
            Spi::connect_mut(|client| {
                let args = [
                    String::from(state as char).into(),
                    result.into(),
                    k.hash.into(),
                    text_arg(k.biz_type),
                    text_arg(k.key),
                    ts(row.expires_at).into(),
                    ts(row.claimed_at).into(),
                ];
                client.update(REWRITE, None, &args).map(|t| t.len())
            })
        });
        if n != 1 {
            mixed(format!("the claim row to update was found {n} times, not once"));
        }
    }
}
