//! Building and taking apart the datums idem stores: text with exact bytes,
//! jsonb documents assembled from jsonb values (never by splicing JSON
//! text), timestamps printed in one fixed style.
//!
//! Text in the database is in the server encoding. serde_json speaks UTF-8,
//! so every JSON text that crosses between the two is converted
//! (`pg_server_to_any` / `pg_any_to_server`); values that did not come from
//! serde (keys, recovery points and data) are never converted at all.

use crate::errors::internal;
use pgrx::pg_sys;

/// A palloc'd text datum holding exactly `bytes`.
pub fn text_datum(bytes: &[u8]) -> pg_sys::Datum {
    // SAFETY: the palloc'd block is `len` bytes: the header, then exactly `bytes.len()` copied bytes.
    unsafe {
        let len = bytes.len() + pg_sys::VARHDRSZ;
        let p = pg_sys::palloc(len) as *mut pg_sys::varlena;
        pgrx::varlena::set_varsize_4b(p, len as i32);
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), pgrx::varlena::vardata_4b(p) as *mut u8, bytes.len());
        pg_sys::Datum::from(p)
    }
}

/// The bytes of a text (or other varlena) datum, detoasted.
///
/// # Safety
/// `d` must be a valid varlena datum; the slice lives as long as the current
/// memory context (or the datum, if it was not toasted).
pub unsafe fn varlena_bytes<'a>(d: pg_sys::Datum) -> &'a [u8] {
    // SAFETY: `d` is a valid varlena datum (this function's contract).
    unsafe { detoasted(d).1 }
}

/// A varlena datum detoasted, and its bytes: the datum itself unless it
/// was compressed or stored out of line (then a copy), a plain or short
/// varlena that tuples, scan keys and statements take as it is.
///
/// # Safety
/// As `varlena_bytes`.
pub unsafe fn detoasted<'a>(d: pg_sys::Datum) -> (pg_sys::Datum, &'a [u8]) {
    // SAFETY: `d` is a valid varlena datum (this function's contract).
    unsafe {
        let v = pg_sys::pg_detoast_datum_packed(d.cast_mut_ptr());
        (pg_sys::Datum::from(v), pgrx::varlena::varlena_to_byte_slice(v))
    }
}

/// The elements of a text[] datum in order, a NULL element as None (valid
/// for the call); 22023 for an array of more than one dimension.
pub fn text_array<'a>(d: pg_sys::Datum, what: &str) -> Vec<Option<&'a [u8]>> {
    // SAFETY: `d` is a non-NULL text[] argument: detoasted, it is an
    // ArrayType whose elements deconstruct_array returns as `n` datums and
    // `n` null flags, in the current memory context.
    unsafe {
        let arr = pg_sys::pg_detoast_datum(d.cast_mut_ptr()).cast::<pg_sys::ArrayType>();
        if (*arr).ndim > 1 {
            crate::errors::invalid(format!("{what} must be a one-dimensional array"));
        }
        let (mut elems, mut nulls, mut n) = (std::ptr::null_mut(), std::ptr::null_mut(), 0);
        pg_sys::deconstruct_array(
            arr,
            pg_sys::TEXTOID,
            -1,
            false,
            pg_sys::TYPALIGN_INT as std::ffi::c_char,
            &mut elems,
            &mut nulls,
            &mut n,
        );
        (0..n as usize).map(|i| (!*nulls.add(i)).then(|| varlena_bytes(*elems.add(i)))).collect()
    }
}

/// A detoasted copy of a varlena datum in the current memory context.
///
/// # Safety
/// `d` must be a valid varlena datum.
pub unsafe fn varlena_copy(d: pg_sys::Datum) -> pg_sys::Datum {
    // SAFETY: `d` is a valid varlena datum (this function's contract).
    unsafe { pg_sys::Datum::from(pg_sys::pg_detoast_datum_copy(d.cast_mut_ptr())) }
}

fn call2(f: u32, a: pg_sys::Datum, b: pg_sys::Datum) -> pg_sys::Datum {
    // SAFETY: callers pass a built-in function's OID with datums of its argument types.
    unsafe { pg_sys::OidFunctionCall2Coll(pg_sys::Oid::from(f), pg_sys::InvalidOid, a, b) }
}

