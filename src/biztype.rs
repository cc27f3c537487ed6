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
    if let Some(owner) = settings.owner {
        if !unsafe { pg_sys::has_privs_of_role(pg_sys::GetUserId(), owner) } {
            IdemError::InsufficientPrivilege { biz_type: k.biz_type.to_vec(), owner: role_name(owner) }.fail();
        }
    }
    settings
}

fn role_name(role: pg_sys::Oid) -> String {
    unsafe {
        let name = pg_sys::GetUserNameFromId(role, true);
        if name.is_null() {
            format!("{}", role.to_u32())
        } else {
            std::ffi::CStr::from_ptr(name).to_string_lossy().into_owned()
        }
    }
}

/// Set (or, with None, clear) a type's TTL, keeping its owner.
pub fn configure(biz_type: &str, ttl: Option<pg_sys::Datum>) {
    static UPSERT: Statement = Statement::new(
        c"INSERT INTO idem.biz_types AS b (biz_type, ttl, updated_at) VALUES ($1, $2, $3)
          ON CONFLICT (biz_type) DO UPDATE SET ttl = EXCLUDED.ttl, updated_at = EXCLUDED.updated_at",
        &[pg_sys::TEXTOID, pg_sys::INTERVALOID, pg_sys::TIMESTAMPTZOID],
    );
    write(&UPSERT, biz_type, ttl);
}

/// Set (or, with None, clear) a type's owner role, keeping its TTL.
pub fn set_owner(biz_type: &str, owner: Option<pg_sys::Oid>) {
    static UPSERT: Statement = Statement::new(
        c"INSERT INTO idem.biz_types AS b (biz_type, owner, updated_at) VALUES ($1, $2, $3)
          ON CONFLICT (biz_type) DO UPDATE SET owner = EXCLUDED.owner, updated_at = EXCLUDED.updated_at",
        &[pg_sys::TEXTOID, pg_sys::REGROLEOID, pg_sys::TIMESTAMPTZOID],
    );
    write(&UPSERT, biz_type, owner.map(pg_sys::Datum::from));
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
