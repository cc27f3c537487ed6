//! idem's settings. The `idem.` prefix is reserved: a misspelt idem.* name
//! is an error, not a silently ignored placeholder.

use crate::backend::BackendLocal;
use crate::errors::invalid;
use pgrx::pg_sys;
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting, PostgresGucEnum};
use std::ffi::CString;

pub static DEFAULT_TTL: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c"24 hours"));

// Read by idem_maintain (PL/pgSQL, through current_setting); defined here so
// that they are documented, typed and covered by the reserved prefix.
// Read by claims too (ttl_class.rs), through its assign hook.
static PARTITION_WIDTH: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c"1 minute"));
static PREMAKE_AHEAD: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c"20 minutes"));
static MAINTENANCE_LOCK_TIMEOUT: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"50 milliseconds"));
static MAINTENANCE_LOCK_RETRIES: GucSetting<i32> = GucSetting::<i32>::new(20);
static PREMAKE_LIMIT: GucSetting<i32> = GucSetting::<i32>::new(128);

// Read by the idem_health view (sql/metrics.sql): its thresholds.
static HEALTH_MAINTENANCE_AFTER: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c"15 minutes"));
static HEALTH_LEASE_AFTER: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c"15 minutes"));

/// How claims reach idem.claims while Citus does not distribute it: by the
/// partitions' heaps and indexes (direct, fast), or by SQL on the logical
/// table (sql). auto: sql when Citus is preloaded (idem.claims not
/// distributed yet), else direct. Once Citus distributes idem.claims, every
/// call takes the Citus path whatever this says: the direct path on the
/// key's local shard, never SQL (storage/mod.rs, storage/citus.rs).
#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum StorageAccess {
    #[name = c"auto"]
    Auto,
    #[name = c"direct"]
    Direct,
    #[name = c"sql"]
    Sql,
}

static STORAGE_ACCESS: GucSetting<StorageAccess> = GucSetting::<StorageAccess>::new(StorageAccess::Auto);

