//! The identity of a claim: a business type and a key, validated once, with
//! every form the rest of a call needs made once, here: the digest storage
//! indexes them by, their text datums (what storage writes and searches
//! with: a SQL function's own text arguments, else built here) and their
//! name in errors (`KeyName`).
//!
//! Both are compared as bytes, exactly as the database stores them, in
//! whatever the database's encoding is: never decoded, never re-encoded.

use crate::datum::text_datum;
use crate::errors::{invalid, IdemError};
use pgrx::pg_sys;

pub const MAX_KEY_BYTES: usize = 1024;

/// A validated (biz_type, key), its digest and its text datums.
#[derive(Clone, Copy, Debug)]
pub struct ClaimKey<'a> {
    pub biz_type: &'a [u8],
    pub key: &'a [u8],
    /// biz_type and key as text datums (a SQL function's own arguments, else
    /// palloc'd once in the call's memory context): storage passes them to
    /// tuples, scan keys and statements, which copy or only read them.
    pub biz_type_text: pg_sys::Datum,
    pub key_text: pg_sys::Datum,
    digest: i64,
}

/// A key and its type as an error names them (errors.rs writes them into
/// its message), built by `ClaimKey::name`.
#[derive(Debug)]
pub struct KeyName {
    pub biz_type: Vec<u8>,
    pub key: Vec<u8>,
}

impl<'a> ClaimKey<'a> {
    /// Validate, or raise 22023 naming the rule that was broken.
    pub fn new(biz_type: &'a [u8], key: &'a [u8]) -> Self {
        ClaimKey::of_text((text_datum(biz_type), biz_type), (text_datum(key), key))
    }

