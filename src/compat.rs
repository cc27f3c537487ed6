//! The PostgreSQL API differences between the majors idem builds for
//! (15, 16, 17, 18), each behind one function with the same meaning on
//! every major. Nothing else in idem mentions a version.

use pgrx::pg_sys;

/// `simple_heap_update`, telling whether the new version needs index
/// entries of its own (false for a HOT update, which shares the old ones).
///
/// # Safety
/// `rel` is open and locked, `otid` is a live tuple of it that no other
/// transaction is updating, `tup` is formed with `rel`'s descriptor.
pub unsafe fn heap_update(rel: pg_sys::Relation, otid: &mut pg_sys::ItemPointerData, tup: pg_sys::HeapTuple) -> bool {
    // SAFETY: the caller's contract (above) is simple_heap_update's.
    unsafe {
        #[cfg(feature = "pg15")]
        {
            pg_sys::simple_heap_update(rel, otid, tup);
            (*(*tup).t_data).t_infomask2 as u32 & pg_sys::HEAP_ONLY_TUPLE == 0
        }
        #[cfg(not(feature = "pg15"))]
        {
            let mut update_indexes: pg_sys::TU_UpdateIndexes::Type = pg_sys::TU_UpdateIndexes::TU_None;
            pg_sys::simple_heap_update(rel, otid, tup, &mut update_indexes);
            update_indexes != pg_sys::TU_UpdateIndexes::TU_None
        }
    }
}

/// `index_beginscan` without instrumentation (an argument since 18).
///
/// # Safety
/// `heap` and `index` are open and locked; `snapshot` outlives the scan.
pub unsafe fn index_beginscan(
    heap: pg_sys::Relation,
    index: pg_sys::Relation,
    snapshot: pg_sys::Snapshot,
    nkeys: i32,
) -> pg_sys::IndexScanDesc {
    // SAFETY: the caller's contract (above) is index_beginscan's.
    unsafe {
        #[cfg(not(feature = "pg18"))]
        {
            pg_sys::index_beginscan(heap, index, snapshot, nkeys, 0)
        }
        #[cfg(feature = "pg18")]
        {
            pg_sys::index_beginscan(heap, index, snapshot, std::ptr::null_mut(), nkeys, 0)
        }
    }
}

/// Attribute `i` (0-based) of a tuple descriptor (an inline accessor since
/// 18, which moved the attribute array behind the compact one).
///
/// # Safety
/// `desc` is a valid tuple descriptor and `i < natts`.
pub unsafe fn tuple_desc_attr(desc: pg_sys::TupleDesc, i: usize) -> *mut pg_sys::FormData_pg_attribute {
    // SAFETY: `desc` is valid and `i < natts` (the caller's contract).
    unsafe {
        #[cfg(not(feature = "pg18"))]
        {
            (*desc).attrs.as_mut_ptr().add(i)
        }
        #[cfg(feature = "pg18")]
        {
            pg_sys::TupleDescAttr(desc, i as i32)
        }
    }
}

/// The primary key index of `rel`, or InvalidOid (a deferrable primary key
/// counts: an argument since 18).
///
/// # Safety
/// `rel` is open.
pub unsafe fn primary_key_index(rel: pg_sys::Relation) -> pg_sys::Oid {
    // SAFETY: `rel` is open (the caller's contract).
    unsafe {
        #[cfg(not(feature = "pg18"))]
        {
            pg_sys::RelationGetPrimaryKeyIndex(rel)
        }
        #[cfg(feature = "pg18")]
        {
            pg_sys::RelationGetPrimaryKeyIndex(rel, true)
        }
    }
}
