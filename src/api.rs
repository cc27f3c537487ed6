//! The SQL functions written in Rust: each reads its arguments by the
//! positions named here (next to the SQL signature they come from,
//! sql/*.sql; a pg_test checks the names against pg_proc), validates them,
//! calls the protocol, and turns the answer into a datum.

use crate::biztype;
use crate::datum::{text_array, text_datum};
use crate::errors::{invalid, IdemError};
use crate::fmgr::{Args, Composite};
use crate::guc;
use crate::key::{self, check_biz_type, ClaimKey};
use crate::metrics::{self, Event};
use crate::protocol::{self, ClaimRequest, Finish, Outcome, State};
use crate::sql_function;
use crate::storage::partitions;
use pgrx::pg_sys;

/// Argument positions of one SQL function, and their names as declared.
macro_rules! arguments {
    ($module:ident: $($name:ident = $pos:literal $sql:literal),* $(,)?) => {
        #[allow(dead_code)]
        mod $module {
            $(pub const $name: usize = $pos;)*
            pub const NAMES: &[&str] = &[$($sql),*];
        }
    };
}

/// The (key, biz_type) every claim function takes first.
fn claim_key<'a>(args: Args, key: usize, biz_type: usize) -> ClaimKey<'a> {
    ClaimKey::of_text(args.text_datum_req(biz_type, "biz_type"), args.text_datum_req(key, "key"))
}

/// A state's name in SQL results (the `state` column).
fn state_name(s: State) -> &'static str {
    match s {
        State::New => "new",
        State::Absent => "absent",
        State::InProgress => "in_progress",
        State::Completed => "completed",
        State::Failed => "failed",
    }
}

/// The columns of idem_claim_result (sql/claim.sql) for an outcome.
fn outcome_values(o: Outcome) -> Composite {
    let opt = |v: Option<pg_sys::Datum>| (v.unwrap_or(pg_sys::Datum::from(0)), v.is_none());
    let ts = |t: Option<i64>| opt(t.map(pg_sys::Datum::from));
    let (result, result_null) = opt(o.result);
    let (first, first_null) = ts(o.first_claimed_at);
    let (expires, expires_null) = ts(o.expires_at);
    let values =
        vec![pg_sys::Datum::from(o.claimed), text_datum(state_name(o.state).as_bytes()), result, first, expires];
    Composite(values, vec![false, false, result_null, first_null, expires_null])
}

/// What a claim that answered `o` is counted as (metrics.rs): every
/// function counts here, at the boundary, from what the call returned.
fn claim_event(o: &Outcome) -> Event {
    match o.state {
        State::New if o.took_over => Event::Takeover,
        State::New => Event::Claimed,
        State::Completed => Event::DuplicateCompleted,
        State::Failed => Event::DuplicateFailed,
        // (A claim is never answered absent.)
        State::InProgress | State::Absent => Event::InProgress,
    }
}

// idem_claim(key text, biz_type text, ttl interval DEFAULT NULL,
//            fingerprint text DEFAULT NULL, wait boolean DEFAULT true,
//            lease interval DEFAULT NULL) RETURNS idem_claim_result
arguments!(claim_args: KEY = 0 "key", BIZ_TYPE = 1 "biz_type", TTL = 2 "ttl", FINGERPRINT = 3 "fingerprint", WAIT = 4 "wait", LEASE = 5 "lease");
fn claim(args: Args) -> Composite {
    use claim_args::*;
    let req = ClaimRequest {
        key: claim_key(args, KEY, BIZ_TYPE),
        ttl_us: args.interval(TTL).map(|iv| guc::checked_ttl(&iv, "ttl")),
        fingerprint: args.text(FINGERPRINT),
        wait: args.bool(WAIT).unwrap_or(true),
        lease_us: args.interval(LEASE).map(|iv| guc::checked_ttl(&iv, "lease")),
    };
    let outcome = protocol::claim(&req);
    metrics::count(req.key.biz_type, claim_event(&outcome));
    outcome_values(outcome)
}
sql_function!(idem_claim, pg_finfo_idem_claim, claim, composite);