pub fn init() {
    // Interval settings are checked when set, so that a bad value is refused
    // by SET (22023) rather than by the next claim.
    // SAFETY: called once, from _PG_init, with hooks that live as long as the library and static names and
    // values.
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"idem.default_ttl",
            c"TTL of claims whose biz_type has none configured (1 second to 400 days).",
            c"idem_configure(biz_type, ttl) overrides it per type; idem_claim's ttl argument per call.",
            &DEFAULT_TTL,
            GucContext::Userset,
            GucFlags::default(),
            Some(check_default_ttl),
            Some(assign_default_ttl),
            None,
        );
        GucRegistry::define_string_guc_with_hooks(
            c"idem.partition_width",
            c"Width of the narrowest partitions of idem.claims, those of TTL class 0 (100 milliseconds to 400 days); each class is the square root of 2 wider than the one before.",
            c"A claim goes into the widest class whose partitions are at most a quarter of its TTL wide (class 0 if none is), so an expired claim is dropped at most a quarter of its TTL late, or this width for TTLs under 4 of it.",
            &PARTITION_WIDTH,
            GucContext::Suset,
            GucFlags::default(),
            Some(check_width),
            Some(assign_width),
            None,
        );
        GucRegistry::define_string_guc_with_hooks(
            c"idem.premake_ahead",
            c"How late idem_maintain may run before claims land in the default partition (0 to 400 days): each TTL class's partitions reach this far beyond its longest TTL, at least one width and at most 16.",
            c"Keep it above the interval maintenance runs at (every 5 minutes with idem_schedule_maintenance's default).",
            &PREMAKE_AHEAD,
            GucContext::Suset,
            GucFlags::default(),
            Some(check_premake_ahead),
            None,
            None,
        );
        GucRegistry::define_string_guc_with_hooks(
            c"idem.maintenance_lock_timeout",
            c"How long idem_maintain waits for its lock on idem.claims per attempt.",
            c"Claims that arrive while it waits queue behind it, so keep it short; 0 tries without waiting (NOWAIT).",
            &MAINTENANCE_LOCK_TIMEOUT,
            GucContext::Suset,
            GucFlags::default(),
            Some(check_lock_timeout),
            None,
            None,
        );
        GucRegistry::define_string_guc_with_hooks(
            c"idem.health_maintenance_after",
            c"idem_health reports maintenance overdue when its last successful run is older than this (1 second to 400 days).",
            c"Critical once it is older than a day, or when no run is recorded.",
            &HEALTH_MAINTENANCE_AFTER,
            GucContext::Userset,
            GucFlags::default(),
            Some(check_health_after),
            None,
            None,
        );
        GucRegistry::define_string_guc_with_hooks(
            c"idem.health_lease_after",
            c"idem_health reports a lease stuck when it ran out longer ago than this and nobody took it over (1 second to 400 days).",
            c"The work it stands for stopped: the next idem_claim of the key takes the lease over.",
            &HEALTH_LEASE_AFTER,
            GucContext::Userset,
            GucFlags::default(),
            Some(check_health_after),
            None,
            None,
        );
    }
    GucRegistry::define_int_guc(
        c"idem.maintenance_lock_retries",
        c"How many times idem_maintain tries to take its lock before leaving the work to the next run.",
        c"",
        &MAINTENANCE_LOCK_RETRIES,
        1,
        1000,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"idem.premake_limit",
        c"The most partitions one idem_maintain run creates ahead of time.",
        c"Claims whose expiry lies beyond the premade partitions wait in the default partition. A first run makes up to about 36 partitions per TTL class in use (class 0, TTLs under 4 minutes: 20 minutes ahead at one minute each), later runs a few.",
        &PREMAKE_LIMIT,
        1,
        10000,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_enum_guc(
        c"idem.storage_access",
        c"How claims reach their storage: direct (heap and index access), sql (SQL on idem.claims), or auto.",
        c"auto means sql when citus is in shared_preload_libraries, else direct. Once Citus distributes idem.claims, calls take the Citus path (direct access to the key's shard) whatever this says. Every session of a database must use the same path: change it only with no claims running.",
        &STORAGE_ACCESS,
        GucContext::Sighup,
        GucFlags::default(),
    );
    // SAFETY: called from _PG_init with a static NUL-terminated prefix.
    unsafe { pg_sys::MarkGUCPrefixReserved(c"idem".as_ptr()) };
}

/// Whether claims go through SQL (storage/sql.rs) rather than direct access,
/// when Citus does not distribute idem.claims (storage::Path::now decides
/// that first).
pub fn sql_access() -> bool {
    match STORAGE_ACCESS.get() {
        StorageAccess::Direct => false,
        StorageAccess::Sql => true,
        StorageAccess::Auto => citus_preloaded(),
    }
}

/// shared_preload_libraries cannot change while the server runs: read once.
static CITUS_PRELOADED: BackendLocal<Option<bool>> = BackendLocal::new(None);

pub fn citus_preloaded() -> bool {
    if let Some(c) = CITUS_PRELOADED.get() {
        return c;
    }
    // SAFETY: GetConfigOption returns NULL or a NUL-terminated string owned by the GUC machinery, copied
    // before anything can change it.
    let list = unsafe {
        let raw = pg_sys::GetConfigOption(c"shared_preload_libraries".as_ptr(), true, false);
        if raw.is_null() {
            String::new()
        } else {
            std::ffi::CStr::from_ptr(raw).to_string_lossy().into_owned()
        }
    };
    let c = list.split(',').any(|l| l.trim().trim_matches('"') == "citus");
    CITUS_PRELOADED.set(Some(c));
    c
}

pub const MIN_TTL_US: i128 = 1_000_000;
pub const MAX_TTL_US: i128 = 400 * 86_400_000_000;