    /// As `new`, for a biz_type and key that are text datums already (a SQL
    /// function's arguments, detoasted), with their bytes: used as they are,
    /// not copied.
    pub fn of_text(
        (biz_type_text, biz_type): (pg_sys::Datum, &'a [u8]),
        (key_text, key): (pg_sys::Datum, &'a [u8]),
    ) -> Self {
        check_key(key);
        check_biz_type(biz_type);
        ClaimKey { biz_type, key, biz_type_text, key_text, digest: digest(biz_type, key) }
    }

    /// The key and its type, for an error about it.
    pub fn name(&self) -> KeyName {
        KeyName { biz_type: self.biz_type.to_vec(), key: self.key.to_vec() }
    }

    /// The digest as the schema in place indexes it (`key_hash`), read
    /// when it is used: storage uses it once it holds its lock on
    /// idem.claims, and the lock brings in a catalog change that committed
    /// meanwhile, such as an ALTER EXTENSION idem UPDATE from 0.3.0 that
    /// changes the digest (a digest taken before the lock would miss the
    /// rows the update digested anew, or write one that probes miss).
    pub fn hash(&self) -> i64 {
        if crate::catalog::type_classes_oid().is_none() {
            legacy_digest(self.biz_type, self.key)
        } else {
            self.digest
        }
    }
}

/// The business type rule. The same rule is written in SQL as
/// idem.check_name (sql/storage.sql) for the PL/pgSQL functions; the
/// pg_test below checks that the two agree.
pub fn valid_biz_type(b: &[u8]) -> bool {
    (1..=64).contains(&b.len()) && b.iter().all(|c| c.is_ascii_alphanumeric() || b"_.:-".contains(c))
}

pub fn check_biz_type(b: &[u8]) {
    if !valid_biz_type(b) {
        // At most 80 bytes are shown, cut at a character boundary of the
        // database's encoding (a cut character would not be text).
        // SAFETY: reads at most `b.len()` bytes of `b`, a live slice.
        let shown = unsafe { pg_sys::pg_mbcliplen(b.as_ptr().cast(), b.len() as i32, 80) } as usize;
        IdemError::InvalidValue {
            what: "biz_type",
            value: b[..shown.min(b.len())].to_vec(),
            rule: "it must match ^[A-Za-z0-9_.:-]{1,64}$",
        }
        .fail();
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

/// The digest of a claim's key, as the schema in place indexes it:
/// `digest` since 0.4.0, `legacy_digest` in 0.3.0's schema (this library
/// installed, ALTER EXTENSION idem UPDATE not run yet), whose indexes call
/// idem.key_hash declared on the symbol idem_key_hash. The update declares
/// it on idem_key_digest and rebuilds every index on it
/// (sql/idem--0.3.0--0.4.0.sql).
pub fn key_hash(biz_type: &[u8], key: &[u8]) -> i64 {
    if crate::catalog::type_classes_oid().is_none() {
        legacy_digest(biz_type, key)
    } else {
        digest(biz_type, key)
    }
}

/// The stable digest the index is built on since 0.4.0: the first 8 bytes
/// (big endian) of the SHA-256 of the biz_type's length (one byte: it is at
/// most 64), the biz_type and the key. The portable edition computes the
/// same digest with PostgreSQL's built-in sha256() in one expression (a
/// PL/pgSQL SipHash cost it a fifth of its claim); SHA-256 keeps what
/// SipHash with a public key gave: no way to make keys collide cheaper than
/// by brute force (docs/design.md, "Indexed by a digest"). It is on disk
/// (the indexes, the portable edition's gates): changing it takes an update
/// that rebuilds them.
pub fn digest(biz_type: &[u8], key: &[u8]) -> i64 {
    use sha2::{Digest, Sha256};
    let d = Sha256::new().chain_update([biz_type.len() as u8]).chain_update(biz_type).chain_update(key).finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&d[..8]);
    i64::from_be_bytes(first)
}

/// The digest up to 0.3.0: SipHash-1-3 with a fixed key over the same bytes.
pub fn legacy_digest(biz_type: &[u8], key: &[u8]) -> i64 {
    use std::hash::Hasher;
    let mut h = siphasher::sip::SipHasher13::new_with_keys(0x6964_656d_5f6b_6579, 0x7632_5f73_6970_3133);
    h.write(&[biz_type.len() as u8]);
    h.write(biz_type);
    h.write(key);
    h.finish() as i64
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::{digest, key_hash, legacy_digest, valid_biz_type};
    use pgrx::prelude::*;

    #[pg_test]
    fn key_hash_is_stable() {
        // On disk: these values must never change.
        let pinned = key_hash(b"payment", b"req-42");
        let sql = Spi::get_one::<i64>("SELECT idem.key_hash('payment', 'req-42')").unwrap().unwrap();
        assert_eq!(pinned, sql, "SQL and claim path must agree");
        assert_eq!(pinned, 0xe843_9040_a94e_8ecb_u64 as i64, "the digest of a stored key changed");
        assert_eq!(pinned, digest(b"payment", b"req-42"));
        // 0.3.0's, which this library still computes for a 0.3.0 schema.
        assert_eq!(legacy_digest(b"payment", b"req-42"), 0xa92d_befc_b3a3_fdeb_u64 as i64);
    }

    #[pg_test]
    fn key_hash_separates_type_from_key() {
        // ("ab", "c") and ("a", "bc") must not collide by construction.
        assert_ne!(digest(b"ab", b"c"), digest(b"a", b"bc"));
        assert_ne!(digest(b"t", b"k"), digest(b"u", b"k"));
    }

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

    /// The Rust rule and idem.check_name (for the PL/pgSQL functions) agree
    /// on every byte and on the length limits.
    #[pg_test]
    fn biz_type_rule_matches_sql() {
        let mut candidates: Vec<Vec<u8>> = (1u8..=127).map(|b| vec![b'a', b]).collect();
        candidates.push("a".repeat(64).into_bytes());
        candidates.push("a".repeat(65).into_bytes());
        candidates.push("é".as_bytes().to_vec());
        for c in candidates {
            let text = String::from_utf8(c.clone()).unwrap();
            let sql_ok = Spi::get_one_with_args::<bool>(
                "SELECT $1 ~ '^[A-Za-z0-9_.:-]{1,64}$' AND pg_get_functiondef('idem.check_name(text,text)'::regprocedure) LIKE '%^[A-Za-z0-9_.:-]{1,64}$%'",
                &[text.as_str().into()],
            )
            .unwrap()
            .unwrap();
            assert_eq!(valid_biz_type(&c), sql_ok, "rule differs for {text:?}");
        }
    }
}

/// A claim's id: a UUID (version 8) made of the first 128 bits of the
/// SHA-256 of biz_type, a zero byte, the key, a zero byte, and the claim's
/// first_claimed_at in microseconds since 2000-01-01 UTC (8 bytes, big
/// endian). Text holds no zero byte, so no two claims share the input; and
/// a claim keeps its first_claimed_at through takeovers, retries, moves by
/// maintenance and dump and restore, so its id never changes. The
/// portable edition computes the same bytes in SQL.
pub fn claim_id(biz_type: &[u8], key: &[u8], first_claimed_at: i64) -> [u8; 16] {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(biz_type)
        .chain_update([0])
        .chain_update(key)
        .chain_update([0])
        .chain_update(first_claimed_at.to_be_bytes())
        .finalize();
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest[..16]);
    id[6] = (id[6] & 0x0f) | 0x80; // version 8
    id[8] = (id[8] & 0x3f) | 0x80; // the RFC 9562 variant
    id
}