// idem_claim_many(keys text[], biz_type text, ttl interval DEFAULT NULL,
//                 fingerprints text[] DEFAULT NULL, wait boolean DEFAULT true)
//   RETURNS TABLE (key text, claimed boolean, state text, result jsonb,
//                  first_claimed_at timestamptz, expires_at timestamptz)
arguments!(claim_many_args: KEYS = 0 "keys", BIZ_TYPE = 1 "biz_type", TTL = 2 "ttl", FINGERPRINTS = 3 "fingerprints", WAIT = 4 "wait");
fn claim_many(args: Args) -> pg_sys::Datum {
    use claim_many_args::*;
    let keys = args.datum(KEYS).unwrap_or_else(|| IdemError::NullArgument("keys").fail());
    let (biz_type_text, biz_type) = args.text_datum_req(BIZ_TYPE, "biz_type");
    check_biz_type(biz_type);
    let keys = text_array(keys, "keys");
    let fingerprints = args.datum(FINGERPRINTS).map(|d| text_array(d, "fingerprints"));
    if fingerprints.as_ref().is_some_and(|f| f.len() != keys.len()) {
        invalid("fingerprints must have one element per key (NULL for a key without one)");
    }
    if crate::storage::Path::now() == crate::storage::Path::Citus {
        // Citus delegates a call by one key; a batch spans workers.
        IdemError::FeatureNotSupported(
            "idem_claim_many is not supported when Citus distributes idem.claims".into(),
            Some("Claim each key with SELECT * FROM idem_claim(key, biz_type) as its own statement (delegated to the key's worker), in one transaction (docs/scaling.md).".into()),
        )
        .fail();
    }
    let ttl_us = args.interval(TTL).map(|iv| guc::checked_ttl(&iv, "ttl"));
    let wait = args.bool(WAIT).unwrap_or(true);
    let keys: Vec<ClaimKey> = keys
        .into_iter()
        .map(|k| {
            let k = k.unwrap_or_else(|| IdemError::NullArgument("key").fail());
            ClaimKey::of_text((biz_type_text, biz_type), (text_datum(k), k))
        })
        .collect();
    // (refused here, in its own name, before the first key's claim would
    // refuse in idem_claim's)
    protocol::require_writable("idem_claim_many");
    // Claimed in the order of their bytes, whatever the input order: two
    // batches with keys in common wait for each other in one direction only
    // (no deadlock). The sort is stable, so of a key given twice the first
    // in input order claims and the later one is answered as a duplicate.
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by(|&a, &b| keys[a].key.cmp(keys[b].key));
    let mut outcomes: Vec<Option<Outcome>> = (0..keys.len()).map(|_| None).collect();
    for i in order {
        // A batch of many thousand keys can be cancelled between two keys.
        pg_sys::check_for_interrupts!();
        let req = ClaimRequest {
            key: keys[i],
            ttl_us,
            fingerprint: fingerprints.as_ref().and_then(|f| f[i]),
            wait,
            lease_us: None,
        };
        let outcome = protocol::claim(&req);
        metrics::count(biz_type, claim_event(&outcome));
        outcomes[i] = Some(outcome);
    }
    let rows = keys
        .iter()
        .zip(outcomes)
        .map(|(k, o)| {
            let o = o.expect("every key was claimed");
            let Composite(mut values, mut nulls) = outcome_values(o);
            values.insert(0, text_datum(k.key));
            nulls.insert(0, false);
            (values, nulls)
        })
        .collect();
    args.return_rows(rows)
}
sql_function!(idem_claim_many, pg_finfo_idem_claim_many, claim_many, rows);

