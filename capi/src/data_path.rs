//! The data path in force for a runtime's registration: direct (the drives
//! DMA into the KV memory) or staged (through pinned host staging slots the
//! executor copies), and for staged what direct DMA lacks.

use crate::error::{guard, Result};
use crate::kv::{TUTTI_MEMORY_CUDA, TUTTI_MEMORY_HOST, TUTTI_MEMORY_HOST_STAGED};
use crate::ptr::{self, SizePrefixed};
use crate::runtime::{tutti_runtime_t, Runtime};
use crate::status::TUTTI_OK;
use std::ffi::c_char;
use tutti_objstore::KvMemoryKind;

/// No KV memory is registered.
pub const TUTTI_DATA_PATH_NONE: u32 = 0;
/// The drives DMA straight into the registered KV memory.
pub const TUTTI_DATA_PATH_DIRECT: u32 = 1;
/// The drives DMA into pinned host staging slots; the executor copies each
/// chunk between a slot and the KV memory.
pub const TUTTI_DATA_PATH_STAGED: u32 = 2;

/// Bytes of `tutti_data_path_t::p2p_missing`, NUL included.
pub const TUTTI_DATA_PATH_REASON_BYTES: usize = 256;

/// ABI 1.4. Set `struct_size = sizeof(tutti_data_path_t)`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tutti_data_path_t {
    pub struct_size: u32,
    /// `TUTTI_DATA_PATH_*`.
    pub mode: u32,
    /// `TUTTI_MEMORY_*` of the registration (0 when none).
    pub memory: u32,
    /// STAGED: staging slots (one chunk each).
    pub staging_slots: u32,
    /// STAGED: bytes of one slot.
    pub staging_slot_bytes: u64,
    /// STAGED: times a command waited for a free slot (backpressure).
    pub staging_waits: u64,
    /// STAGED: slots taken out of use after a command of unknown outcome.
    pub staging_withheld: u64,
    /// STAGED: bytes the executor copied between slots and KV memory.
    pub staged_bytes: u64,
    /// STAGED: what direct DMA lacks, NUL-terminated (cut at 255 bytes); else empty.
    pub p2p_missing: [c_char; TUTTI_DATA_PATH_REASON_BYTES],
}

// SAFETY: repr(C) with `struct_size: u32` first; integers and a byte array only.
unsafe impl SizePrefixed for tutti_data_path_t {
    const NAME: &'static str = "tutti_data_path_t";
}

/// Reports the data path of the runtime's current registration.
///
/// # Safety
/// `rt` is a runtime handle (checked); `out` is NULL or points to a
/// `tutti_data_path_t` with `struct_size` set.
#[no_mangle]
pub unsafe extern "C" fn tutti_runtime_data_path(
    rt: *mut tutti_runtime_t,
    out: *mut tutti_data_path_t,
) -> i32 {
    guard("tutti_runtime_data_path", || {
        let rt = Runtime::get(rt)?;
        // SAFETY: forwarded from the caller.
        let out = unsafe { ptr::sized_out(out)? };
        *out = describe(&rt, out.struct_size)?;
        Ok(TUTTI_OK)
    })
}

fn describe(rt: &Runtime, struct_size: u32) -> Result<tutti_data_path_t> {
    let mut d = tutti_data_path_t {
        struct_size,
        mode: TUTTI_DATA_PATH_NONE,
        memory: 0,
        staging_slots: 0,
        staging_slot_bytes: 0,
        staging_waits: 0,
        staging_withheld: 0,
        staged_bytes: 0,
        p2p_missing: [0; TUTTI_DATA_PATH_REASON_BYTES],
    };
    let Some(path) = rt.current().store.info().data_path else { return Ok(d) };
    d.mode = if path.mode == "staged" { TUTTI_DATA_PATH_STAGED } else { TUTTI_DATA_PATH_DIRECT };
    d.memory = match path.memory {
        KvMemoryKind::Host => TUTTI_MEMORY_HOST,
        KvMemoryKind::HostUnmapped => TUTTI_MEMORY_HOST_STAGED,
        KvMemoryKind::Cuda => TUTTI_MEMORY_CUDA,
    };
    if let Some(s) = path.staging {
        d.staging_slots = s.slots;
        d.staging_slot_bytes = s.slot_bytes as u64;
        d.staging_waits = s.waits;
        d.staging_withheld = s.withheld;
        d.staged_bytes = s.staged_bytes;
    }
    let why = path.p2p_missing.unwrap_or_default();
    // Cut on a character boundary, leaving room for the NUL.
    let mut end = why.len().min(TUTTI_DATA_PATH_REASON_BYTES - 1);
    while !why.is_char_boundary(end) {
        end -= 1;
    }
    for (dst, &b) in d.p2p_missing.iter_mut().zip(&why.as_bytes()[..end]) {
        *dst = b as c_char;
    }
    Ok(d)
}
