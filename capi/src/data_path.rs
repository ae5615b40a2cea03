//! The data path in force for a runtime's registration: direct (the drives
//! DMA into the KV memory) or staged (through pinned host staging slots the
//! executor copies), and for staged what direct DMA lacks.

use crate::error::{guard, Result};
use crate::kv::{TUTTI_MEMORY_CUDA, TUTTI_MEMORY_DEVICE_P2P, TUTTI_MEMORY_HOST, TUTTI_MEMORY_HOST_STAGED};
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
/// ABI 1.10: the drives DMA straight into another device's memory
/// (`TUTTI_MEMORY_DEVICE_P2P`), after a probe at registration checked the
/// bytes; `p2p_provider` names who mapped it.
pub const TUTTI_DATA_PATH_P2P: u32 = 3;

/// Bytes of `tutti_data_path_t::p2p_provider`, NUL included.
pub const TUTTI_DATA_PATH_PROVIDER_BYTES: usize = 64;

/// Bytes of `tutti_data_path_t::p2p_missing`, NUL included.
pub const TUTTI_DATA_PATH_REASON_BYTES: usize = 256;

/// ABI 1.4 (304 bytes); 1.10 appended `p2p_provider` (368 bytes). Set
/// `struct_size = sizeof(tutti_data_path_t)`.
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
    /// ABI 1.10. Device KV memory (P2P, or STAGED after a failed probe): who
    /// maps it for the drives, NUL-terminated (cut at 63 bytes); else empty.
    pub p2p_provider: [c_char; TUTTI_DATA_PATH_PROVIDER_BYTES],
}

impl Default for tutti_data_path_t {
    fn default() -> Self {
        tutti_data_path_t {
            struct_size: 0,
            mode: TUTTI_DATA_PATH_NONE,
            memory: 0,
            staging_slots: 0,
            staging_slot_bytes: 0,
            staging_waits: 0,
            staging_withheld: 0,
            staged_bytes: 0,
            p2p_missing: [0; TUTTI_DATA_PATH_REASON_BYTES],
            p2p_provider: [0; TUTTI_DATA_PATH_PROVIDER_BYTES],
        }
    }
}

/// Size of `tutti_data_path_t` in ABI 1.4 to 1.9 (before `p2p_provider`).
const DATA_PATH_V4: u32 = 48 + TUTTI_DATA_PATH_REASON_BYTES as u32;

// SAFETY: repr(C) with `struct_size: u32` first; u32s, then u64s, then byte arrays: no
// padding (304 and 368 bytes are multiples of 8). 1.10 appended `p2p_provider`.
unsafe impl SizePrefixed for tutti_data_path_t {
    const NAME: &'static str = "tutti_data_path_t";
    const SIZES: &'static [u32] = &[DATA_PATH_V4, std::mem::size_of::<tutti_data_path_t>() as u32];
}
const _: () = assert!(std::mem::size_of::<tutti_data_path_t>() == 368);

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
        let mut out = unsafe { ptr::sized_out_prefix(out)? };
        out.val = describe(&rt, out.val.struct_size)?;
        out.commit();
        Ok(TUTTI_OK)
    })
}

fn describe(rt: &Runtime, struct_size: u32) -> Result<tutti_data_path_t> {
    let mut d = tutti_data_path_t { struct_size, ..Default::default() };
    let Some(path) = rt.current().store.info().data_path else { return Ok(d) };
    d.mode = match path.mode {
        "staged" => TUTTI_DATA_PATH_STAGED,
        "p2p" => TUTTI_DATA_PATH_P2P,
        _ => TUTTI_DATA_PATH_DIRECT,
    };
    d.memory = match path.memory {
        KvMemoryKind::Host => TUTTI_MEMORY_HOST,
        KvMemoryKind::HostUnmapped => TUTTI_MEMORY_HOST_STAGED,
        KvMemoryKind::Cuda => TUTTI_MEMORY_CUDA,
        KvMemoryKind::DeviceP2p => TUTTI_MEMORY_DEVICE_P2P,
    };
    copy_c_string(&mut d.p2p_provider, path.provider.as_deref().unwrap_or(""));
    if let Some(s) = path.staging {
        d.staging_slots = s.slots;
        d.staging_slot_bytes = s.slot_bytes as u64;
        d.staging_waits = s.waits;
        d.staging_withheld = s.withheld;
        d.staged_bytes = s.staged_bytes;
    }
    copy_c_string(&mut d.p2p_missing, &path.p2p_missing.unwrap_or_default());
    Ok(d)
}

/// Copies `s` into `dst`, cut on a character boundary, leaving room for the NUL.
fn copy_c_string(dst: &mut [c_char], s: &str) {
    let mut end = s.len().min(dst.len().saturating_sub(1));
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    for (d, &b) in dst.iter_mut().zip(&s.as_bytes()[..end]) {
        *d = b as c_char;
    }
}
