//! idem_claim and its companions: the protocol that makes the first arrival
//! of (biz_type, key) claim it and every later one get the first outcome.
//!
//! One claim: lock idem.claims and its live partitions; take the key lock;
//! probe every live partition with a dirty snapshot; then
//!   - nothing live: insert the claim, release the key lock: claimed;
//!   - a row another transaction is still writing: release the key lock, wait
//!     for that transaction (or return in_progress at once), probe again;
//!   - a committed row: a duplicate; it gets the stored outcome and writes
//!     nothing. Under REPEATABLE READ / SERIALIZABLE a row this snapshot
//!     cannot see raises 40001, as INSERT ... ON CONFLICT does;
//!   - a committed leased claim (lease.rs): in_progress while the lease
//!     runs, taken over by this claim once it has run out.
//!
//! With idem.storage_access = sql the same decision runs on rows read and
//! written through SQL, under a key lock held to the end of the transaction
//! (claim_via_sql, sqlstore.rs). docs/design.md explains why neither path
//! ever lets two claims of a key commit.

use crate::catalog;
use crate::errors::{invalid, IdemError};
use crate::fmgr::*;
use crate::guc;
use crate::lease::Lease;
use crate::sqlstore::SqlStore;
use crate::storage::{
    self, KeyLock, KeyRef, Opened, Row, Store, STATE_COMPLETED, STATE_FAILED, STATE_LEASED, STATE_PENDING,
};
use pgrx::pg_sys;

pub const MAX_KEY_BYTES: usize = 1024;

/// A validated (key, biz_type) pair.
pub struct Target<'a> {
    pub key: &'a [u8],
    pub biz_type: &'a [u8],
}

pub fn valid_biz_type(b: &[u8]) -> bool {
    // Same rule as idem.check_name (sql/storage.sql) for the PL/pgSQL functions.
    (1..=64).contains(&b.len()) && b.iter().all(|c| c.is_ascii_alphanumeric() || b"_.:-".contains(c))
}

pub fn check_biz_type(b: &[u8]) {
    if !valid_biz_type(b) {
        invalid(format!(
            "biz_type \"{}\" is not valid: it must match ^[A-Za-z0-9_.:-]{{1,64}}$",
            String::from_utf8_lossy(&b[..b.len().min(80)])
        ));
    }
}

pub fn check_key(k: &[u8]) {
    if k.is_empty() {
        invalid("key must not be empty");
    }
    if k.len() > MAX_KEY_BYTES {
        invalid(format!("key is {} bytes long; the limit is {MAX_KEY_BYTES}", k.len()));
    }
}

/// Read and validate the (key, biz_type) arguments 0 and 1.
pub unsafe fn target_args<'a>(fcinfo: pg_sys::FunctionCallInfo) -> Target<'a> {
    unsafe {
        let key = arg_text_req(fcinfo, 0, "key");
        let biz_type = arg_text_req(fcinfo, 1, "biz_type");
        check_key(key);
        check_biz_type(biz_type);
        Target { key, biz_type }
    }
}

impl Target<'_> {
    pub fn key_ref(&self) -> KeyRef<'_> {
        KeyRef::new(self.biz_type, self.key)
    }
    fn lossy_key(&self) -> String {
        String::from_utf8_lossy(self.key).into_owned()
    }
    fn lossy_type(&self) -> String {
        String::from_utf8_lossy(self.biz_type).into_owned()
    }
}

fn now() -> i64 {
    unsafe { pg_sys::GetCurrentTimestamp() }
}

/// What a caller is told about a key.
pub struct Outcome {
    pub claimed: bool,
    pub state: &'static str,
    pub result: Option<pg_sys::Datum>,
    pub first_claimed_at: Option<i64>,
    pub expires_at: Option<i64>,
}

impl Outcome {
    fn absent() -> Outcome {
        Outcome { claimed: false, state: "absent", result: None, first_claimed_at: None, expires_at: None }
    }

    /// Another transaction holds the key and the caller would not wait; on
    /// the SQL path its row is not visible yet, so no times are known.
    fn in_progress() -> Outcome {
        Outcome { claimed: false, state: "in_progress", result: None, first_claimed_at: None, expires_at: None }
    }

