//! The completer: leases that ran out with nobody coming back for them (a
//! worker died, no duplicate arrived) are handed, each to exactly one
//! caller, to a job that re-drives or reports them (docs/patterns.md, "A
//! completer").
//!
//! Finding them is a scan of the type's live leased claims (as idem_leases
//! does), run as the extension's owner after the caller is admitted to the
//! type; taking one is protocol::take_expired, under the key's lock and
//! without waiting, so of two completers (or a completer and a duplicate's
//! idem_claim) exactly one takes each lease and the other passes it by.

use crate::backend::now;
use crate::biztype;
use crate::datum::text_datum;
use crate::key::ClaimKey;
use crate::protocol::{self, Taken};
use crate::spi::Statement;
use pgrx::pg_sys;

/// Keys of `biz_type` whose lease ran out, longest run out first.
fn expired_keys(biz_type: &str, now: i64) -> Vec<Vec<u8>> {
    static SCAN: Statement = Statement::new(
        c"SELECT c.key FROM idem.claims c
           WHERE c.biz_type OPERATOR(pg_catalog.=) $1 AND c.state OPERATOR(pg_catalog.=) 'l'
             AND c.expires_at OPERATOR(pg_catalog.>) $2
             AND (c.result OPERATOR(pg_catalog.->>) 'lease_until_us')::pg_catalog.int8 OPERATOR(pg_catalog.<=) $3
           ORDER BY (c.result OPERATOR(pg_catalog.->>) 'lease_until_us')::pg_catalog.int8",
        &[pg_sys::TEXTOID, pg_sys::TIMESTAMPTZOID, pg_sys::INT8OID],
    );
    let at = Some(pg_sys::Datum::from(now));
    SCAN.query_as_owner(&[Some(text_datum(biz_type.as_bytes())), at, at])
        .into_iter()
        // SAFETY: column 1 is key, a text datum in this memory context.
        .filter_map(|row| row[0].map(|d| unsafe { crate::datum::varlena_bytes(d) }.to_vec()))
        .collect()
}

/// Take over at most `max` of `biz_type`'s run-out leases, each with a
/// new lease `lease_us` long (None: as long as its last one).
pub fn take(biz_type: &str, max: usize, lease_us: Option<i64>) -> Vec<(Vec<u8>, Taken)> {
    protocol::require_writable("idem_take_expired_leases");
    biztype::admit(biz_type.as_bytes());
    let mut taken = Vec::new();
    for key in expired_keys(biz_type, now()) {
        if taken.len() >= max {
            break;
        }
        pg_sys::check_for_interrupts!();
        if let Some(t) = protocol::take_expired(&ClaimKey::new(biz_type.as_bytes(), &key), lease_us) {
            taken.push((key, t));
        }
    }
    taken
}