// idem_take_expired_leases(biz_type text, max_leases integer DEFAULT 100,
//                          lease interval DEFAULT NULL)
//   RETURNS TABLE (key text, attempt bigint, recovery_point text,
//                  recovery_data jsonb, lease_token text, lease_until timestamptz,
//                  first_claimed_at timestamptz, expires_at timestamptz, claim_id uuid)
arguments!(take_expired_args: BIZ_TYPE = 0 "biz_type", MAX_LEASES = 1 "max_leases", LEASE = 2 "lease");
fn take_expired_leases(args: Args) -> pg_sys::Datum {
    use take_expired_args::*;
    let biz_type = biz_type_arg(args, BIZ_TYPE);
    let max = args.int4(MAX_LEASES).unwrap_or_else(|| IdemError::NullArgument("max_leases").fail());
    if !(1..=10_000).contains(&max) {
        invalid("max_leases must be between 1 and 10000");
    }
    let lease_us = args.interval(LEASE).map(|iv| guc::checked_ttl(&iv, "lease"));
    if crate::storage::Path::now() == crate::storage::Path::Citus {
        IdemError::FeatureNotSupported(
            "idem_take_expired_leases is not supported when Citus distributes idem.claims".into(),
            Some("Take each run-out lease of idem_leases over with SELECT * FROM idem_claim(key, biz_type, wait => false, lease => ...) as its own statement (docs/patterns.md, \"A completer\").".into()),
        )
        .fail();
    }
    let rows = crate::completer::take(biz_type, max as usize, lease_us)
        .into_iter()
        .map(|(key, t)| {
            metrics::count(biz_type.as_bytes(), Event::Takeover);
            let opt = |v: Option<pg_sys::Datum>| (v.unwrap_or(pg_sys::Datum::from(0)), v.is_none());
            let (point, point_null) = opt(t.lease.point.and_then(crate::datum::jsonb_scalar_text));
            let (data, data_null) = opt(t.lease.data.filter(|d| crate::datum::jsonb_type(*d) != b"null"));
            let id = uuid_datum(crate::key::claim_id(biz_type.as_bytes(), &key, t.first_claimed_at));
            let values = vec![
                text_datum(&key),
                pg_sys::Datum::from(t.lease.attempt),
                point,
                data,
                text_datum(t.token.as_bytes()),
                pg_sys::Datum::from(t.lease.until),
                pg_sys::Datum::from(t.first_claimed_at),
                pg_sys::Datum::from(t.expires_at),
                id,
            ];
            let mut nulls = vec![false; values.len()];
            (nulls[2], nulls[3]) = (point_null, data_null);
            (values, nulls)
        })
        .collect();
    args.return_rows(rows)
}
sql_function!(idem_take_expired_leases, pg_finfo_idem_take_expired_leases, take_expired_leases, rows);

/// A uuid datum (by reference, 16 bytes) of these bytes.
fn uuid_datum(uuid: [u8; 16]) -> pg_sys::Datum {
    // SAFETY: a palloc'd block of exactly the 16 bytes a uuid datum holds.
    unsafe {
        let p = pg_sys::palloc(uuid.len()) as *mut u8;
        std::ptr::copy_nonoverlapping(uuid.as_ptr(), p, uuid.len());
        pg_sys::Datum::from(p)
    }
}

// idem_claim_id(key text, biz_type text, first_claimed_at timestamptz)
//   RETURNS uuid (IMMUTABLE STRICT): the claim's id, derived from what
// identifies one claim of a key (docs/design.md §6, "The claim id").
arguments!(claim_id_args: KEY = 0 "key", BIZ_TYPE = 1 "biz_type", FIRST_CLAIMED_AT = 2 "first_claimed_at");
fn claim_id(args: Args) -> pg_sys::Datum {
    use claim_id_args::*;
    let first = args.datum(FIRST_CLAIMED_AT).map_or(0, |d| d.value() as i64);
    uuid_datum(crate::key::claim_id(args.text(BIZ_TYPE).unwrap_or_default(), args.text(KEY).unwrap_or_default(), first))
}
sql_function!(idem_claim_id, pg_finfo_idem_claim_id, claim_id);

// idem_lookup(key text, biz_type text) RETURNS idem_claim_result
arguments!(lookup_args: KEY = 0 "key", BIZ_TYPE = 1 "biz_type");
fn lookup(args: Args) -> Composite {
    use lookup_args::*;
    outcome_values(protocol::lookup(&claim_key(args, KEY, BIZ_TYPE)))
}
sql_function!(idem_lookup, pg_finfo_idem_lookup, lookup, composite);

/// The void result of a finishing function that returned, after counting
/// what it recorded.
fn finished(k: &ClaimKey, recorded: Event) -> pg_sys::Datum {
    metrics::count(k.biz_type, recorded);
    pg_sys::Datum::from(0)
}

// idem_complete(key text, biz_type text, result jsonb DEFAULT NULL, lease_token text DEFAULT NULL)
arguments!(complete_args: KEY = 0 "key", BIZ_TYPE = 1 "biz_type", RESULT = 2 "result", LEASE_TOKEN = 3 "lease_token");
fn complete(args: Args) -> pg_sys::Datum {
    use complete_args::*;
    let k = claim_key(args, KEY, BIZ_TYPE);
    protocol::finish(&k, Finish::Complete(args.jsonb(RESULT)), args.text(LEASE_TOKEN));
    finished(&k, Event::Completed)
}
sql_function!(idem_complete, pg_finfo_idem_complete, complete);

// idem_fail(key text, biz_type text, error jsonb, lease_token text DEFAULT NULL)
arguments!(fail_args: KEY = 0 "key", BIZ_TYPE = 1 "biz_type", ERROR = 2 "error", LEASE_TOKEN = 3 "lease_token");
fn fail(args: Args) -> pg_sys::Datum {
    use fail_args::*;
    let k = claim_key(args, KEY, BIZ_TYPE);
    let error = args.jsonb(ERROR).unwrap_or_else(|| IdemError::NullArgument("error").fail());
    protocol::finish(&k, Finish::Fail(error), args.text(LEASE_TOKEN));
    finished(&k, Event::Failed)
}
sql_function!(idem_fail, pg_finfo_idem_fail, fail);

