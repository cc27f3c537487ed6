//! The claim protocol: the first arrival of (biz_type, key) claims it, every
//! later one gets the first outcome, and only the holder of a claim may
//! finish it. One body per operation; how a key's row is found, locked,
//! waited for and written is storage's business (storage/mod.rs).
//!
//! claim: find the key's live row, then
//!   - none: insert the claim: claimed;
//!   - another transaction is writing it: storage waits for it (or, without
//!     wait, the caller is told in_progress);
//!   - a committed row: a duplicate, answered with the stored outcome and
//!     nothing written. Under REPEATABLE READ / SERIALIZABLE a row this
//!     snapshot cannot see raises 40001, as INSERT ... ON CONFLICT does;
//!   - a committed leased claim (lease.rs): in_progress while the lease
//!     runs, taken over by this claim once it has run out (with a new
//!     lease if the claim asks for one, else as a plain claim);
//!   - a committed failure of a type whose on_failure is retry: claimed
//!     anew (`retry`); a completed claim is final whatever the policy.
//!
//! docs/design.md says why no two claims of a key ever commit.
//!
//! Nothing here counts: what a call answered (an outcome, a finish that
//! returned) or raised is counted at the API boundary (api.rs, fmgr.rs;
//! metrics.rs).

use crate::backend::now;
use crate::biztype;
use crate::datum::{jsonb_concat, jsonb_decode, jsonb_encode, jsonb_field, jsonb_object1, jsonb_type, jsonb_without};
use crate::errors::{internal, invalid, IdemError};
use crate::guc;
use crate::key::ClaimKey;
use crate::lease::Lease;
use crate::storage::{
    self, is_failure, Found, Intent, NewRow, Row, Seen, Store, STATE_COMPLETED, STATE_FAILED, STATE_FAILED_RETRIED,
    STATE_LEASED, STATE_PENDING,
};
use pgrx::pg_sys;

/// The state a caller is told a key is in: the `state` column of
/// idem_claim's and idem_lookup's results (sql/claim.sql; named in api.rs).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum State {
    /// This call claimed the key.
    New,
    /// No live claim of the key (idem_lookup only).
    Absent,
    /// Another transaction is writing the key, a lease on it runs, or this
    /// transaction's own claim is not finished yet.
    InProgress,
    Completed,
    Failed,
}

/// What a caller is told about a key.
pub struct Outcome {
    pub claimed: bool,
    pub state: State,
    pub result: Option<pg_sys::Datum>,
    pub first_claimed_at: Option<i64>,
    pub expires_at: Option<i64>,
    /// This claim took over a leased claim whose lease ran out.
    pub took_over: bool,
}

impl Outcome {
    fn absent() -> Outcome {
        Outcome {
            claimed: false,
            state: State::Absent,
            result: None,
            first_claimed_at: None,
            expires_at: None,
            took_over: false,
        }
    }

    /// Another transaction is writing the key and the caller would not wait;
    /// its row, when the storage path can see it, gives the times.
    fn in_progress(row: Option<&Row>) -> Outcome {
        match row {
            Some(row) => Outcome::of_row(row),
            None => Outcome {
                claimed: false,
                state: State::InProgress,
                result: None,
                first_claimed_at: None,
                expires_at: None,
                took_over: false,
            },
        }
    }

    /// How an existing row reads to someone who did not just claim it.
    fn of_row(row: &Row) -> Outcome {
        let running = row.busy.is_some() || row.state == STATE_LEASED;
        let state = if running {
            State::InProgress
        } else {
            match row.state {
                STATE_FAILED | STATE_FAILED_RETRIED => State::Failed,
                STATE_COMPLETED => State::Completed,
                // Claimed and committed without idem_complete: completed,
                // no result. Still pending in this very transaction: ours.
                _ if row.own => State::InProgress,
                _ => State::Completed,
            }
        };
        let result = match row.state {
            _ if running => None,
            // The error as idem_fail stored it, without the attempt.
            STATE_FAILED_RETRIED => row.result.and_then(|doc| jsonb_field(doc, "error")),
            // A retry's {attempt, previous_error} is for its claimer only
            // (a claim committed unfinished reads completed, no result).
            STATE_PENDING => None,
            _ => row.result,
        };
        Outcome {
            claimed: false,
            state,
            result,
            first_claimed_at: Some(row.claimed_at),
            expires_at: Some(row.expires_at),
            took_over: false,
        }
    }
}

