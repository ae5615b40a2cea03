//! Status codes: 0 ok, 1 in progress, negative errors, each with a stable name.
//!
//! Values never change meaning once released; new errors take new values.

/// Success; for jobs and layers: finished.
pub const TUTTI_OK: i32 = 0;
/// The job (or layer) has not finished yet.
pub const TUTTI_IN_PROGRESS: i32 = 1;
/// A value is out of range, inconsistent with another, or an unknown enum value.
pub const TUTTI_E_INVALID_ARG: i32 = -1;
/// A required pointer is NULL.
pub const TUTTI_E_NULL_POINTER: i32 = -2;
/// A struct's `struct_size` is not the size this library expects.
pub const TUTTI_E_STRUCT_SIZE: i32 = -3;
/// The pointer is not a live handle of the expected type (destroyed, never created, or another type).
pub const TUTTI_E_BAD_HANDLE: i32 = -4;
/// An unknown pin id.
pub const TUTTI_E_NOT_FOUND: i32 = -5;
/// No KV memory is registered with the runtime.
pub const TUTTI_E_NOT_REGISTERED: i32 = -6;
/// The deadline passed before the job or layer finished.
pub const TUTTI_E_TIMEOUT: i32 = -7;
/// Jobs or stores in flight prevent the call; finish them first.
pub const TUTTI_E_BUSY: i32 = -8;
/// No pool file is free or evictable.
pub const TUTTI_E_POOL_FULL: i32 = -9;
/// A device, driver or gio_uring error.
pub const TUTTI_E_IO: i32 = -10;
/// The pool on the drives is missing, of another geometry, or damaged.
pub const TUTTI_E_POOL: i32 = -11;
/// A caller buffer is too small; the size needed is reported.
pub const TUTTI_E_BUFFER_TOO_SMALL: i32 = -12;
/// Not available in this build or on this machine.
pub const TUTTI_E_UNSUPPORTED: i32 = -13;
/// The profiler or slack table rejected the data.
pub const TUTTI_E_PROFILE: i32 = -14;
/// Internal state is poisoned; the runtime is unusable.
pub const TUTTI_E_INTERNAL: i32 = -15;
/// A Rust panic was caught at the boundary (a bug in tutti).
pub const TUTTI_E_PANIC: i32 = -16;

/// Every status with its name, in value order.
pub(crate) const NAMES: &[(i32, &str)] = &[
    (TUTTI_OK, "TUTTI_OK\0"),
    (TUTTI_IN_PROGRESS, "TUTTI_IN_PROGRESS\0"),
    (TUTTI_E_INVALID_ARG, "TUTTI_E_INVALID_ARG\0"),
    (TUTTI_E_NULL_POINTER, "TUTTI_E_NULL_POINTER\0"),
    (TUTTI_E_STRUCT_SIZE, "TUTTI_E_STRUCT_SIZE\0"),
    (TUTTI_E_BAD_HANDLE, "TUTTI_E_BAD_HANDLE\0"),
    (TUTTI_E_NOT_FOUND, "TUTTI_E_NOT_FOUND\0"),
    (TUTTI_E_NOT_REGISTERED, "TUTTI_E_NOT_REGISTERED\0"),
    (TUTTI_E_TIMEOUT, "TUTTI_E_TIMEOUT\0"),
    (TUTTI_E_BUSY, "TUTTI_E_BUSY\0"),
    (TUTTI_E_POOL_FULL, "TUTTI_E_POOL_FULL\0"),
    (TUTTI_E_IO, "TUTTI_E_IO\0"),
    (TUTTI_E_POOL, "TUTTI_E_POOL\0"),
    (TUTTI_E_BUFFER_TOO_SMALL, "TUTTI_E_BUFFER_TOO_SMALL\0"),
    (TUTTI_E_UNSUPPORTED, "TUTTI_E_UNSUPPORTED\0"),
    (TUTTI_E_PROFILE, "TUTTI_E_PROFILE\0"),
    (TUTTI_E_INTERNAL, "TUTTI_E_INTERNAL\0"),
    (TUTTI_E_PANIC, "TUTTI_E_PANIC\0"),
];

pub(crate) const UNKNOWN_STATUS: &str = "TUTTI_UNKNOWN_STATUS\0";

/// The NUL-terminated name of `code`.
pub(crate) fn name_of(code: i32) -> &'static str {
    NAMES.iter().find(|(c, _)| *c == code).map(|(_, n)| *n).unwrap_or(UNKNOWN_STATUS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_a_distinct_nul_terminated_name() {
        let mut codes: Vec<i32> = NAMES.iter().map(|(c, _)| *c).collect();
        codes.sort();
        codes.dedup();
        assert_eq!(codes, (-16..=1).collect::<Vec<_>>(), "values are distinct and dense from -16 to 1");
        for (c, n) in NAMES {
            assert!(n.ends_with('\0') && n.starts_with("TUTTI_"), "{c}: {n}");
            assert_eq!(n.matches('\0').count(), 1);
        }
        assert_eq!(name_of(TUTTI_E_TIMEOUT), "TUTTI_E_TIMEOUT\0");
        assert_eq!(name_of(42), UNKNOWN_STATUS);
    }
}
