//! The columns of idem.claims, in table order: the one declaration the Rust
//! side reads them from. partitions.rs checks every partition against it,
//! direct.rs forms and reads tuples by the positions derived here, sql.rs
//! types its INSERT's parameters with it. sql/storage.sql creates the table;
//! a `#[pg_test]` below checks that the two agree (names, types, order).

use pgrx::pg_sys;

/// One column of idem.claims.
pub struct Column {
    pub name: &'static str,
    pub type_oid: pg_sys::Oid,
    /// Also in 0.3.0's layout (this library installed, ALTER EXTENSION idem
    /// UPDATE not run yet), which lacks ttl_class.
    pub in_0_3: bool,
}

/// idem.claims' columns, in order (sql/storage.sql).
pub const CLAIMS: [Column; 8] = [
    Column { name: "expires_at", type_oid: pg_sys::TIMESTAMPTZOID, in_0_3: true },
    Column { name: "claimed_at", type_oid: pg_sys::TIMESTAMPTZOID, in_0_3: true },
    Column { name: "ttl_class", type_oid: pg_sys::INT2OID, in_0_3: false },
    Column { name: "state", type_oid: pg_sys::CHAROID, in_0_3: true },
    Column { name: "biz_type", type_oid: pg_sys::TEXTOID, in_0_3: true },
    Column { name: "key", type_oid: pg_sys::TEXTOID, in_0_3: true },
    Column { name: "fingerprint", type_oid: pg_sys::TEXTOID, in_0_3: true },
    Column { name: "result", type_oid: pg_sys::JSONBOID, in_0_3: true },
];

/// The columns of a partition in the current layout or (`legacy`) 0.3.0's.
pub fn layout(legacy: bool) -> impl Iterator<Item = &'static Column> {
    CLAIMS.iter().filter(move |c| !legacy || c.in_0_3)
}

/// Where each column is in a partition's tuple (0-based).
pub struct Positions {
    pub expires_at: usize,
    pub claimed_at: usize,
    pub ttl_class: Option<usize>,
    pub state: usize,
    pub biz_type: usize,
    pub key: usize,
    pub fingerprint: usize,
    pub result: usize,
    /// How many columns a tuple has.
    pub n: usize,
}

impl Positions {
    /// The positions in the current layout or (`legacy`) 0.3.0's.
    pub const fn of(legacy: bool) -> Positions {
        Positions {
            expires_at: required(position("expires_at", legacy)),
            claimed_at: required(position("claimed_at", legacy)),
            ttl_class: position("ttl_class", legacy),
            state: required(position("state", legacy)),
            biz_type: required(position("biz_type", legacy)),
            key: required(position("key", legacy)),
            fingerprint: required(position("fingerprint", legacy)),
            result: required(position("result", legacy)),
            n: count(legacy),
        }
    }
}

/// The types of the columns of a layout, in order: the parameters of an
/// INSERT that names every column in table order.
pub const fn types<const N: usize>(legacy: bool) -> [pg_sys::Oid; N] {
    assert!(N == count(legacy), "a layout's column count");
    let mut out = [pg_sys::InvalidOid; N];
    let (mut i, mut at) = (0, 0);
    while i < CLAIMS.len() {
        if !legacy || CLAIMS[i].in_0_3 {
            out[at] = CLAIMS[i].type_oid;
            at += 1;
        }
        i += 1;
    }
    out
}

const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// `name`'s position in a tuple of the layout; None if the layout lacks it.
const fn position(name: &str, legacy: bool) -> Option<usize> {
    let (mut i, mut at) = (0, 0);
    while i < CLAIMS.len() {
        if !legacy || CLAIMS[i].in_0_3 {
            if same(CLAIMS[i].name, name) {
                return Some(at);
            }
            at += 1;
        }
        i += 1;
    }
    None
}

/// A column every layout has (a missing one fails the build).
const fn required(position: Option<usize>) -> usize {
    match position {
        Some(p) => p,
        None => panic!("a column of idem.claims that every layout has"),
    }
}

/// How many columns a tuple of the layout has.
pub const fn count(legacy: bool) -> usize {
    let (mut i, mut n) = (0, 0);
    while i < CLAIMS.len() {
        if !legacy || CLAIMS[i].in_0_3 {
            n += 1;
        }
        i += 1;
    }
    n
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    /// The declaration above is idem.claims as sql/storage.sql creates it:
    /// the same names and types in the same order.
    #[pg_test]
    fn claims_columns_match_the_table() {
        let table = Spi::get_one::<Vec<String>>(
            "SELECT array_agg(attname::text || ' ' || atttypid::text ORDER BY attnum)
               FROM pg_attribute
              WHERE attrelid = 'idem.claims'::regclass AND attnum > 0 AND NOT attisdropped",
        )
        .unwrap()
        .unwrap_or_default();
        let declared: Vec<String> =
            super::CLAIMS.iter().map(|c| format!("{} {}", c.name, c.type_oid.to_u32())).collect();
        assert_eq!(table, declared);
    }

    /// The positions follow the declaration in both layouts.
    #[pg_test]
    fn positions_follow_the_declaration() {
        let now = super::Positions::of(false);
        assert_eq!((now.expires_at, now.ttl_class, now.state, now.result, now.n), (0, Some(2), 3, 7, 8));
        let legacy = super::Positions::of(true);
        assert_eq!((legacy.expires_at, legacy.ttl_class, legacy.state, legacy.result, legacy.n), (0, None, 2, 6, 7));
        assert_eq!(super::types::<7>(true)[2], pgrx::pg_sys::CHAROID);
    }
}