/// Writers refuse in a read-only transaction or on a hot standby (25006),
/// and during a parallel operation (25000: reached from a parallel worker
/// through a PARALLEL SAFE wrapper, where no transaction id can be taken),
/// before they touch anything, as INSERT does.
pub fn require_writable(what: &'static str) {
    // SAFETY: state checks of the current transaction, on the backend's only thread.
    unsafe {
        if pg_sys::IsInParallelMode() {
            IdemError::ParallelMode { what }.fail();
        }
        if pg_sys::RecoveryInProgress() {
            IdemError::ReadOnly { what, standby: true }.fail();
        }
        if pg_sys::XactReadOnly {
            IdemError::ReadOnly { what, standby: false }.fail();
        }
    }
}

pub struct ClaimRequest<'a> {
    pub key: ClaimKey<'a>,
    pub ttl_us: Option<i64>,
    pub fingerprint: Option<&'a [u8]>,
    pub wait: bool,
    pub lease_us: Option<i64>,
}

pub fn claim(req: &ClaimRequest) -> Outcome {
    let k = &req.key;
    require_writable("idem_claim");
    let settings = biztype::admit(k.biz_type);
    let ttl = req.ttl_us.or(settings.ttl_us).unwrap_or_else(guc::default_ttl_us);
    if req.lease_us.is_some_and(|lease| lease > ttl) {
        // A lease never outlives its claim: the claim would expire under a
        // running lease and a second worker would claim the key.
        invalid("lease must not be longer than the claim's ttl");
    }
    let (store, found) = storage::find(k, Intent::Claim { wait: req.wait, retry_failed: settings.retry_failed });
    match found {
        Found::Busy(row) => Outcome::in_progress(row.as_ref()),
        Found::Absent(held) => {
            let now = now();
            let expires_at = now.saturating_add(ttl);
            let (state, stored, told) = match req.lease_us {
                None => (STATE_PENDING, None, None),
                Some(lease_us) => {
                    let (lease, token) = Lease::new(1, lease_us, now.saturating_add(lease_us), None, None);
                    (STATE_LEASED, Some(lease.to_datum()), Some(lease.for_owner(Some(&token))))
                }
            };
            let new = NewRow { claimed_at: now, expires_at, state, fingerprint: req.fingerprint, result: stored };
            store.insert(k, &new);
            drop(held);
            Outcome {
                claimed: true,
                state: State::New,
                result: told,
                first_claimed_at: Some(now),
                expires_at: Some(expires_at),
                took_over: false,
            }
        }
        Found::Row(row, held) => {
            check_duplicate(k, req.fingerprint, &row);
            let now = now();
            if settings.retry_failed && is_failure(row.state) && !row.own {
                return retry(store, k, req, &row, now);
            }
            if row.state != STATE_LEASED || row.own {
                return Outcome::of_row(&row);
            }
            let lease = Lease::from_datum(row.result);
            if lease.until > now {
                return Outcome::of_row(&row);
            }
            // The lease ran out: this claim takes the work over, and is told
            // which attempt it is and where the last one got to. With a
            // lease of its own it gets a new lease and token; without one
            // it is a plain claim of this transaction, finished in it or
            // read completed once it commits (a lease it had not asked for
            // would run out again after the commit, and the next arrival
            // would do the work a second time).
            let told = match req.lease_us {
                Some(lease_us) => {
                    let (next, token) = take_over(store, k, &row, &lease, lease_us, now);
                    next.for_owner(Some(&token))
                }
                None => {
                    let (told, stored) = lease.for_plain_claim();
                    store.rewrite(&row, k, STATE_PENDING, Some(stored));
                    told
                }
            };
            drop(held);
            Outcome {
                claimed: true,
                state: State::New,
                result: Some(told),
                first_claimed_at: Some(row.claimed_at),
                expires_at: Some(row.expires_at),
                took_over: true,
            }
        }
    }
}

/// Take over a leased claim whose lease ran out with a lease of
/// `lease_us`: attempt + 1, the recovery point and data and a retry's
/// previous error kept, a new token (returned with the new lease), never
/// beyond the claim's expiry. The caller holds the key's lock.
fn take_over(
    store: Box<dyn Store>,
    k: &ClaimKey,
    row: &Row,
    lease: &Lease,
    lease_us: i64,
    now: i64,
) -> (Lease, String) {
    let until = now.saturating_add(lease_us).min(row.expires_at);
    let (mut next, token) = Lease::new(lease.attempt + 1, lease_us, until, lease.point, lease.data);
    next.previous_error = lease.previous_error;
    store.rewrite(row, k, STATE_LEASED, Some(next.to_datum()));
    (next, token)
}