// idem_checkpoint(key text, biz_type text, point text, data jsonb DEFAULT NULL, lease_token text DEFAULT NULL)
// and idem_checkpoint(key, biz_type, point, data, lease_token, merge boolean):
// one body (merge false in the form without it; in the other it has no
// default, so NULL is refused, 22004, as other required arguments).
arguments!(checkpoint_args: KEY = 0 "key", BIZ_TYPE = 1 "biz_type", POINT = 2 "point", DATA = 3 "data", LEASE_TOKEN = 4 "lease_token", MERGE = 5 "merge");
fn checkpoint_with(args: Args, merge: Option<bool>) -> pg_sys::Datum {
    use checkpoint_args::*;
    let k = claim_key(args, KEY, BIZ_TYPE);
    let point = args.text_req(POINT, "point");
    if point.is_empty() || point.len() > 256 {
        invalid("point must be 1 to 256 bytes long");
    }
    let merge = merge.unwrap_or_else(|| IdemError::NullArgument("merge").fail());
    protocol::finish(&k, Finish::Checkpoint { point, data: args.jsonb(DATA), merge }, args.text(LEASE_TOKEN));
    finished(&k, Event::Checkpointed)
}
fn checkpoint(args: Args) -> pg_sys::Datum {
    checkpoint_with(args, Some(false))
}
fn checkpoint_merge(args: Args) -> pg_sys::Datum {
    checkpoint_with(args, args.bool(checkpoint_args::MERGE))
}
sql_function!(idem_checkpoint, pg_finfo_idem_checkpoint, checkpoint);
sql_function!(idem_checkpoint_merge, pg_finfo_idem_checkpoint_merge, checkpoint_merge);

// idem_release(key text, biz_type text, lease_token text DEFAULT NULL)
arguments!(release_args: KEY = 0 "key", BIZ_TYPE = 1 "biz_type", LEASE_TOKEN = 2 "lease_token");
fn release(args: Args) -> pg_sys::Datum {
    use release_args::*;
    let k = claim_key(args, KEY, BIZ_TYPE);
    // (A release is not counted.)
    protocol::finish(&k, Finish::Release, args.text(LEASE_TOKEN));
    pg_sys::Datum::from(0)
}
sql_function!(idem_release, pg_finfo_idem_release, release);

// idem_forget(key text, biz_type text) RETURNS boolean
arguments!(forget_args: KEY = 0 "key", BIZ_TYPE = 1 "biz_type");
fn forget(args: Args) -> pg_sys::Datum {
    use forget_args::*;
    pg_sys::Datum::from(protocol::forget(&claim_key(args, KEY, BIZ_TYPE)))
}
sql_function!(idem_forget, pg_finfo_idem_forget, forget);

/// A business type argument for the settings functions (no key).
fn biz_type_arg<'a>(args: Args, n: usize) -> &'a str {
    let b = args.text_req(n, "biz_type");
    check_biz_type(b);
    std::str::from_utf8(b).expect("biz_type is validated ASCII")
}

