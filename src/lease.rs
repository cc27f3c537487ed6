//! Leases: a claim committed on its own before work that cannot sit inside
//! the database transaction (an external payment call). While a claim is
//! leased, its row's `result` column holds the lease document below instead
//! of a result; idem_checkpoint records recovery points in it, and once the
//! lease runs out the next idem_claim takes the claim over and is told where
//! the last attempt got to.
//!
//! Ownership is proven by the lease token (stored only as its SHA-256), or
//! by being the very transaction that took the lease. Never by the server
//! session: behind a transaction-mode pooler one session serves many
//! clients (docs/design.md §10).
//!
//! The document: the typed fields below (serde) plus `recovery_point` and
//! `recovery_data`, which are jsonb values kept exactly as given (any
//! encoding, depth and number) and joined to the rest with jsonb's own `||`,
//! and, on a lease that retries a stored failure (on_failure = retry),
//! `previous_error`, kept the same way, so that a takeover is told it too.

use crate::datum::{
    iso_utc, jsonb_concat, jsonb_decode, jsonb_encode, jsonb_field, jsonb_from_utf8, jsonb_object1, jsonb_without,
};
use crate::errors::IdemError;
use pgrx::pg_sys;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The typed part of the stored document. Unknown fields (0.2.0 also kept
/// `owner_session`) are ignored; a missing one is a damaged document (XX000).
#[derive(Serialize, Deserialize)]
struct Stored {
    attempt: i64,
    lease_us: i64,
    lease_until_us: i64,
    owner_token_sha256: String,
}

/// What the lease holder is told (`result` of the claim that took it).
#[derive(Serialize)]
struct OwnerView<'a> {
    attempt: i64,
    lease_until: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_token: Option<&'a str>,
}

pub struct Lease {
    pub attempt: i64,
    pub lease_us: i64,
    pub until: i64,
    owner_token_sha256: String,
    /// The last recovery point: a jsonb string (or JSON null), exactly.
    pub point: Option<pg_sys::Datum>,
    /// Its data, a jsonb value as given to idem_checkpoint, exactly.
    pub data: Option<pg_sys::Datum>,
    /// The stored failure this claim retries (on_failure = retry), exactly;
    /// None on a lease that retries nothing (no field in the document).
    pub previous_error: Option<pg_sys::Datum>,
}