/// A lease taken over by the completer: the new lease and its token, and
/// the claim's times.
pub struct Taken {
    pub lease: Lease,
    pub token: String,
    pub first_claimed_at: i64,
    pub expires_at: i64,
}

/// The completer (idem_take_expired_leases), for one key it found leased
/// and run out: take the lease over as the next idem_claim would, if it is
/// still so. Nothing (None) for a key that is no longer leased, whose lease
/// runs again, or that another transaction is writing (taken by another
/// completer or claim, not yet committed: skipped, never waited for, as
/// SKIP LOCKED does). Never claims an absent key, nor retries a failure.
pub fn take_expired(k: &ClaimKey, lease_us: Option<i64>) -> Option<Taken> {
    let (store, found) = storage::find(k, Intent::Claim { wait: false, retry_failed: false });
    let Found::Row(row, held) = found else { return None };
    if row.state != STATE_LEASED || row.own {
        return None;
    }
    let lease = Lease::from_datum(row.result);
    let now = now();
    if lease.until > now {
        return None;
    }
    check_visible(k, &row);
    let (next, token) = take_over(store, k, &row, &lease, lease_us.unwrap_or(lease.lease_us), now);
    drop(held);
    Some(Taken { lease: next, token, first_claimed_at: row.claimed_at, expires_at: row.expires_at })
}

/// A type's on_failure = retry: the first arrival after a stored failure
/// claims the key anew, in the failed claim's row (its first_claimed_at and
/// expiry stay: a retry does not lengthen the key's life), and is told
/// which attempt it is and the error the last one stored. `row` is a
/// committed failure, found under the key lock: of two arrivals, the second
/// waits for the first and then finds its claim.
fn retry(store: Box<dyn Store>, k: &ClaimKey, req: &ClaimRequest, row: &Row, now: i64) -> Outcome {
    let (last, error) = match row.state {
        STATE_FAILED_RETRIED => {
            let doc = row.result.unwrap_or_else(|| internal("a retried failure has no document"));
            (attempt_of(doc, "error"), jsonb_field(doc, "error"))
        }
        _ => (1, row.result),
    };
    let attempt = last + 1;
    let (state, stored, told) = match req.lease_us {
        None => {
            let doc = retry_doc(attempt, "previous_error", error);
            (STATE_PENDING, doc, doc)
        }
        Some(lease_us) => {
            // The error goes into the lease document too: a takeover of
            // this lease (after a crash or idem_release) is told it as well.
            let until = now.saturating_add(lease_us).min(row.expires_at);
            let (mut lease, token) = Lease::new(attempt, lease_us, until, None, None);
            lease.retrying(error);
            (STATE_LEASED, lease.to_datum(), lease.for_owner(Some(&token)))
        }
    };
    store.rewrite(row, k, state, Some(stored));
    Outcome {
        claimed: true,
        state: State::New,
        result: Some(told),
        first_claimed_at: Some(row.claimed_at),
        expires_at: Some(row.expires_at),
        took_over: false,
    }
}