    /// How an existing row reads to someone who did not just claim it.
    fn of_row(row: &Row) -> Outcome {
        let state = if row.busy.is_some() || row.state == STATE_LEASED {
            "in_progress"
        } else {
            match row.state {
                STATE_FAILED => "failed",
                STATE_COMPLETED => "completed",
                // Claimed and committed without idem_complete: completed,
                // no result. Still pending in this very transaction: ours.
                _ if row.own => "in_progress",
                _ => "completed",
            }
        };
        let result = if row.busy.is_some() || row.state == STATE_LEASED { None } else { row.result };
        Outcome {
            claimed: false,
            state,
            result,
            first_claimed_at: Some(row.claimed_at),
            expires_at: Some(row.expires_at),
        }
    }

    unsafe fn into_datum(self, fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
        unsafe {
            let desc = result_tupdesc(fcinfo);
            let mut values = [pg_sys::Datum::from(0); 5];
            let mut nulls = [false; 5];
            values[0] = pg_sys::Datum::from(self.claimed);
            values[1] = text_datum(self.state.as_bytes());
            match self.result {
                Some(r) => values[2] = r,
                None => nulls[2] = true,
            }
            match self.first_claimed_at {
                Some(t) => values[3] = pg_sys::Datum::from(t),
                None => nulls[3] = true,
            }
            match self.expires_at {
                Some(t) => values[4] = pg_sys::Datum::from(t),
                None => nulls[4] = true,
            }
            form_composite(desc, &mut values, &mut nulls)
        }
    }
}

pub struct ClaimRequest<'a> {
    pub target: Target<'a>,
    pub ttl_us: Option<i64>,
    pub fingerprint: Option<&'a [u8]>,
    pub wait: bool,
    pub lease_us: Option<i64>,
}

pub fn claim(req: &ClaimRequest) -> Outcome {
    if guc::sql_access() {
        return claim_via_sql(req);
    }
    let k = req.target.key_ref();
    let claims = storage::open(now(), pg_sys::RowExclusiveLock as _);
    loop {
        let lock = KeyLock::acquire(k.hash);
        let now = now();
        let row = claims.probe(k, now, true);
        if let Some(xid) = row.as_ref().and_then(|r| r.busy) {
            drop(lock);
            if !req.wait {
                return Outcome::of_row(row.as_ref().unwrap());
            }
            storage::wait_for(xid);
            continue;
        }
        let outcome = settle(&claims, req, row, now);
        drop(lock);
        return outcome;
    }
}

/// The SQL path (idem.storage_access = sql; sqlstore.rs). A statement cannot
/// see another transaction's uncommitted claim, so the key lock is held until
/// this transaction ends: a second claimer of the key waits on the lock
/// (or, without wait, is told in_progress), then sees the first one's row
/// if it committed. A committed outcome is final, so a duplicate that finds
/// one is answered without taking the lock.
fn claim_via_sql(req: &ClaimRequest) -> Outcome {
    let t = &req.target;
    let k = t.key_ref();
    require_read_committed();
    let store = SqlStore;
    if let Some(row) = store.probe(k, now()) {
        if row.state != STATE_LEASED {
            check_duplicate(t, req.fingerprint, &row);
            return Outcome::of_row(&row);
        }
    }
    if !storage::key_lock_until_end(k.hash, req.wait) {
        return Outcome::in_progress();
    }
    let now = now();
    settle(&store, req, store.probe(k, now), now)
}

/// Under idem.storage_access = sql, a REPEATABLE READ snapshot could miss a
/// claim committed after it was taken, and nothing would tell: refuse.
fn require_read_committed() {
    if unsafe { pg_sys::XactIsoLevel } >= pg_sys::XACT_REPEATABLE_READ as i32 {
        IdemError::FeatureNotSupported(
            "idem.storage_access = sql works under READ COMMITTED only: a REPEATABLE READ or SERIALIZABLE snapshot cannot see a claim committed after it was taken".into(),
        )
        .fail();
    }
}