/// An interval in microseconds, counted the way extract(epoch ...) does:
/// a day is 24 hours, a month 30 days, a year 365.25 days.
pub fn interval_us(iv: &pg_sys::Interval) -> i128 {
    let years = (iv.month / 12) as i128;
    let months = (iv.month % 12) as i128;
    iv.time as i128 + iv.day as i128 * 86_400_000_000 + years * 31_557_600_000_000 + months * 2_592_000_000_000
}

/// A TTL from `what`, checked to lie within 1 second .. 400 days.
pub fn checked_ttl(iv: &pg_sys::Interval, what: &str) -> i64 {
    let us = interval_us(iv);
    if !(MIN_TTL_US..=MAX_TTL_US).contains(&us) {
        invalid(format!("{what} must be between 1 second and 400 days"));
    }
    us as i64
}

/// Parse an interval as interval_in does, but report failure instead of
/// raising an error (GUC check hooks must not raise).
pub fn parse_interval(text: &std::ffi::CStr) -> Option<pg_sys::Interval> {
    use std::mem::zeroed;
    const MAXF: usize = pg_sys::MAXDATEFIELDS as usize;
    // SAFETY: ParseDateTime and DecodeInterval write only into the local buffers whose sizes they are given
    // (MAXDATEFIELDS fields, 256 bytes); the input is NUL-terminated.
    unsafe {
        let mut workbuf = [0 as std::ffi::c_char; 256];
        let mut field = [std::ptr::null_mut(); MAXF];
        let mut ftype = [0; MAXF];
        let (mut nf, mut dtype) = (0, 0);
        let mut itm: pg_sys::pg_itm_in = zeroed();
        let mut err = pg_sys::ParseDateTime(
            text.as_ptr(),
            workbuf.as_mut_ptr(),
            workbuf.len(),
            field.as_mut_ptr(),
            ftype.as_mut_ptr(),
            MAXF as i32,
            &mut nf,
        );
        if err == 0 {
            err = pg_sys::DecodeInterval(
                field.as_mut_ptr(),
                ftype.as_mut_ptr(),
                nf,
                pg_sys::INTERVAL_FULL_RANGE as i32,
                &mut dtype,
                &mut itm,
            );
        }
        if err == pg_sys::DTERR_BAD_FORMAT {
            itm = zeroed();
            err = pg_sys::DecodeISO8601Interval(text.as_ptr().cast_mut(), &mut dtype, &mut itm);
        }
        if err != 0 || dtype != pg_sys::DTK_DELTA as i32 {
            return None;
        }
        let mut iv: pg_sys::Interval = zeroed();
        (pg_sys::itmin2interval(&mut itm, &mut iv) == 0).then_some(iv)
    }
}

/// A check hook: the value must be an interval within [min_us, max_us].
///
/// # Safety
/// `newval` is the check hook's argument: a pointer to a NUL-terminated
/// string or to NULL.
unsafe fn check_interval(
    newval: *mut *mut std::ffi::c_char,
    min_us: i128,
    max_us: i128,
    range: &std::ffi::CStr,
) -> bool {
    // SAFETY: a GUC check hook's `newval` points at the proposed value (this function's contract), which the
    // hook may replace with a guc_malloc'd string.
    unsafe {
        if (*newval).is_null() {
            return true;
        }
        let ok = parse_interval(std::ffi::CStr::from_ptr(*newval))
            .is_some_and(|iv| (min_us..=max_us).contains(&interval_us(&iv)));
        if !ok {
            pg_sys::GUC_check_errcode(pgrx::PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE as i32);
            pg_sys::GUC_check_errdetail_string = pg_sys::pstrdup(range.as_ptr());
        }
        ok
    }
}

/// A GUC check hook accepting intervals within [$min_us, $max_us].
macro_rules! interval_check_hook {
    ($name:ident, $min_us:expr, $max_us:expr, $detail:literal) => {
        #[pgrx::pg_guard]
        unsafe extern "C-unwind" fn $name(
            v: *mut *mut std::ffi::c_char,
            _extra: *mut *mut std::ffi::c_void,
            _source: pg_sys::GucSource::Type,
        ) -> bool {
            // SAFETY: called by the GUC machinery as a check hook, with `v` pointing at the proposed value.
            unsafe { check_interval(v, $min_us, $max_us, $detail) }
        }
    };
}