/// {"attempt": attempt, field: value}: what a retry stores and is told
/// (field previous_error), and a retried claim's failure (field error).
fn retry_doc(attempt: i64, field: &str, value: Option<pg_sys::Datum>) -> pg_sys::Datum {
    jsonb_concat(jsonb_encode(&Attempt { attempt }), jsonb_object1(field, value))
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Attempt {
    attempt: i64,
}

/// The attempt a retry document counts (its `field`, any JSON, left out of
/// the decoding).
fn attempt_of(doc: pg_sys::Datum, field: &str) -> i64 {
    jsonb_decode::<Attempt>(jsonb_without(doc, field), "a retry document").attempt
}

/// Under REPEATABLE READ and SERIALIZABLE, a row the caller's snapshot
/// cannot see must not be reported or written as if it could: 40001, as
/// INSERT ... ON CONFLICT and UPDATE do.
fn check_visible(k: &ClaimKey, row: &Row) {
    // SAFETY: a backend global of the current transaction, read on the backend's only thread.
    if !row.visible && unsafe { pg_sys::XactIsoLevel } >= pg_sys::XACT_REPEATABLE_READ as i32 {
        IdemError::SerializationFailure(k.name()).fail();
    }
}

/// A duplicate must be visible to the caller's snapshot and carry the first
/// claim's fingerprint (if both have one).
fn check_duplicate(k: &ClaimKey, fingerprint: Option<&[u8]>, row: &Row) {
    check_visible(k, row);
    if let (Some(mine), Some(first)) = (fingerprint, row.fingerprint.as_deref()) {
        if mine != first {
            IdemError::FingerprintMismatch(k.name()).fail();
        }
    }
}

/// Read without claiming, locking or waiting.
pub fn lookup(k: &ClaimKey) -> Outcome {
    biztype::admit(k.biz_type);
    match storage::peek(k, now()) {
        Seen::Absent => Outcome::absent(),
        Seen::Busy(row) => Outcome::in_progress(row.as_ref()),
        Seen::Row(row) => Outcome::of_row(&row),
    }
}

/// What idem_complete, idem_fail, idem_checkpoint and idem_release do to a
/// claim.
pub enum Finish<'a> {
    Complete(Option<pg_sys::Datum>),
    Fail(pg_sys::Datum),
    Checkpoint {
        point: &'a [u8],
        data: Option<pg_sys::Datum>,
        /// Merge `data` into the recovery data (its fields added to the
        /// stored object's) instead of replacing it.
        merge: bool,
    },
    /// End the lease now (a transient failure): the next claim takes over.
    Release,
}

impl Finish<'_> {
    fn function(&self) -> &'static str {
        match self {
            Finish::Complete(_) => "idem_complete",
            Finish::Fail(_) => "idem_fail",
            Finish::Checkpoint { .. } => "idem_checkpoint",
            Finish::Release => "idem_release",
        }
    }
}

/// Record an outcome or a recovery point on a claim the caller holds: one
/// this transaction made, or a leased claim whose lease token the caller
/// passes.
pub fn finish(k: &ClaimKey, what: Finish, lease_token: Option<&[u8]>) {
    require_writable(what.function());
    let settings = biztype::admit(k.biz_type);
    let (store, found) = storage::find(k, Intent::Update);
    let (row, held) = match found {
        Found::Row(row, held) => (row, held),
        Found::Absent(_) | Found::Busy(_) => {
            not_claimed(k, "is not claimed by this transaction, nor leased to the caller")
        }
    };
    let leased = row.state == STATE_LEASED;
    let lease = leased.then(|| Lease::from_datum(row.result));
    let holds = match &lease {
        Some(lease) => row.own || lease.token_matches(lease_token),
        None => row.own && !matches!(what, Finish::Checkpoint { .. } | Finish::Release),
    };
    if !holds {
        match (&lease, lease_token) {
            (Some(_), None) => not_claimed(k, "is leased: pass the lease_token that idem_claim returned"),
            (Some(lease), Some(_)) if lease.released() => {
                not_claimed(k, "was released by its lease holder: claim it again (its token is spent)")
            }
            (Some(_), Some(_)) => not_claimed(k, "is leased to another owner (or the lease was taken over)"),
            (None, _) if row.own => match what {
                Finish::Release => not_claimed(k, "is not leased: idem_release needs idem_claim(..., lease => ...)"),
                _ => not_claimed(k, "is not leased: idem_checkpoint needs idem_claim(..., lease => ...)"),
            },
            (None, _) => not_claimed(k, "is claimed by another transaction, not this one"),
        }
    }
    check_visible(k, &row);
    match what {
        Finish::Complete(result) => {
            write_outcome(store, &row, k, &settings, STATE_COMPLETED, result);
        }
        Finish::Fail(error) => {
            // A retried claim's failure keeps its attempt, for the next
            // retry to count on (only while the type retries: replayed,
            // the error is stored as given).
            let attempt = match (&lease, row.state, row.result) {
                (Some(lease), _, _) => lease.attempt,
                (None, STATE_PENDING, Some(doc)) => attempt_of(doc, "previous_error"),
                _ => 1,
            };
            if settings.retry_failed && attempt > 1 {
                let doc = retry_doc(attempt, "error", Some(error));
                write_outcome(store, &row, k, &settings, STATE_FAILED_RETRIED, Some(doc));
            } else {
                write_outcome(store, &row, k, &settings, STATE_FAILED, Some(error));
            }
        }
        Finish::Checkpoint { point, data, merge } => {
            // Recording progress also renews the lease, never beyond the
            // claim's expiry.
            let mut lease = lease.expect("checked above: only a leased claim takes a checkpoint");
            lease.data = if merge { merged(lease.data, data) } else { data };
            lease.point = Some(crate::datum::jsonb_string(point));
            lease.until = now().saturating_add(lease.lease_us).min(row.expires_at);
            store.rewrite(&row, k, STATE_LEASED, Some(lease.to_datum()));
        }
        Finish::Release => {
            // Still leased, but run out: the next idem_claim takes it over
            // (attempt + 1, recovery point and data as they are).
            let mut lease = lease.expect("checked above: only a leased claim is released");
            lease.release(now());
            store.rewrite(&row, k, STATE_LEASED, Some(lease.to_datum()));
        }
    }
    drop(held);
}