// idem_configure(biz_type text, ttl interval),
// idem_configure(biz_type text, ttl interval, on_failure text) and
// idem_configure(biz_type text, ttl interval, on_failure text, retain_from text):
// one body, each setting set only by the forms that name it.
arguments!(configure_args: BIZ_TYPE = 0 "biz_type", TTL = 1 "ttl", ON_FAILURE = 2 "on_failure", RETAIN_FROM = 3 "retain_from");
fn configure(args: Args, with_policy: bool, with_retention: bool) -> pg_sys::Datum {
    use configure_args::*;
    let biz_type = biz_type_arg(args, BIZ_TYPE);
    if let Some(iv) = args.interval(TTL) {
        guc::checked_ttl(&iv, "ttl");
    }
    let on_failure = with_policy.then(|| args.text(ON_FAILURE));
    if let Some(Some(policy)) = on_failure {
        if policy != b"replay" && policy != b"retry" {
            invalid("on_failure must be replay or retry (or NULL: replay)");
        }
    }
    let retain_from = with_retention.then(|| args.text(RETAIN_FROM));
    if let Some(Some(from)) = retain_from {
        if from != b"claim" && from != b"completion" {
            invalid("retain_from must be claim or completion (or NULL: claim)");
        }
        if from == b"completion" && crate::storage::Path::now() == crate::storage::Path::Citus {
            // A completion moves the row to the partition of its new expiry
            // (a delete and an insert): not built for Citus's shards yet.
            IdemError::FeatureNotSupported(
                "retain_from => 'completion' is not supported when Citus distributes idem.claims".into(),
                Some("Give the type a TTL that covers the longest time to completion (docs/patterns.md).".into()),
            )
            .fail();
        }
    }
    protocol::require_writable("idem_configure");
    biztype::configure(biz_type, args.datum(TTL), on_failure, retain_from);
    pg_sys::Datum::from(0)
}
fn configure_ttl(args: Args) -> pg_sys::Datum {
    configure(args, false, false)
}
fn configure_policy(args: Args) -> pg_sys::Datum {
    configure(args, true, false)
}
fn configure_retention(args: Args) -> pg_sys::Datum {
    configure(args, true, true)
}
sql_function!(idem_configure, pg_finfo_idem_configure, configure_ttl);
sql_function!(idem_configure_policy, pg_finfo_idem_configure_policy, configure_policy);
sql_function!(idem_configure_retention, pg_finfo_idem_configure_retention, configure_retention);

// idem_set_owner(biz_type text, owner regrole)
arguments!(set_owner_args: BIZ_TYPE = 0 "biz_type", OWNER = 1 "owner");
fn set_owner(args: Args) -> pg_sys::Datum {
    use set_owner_args::*;
    let biz_type = biz_type_arg(args, BIZ_TYPE);
    protocol::require_writable("idem_set_owner");
    biztype::set_owner(biz_type, args.oid(OWNER));
    pg_sys::Datum::from(0)
}
sql_function!(idem_set_owner, pg_finfo_idem_set_owner, set_owner);

// idem_storage_path() RETURNS text: how this node reaches idem.claims now
// (storage/mod.rs): direct, sql, or citus.
fn storage_path(_args: Args) -> pg_sys::Datum {
    text_datum(crate::storage::Path::now().name().as_bytes())
}
sql_function!(idem_storage_path, pg_finfo_idem_storage_path, storage_path);

// idem.random_token() RETURNS text: 256 bits from the CSPRNG, as hex.
fn random_token(_args: Args) -> pg_sys::Datum {
    text_datum(crate::lease::random_hex(32).as_bytes())
}
sql_function!(idem_random_token, pg_finfo_idem_random_token, random_token);

// idem.key_hash(biz_type text, key text) RETURNS bigint (STRICT): declared
// on idem_key_digest since 0.4.0; idem_key_hash is 0.3.0's digest, which
// that schema's declaration and indexes use until its update (src/key.rs).
arguments!(key_hash_args: BIZ_TYPE = 0 "biz_type", KEY = 1 "key");
fn key_digest(args: Args) -> pg_sys::Datum {
    use key_hash_args::*;
    pg_sys::Datum::from(key::digest(args.text(BIZ_TYPE).unwrap_or_default(), args.text(KEY).unwrap_or_default()))
}
sql_function!(idem_key_digest, pg_finfo_idem_key_digest, key_digest);
fn legacy_key_hash(args: Args) -> pg_sys::Datum {
    use key_hash_args::*;
    pg_sys::Datum::from(key::legacy_digest(args.text(BIZ_TYPE).unwrap_or_default(), args.text(KEY).unwrap_or_default()))
}
sql_function!(idem_key_hash, pg_finfo_idem_key_hash, legacy_key_hash);

// idem.partition_from(partition regclass) / idem.partition_to(partition
// regclass) RETURNS timestamptz, idem.partition_class(partition regclass)
// RETURNS smallint (STRICT): a partition's TTL class and range of
// expires_at, read in binary as the claim path reads them; NULL for the
// default partition and for a relation that is not a partition.
arguments!(partition_bound_args: PARTITION = 0 "partition");
fn partition_bound(args: Args) -> Option<partitions::Bound> {
    let relid = args.oid(partition_bound_args::PARTITION).unwrap_or(pg_sys::InvalidOid);
    partitions::partition_bound(relid).flatten()
}
fn partition_from(args: Args) -> pg_sys::Datum {
    match partition_bound(args) {
        Some(b) => pg_sys::Datum::from(b.from),
        None => args.return_null(),
    }
}
fn partition_to(args: Args) -> pg_sys::Datum {
    match partition_bound(args) {
        Some(b) => pg_sys::Datum::from(b.to),
        None => args.return_null(),
    }
}
fn partition_class(args: Args) -> pg_sys::Datum {
    match partition_bound(args) {
        Some(b) => pg_sys::Datum::from(b.class),
        None => args.return_null(),
    }
}
sql_function!(idem_partition_from, pg_finfo_idem_partition_from, partition_from);
sql_function!(idem_partition_to, pg_finfo_idem_partition_to, partition_to);
sql_function!(idem_partition_class, pg_finfo_idem_partition_class, partition_class);