/// The fields of the document kept as jsonb values, outside the typed part.
const KEPT: [&str; 3] = ["recovery_point", "recovery_data", "previous_error"];

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// `bytes` bytes from PostgreSQL's CSPRNG, as hex digits.
pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    // SAFETY: writes exactly `buf.len()` bytes into `buf`.
    if !unsafe { pg_sys::pg_strong_random(buf.as_mut_ptr().cast(), buf.len()) } {
        IdemError::Internal("could not generate random bytes (pg_strong_random failed)".into()).fail();
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

impl Lease {
    /// A new lease (attempt `attempt`) ending at `until`; returns it and the
    /// bearer token that proves ownership.
    pub fn new(
        attempt: i64,
        lease_us: i64,
        until: i64,
        point: Option<pg_sys::Datum>,
        data: Option<pg_sys::Datum>,
    ) -> (Lease, String) {
        let token = random_hex(16);
        let owner_token_sha256 = sha256_hex(token.as_bytes());
        let lease = Lease { attempt, lease_us, until, owner_token_sha256, point, data, previous_error: None };
        (lease, token)
    }

    /// Read a stored lease document; XX000 if it is missing or damaged.
    pub fn from_datum(doc: Option<pg_sys::Datum>) -> Lease {
        let Some(doc) = doc else { IdemError::Internal("a leased claim has no lease document".into()).fail() };
        let point = jsonb_field(doc, "recovery_point");
        let data = jsonb_field(doc, "recovery_data");
        let previous_error = jsonb_field(doc, "previous_error");
        let typed = KEPT.iter().fold(doc, |d, field| jsonb_without(d, field));
        let s: Stored = jsonb_decode(typed, "the lease document");
        Lease {
            attempt: s.attempt,
            lease_us: s.lease_us,
            until: s.lease_until_us,
            owner_token_sha256: s.owner_token_sha256,
            point,
            data,
            previous_error,
        }
    }

    pub fn to_datum(&self) -> pg_sys::Datum {
        let typed = jsonb_encode(&Stored {
            attempt: self.attempt,
            lease_us: self.lease_us,
            lease_until_us: self.until,
            owner_token_sha256: self.owner_token_sha256.clone(),
        });
        self.with_recovery(typed)
    }

    /// What the owner is told: attempt, recovery point and data, lease end,
    /// and (when it has just been issued) the lease token; the error it
    /// retries, if it does.
    pub fn for_owner(&self, token: Option<&str>) -> pg_sys::Datum {
        let view = OwnerView { attempt: self.attempt, lease_until: iso_utc(self.until), lease_token: token };
        self.with_recovery(jsonb_encode(&view))
    }

    /// What a claim without a lease that takes this lease over (attempt + 1)
    /// is told, and what its row then stores.
    pub fn for_plain_claim(&self) -> (pg_sys::Datum, pg_sys::Datum) {
        let attempt = jsonb_encode(&serde_json::json!({ "attempt": self.attempt + 1 }));
        let stored = self.with_error(attempt);
        (self.with_recovery(attempt), stored)
    }

    /// Retrying `error` (a stored failure, JSON null when there is none).
    pub fn retrying(&mut self, error: Option<pg_sys::Datum>) {
        self.previous_error = Some(error.unwrap_or_else(|| jsonb_from_utf8(b"null")));
    }

    fn with_recovery(&self, doc: pg_sys::Datum) -> pg_sys::Datum {
        let doc = jsonb_concat(doc, jsonb_object1("recovery_point", self.point));
        self.with_error(jsonb_concat(doc, jsonb_object1("recovery_data", self.data)))
    }

    fn with_error(&self, doc: pg_sys::Datum) -> pg_sys::Datum {
        match self.previous_error {
            Some(error) => jsonb_concat(doc, jsonb_object1("previous_error", Some(error))),
            None => doc,
        }
    }

    /// Whether `token` is this lease's token (a released lease has none).
    pub fn token_matches(&self, token: Option<&[u8]>) -> bool {
        !self.released() && token.is_some_and(|t| sha256_hex(t) == self.owner_token_sha256)
    }

    /// Hand the lease back (idem_release): it has run out as of `now`, so
    /// the next claim takes it over at once, with the attempt and recovery
    /// data kept; and its token is spent, so the former holder can no
    /// longer finish, checkpoint or release it.
    pub fn release(&mut self, now: i64) {
        self.until = self.until.min(now);
        self.owner_token_sha256.clear();
    }

    /// Whether the holder handed the lease back (no claim took it over yet).
    pub fn released(&self) -> bool {
        self.owner_token_sha256.is_empty()
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::*;
    use crate::datum::jsonb_to_utf8;
    use pgrx::prelude::*;

    fn json(d: pg_sys::Datum) -> serde_json::Value {
        serde_json::from_slice(&jsonb_to_utf8(d)).expect("jsonb's text is JSON")
    }

    #[pg_test]
    fn previous_error_stays_with_the_lease_and_its_takeovers() {
        let error = jsonb_from_utf8(br#"{"declined": "try later"}"#);
        let (mut lease, _) = Lease::new(2, 1_000_000, 5_000_000, None, None);
        lease.retrying(Some(error));
        // Stored, read back, checkpointed and released: still there.
        let mut read = Lease::from_datum(Some(lease.to_datum()));
        read.point = Some(crate::datum::jsonb_string(b"charged"));
        read.release(4_000_000);
        let read = Lease::from_datum(Some(read.to_datum()));
        assert_eq!(json(read.previous_error.expect("kept")), serde_json::json!({"declined": "try later"}));
        assert_eq!(json(read.for_owner(None))["previous_error"], serde_json::json!({"declined": "try later"}));
        // A plain claim taking it over: attempt 3, the recovery point, the
        // error; stored for idem_fail to count on, without a lease.
        let (told, stored) = read.for_plain_claim();
        assert_eq!(
            json(told),
            serde_json::json!({"attempt": 3, "recovery_point": "charged", "recovery_data": null,
                               "previous_error": {"declined": "try later"}})
        );
        assert_eq!(json(stored), serde_json::json!({"attempt": 3, "previous_error": {"declined": "try later"}}));
        // A lease that retries nothing has no such field.
        let (plain, _) = Lease::new(1, 1_000_000, 5_000_000, None, None);
        assert!(json(plain.to_datum()).get("previous_error").is_none());
        assert_eq!(json(plain.for_plain_claim().1), serde_json::json!({"attempt": 2}));
    }
}
