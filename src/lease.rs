//! Leases: a claim committed on its own before work that cannot sit inside
//! the database transaction (an external payment call). While a claim is
//! leased, its row's `result` column holds the lease document below instead
//! of a result; idem_checkpoint records recovery points in it, and once the
//! lease runs out the next idem_claim takes the claim over and is told where
//! the last attempt got to.

use crate::errors::IdemError;
use crate::fmgr::{jsonb_field, jsonb_with_raw, jsonb_without};
use pgrx::datum::FromDatum;
use pgrx::pg_sys;
use pgrx::JsonB;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

pub struct Lease {
    pub attempt: i64,
    pub lease_us: i64,
    pub until: i64,
    pub owner_session: String,
    pub owner_token_sha256: String,
    pub point: Value,
    /// The recovery data as given to idem_checkpoint: a jsonb datum, kept
    /// exactly (serde_json would round numbers and limit nesting).
    pub data: Option<pg_sys::Datum>,
}

/// This backend, as a lease owner: pid and start time, so that a later
/// backend reusing the pid is a different owner.
pub fn this_session() -> String {
    let (pid, started) = unsafe { (pg_sys::MyProcPid, pg_sys::MyStartTimestamp) };
    format!("{pid}:{started}")
}

fn sha256_hex(s: &str) -> String {
    Sha256::digest(s.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// 128 bits from PostgreSQL's CSPRNG, as 32 hex digits.
pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    if !unsafe { pg_sys::pg_strong_random(buf.as_mut_ptr().cast(), buf.len()) } {
        IdemError::ObjectNotInPrerequisiteState("could not generate random bytes".into(), None).fail();
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

fn timestamp_text(ts: i64) -> Value {
    unsafe {
        let d = pgrx::fcinfo::direct_function_call_as_datum(pg_sys::timestamptz_out, &[Some(pg_sys::Datum::from(ts))])
            .unwrap();
        Value::String(std::ffi::CStr::from_ptr(d.cast_mut_ptr()).to_string_lossy().into_owned())
    }
}

impl Lease {
    /// A new lease (attempt `attempt`) owned by this session; returns it and
    /// the bearer token that also proves ownership from another session.
    pub fn new(attempt: i64, lease_us: i64, now: i64, point: Value, data: Option<pg_sys::Datum>) -> (Lease, String) {
        let token = random_hex(16);
        let lease = Lease {
            attempt,
            lease_us,
            until: now.saturating_add(lease_us),
            owner_session: this_session(),
            owner_token_sha256: sha256_hex(&token),
            point,
            data,
        };
        (lease, token)
    }

    pub fn from_datum(d: Option<pg_sys::Datum>) -> Lease {
        // The small fields through serde; the recovery data stays jsonb.
        let data = d.and_then(|d| jsonb_field(d, "recovery_data"));
        let v = d
            .map(|d| jsonb_without(d, "recovery_data"))
            .and_then(|d| unsafe { JsonB::from_datum(d, false) })
            .map(|j| j.0)
            .unwrap_or(Value::Null);
        Lease {
            attempt: v["attempt"].as_i64().unwrap_or(1),
            lease_us: v["lease_us"].as_i64().unwrap_or(0),
            until: v["lease_until_us"].as_i64().unwrap_or(0),
            owner_session: v["owner_session"].as_str().unwrap_or("").into(),
            owner_token_sha256: v["owner_token_sha256"].as_str().unwrap_or("").into(),
            point: v["recovery_point"].clone(),
            data,
        }
    }

    pub fn to_datum(&self) -> pg_sys::Datum {
        let fields = json!({
            "attempt": self.attempt,
            "lease_us": self.lease_us,
            "lease_until_us": self.until,
            "owner_session": self.owner_session,
            "owner_token_sha256": self.owner_token_sha256,
            "recovery_point": self.point,
        });
        let Value::Object(fields) = fields else { unreachable!() };
        jsonb_with_raw(fields, "recovery_data", self.data)
    }

    /// What the owner is told: attempt, recovery point and data, lease end,
    /// and (when it has just been issued) the lease token.
    pub fn for_owner(&self, token: Option<&str>) -> pg_sys::Datum {
        let mut v = json!({
            "attempt": self.attempt,
            "recovery_point": self.point,
            "lease_until": timestamp_text(self.until),
        });
        if let Some(t) = token {
            v["lease_token"] = Value::String(t.into());
        }
        let Value::Object(fields) = v else { unreachable!() };
        jsonb_with_raw(fields, "recovery_data", self.data)
    }

    pub fn owned_by_caller(&self, token: Option<&[u8]>) -> bool {
        match token {
            Some(t) => sha256_hex(&String::from_utf8_lossy(t)) == self.owner_token_sha256,
            None => self.owner_session == this_session(),
        }
    }
}