// idem.ttl_class(ttl interval) RETURNS smallint, idem.class_width(ttl_class
// smallint) / idem.class_max_ttl(ttl_class smallint) RETURNS interval
// (STRICT): the TTL classes of ttl_class.rs.
arguments!(ttl_class_args: TTL = 0 "ttl");
fn ttl_class_of(args: Args) -> pg_sys::Datum {
    let ttl = args.interval(ttl_class_args::TTL).map_or(0, |iv| crate::guc::interval_us(&iv));
    pg_sys::Datum::from(crate::ttl_class::of_ttl(ttl.clamp(i64::MIN as i128, i64::MAX as i128) as i64))
}
arguments!(class_args: CLASS = 0 "ttl_class");
fn class_interval(args: Args, of: fn(i16) -> Option<i64>) -> pg_sys::Datum {
    match args.int4(class_args::CLASS).and_then(|k| i16::try_from(k).ok()).and_then(of) {
        Some(us) => crate::datum::interval_datum(us),
        None => args.return_null(),
    }
}
fn class_width(args: Args) -> pg_sys::Datum {
    class_interval(args, crate::ttl_class::width)
}
fn class_max_ttl(args: Args) -> pg_sys::Datum {
    class_interval(args, crate::ttl_class::max_ttl)
}
sql_function!(idem_ttl_class, pg_finfo_idem_ttl_class, ttl_class_of);
sql_function!(idem_class_width, pg_finfo_idem_class_width, class_width);
sql_function!(idem_class_max_ttl, pg_finfo_idem_class_max_ttl, class_max_ttl);

/// The result columns of idem.metrics() (sql/metrics.sql's OUT arguments),
/// in order: the columns after biz_type follow metrics::Event, then the
/// wait time. A `#[pg_test]` checks them against the declaration.
mod metrics_columns {
    pub const NAMES: &[&str] = &[
        "biz_type",
        "claims",
        "takeovers",
        "duplicates_completed",
        "duplicates_failed",
        "in_progress",
        "waits",
        "wait_seconds",
        "fingerprint_mismatches",
        "not_held",
        "serialization_failures",
        "completes",
        "fails",
        "checkpoints",
        "stats_since",
        "note",
    ];
    pub const BIZ_TYPE: usize = position("biz_type");
    /// claims .. waits: the first six counters.
    pub const FIRST_COUNTERS: usize = position("claims");
    pub const WAIT_SECONDS: usize = position("wait_seconds");
    /// fingerprint_mismatches .. checkpoints: the other counters.
    pub const LATER_COUNTERS: usize = position("fingerprint_mismatches");
    pub const STATS_SINCE: usize = position("stats_since");
    pub const NOTE: usize = position("note");

