//! TTL classes: which partitions a claim lives in, decided by its TTL
//! (docs/design.md §1).
//!
//! idem.claims is partitioned by (ttl_class, expires_at). Class k's
//! partitions are W·√2^k wide, W being idem.partition_width (one minute by
//! default); a claim goes into the widest class whose width is at most a
//! quarter of its TTL (class 0 when none is), so that a partition whose
//! every claim has expired is dropped at most a quarter of a TTL late (a
//! width). A class holds TTLs from 4 of its widths up to 4 of the next
//! class's (√2 more), so a key's live rows of one class span at most
//! 4·√2 ≈ 5.7 widths: a claim looks into about 7 partitions of a class,
//! whatever the TTL, one minute or 400 days.
//!
//! Which class a claim picked never decides whether it is found: claims look
//! into the classes their type is registered in (type_classes.rs), up to
//! the expiry the registrations cover. So a change of idem.partition_width
//! moves coming claims to other partitions, and nothing else.
//!
//! No class is wider than 400 days (MAX_WIDTH_US, the widest
//! idem.partition_width and the longest TTL). A claim never picks a class
//! that wide unless it is class 0, but a class registered at another width
//! can be one: a 400-day claim made at 100 ms is in class 52, which is
//! 2^26 days wide at 1 day. Uncapped, such a width overflowed every
//! interval and timestamp it was combined with (16 widths ahead in
//! idem_maintain, a width past a TTL in idem_health, registrations
//! rounded up to a width). Capped, width + TTL + 16 widths + 400 days of
//! idem.premake_ahead stay within 7,600 days.
//!
//! This is the one definition; the SQL functions idem.ttl_class,
//! idem.class_width and idem.class_max_ttl (sql/storage.sql) call into it.

use crate::guc::{self, MAX_TTL_US};

/// A claim's partition is at most this fraction of its TTL wide.
pub const TTL_PER_WIDTH: i64 = 4;

/// Classes stop here (far beyond 400 days at the narrowest width).
const MAX_CLASS: i16 = 80;

/// No class is wider (microseconds): 400 days (see above).
pub const MAX_WIDTH_US: i64 = MAX_TTL_US as i64;

/// The width of class `k` at narrowest width `unit` (microseconds).
fn width_at(unit: i64, k: i16) -> i64 {
    ((unit as f64 * 2f64.powf(k as f64 / 2.0)).round() as i64).min(MAX_WIDTH_US)
}

/// The class of a claim with TTL `ttl_us` at narrowest width `unit`; a TTL
/// beyond 400 days (which no claim has) counts as 400 days.
fn of_ttl_at(unit: i64, ttl_us: i64) -> i16 {
    let ttl_us = ttl_us.min(MAX_TTL_US as i64);
    let mut k = 0;
    while k < MAX_CLASS && width_at(unit, k + 1).saturating_mul(TTL_PER_WIDTH) <= ttl_us {
        k += 1;
    }
    k
}

/// The class of a claim with this TTL (microseconds).
pub fn of_ttl(ttl_us: i64) -> i16 {
    of_ttl_at(guc::partition_width_us(), ttl_us)
}

/// The partition width of class `k` (microseconds); None if there is no
/// such class.
pub fn width(k: i16) -> Option<i64> {
    (0..=MAX_CLASS).contains(&k).then(|| width_at(guc::partition_width_us(), k))
}

/// The longest TTL a claim of class `k` can have (microseconds).
pub fn max_ttl(k: i16) -> Option<i64> {
    width(k)?;
    let next = width_at(guc::partition_width_us(), k + 1);
    Some((next.saturating_mul(TTL_PER_WIDTH) - 1).min(MAX_TTL_US as i64))
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::*;
    use pgrx::prelude::*;

    const DAY: i64 = 86_400_000_000;
    const MINUTE: i64 = 60_000_000;

    #[pg_test]
    fn every_ttl_gets_a_class_at_most_a_quarter_wide() {
        for unit in [100_000, MINUTE, DAY] {
            for ttl in [1_000_000, 239_999_999, 240_000_000, 3_600_000_000, DAY, 30 * DAY, 365 * DAY, 400 * DAY] {
                let k = of_ttl_at(unit, ttl);
                let w = width_at(unit, k);
                // A quarter of the TTL, except in class 0 (the narrowest).
                assert!(w * 4 <= ttl || k == 0, "unit {unit}, ttl {ttl}: width {w}");
                // The next class would be too wide.
                assert!(width_at(unit, k + 1) * 4 > ttl, "unit {unit}, ttl {ttl}: class {k}");
                // A class spans under 4·√2 of its widths of TTL: 7 partitions.
                assert!((width_at(unit, k + 1) * 4 - 1) / w <= 5, "unit {unit}, class {k}");
            }
        }
        assert_eq!(of_ttl_at(MINUTE, DAY), 16);
        assert_eq!(of_ttl_at(MINUTE, 400 * DAY), 34);
        assert_eq!(width_at(MINUTE, 16), 15_360_000_000);
    }

    #[pg_test]
    fn no_class_is_wider_than_400_days_at_any_width() {
        for unit in [100_000, 1_000_000, MINUTE, 60 * MINUTE, 360 * MINUTE, DAY, 100 * DAY, 400 * DAY] {
            let mut last = 0;
            for k in 0..=MAX_CLASS {
                let w = width_at(unit, k);
                assert!(w >= last && w <= MAX_WIDTH_US, "unit {unit}, class {k}: width {w}");
                // What maintenance adds up stays far inside an interval.
                assert!(w.checked_mul(16).and_then(|x| x.checked_add(2 * MAX_TTL_US as i64)).is_some());
                last = w;
            }
            // A TTL beyond 400 days is classed as 400 days, and no claim's
            // class is wider than a quarter of it (but class 0).
            assert_eq!(of_ttl_at(unit, i64::MAX), of_ttl_at(unit, MAX_TTL_US as i64));
            let k = of_ttl_at(unit, MAX_TTL_US as i64);
            assert!(k == 0 || width_at(unit, k) * 4 <= MAX_TTL_US as i64);
        }
        // A 400-day claim made at 100 ms, read at one day.
        assert_eq!(of_ttl_at(100_000, 400 * DAY), 52);
        assert_eq!(width_at(DAY, 52), MAX_WIDTH_US);
    }

    #[pg_test]
    fn sql_functions_agree_with_the_rule() {
        Spi::run("SET LOCAL idem.partition_width = '1 minute'").unwrap();
        let k = Spi::get_one::<i16>("SELECT idem.ttl_class(interval '30 days')").unwrap().unwrap();
        assert_eq!(k, of_ttl_at(MINUTE, 30 * DAY));
        let w = Spi::get_one::<i64>("SELECT (extract(epoch FROM idem.class_width(16)) * 1000000)::bigint")
            .unwrap()
            .unwrap();
        assert_eq!(w, width_at(MINUTE, 16));
        Spi::run("SET LOCAL idem.partition_width = '100 milliseconds'").unwrap();
        let k = Spi::get_one::<i16>("SELECT idem.ttl_class(interval '1 second')").unwrap().unwrap();
        assert_eq!(k, of_ttl_at(100_000, 1_000_000));
    }
}