interval_check_hook!(check_width, 100_000, MAX_TTL_US, c"It must be an interval from 100 milliseconds to 400 days.");
interval_check_hook!(check_premake_ahead, 0, MAX_TTL_US, c"It must be an interval from 0 to 400 days.");
interval_check_hook!(check_lock_timeout, 0, 3_600_000_000, c"It must be an interval from 0 (NOWAIT) to 1 hour.");
interval_check_hook!(check_health_after, MIN_TTL_US, MAX_TTL_US, c"It must be an interval from 1 second to 400 days.");

/// idem.default_ttl in microseconds, as the check hook parsed it and the
/// assign hook installed it: PostgreSQL runs them whenever the value
/// changes (SET, SET LOCAL and its rollback, RESET, a reload), so a claim
/// reads a number, not the setting's text.
static DEFAULT_TTL_US: BackendLocal<i64> = BackendLocal::new(86_400_000_000);

pub fn default_ttl_us() -> i64 {
    DEFAULT_TTL_US.get()
}

interval_check_hook!(check_default_ttl, MIN_TTL_US, MAX_TTL_US, c"It must be an interval from 1 second to 400 days.");

/// An interval setting's value in microseconds, as its check hook vetted
/// it (so it parses: assign hooks must not fail, and parse_interval never
/// raises), else `fallback`.
fn assigned_us(newval: *const std::ffi::c_char, fallback: i64) -> i64 {
    (!newval.is_null())
        // SAFETY: an assign hook's non-NULL value is a NUL-terminated string the GUC machinery owns for the
        // call.
        .then(|| parse_interval(unsafe { std::ffi::CStr::from_ptr(newval) }))
        .flatten()
        .map_or(fallback, |iv| interval_us(&iv) as i64)
}

/// The assign hook of idem.default_ttl.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn assign_default_ttl(newval: *const std::ffi::c_char, _extra: *mut std::ffi::c_void) {
    DEFAULT_TTL_US.set(assigned_us(newval, 86_400_000_000));
}

/// idem.partition_width in microseconds (assign hook, as default_ttl): the
/// claim path reads it (ttl_class.rs).
static WIDTH_US: BackendLocal<i64> = BackendLocal::new(60_000_000);

pub fn partition_width_us() -> i64 {
    WIDTH_US.get()
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn assign_width(newval: *const std::ffi::c_char, _extra: *mut std::ffi::c_void) {
    WIDTH_US.set(assigned_us(newval, 60_000_000));
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::interval_us;
    use pgrx::pg_sys::Interval;
    use pgrx::prelude::*;

    #[pg_test]
    fn intervals_count_like_extract_epoch() {
        let iv = |month, day, time| Interval { time, day, month };
        assert_eq!(interval_us(&iv(0, 0, 1_000_000)), 1_000_000);
        assert_eq!(interval_us(&iv(0, 1, 0)), 86_400_000_000);
        assert_eq!(interval_us(&iv(1, 0, 0)), 30 * 86_400_000_000);
        assert_eq!(interval_us(&iv(12, 0, 0)), 31_557_600_000_000);
        let sql = Spi::get_one::<i64>(
            "SELECT (extract(epoch FROM interval '1 year 2 months 3 days 4 seconds') * 1000000)::bigint",
        )
        .unwrap()
        .unwrap();
        assert_eq!(interval_us(&iv(14, 3, 4_000_000)), sql as i128);
    }

    #[pg_test]
    fn default_ttl_follows_the_setting() {
        Spi::run("SET LOCAL idem.default_ttl = '90 minutes'").unwrap();
        assert_eq!(super::default_ttl_us(), 90 * 60 * 1_000_000);
    }
}