/// `doc -> key`, or None when the object has no such key.
/// An interval datum of `us` microseconds (no days or months), palloc'd.
pub fn interval_datum(us: i64) -> pg_sys::Datum {
    // SAFETY: the palloc'd block has Interval's size and is fully written before use.
    unsafe {
        let iv = pg_sys::palloc(std::mem::size_of::<pg_sys::Interval>()) as *mut pg_sys::Interval;
        *iv = pg_sys::Interval { time: us, day: 0, month: 0 };
        pg_sys::Datum::from(iv)
    }
}

pub fn jsonb_field(doc: pg_sys::Datum, key: &str) -> Option<pg_sys::Datum> {
    let k = text_datum(key.as_bytes());
    let has = call2(pg_sys::F_JSONB_EXISTS, doc, k).value() != 0;
    has.then(|| call2(pg_sys::F_JSONB_OBJECT_FIELD, doc, k))
}

/// jsonb_typeof(doc): object, array, string, number, boolean or null.
pub fn jsonb_type(doc: pg_sys::Datum) -> Vec<u8> {
    // SAFETY: jsonb_typeof takes one jsonb datum and returns a text datum.
    let t = unsafe {
        pg_sys::OidFunctionCall1Coll(pg_sys::Oid::from(pg_sys::F_JSONB_TYPEOF), pg_sys::InvalidOid, doc)
    };
    // SAFETY: a text datum in the current memory context.
    unsafe { varlena_bytes(t) }.to_vec()
}

/// `doc - key`.
pub fn jsonb_without(doc: pg_sys::Datum, key: &str) -> pg_sys::Datum {
    call2(pg_sys::F_JSONB_DELETE_JSONB_TEXT, doc, text_datum(key.as_bytes()))
}

/// `a || b` (for objects: b's fields added to a's).
pub fn jsonb_concat(a: pg_sys::Datum, b: pg_sys::Datum) -> pg_sys::Datum {
    call2(pg_sys::F_JSONB_CONCAT, a, b)
}

/// `jsonb_build_object(key, value)` for a jsonb value, kept exactly (any
/// depth, every digit); JSON null when None.
pub fn jsonb_object1(key: &str, value: Option<pg_sys::Datum>) -> pg_sys::Datum {
    let value = value.unwrap_or_else(|| jsonb_from_utf8(b"null"));
    // {"key": null}, then jsonb_set puts the value in as it is.
    let template = format!("{{{}:null}}", serde_json::to_string(key).expect("a str serializes"));
    // SAFETY: the array is built from text datums of its declared element type; the functions are called with
    // datums of their argument types.
    unsafe {
        let elems = [text_datum(key.as_bytes())];
        let path =
            pg_sys::construct_array(elems.as_ptr().cast_mut(), 1, pg_sys::TEXTOID, -1, false, b'i' as std::ffi::c_char);
        pg_sys::OidFunctionCall4Coll(
            pg_sys::Oid::from(pg_sys::F_JSONB_SET),
            pg_sys::InvalidOid,
            jsonb_from_utf8(template.as_bytes()),
            pg_sys::Datum::from(path),
            value,
            pg_sys::Datum::from(true),
        )
    }
}

/// A jsonb scalar as text, as `->>` gives it (a string unquoted); None for
/// JSON null.
pub fn jsonb_scalar_text(d: pg_sys::Datum) -> Option<pg_sys::Datum> {
    (jsonb_type(d) != b"null")
        .then(|| call2(pg_sys::F_JSONB_OBJECT_FIELD_TEXT, jsonb_object1("v", Some(d)), text_datum(b"v")))
}