/// Store a claim's outcome. Under retain_from = completion its expiry
/// moves to its TTL from now (the TTL it was claimed with: its expiry less
/// its claim time), so a result stored late is kept as long as one stored
/// at once: the row is written anew where a claim with that expiry goes (a
/// claim of its span, expiry less claim time, placed and registered as
/// type_classes.rs says: the registration covers the new expiry and
/// commits with it) and its old version deleted; a claimer of the key
/// waits for the old version's deleter, then reads the registrations again
/// and finds the new one. A failure the type retries is not final: it
/// keeps its expiry (a retry does not lengthen a key's life), and so the
/// TTL is measured on a row never moved.
fn write_outcome(
    store: Box<dyn Store>,
    row: &Row,
    k: &ClaimKey,
    settings: &biztype::BizType,
    state: u8,
    result: Option<pg_sys::Datum>,
) {
    // (Not under Citus, which idem_configure refuses it for: a type
    // configured so before idem_distribute keeps expiring from its claim.)
    if settings.retain_from_completion
        && !(is_failure(state) && settings.retry_failed)
        && crate::storage::Path::now() != crate::storage::Path::Citus
    {
        let ttl = row.expires_at - row.claimed_at;
        let expires_at = now().saturating_add(ttl);
        if expires_at > row.expires_at {
            store.delete(row, k);
            let fingerprint = row.fingerprint.as_deref();
            store.insert(k, &NewRow { claimed_at: row.claimed_at, expires_at, state, fingerprint, result });
            return;
        }
    }
    store.rewrite(row, k, state, result);
}

/// A checkpoint's data merged into the stored recovery data: the stored
/// object with the new object's fields added (replacing those of the same
/// name, jsonb's ||); stored data that is absent or JSON null counts as
/// {}, and no new data keeps the stored data. 22023 for data that is not
/// an object, before anything is written.
fn merged(stored: Option<pg_sys::Datum>, data: Option<pg_sys::Datum>) -> Option<pg_sys::Datum> {
    let Some(data) = data else { return stored };
    if jsonb_type(data) != b"object" {
        invalid("merge => true needs data that is a JSON object");
    }
    match stored.map(|s| (s, jsonb_type(s))) {
        None => Some(data),
        Some((_, t)) if t == b"null" => Some(data),
        Some((s, t)) if t == b"object" => Some(jsonb_concat(s, data)),
        Some(_) => invalid(
            "merge => true needs the stored recovery data to be a JSON object (checkpoint it without merge first)",
        ),
    }
}

fn not_claimed(k: &ClaimKey, why: &'static str) -> ! {
    IdemError::NotClaimed { key: k.name(), why }.fail()
}

/// Operator eviction: delete the key's live claim (committed, or this
/// transaction's own), after waiting for a transaction that is finishing
/// it; a claim another transaction has not committed is left alone. True if
/// one was removed. Under REPEATABLE READ and SERIALIZABLE, a claim
/// committed after the snapshot is 40001, as a DELETE of a row updated
/// since would be: "true" would report a claim the snapshot cannot see.
pub fn forget(k: &ClaimKey) -> bool {
    require_writable("idem_forget");
    biztype::admit(k.biz_type);
    let (store, found) = storage::find(k, Intent::Forget);
    match found {
        Found::Row(row, held) => {
            check_visible(k, &row);
            store.delete(&row, k);
            drop(held);
            true
        }
        Found::Absent(_) | Found::Busy(_) => false,
    }
}