    const fn position(name: &str) -> usize {
        let mut i = 0;
        while i < NAMES.len() {
            let (a, b) = (NAMES[i].as_bytes(), name.as_bytes());
            if a.len() == b.len() {
                let mut j = 0;
                while j < a.len() && a[j] == b[j] {
                    j += 1;
                }
                if j == a.len() {
                    return i;
                }
            }
            i += 1;
        }
        panic!("not a column of idem.metrics()")
    }
}
const METRICS_COLUMNS: usize = metrics_columns::NAMES.len();
pub const METRICS_OFF: &str = "counters are off: idem is not in shared_preload_libraries. Add it (shared_preload_libraries = 'idem', or append it to the list there) and restart the server to count claims, duplicates, waits and errors per business type";
fn metrics(args: Args) -> pg_sys::Datum {
    let nothing = || (vec![pg_sys::Datum::from(0); METRICS_COLUMNS], vec![true; METRICS_COLUMNS]);
    let rows = match metrics::rows() {
        None => {
            let (mut values, mut nulls) = nothing();
            values[metrics_columns::NOTE] = text_datum(METRICS_OFF.as_bytes());
            nulls[metrics_columns::NOTE] = false;
            vec![(values, nulls)]
        }
        Some(rows) => rows
            .into_iter()
            .map(|r| {
                let (mut values, mut nulls) = nothing();
                let mut put = |i: usize, d: pg_sys::Datum| {
                    values[i] = d;
                    nulls[i] = false;
                };
                if let Some(b) = &r.biz_type {
                    put(metrics_columns::BIZ_TYPE, text_datum(b));
                }
                if let Some(note) = &r.note {
                    put(metrics_columns::NOTE, text_datum(note.as_bytes()));
                }
                let first = metrics_columns::WAIT_SECONDS - metrics_columns::FIRST_COUNTERS;
                for (i, v) in r.counters[..first].iter().enumerate() {
                    put(metrics_columns::FIRST_COUNTERS + i, pg_sys::Datum::from(*v as i64));
                }
                put(metrics_columns::WAIT_SECONDS, pg_sys::Datum::from((r.wait_us as f64 / 1e6).to_bits()));
                for (i, v) in r.counters[first..].iter().enumerate() {
                    put(metrics_columns::LATER_COUNTERS + i, pg_sys::Datum::from(*v as i64));
                }
                put(metrics_columns::STATS_SINCE, pg_sys::Datum::from(r.since));
                (values, nulls)
            })
            .collect(),
    };
    args.return_rows(rows)
}
sql_function!(idem_metrics, pg_finfo_idem_metrics, metrics, rows);

// idem.metrics_info() RETURNS TABLE (counting boolean, slots_used int,
//   slots int, overflowed boolean)
fn metrics_info(args: Args) -> pg_sys::Datum {
    let row = match metrics::usage() {
        None => (vec![pg_sys::Datum::from(false), 0.into(), 0.into(), 0.into()], vec![false, true, true, true]),
        Some((used, overflowed)) => (
            vec![
                pg_sys::Datum::from(true),
                pg_sys::Datum::from(used as i32),
                pg_sys::Datum::from(metrics::SLOTS as i32),
                pg_sys::Datum::from(overflowed),
            ],
            vec![false; 4],
        ),
    };
    args.return_rows(vec![row])
}
sql_function!(idem_metrics_info, pg_finfo_idem_metrics_info, metrics_info, rows);

// idem.metrics_database(OUT slots_used int, OUT share int, OUT no_room bigint)
fn metrics_database(args: Args) -> pg_sys::Datum {
    let row = match metrics::database_usage() {
        None => (vec![pg_sys::Datum::from(0); 3], vec![true; 3]),
        Some((used, no_room)) => (
            vec![
                pg_sys::Datum::from(used as i32),
                pg_sys::Datum::from(metrics::SHARE as i32),
                pg_sys::Datum::from(no_room as i64),
            ],
            vec![false; 3],
        ),
    };
    args.return_rows(vec![row])
}
sql_function!(idem_metrics_database, pg_finfo_idem_metrics_database, metrics_database, rows);

// idem.metrics_types(OUT biz_type text, OUT stats_since timestamptz) RETURNS SETOF record
fn metrics_types(args: Args) -> pg_sys::Datum {
    args.return_rows(
        metrics::types()
            .iter()
            .map(|(t, since)| (vec![text_datum(t), pg_sys::Datum::from(*since)], vec![false, false]))
            .collect(),
    )
}
sql_function!(idem_metrics_types, pg_finfo_idem_metrics_types, metrics_types, rows);

// idem.metrics_release(biz_type text) RETURNS boolean
fn metrics_release(args: Args) -> pg_sys::Datum {
    let biz_type = args.text_req(0, "biz_type");
    pg_sys::Datum::from(metrics::release_type(biz_type))
}
sql_function!(idem_metrics_release, pg_finfo_idem_metrics_release, metrics_release);

// idem.metrics_release_dropped() RETURNS int
fn metrics_release_dropped(_args: Args) -> pg_sys::Datum {
    pg_sys::Datum::from(metrics::release_dropped() as i32)
}
sql_function!(idem_metrics_release_dropped, pg_finfo_idem_metrics_release_dropped, metrics_release_dropped);