/// Decide a claim once the key's live row (if any) is known and nobody else
/// is writing it; the caller holds the key lock.
fn settle(store: &impl Store, req: &ClaimRequest, row: Option<Row>, now: i64) -> Outcome {
    let t = &req.target;
    let k = t.key_ref();
    let ttl = req.ttl_us.or_else(|| catalog::configured_ttl(t.biz_type)).unwrap_or_else(guc::default_ttl_us);
    match row {
        None => {
            let expires_at = now.saturating_add(ttl);
            let (state, stored, told) = match req.lease_us {
                None => (STATE_PENDING, None, None),
                Some(lease_us) => {
                    let (lease, token) = Lease::new(1, lease_us, now, serde_json::Value::Null, None);
                    (STATE_LEASED, Some(lease.to_datum()), Some(lease.for_owner(Some(&token))))
                }
            };
            store.insert(k, now, expires_at, state, req.fingerprint, stored);
            Outcome {
                claimed: true,
                state: "new",
                result: told,
                first_claimed_at: Some(now),
                expires_at: Some(expires_at),
            }
        }
        Some(row) if row.state == STATE_LEASED && !row.own => {
            check_duplicate(t, req.fingerprint, &row);
            let lease = Lease::from_datum(row.result);
            if lease.until > now {
                return Outcome::of_row(&row);
            }
            // The lease ran out: this claim takes the work over, and is
            // told which attempt it is and where the last one got to.
            let (next, token) =
                Lease::new(lease.attempt + 1, req.lease_us.unwrap_or(lease.lease_us), now, lease.point, lease.data);
            store.rewrite(&row, k, STATE_LEASED, Some(next.to_datum()));
            Outcome {
                claimed: true,
                state: "new",
                result: Some(next.for_owner(Some(&token))),
                first_claimed_at: Some(row.claimed_at),
                expires_at: Some(row.expires_at),
            }
        }
        Some(row) => {
            check_duplicate(t, req.fingerprint, &row);
            Outcome::of_row(&row)
        }
    }
}

/// Under REPEATABLE READ and SERIALIZABLE, a row the caller's snapshot
/// cannot see must not be reported or written as if it could: 40001, as
/// INSERT ... ON CONFLICT and UPDATE do.
fn check_visible(t: &Target, row: &Row) {
    if !row.visible && unsafe { pg_sys::XactIsoLevel } >= pg_sys::XACT_REPEATABLE_READ as i32 {
        IdemError::SerializationFailure { biz_type: t.lossy_type(), key: t.lossy_key() }.fail();
    }
}

/// A duplicate must be visible to the caller's snapshot and carry the first
/// claim's fingerprint (if both have one).
fn check_duplicate(t: &Target, fingerprint: Option<&[u8]>, row: &Row) {
    check_visible(t, row);
    if let (Some(mine), Some(first)) = (fingerprint, row.fingerprint.as_deref()) {
        if mine != first {
            IdemError::FingerprintMismatch { biz_type: t.lossy_type(), key: t.lossy_key() }.fail();
        }
    }
}

pub fn lookup(t: &Target) -> Outcome {
    let now = now();
    let row = if guc::sql_access() {
        let row = SqlStore.probe(t.key_ref(), now);
        if row.is_none() && storage::key_lock_held_elsewhere(t.key_ref().hash) {
            return Outcome::in_progress();
        }
        row
    } else {
        storage::open(now, pg_sys::AccessShareLock as _).probe(t.key_ref(), now, true)
    };
    match row {
        Some(row) => Outcome::of_row(&row),
        None => Outcome::absent(),
    }
}

/// What idem_complete, idem_fail and idem_checkpoint do to a claim.
pub enum Finish {
    Complete(Option<pg_sys::Datum>),
    Fail(pg_sys::Datum),
    Checkpoint { point: String, data: Option<pg_sys::Datum> },
}

