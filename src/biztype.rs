//! Business types: their settings (TTL, owner role), how they are changed,
//! and who may use a type.
//!
//! A type needs no row to be used: claims carry the type's name. A row in
//! idem.biz_types gives it a TTL (idem_configure) and/or an owner role
//! (idem_set_owner): then only members of that role may claim, finish,
//! look up or forget its keys (docs/design.md §8).

use crate::catalog::{self, BizType};
use crate::datum::text_datum;
use crate::errors::{internal, IdemError};
use crate::key::ClaimKey;
use crate::spi::Statement;
use pgrx::pg_sys;

/// The settings of `k`'s type, for a call by the current role: 42501 if the
/// type has an owner the role is not a member of.
pub fn admit(k: &ClaimKey) -> BizType {
    let settings = crate::storage::biz_type(k.biz_type_str());
    require_owner_member(k.biz_type, &settings);
    settings
}

/// 42501 unless the current role may use a type with these settings: any
/// role when it has no owner, else the owner's members. An owner role that
/// no longer exists (dropped, or missing on a server a dump was restored
/// onto) admits superusers only, until one names an owner again.
fn require_owner_member(biz_type: &[u8], settings: &BizType) {
    let Some(owner) = settings.owner else { return };
    let name = unsafe { std::ffi::CStr::from_ptr(owner.data.as_ptr()) };
    let role = unsafe { pg_sys::get_role_oid(name.as_ptr(), true) };
    let admitted = if role == pg_sys::InvalidOid {
        unsafe { pg_sys::superuser() }
    } else {
        unsafe { pg_sys::has_privs_of_role(pg_sys::GetUserId(), role) }
    };
    if !admitted {
        IdemError::InsufficientPrivilege {
            biz_type: biz_type.to_vec(),
            owner: name.to_string_lossy().into_owned(),
            owner_exists: role != pg_sys::InvalidOid,
        }
        .fail();
    }
}

/// Set (or, with None, clear) a type's TTL, keeping its owner. A type
/// reserved for a role is configured only by that role's members (whoever
/// else may call idem_configure).
pub fn configure(biz_type: &str, ttl: Option<pg_sys::Datum>) {
    require_owner_member(biz_type.as_bytes(), &crate::storage::biz_type(biz_type));
    static UPSERT: Statement = Statement::new(
        c"INSERT INTO idem.biz_types AS b (biz_type, ttl, updated_at) VALUES ($1, $2, $3)
          ON CONFLICT (biz_type) DO UPDATE SET ttl = EXCLUDED.ttl, updated_at = EXCLUDED.updated_at",
        &[pg_sys::TEXTOID, pg_sys::INTERVALOID, pg_sys::TIMESTAMPTZOID],
    );
    write(&UPSERT, biz_type, ttl);
}

/// Set (or, with None, clear) a type's owner role, keeping its TTL; stored
/// by name (catalog.rs says why). A type reserved for a role is handed on
/// only by that role's members.
pub fn set_owner(biz_type: &str, owner: Option<pg_sys::Oid>) {
    static UPSERT: Statement = Statement::new(
        c"INSERT INTO idem.biz_types AS b (biz_type, owner, updated_at) VALUES ($1, $2, $3)
          ON CONFLICT (biz_type) DO UPDATE SET owner = EXCLUDED.owner, updated_at = EXCLUDED.updated_at",
        &[pg_sys::TEXTOID, pg_sys::NAMEOID, pg_sys::TIMESTAMPTZOID],
    );
    // 0.3.0's schema (this library installed, ALTER EXTENSION UPDATE not run
    // yet) keeps the owner as a regrole.
    static UPSERT_0_3: Statement = Statement::new(
        c"INSERT INTO idem.biz_types AS b (biz_type, owner, updated_at) VALUES ($1, $2, $3)
          ON CONFLICT (biz_type) DO UPDATE SET owner = EXCLUDED.owner, updated_at = EXCLUDED.updated_at",
        &[pg_sys::TEXTOID, pg_sys::REGROLEOID, pg_sys::TIMESTAMPTZOID],
    );
    require_owner_member(biz_type.as_bytes(), &crate::storage::biz_type(biz_type));
    if catalog::owner_column_type(catalog::biz_types_oid()) != Some(pg_sys::NAMEOID) {
        return write(&UPSERT_0_3, biz_type, owner.map(pg_sys::Datum::from));
    }
    let mut name = pg_sys::NameData::default();
    let datum = owner.map(|role| unsafe {
        // (regrole input checked that the role exists.)
        pg_sys::namestrcpy(&mut name, pg_sys::GetUserNameFromId(role, false));
        pg_sys::Datum::from(&raw mut name)
    });
    write(&UPSERT, biz_type, datum);
}

fn write(upsert: &Statement, biz_type: &str, value: Option<pg_sys::Datum>) {
    // The time is passed in rather than written as now(): Citus refuses
    // non-immutable functions in the DO UPDATE SET of a reference table.
    let now = unsafe { pg_sys::GetCurrentTransactionStartTimestamp() };
    let (n, _) = catalog::as_owner(|| {
        upsert.execute(&[Some(text_datum(biz_type.as_bytes())), value, Some(pg_sys::Datum::from(now))])
    });
    if n != 1 {
        internal(format!("writing the settings of biz_type {biz_type} touched {n} rows"));
    }
    catalog::invalidate_biz_types();
}
