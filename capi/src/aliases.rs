//! The old names of the C ABI (ABI 1.0 to 1.8), kept as aliases: each is a real exported
//! symbol that runs the same code as its new name (ABI 1.9), and names itself in the last error.
//! The naming rule the new names follow is in the header's preamble (`capi/cbindgen.toml`):
//! `tutti_<object>_<verb>`, handles released by `tutti_<object>_destroy`. New code uses the new
//! names; these stay for callers built against an older header.

use crate::data_path::*;
use crate::error::alias;
use crate::jobs::*;
use crate::kv::*;
use crate::load::*;
use crate::runtime::{tutti_runtime_destroy, tutti_runtime_t};
use crate::stats::*;
use std::ffi::c_char;

/// Alias: the name of `tutti_load_submit` before ABI 1.9; runs the same code.
///
/// # Safety
/// As `tutti_load_submit`.
#[no_mangle]
pub unsafe extern "C" fn tutti_submit_load(
    rt: *mut tutti_runtime_t,
    hashes: *const tutti_hash_t,
    block_ids: *const u32,
    count: usize,
    first_layer: u32,
    num_layers: u32,
    out_job: *mut *mut tutti_job_t,
) -> i32 {
    // SAFETY: forwarded from the caller.
    alias("tutti_submit_load", "tutti_load_submit", unsafe {
        tutti_load_submit(rt, hashes, block_ids, count, first_layer, num_layers, out_job)
    })
}

/// Alias: the name of `tutti_kv_register` before ABI 1.9; runs the same code.
///
/// # Safety
/// As `tutti_kv_register`.
#[no_mangle]
pub unsafe extern "C" fn tutti_register_kv(
    rt: *mut tutti_runtime_t,
    layout: *const tutti_kv_layout_t,
    sizes: *mut tutti_table_sizes_t,
) -> i32 {
    // SAFETY: forwarded from the caller.
    alias("tutti_register_kv", "tutti_kv_register", unsafe { tutti_kv_register(rt, layout, sizes) })
}

/// Alias: the name of `tutti_kv_unregister` before ABI 1.9; runs the same code.
///
/// # Safety
/// As `tutti_kv_unregister`.
#[no_mangle]
pub unsafe extern "C" fn tutti_unregister_kv(rt: *mut tutti_runtime_t) -> i32 {
    // SAFETY: forwarded from the caller.
    alias("tutti_unregister_kv", "tutti_kv_unregister", unsafe { tutti_kv_unregister(rt) })
}

/// Alias: the name of `tutti_kv_lookup` before ABI 1.9; runs the same code.
///
/// # Safety
/// As `tutti_kv_lookup`.
#[no_mangle]
pub unsafe extern "C" fn tutti_lookup(
    rt: *mut tutti_runtime_t,
    hashes: *const tutti_hash_t,
    count: usize,
    flags: u32,
    out_hits: *mut usize,
    out_pin: *mut u64,
) -> i32 {
    // SAFETY: forwarded from the caller.
    alias("tutti_lookup", "tutti_kv_lookup", unsafe {
        tutti_kv_lookup(rt, hashes, count, flags, out_hits, out_pin)
    })
}

/// Alias: the name of `tutti_kv_unpin` before ABI 1.9; runs the same code.
///
/// # Safety
/// As `tutti_kv_unpin`.
#[no_mangle]
pub unsafe extern "C" fn tutti_unpin(rt: *mut tutti_runtime_t, pin: u64) -> i32 {
    // SAFETY: forwarded from the caller.
    alias("tutti_unpin", "tutti_kv_unpin", unsafe { tutti_kv_unpin(rt, pin) })
}

/// Alias: the name of `tutti_kv_contains_identity` before ABI 1.9; runs the same code.
///
/// # Safety
/// As `tutti_kv_contains_identity`.
#[no_mangle]
pub unsafe extern "C" fn tutti_contains_identity(
    rt: *mut tutti_runtime_t,
    model: *const c_char,
    tenant_salt: *const u8,
    tenant_salt_len: usize,
    layout_kind: u32,
    hashes: *const tutti_hash_t,
    count: usize,
    out_hits: *mut usize,
) -> i32 {
    // SAFETY: forwarded from the caller.
    alias("tutti_contains_identity", "tutti_kv_contains_identity", unsafe {
        tutti_kv_contains_identity(
            rt,
            model,
            tenant_salt,
            tenant_salt_len,
            layout_kind,
            hashes,
            count,
            out_hits,
        )
    })
}

/// Alias: the name of `tutti_hash_chain` before ABI 1.9; runs the same code.
///
/// # Safety
/// As `tutti_hash_chain`.
#[no_mangle]
pub unsafe extern "C" fn tutti_chain_hashes(
    tokens: *const u32,
    num_tokens: usize,
    tokens_per_block: u32,
    parent: *const tutti_hash_t,
    out: *mut tutti_hash_t,
    out_capacity: usize,
    out_count: *mut usize,
) -> i32 {
    // SAFETY: forwarded from the caller.
    alias("tutti_chain_hashes", "tutti_hash_chain", unsafe {
        tutti_hash_chain(tokens, num_tokens, tokens_per_block, parent, out, out_capacity, out_count)
    })
}

/// Alias: the name of `tutti_runtime_stats` before ABI 1.9; runs the same code.
///
/// # Safety
/// As `tutti_runtime_stats`.
#[no_mangle]
pub unsafe extern "C" fn tutti_get_stats(rt: *mut tutti_runtime_t, out: *mut tutti_stats_t) -> i32 {
    // SAFETY: forwarded from the caller.
    alias("tutti_get_stats", "tutti_runtime_stats", unsafe { tutti_runtime_stats(rt, out) })
}

/// Alias: the name of `tutti_runtime_data_path` before ABI 1.9; runs the same code.
///
/// # Safety
/// As `tutti_runtime_data_path`.
#[no_mangle]
pub unsafe extern "C" fn tutti_data_path(rt: *mut tutti_runtime_t, out: *mut tutti_data_path_t) -> i32 {
    // SAFETY: forwarded from the caller.
    alias("tutti_data_path", "tutti_runtime_data_path", unsafe { tutti_runtime_data_path(rt, out) })
}

/// Alias: the name of `tutti_runtime_destroy` before ABI 1.9; runs the same code.
///
/// # Safety
/// As `tutti_runtime_destroy`.
#[no_mangle]
pub unsafe extern "C" fn tutti_runtime_close(rt: *mut tutti_runtime_t) -> i32 {
    // SAFETY: forwarded from the caller.
    alias("tutti_runtime_close", "tutti_runtime_destroy", unsafe { tutti_runtime_destroy(rt) })
}