/// Record an outcome or a recovery point on a claim the caller holds: one
/// this transaction made, or a leased claim the caller owns (by lease token,
/// or else by being the session that took the lease).
pub fn finish(t: &Target, what: Finish, lease_token: Option<&[u8]>) {
    let k = t.key_ref();
    let now = now();
    if guc::sql_access() {
        require_read_committed();
        storage::key_lock_until_end(k.hash, true);
        let Some(row) = SqlStore.probe(k, now) else {
            IdemError::NotClaimed {
                biz_type: t.lossy_type(),
                key: t.lossy_key(),
                why: "is not claimed by this transaction, nor leased to the caller",
            }
            .fail()
        };
        return apply(t, &SqlStore, &row, what, lease_token, now);
    }
    // The claim this transaction just made: found without a probe.
    if let Some((claims, row)) = storage::open_recent(k, now) {
        return apply(t, &claims, &row, what, lease_token, now);
    }
    let claims: Opened = storage::open(now, pg_sys::RowExclusiveLock as _);
    loop {
        let _lock = KeyLock::acquire(k.hash);
        let now = self::now();
        let Some(row) = claims.probe(k, now, true) else {
            IdemError::NotClaimed {
                biz_type: t.lossy_type(),
                key: t.lossy_key(),
                why: "is not claimed by this transaction, nor leased to the caller",
            }
            .fail()
        };
        if let Some(xid) = row.busy {
            drop(_lock);
            storage::wait_for(xid);
            continue;
        }
        return apply(t, &claims, &row, what, lease_token, now);
    }
}

/// finish, once the row is found and nobody else is writing it.
fn apply(t: &Target, claims: &impl Store, row: &Row, what: Finish, lease_token: Option<&[u8]>, now: i64) {
    let not_claimed = |why| IdemError::NotClaimed { biz_type: t.lossy_type(), key: t.lossy_key(), why }.fail();
    let k = t.key_ref();
    let held = if row.state == STATE_LEASED {
        row.own || Lease::from_datum(row.result).owned_by_caller(lease_token)
    } else {
        row.own && !matches!(what, Finish::Checkpoint { .. })
    };
    if !held {
        match row.state {
            STATE_LEASED => not_claimed("is leased to another owner (or the lease was taken over)"),
            _ if row.own => not_claimed("is not leased: idem_checkpoint needs idem_claim(..., lease => ...)"),
            _ => not_claimed("is claimed by another transaction, not this one"),
        }
    }
    check_visible(t, row);
    match what {
        Finish::Complete(result) => claims.rewrite(row, k, STATE_COMPLETED, result),
        Finish::Fail(error) => claims.rewrite(row, k, STATE_FAILED, Some(error)),
        Finish::Checkpoint { point, data } => {
            // Recording progress also renews the lease.
            let mut lease = Lease::from_datum(row.result);
            lease.point = serde_json::Value::String(point);
            lease.data = data;
            lease.until = now.saturating_add(lease.lease_us);
            claims.rewrite(row, k, STATE_LEASED, Some(lease.to_datum()));
        }
    }
}

pub fn forget(t: &Target) -> bool {
    let k = t.key_ref();
    // Like every writer of claim rows, under the key lock (see rewrite).
    let _lock = if guc::sql_access() {
        storage::key_lock_until_end(k.hash, true);
        None
    } else {
        Some(KeyLock::acquire(k.hash))
    };
    let n = catalog::as_owner(|| {
        pgrx::spi::Spi::connect_mut(|client| {
            client
                .update(
                    "DELETE FROM idem.claims
                      WHERE idem.key_hash(biz_type, key) OPERATOR(pg_catalog.=) $1
                        AND biz_type OPERATOR(pg_catalog.=) $2
                        AND key OPERATOR(pg_catalog.=) $3
                        AND expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()",
                    None,
                    &[
                        k.hash.into(),
                        String::from_utf8_lossy(k.biz_type).as_ref().into(),
                        String::from_utf8_lossy(k.key).as_ref().into(),
                    ],
                )
                .map(|r| r.len())
        })
    })
    .unwrap_or_else(|e| invalid(format!("{e}")));
    n > 0
}

// ---- SQL entry points (declared in sql/claim.sql) ----

unsafe fn sql_claim(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    unsafe {
        let target = target_args(fcinfo);
        let ttl_us = arg_interval(fcinfo, 2).map(|iv| guc::checked_ttl(&iv, "ttl"));
        let fingerprint = arg_text(fcinfo, 3);
        let wait = arg_bool(fcinfo, 4).unwrap_or(true);
        let lease_us = arg_interval(fcinfo, 5).map(|iv| guc::checked_ttl(&iv, "lease"));
        claim(&ClaimRequest { target, ttl_us, fingerprint, wait, lease_us }).into_datum(fcinfo)
    }
}
crate::sql_function!(idem_claim, pg_finfo_idem_claim, sql_claim);

unsafe fn sql_lookup(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    unsafe { lookup(&target_args(fcinfo)).into_datum(fcinfo) }
}
crate::sql_function!(idem_lookup, pg_finfo_idem_lookup, sql_lookup);

