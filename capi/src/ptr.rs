//! Checked views of what C passes in: every pointer, length and struct size
//! is validated here before any Rust reference to it exists.

use crate::error::{CapiError, Result};
use std::ffi::{c_char, CStr};

/// Largest number of blocks (hashes, block ids) one call accepts.
pub const TUTTI_MAX_BLOCKS_PER_CALL: u32 = 1 << 20;
/// Largest number of tokens `tutti_hash_chain` accepts in one call.
pub const TUTTI_MAX_TOKENS_PER_CALL: u64 = 1 << 28;
/// Longest timeout a wait accepts (one day), in milliseconds.
pub const TUTTI_MAX_TIMEOUT_MS: u64 = 86_400_000;

/// A C struct whose first field is `uint32_t struct_size`.
///
/// ABI 1 grows such a struct only by appending fields (a new minor version,
/// `TUTTI_ABI_MINOR`); `SIZES` lists the size of each of its versions, so a
/// caller built against an older header keeps working: the library reads and
/// writes only the bytes the caller's `struct_size` covers.
///
/// # Safety
/// Implementors must be `#[repr(C)]` with a `u32` `struct_size` first, have
/// no padding, and hold only integers and raw pointers (every bit pattern is
/// a valid value). `SIZES` is ascending, ends with `size_of::<Self>()`, and
/// each entry is a field boundary.
pub(crate) unsafe trait SizePrefixed: Sized {
    const NAME: &'static str;
    /// The struct's size in each ABI-1 minor version that changed it, oldest first.
    const SIZES: &'static [u32] = &[std::mem::size_of::<Self>() as u32];
}

fn check_ptr<T>(p: *const T, what: &'static str) -> Result<()> {
    if p.is_null() {
        return Err(CapiError::Null(what));
    }
    if !p.is_aligned() {
        return Err(CapiError::Misaligned(what, std::any::type_name::<T>()));
    }
    Ok(())
}

/// Reads `struct_size` alone (so a smaller struct is never read past its end),
/// checks that it is the size of one of the struct's versions, and returns it.
///
/// # Safety
/// `p` is NULL or points to at least 4 readable bytes.
unsafe fn check_size<T: SizePrefixed>(p: *const T) -> Result<u32> {
    check_ptr(p, T::NAME)?;
    // SAFETY: non-null and aligned (checked); the caller promises 4 readable bytes.
    let got = unsafe { std::ptr::read(p as *const u32) };
    if !T::SIZES.contains(&got) {
        let expected = T::SIZES.iter().map(u32::to_string).collect::<Vec<_>>().join(" or ");
        return Err(CapiError::StructSize { what: T::NAME, got, expected });
    }
    Ok(got)
}

/// A size-prefixed input struct of a single version.
///
/// # Safety
/// `p` is NULL or points to a readable `T` (if its `struct_size` says so).
pub(crate) unsafe fn sized_in<'a, T: SizePrefixed>(p: *const T) -> Result<&'a T> {
    const { assert!(T::SIZES.len() == 1, "a struct of several versions is read by prefix") };
    // SAFETY: forwarded.
    unsafe { check_size(p)? };
    // SAFETY: checked non-null, aligned, and the caller's struct is this size.
    Ok(unsafe { &*p })
}

/// A size-prefixed output struct of a single version (the caller sets
/// `struct_size`; inputs in it are kept).
///
/// # Safety
/// `p` is NULL or points to a writable `T` (if its `struct_size` says so).
pub(crate) unsafe fn sized_out<'a, T: SizePrefixed>(p: *mut T) -> Result<&'a mut T> {
    const { assert!(T::SIZES.len() == 1, "a struct of several versions is written by prefix") };
    // SAFETY: forwarded.
    unsafe { check_size(p)? };
    // SAFETY: as in `sized_in`, and the caller grants write access.
    Ok(unsafe { &mut *p })
}

/// A size-prefixed input struct of any of its versions: the caller's bytes,
/// with the fields its version lacks at their defaults.
///
/// # Safety
/// `p` is NULL or points to `struct_size` readable bytes (the caller's version of `T`).
pub(crate) unsafe fn sized_in_prefix<T: SizePrefixed + Default>(p: *const T) -> Result<T> {
    // SAFETY: forwarded.
    let len = unsafe { check_size(p)? } as usize;
    let mut val = T::default();
    // SAFETY: the caller has `len` readable bytes; `len <= size_of::<T>()` (the last
    // of `SIZES`); any bytes are a valid `T` prefix (trait contract).
    unsafe { std::ptr::copy_nonoverlapping(p as *const u8, &mut val as *mut T as *mut u8, len) };
    Ok(val)
}

/// An output struct that may be any of its versions: `val` starts as the
/// caller's bytes (its inputs) with the fields its version lacks at their
/// defaults; `commit` writes back only the caller's `struct_size` bytes.
pub(crate) struct SizedOut<T> {
    dst: *mut T,
    len: usize,
    pub val: T,
}

/// A size-prefixed output struct of any of its versions.
///
/// # Safety
/// `p` is NULL or points to `struct_size` readable and writable bytes (the
/// caller's version of `T`), which stay valid until the result is committed or dropped.
pub(crate) unsafe fn sized_out_prefix<T: SizePrefixed + Default>(p: *mut T) -> Result<SizedOut<T>> {
    // SAFETY: forwarded.
    let len = unsafe { check_size(p)? } as usize;
    let mut val = T::default();
    // SAFETY: the caller has `len` readable bytes; `len <= size_of::<T>()` (the last
    // of `SIZES`); any bytes are a valid `T` prefix (trait contract).
    unsafe { std::ptr::copy_nonoverlapping(p as *const u8, &mut val as *mut T as *mut u8, len) };
    Ok(SizedOut { dst: p, len, val })
}