// idem_metrics_reset() RETURNS void
fn metrics_reset(_args: Args) -> pg_sys::Datum {
    metrics::reset();
    pg_sys::Datum::from(0)
}
sql_function!(idem_metrics_reset, pg_finfo_idem_metrics_reset, metrics_reset);

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    /// The positions api.rs reads each argument from are the positions the
    /// SQL declarations give those names.
    #[pg_test]
    fn argument_positions_match_the_sql_declarations() {
        let declared: &[(&str, &[&str])] = &[
            ("idem_claim(text,text,interval,text,boolean,interval)", super::claim_args::NAMES),
            ("idem_lookup(text,text)", super::lookup_args::NAMES),
            ("idem_claim_many(text[],text,interval,text[],boolean)", super::claim_many_args::NAMES),
            ("idem_complete(text,text,jsonb,text)", super::complete_args::NAMES),
            ("idem_fail(text,text,jsonb,text)", super::fail_args::NAMES),
            ("idem_checkpoint(text,text,text,jsonb,text)", &super::checkpoint_args::NAMES[..5]),
            ("idem_checkpoint(text,text,text,jsonb,text,boolean)", super::checkpoint_args::NAMES),
            ("idem_forget(text,text)", super::forget_args::NAMES),
            ("idem_release(text,text,text)", super::release_args::NAMES),
            ("idem_claim_id(text,text,timestamp with time zone)", super::claim_id_args::NAMES),
            ("idem_take_expired_leases(text,integer,interval)", super::take_expired_args::NAMES),
            ("idem_configure(text,interval)", &super::configure_args::NAMES[..2]),
            ("idem_configure(text,interval,text)", &super::configure_args::NAMES[..3]),
            ("idem_configure(text,interval,text,text)", super::configure_args::NAMES),
            ("idem_set_owner(text,regrole)", super::set_owner_args::NAMES),
            ("idem.key_hash(text,text)", super::key_hash_args::NAMES),
            ("idem.partition_from(regclass)", super::partition_bound_args::NAMES),
            ("idem.partition_to(regclass)", super::partition_bound_args::NAMES),
        ];
        for (signature, names) in declared {
            let sql = Spi::get_one_with_args::<Vec<String>>(
                // The input arguments' names (a RETURNS TABLE's columns are
                // OUT arguments).
                "SELECT array_agg(a.n ORDER BY a.i)
                   FROM pg_proc p, unnest(p.proargnames, p.proargmodes::text[]) WITH ORDINALITY AS a(n, m, i)
                  WHERE p.oid = $1::regprocedure AND coalesce(a.m, 'i') IN ('i', 'b', 'v')",
                &[(*signature).into()],
            )
            .unwrap()
            .unwrap_or_default();
            assert_eq!(sql, names.iter().map(|n| n.to_string()).collect::<Vec<_>>(), "{signature}");
        }
    }

    /// The positions idem_metrics fills are the OUT columns sql/metrics.sql
    /// declares, in the same order, and the counters between them are as
    /// many as metrics::Event has (the wait time sits between two runs).
    #[pg_test]
    fn metrics_columns_match_the_sql_declaration() {
        let declared = Spi::get_one::<Vec<String>>(
            "SELECT array_agg(n ORDER BY i)
               FROM pg_proc p, unnest(p.proargnames, p.proargmodes::text[]) WITH ORDINALITY AS a(n, m, i)
              WHERE p.oid = 'idem.metrics()'::regprocedure AND m IN ('o', 't')",
        )
        .unwrap()
        .unwrap_or_default();
        assert_eq!(declared, super::metrics_columns::NAMES.iter().map(|n| n.to_string()).collect::<Vec<_>>());
        use super::metrics_columns::*;
        let counters = (WAIT_SECONDS - FIRST_COUNTERS) + (STATS_SINCE - LATER_COUNTERS);
        assert_eq!(counters, crate::metrics::NEVENTS, "one column per counter");
        assert_eq!(LATER_COUNTERS, WAIT_SECONDS + 1);
    }

    #[pg_test(error = "idem: key must not be empty")]
    fn empty_key_is_refused() {
        Spi::run("SELECT idem_claim('', 'unit')").unwrap();
    }

    #[pg_test]
    fn claim_and_duplicate_in_one_transaction() {
        let first = Spi::get_two::<bool, String>("SELECT claimed, state FROM idem_claim('u1', 'unit')").unwrap();
        assert_eq!(first, (Some(true), Some("new".into())));
        let again = Spi::get_two::<bool, String>("SELECT claimed, state FROM idem_claim('u1', 'unit')").unwrap();
        assert_eq!(again, (Some(false), Some("in_progress".into())));
        Spi::run("SELECT idem_complete('u1', 'unit', '{\"n\": 1}')").unwrap();
        let done = Spi::get_two::<String, pgrx::JsonB>("SELECT state, result FROM idem_lookup('u1', 'unit')").unwrap();
        assert_eq!(done.0.as_deref(), Some("completed"));
        assert_eq!(done.1.unwrap().0, serde_json::json!({"n": 1}));
    }
}