unsafe fn sql_complete(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    unsafe {
        let target = target_args(fcinfo);
        finish(&target, Finish::Complete(arg_jsonb(fcinfo, 2)), arg_text(fcinfo, 3));
        pg_sys::Datum::from(0)
    }
}
crate::sql_function!(idem_complete, pg_finfo_idem_complete, sql_complete);

unsafe fn sql_fail(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    unsafe {
        let target = target_args(fcinfo);
        let error = arg_jsonb(fcinfo, 2).unwrap_or_else(|| IdemError::NullArgument("error").fail());
        finish(&target, Finish::Fail(error), arg_text(fcinfo, 3));
        pg_sys::Datum::from(0)
    }
}
crate::sql_function!(idem_fail, pg_finfo_idem_fail, sql_fail);

unsafe fn sql_checkpoint(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    unsafe {
        let target = target_args(fcinfo);
        let point = arg_text_req(fcinfo, 2, "point");
        if point.is_empty() || point.len() > 256 {
            invalid("point must be 1 to 256 bytes long");
        }
        let what =
            Finish::Checkpoint { point: String::from_utf8_lossy(point).into_owned(), data: arg_jsonb(fcinfo, 3) };
        finish(&target, what, arg_text(fcinfo, 4));
        pg_sys::Datum::from(0)
    }
}
crate::sql_function!(idem_checkpoint, pg_finfo_idem_checkpoint, sql_checkpoint);

unsafe fn sql_random_token(_fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    text_datum(crate::lease::random_hex(32).as_bytes())
}
crate::sql_function!(idem_random_token, pg_finfo_idem_random_token, sql_random_token);

unsafe fn sql_forget(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    unsafe { pg_sys::Datum::from(forget(&target_args(fcinfo))) }
}
crate::sql_function!(idem_forget, pg_finfo_idem_forget, sql_forget);

unsafe fn sql_configure(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    unsafe {
        let biz_type = arg_text_req(fcinfo, 0, "biz_type");
        check_biz_type(biz_type);
        let ttl = arg_interval(fcinfo, 1);
        if let Some(iv) = &ttl {
            guc::checked_ttl(iv, "ttl");
        }
        let name = std::str::from_utf8(biz_type).unwrap();
        let ttl_arg: Option<pgrx::datum::Interval> = pgrx::fcinfo::pg_getarg(fcinfo, 1);
        catalog::as_owner(|| {
            pgrx::spi::Spi::run_with_args(
                "INSERT INTO idem.biz_types AS b (biz_type, ttl) VALUES ($1, $2)
                 ON CONFLICT (biz_type) DO UPDATE SET ttl = EXCLUDED.ttl, updated_at = pg_catalog.now()",
                &[name.into(), ttl_arg.into()],
            )
        })
        .unwrap_or_else(|e| invalid(format!("{e}")));
        catalog::invalidate_biz_types();
        pg_sys::Datum::from(0)
    }
}
crate::sql_function!(idem_configure, pg_finfo_idem_configure, sql_configure);

unsafe fn sql_key_hash(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    unsafe {
        let biz_type = arg_text(fcinfo, 0).unwrap_or_default();
        let key = arg_text(fcinfo, 1).unwrap_or_default();
        pg_sys::Datum::from(storage::key_hash(biz_type, key))
    }
}
crate::sql_function!(idem_key_hash, pg_finfo_idem_key_hash, sql_key_hash);

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::valid_biz_type;
    use pgrx::prelude::*;

    #[pg_test]
    fn biz_type_rule() {
        assert!(valid_biz_type(b"payment"));
        assert!(valid_biz_type(b"orders-consumer:v2.1_x"));
        assert!(valid_biz_type("a".repeat(64).as_bytes()));
        assert!(!valid_biz_type(b""));
        assert!(!valid_biz_type("a".repeat(65).as_bytes()));
        assert!(!valid_biz_type(b"has space"));
        assert!(!valid_biz_type("caf\u{e9}".as_bytes()));
    }

    #[pg_test(error = "idem: key must not be empty")]
    fn empty_key_is_refused() {
        Spi::run("SELECT idem_claim('', 'unit')").unwrap();
    }
}