impl<T> SizedOut<T> {
    /// Writes the caller's version of the struct back.
    pub(crate) fn commit(self) {
        // SAFETY: `dst` has `len` writable bytes (`sized_out_prefix`'s contract); `T`
        // has no padding, so every copied byte is initialised.
        unsafe {
            std::ptr::copy_nonoverlapping(&self.val as *const T as *const u8, self.dst as *mut u8, self.len)
        };
    }
}

/// A required out pointer.
///
/// # Safety
/// `p` is NULL or points to a writable `T`.
pub(crate) unsafe fn out<'a, T>(p: *mut T, what: &'static str) -> Result<&'a mut T> {
    check_ptr(p, what)?;
    // SAFETY: checked non-null and aligned; the caller grants write access.
    Ok(unsafe { &mut *p })
}

/// An optional out pointer (NULL = the caller does not want it).
///
/// # Safety
/// `p` is NULL or points to a writable `T`.
pub(crate) unsafe fn out_opt<'a, T>(p: *mut T, what: &'static str) -> Result<Option<&'a mut T>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: forwarded.
    unsafe { out(p, what) }.map(Some)
}

/// An optional input (NULL = absent).
///
/// # Safety
/// `p` is NULL or points to a readable `T`.
pub(crate) unsafe fn in_opt<'a, T>(p: *const T, what: &'static str) -> Result<Option<&'a T>> {
    if p.is_null() {
        return Ok(None);
    }
    check_ptr(p, what)?;
    // SAFETY: checked non-null and aligned; the caller grants read access.
    Ok(Some(unsafe { &*p }))
}

/// An input array of `len` elements, at most `max`; NULL only when `len` is 0.
///
/// # Safety
/// `p` is NULL or points to `len` readable `T`s.
pub(crate) unsafe fn slice_in<'a, T>(
    p: *const T,
    len: usize,
    what: &'static str,
    max: u64,
) -> Result<&'a [T]> {
    if len as u64 > max {
        return Err(CapiError::invalid(
            what,
            format!("{len} elements is more than the {max} one call accepts"),
        ));
    }
    if len == 0 {
        return Ok(&[]);
    }
    check_ptr(p, what)?;
    // SAFETY: non-null, aligned, bounded length (so no isize overflow); the caller promises `len` elements.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// An output array of `len` elements; NULL only when `len` is 0.
///
/// # Safety
/// `p` is NULL or points to `len` writable `T`s.
pub(crate) unsafe fn slice_out<'a, T>(p: *mut T, len: usize, what: &'static str) -> Result<&'a mut [T]> {
    if len == 0 {
        return Ok(&mut []);
    }
    check_ptr(p, what)?;
    if len.checked_mul(std::mem::size_of::<T>()).is_none_or(|b| b > isize::MAX as usize) {
        return Err(CapiError::invalid(what, format!("{len} elements do not fit in memory")));
    }
    // SAFETY: non-null, aligned, size fits isize; the caller promises `len` writable elements.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, len) })
}

/// A NUL-terminated UTF-8 string of at most `max` bytes.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string.
pub(crate) unsafe fn str_in<'a>(p: *const c_char, what: &'static str, max: usize) -> Result<&'a str> {
    if p.is_null() {
        return Err(CapiError::Null(what));
    }
    // SAFETY: non-null; the caller promises a terminating NUL.
    let s = unsafe { CStr::from_ptr(p) };
    if s.to_bytes().len() > max {
        return Err(CapiError::invalid(what, format!("{} bytes is longer than {max}", s.to_bytes().len())));
    }
    s.to_str().map_err(|e| CapiError::invalid(what, format!("not UTF-8: {e}")))
}

/// Copies `src` (NUL-terminated, from a `String`) into a caller buffer.
///
/// # Safety
/// `buf` is NULL or points to `capacity` writable bytes; `needed` is NULL or writable.
pub(crate) unsafe fn copy_str(
    src: &[u8],
    buf: *mut c_char,
    capacity: usize,
    needed: *mut usize,
) -> Result<()> {
    let need = src.len() + 1;
    // SAFETY: forwarded.
    if let Some(n) = unsafe { out_opt(needed, "needed")? } {
        *n = need;
    }
    if capacity < need {
        return Err(CapiError::BufferTooSmall { what: "buf", needed: need, capacity });
    }
    // SAFETY: forwarded; capacity >= need > 0.
    let dst = unsafe { slice_out(buf as *mut u8, capacity, "buf")? };
    dst[..src.len()].copy_from_slice(src);
    dst[src.len()] = 0;
    Ok(())
}

/// A `uint32_t` boolean field.
pub(crate) fn flag(v: u32, what: &'static str) -> Result<bool> {
    match v {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(CapiError::invalid(what, format!("{v} is not 0 or 1"))),
    }
}

pub(crate) fn timeout(ms: u64) -> Result<std::time::Duration> {
    if ms > TUTTI_MAX_TIMEOUT_MS {
        return Err(CapiError::invalid(
            "timeout_ms",
            format!("{ms} ms is more than the {TUTTI_MAX_TIMEOUT_MS} ms (one day) a wait accepts"),
        ));
    }
    Ok(std::time::Duration::from_millis(ms))
}