/// A jsonb string holding exactly these text bytes (in the server
/// encoding; escaped by PostgreSQL's own escape_json).
pub fn jsonb_string(bytes: &[u8]) -> pg_sys::Datum {
    let mut owned = bytes.to_vec();
    owned.retain(|&b| b != 0); // text holds no NUL
    owned.push(0);
    // SAFETY: `owned` is NUL-terminated (pushed above); the StringInfo's data holds `len` bytes.
    unsafe {
        let buf = pg_sys::makeStringInfo();
        pg_sys::escape_json(buf, owned.as_ptr().cast());
        pg_sys::OidInputFunctionCall(pg_sys::Oid::from(pg_sys::F_JSONB_IN), (*buf).data, pg_sys::JSONBOID, -1)
    }
}

/// Parse JSON text written in UTF-8 (by serde) into jsonb, converting it to
/// the server encoding first.
pub fn jsonb_from_utf8(utf8: &[u8]) -> pg_sys::Datum {
    let mut owned = utf8.to_vec();
    owned.retain(|&b| b != 0);
    owned.push(0);
    // SAFETY: `owned` is NUL-terminated, its length excluding the NUL passed; the result is NUL-terminated.
    unsafe {
        let server =
            pg_sys::pg_any_to_server(owned.as_ptr().cast(), (owned.len() - 1) as i32, pg_sys::pg_enc::PG_UTF8 as i32);
        pg_sys::OidInputFunctionCall(pg_sys::Oid::from(pg_sys::F_JSONB_IN), server, pg_sys::JSONBOID, -1)
    }
}

/// A jsonb datum as JSON text in UTF-8 (for serde).
pub fn jsonb_to_utf8(d: pg_sys::Datum) -> Vec<u8> {
    // SAFETY: `d` is a jsonb datum; jsonb_out returns a NUL-terminated string in the server encoding.
    unsafe {
        let out = pg_sys::OidOutputFunctionCall(pg_sys::Oid::from(pg_sys::F_JSONB_OUT), d);
        let len = std::ffi::CStr::from_ptr(out).to_bytes().len();
        let utf8 = pg_sys::pg_server_to_any(out, len as i32, pg_sys::pg_enc::PG_UTF8 as i32);
        std::ffi::CStr::from_ptr(utf8).to_bytes().to_vec()
    }
}

/// Deserialize a jsonb datum into `T`, or XX000 naming `what` was damaged.
pub fn jsonb_decode<T: serde::de::DeserializeOwned>(d: pg_sys::Datum, what: &str) -> T {
    serde_json::from_slice(&jsonb_to_utf8(d)).unwrap_or_else(|e| internal(format!("{what} is damaged: {e}")))
}

/// Serialize `v` into a jsonb datum.
pub fn jsonb_encode<T: serde::Serialize>(v: &T) -> pg_sys::Datum {
    jsonb_from_utf8(&serde_json::to_vec(v).expect("idem's own documents serialize"))
}

/// A timestamptz as ISO 8601 in UTC with microseconds
/// (`2026-12-01T10:00:00.000000Z`), whatever the session's DateStyle and
/// TimeZone: what idem puts into documents must read the same everywhere.
pub fn iso_utc(ts: i64) -> String {
    // PostgreSQL timestamps count microseconds from 2000-01-01 00:00:00 UTC.
    const PG_EPOCH_UNIX_DAYS: i64 = 10_957;
    let (days, us) = (ts.div_euclid(86_400_000_000), ts.rem_euclid(86_400_000_000));
    let (y, m, d) = civil_from_days(days + PG_EPOCH_UNIX_DAYS);
    let secs = us / 1_000_000;
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:06}Z", secs / 3600, secs / 60 % 60, secs % 60, us % 1_000_000)
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian
/// (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    #[pg_test]
    fn iso_utc_matches_postgres() {
        for ts in [
            "2000-01-01 00:00:00+00",
            "2026-12-01 23:59:59.999999+00",
            "1999-12-31 00:00:00.5+00",
            "2400-02-29 12:00:00+00",
        ] {
            let (us, want) = Spi::get_two_with_args::<i64, String>(
                "SELECT (extract(epoch FROM $1::timestamptz - '2000-01-01 00:00:00+00') * 1000000)::bigint,
                        to_char($1::timestamptz AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')",
                &[ts.into()],
            )
            .unwrap();
            assert_eq!(super::iso_utc(us.unwrap()), want.unwrap(), "{ts}");
        }
    }
}
