//! Device memory, pinned host memory and registered host ranges. Device
//! pointers are host addresses: "device memory" is host memory that only the
//! stand-in's streams and kernels should touch, pinned memory is host memory
//! both sides use.

use crate::error::{fail, Result};
use cudarc::driver::sys::CUresult;
use std::alloc::Layout;
use std::collections::BTreeMap;

/// cuMemAlloc's alignment.
const DEVICE_ALIGN: usize = 256;
/// Reported as the device's memory.
pub(crate) const DEVICE_BYTES: usize = 16 << 30;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MemKind {
    /// cuMemAlloc: owned here.
    Device,
    /// cuMemHostAlloc: owned here.
    Pinned,
    /// cuMemHostRegister: the caller's memory, with the registration flags.
    Registered { flags: u32 },
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Alloc {
    pub len: usize,
    pub kind: MemKind,
    /// The context current at allocation.
    pub ctx: usize,
}

#[derive(Default)]
pub(crate) struct Memory {
    map: BTreeMap<usize, Alloc>,
    device_bytes: usize,
}

impl Memory {
    /// The allocation holding `addr .. addr + len` (len 0: just `addr`).
    pub fn find(&self, addr: usize, len: usize) -> Option<(usize, Alloc)> {
        let (&base, a) = self.map.range(..=addr).next_back()?;
        let end = addr.checked_add(len)?;
        (addr < base + a.len.max(1) && end <= base + a.len).then_some((base, *a))
    }

    fn overlaps(&self, start: usize, len: usize) -> Option<usize> {
        let end = start + len;
        self.map.range(..end).next_back().filter(|(&b, a)| b + a.len > start).map(|(&b, _)| b)
    }

    /// A device range of some allocation, or why not.
    pub fn device_range(&self, addr: u64, len: usize, what: &str) -> Result<(usize, Alloc)> {
        let a = usize::try_from(addr).unwrap_or(usize::MAX);
        self.find(a, len).ok_or_else(|| {
            fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!("{what} {addr:#x}+{len} is not inside any allocation of the device or pinned memory"),
            )
        })
    }

    pub fn alloc_device(&mut self, len: usize, ctx: usize) -> Result<usize> {
        let oom = || fail(CUresult::CUDA_ERROR_OUT_OF_MEMORY, format!("cannot allocate {len} bytes"));
        if len == 0 {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, "cuMemAlloc of 0 bytes"));
        }
        if self.device_bytes.saturating_add(len) > DEVICE_BYTES {
            return Err(oom());
        }
        let layout = Layout::from_size_align(len, DEVICE_ALIGN).map_err(|_| oom())?;
        // SAFETY: a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(oom());
        }
        self.device_bytes += len;
        self.map.insert(p as usize, Alloc { len, kind: MemKind::Device, ctx });
        Ok(p as usize)
    }

    pub fn alloc_pinned(&mut self, len: usize, ctx: usize) -> Result<usize> {
        let oom = || fail(CUresult::CUDA_ERROR_OUT_OF_MEMORY, format!("cannot allocate {len} pinned bytes"));
        let layout = Layout::from_size_align(len.max(1), 4096).map_err(|_| oom())?;
        // SAFETY: a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(oom());
        }
        self.map.insert(p as usize, Alloc { len: len.max(1), kind: MemKind::Pinned, ctx });
        Ok(p as usize)
    }

    pub fn register(&mut self, p: usize, len: usize, flags: u32, ctx: usize) -> Result<()> {
        if p == 0 || len == 0 {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, "registering a NULL or empty range"));
        }
        if let Some(b) = self.overlaps(p, len) {
            let a = self.map[&b];
            let code = if a.kind == MemKind::Device {
                CUresult::CUDA_ERROR_INVALID_VALUE
            } else {
                CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
            };
            return Err(fail(code, format!("{p:#x}+{len} overlaps {:?} memory at {b:#x}+{}", a.kind, a.len)));
        }
        self.map.insert(p, Alloc { len, kind: MemKind::Registered { flags }, ctx });
        Ok(())
    }

    /// Removes the allocation starting at `base` of `kind`; returns it.
    pub fn take(&mut self, base: usize, kinds: &[MemKind], call: &str) -> Result<Alloc> {
        let a =
            self.map.get(&base).copied().filter(|a| {
                kinds.iter().any(|k| std::mem::discriminant(k) == std::mem::discriminant(&a.kind))
            });
        let a = a.ok_or_else(|| {
            let code = if call == "cuMemHostUnregister" {
                CUresult::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
            } else {
                CUresult::CUDA_ERROR_INVALID_VALUE
            };
            fail(code, format!("{call}: {base:#x} is not the start of a {kinds:?} allocation"))
        })?;
        self.map.remove(&base);
        Ok(a)
    }

    /// Releases memory taken with [`Memory::take`] that this module owns.
    pub fn release(&mut self, base: usize, a: Alloc) {
        let align = match a.kind {
            MemKind::Device => DEVICE_ALIGN,
            MemKind::Pinned => 4096,
            MemKind::Registered { .. } => return,
        };
        if a.kind == MemKind::Device {
            self.device_bytes -= a.len;
        }
        if let Ok(layout) = Layout::from_size_align(a.len.max(1), align) {
            // SAFETY: allocated by alloc_device/alloc_pinned with this layout, removed from the map.
            unsafe { std::alloc::dealloc(base as *mut u8, layout) };
        }
    }

    pub fn device_in_use(&self) -> usize {
        self.device_bytes
    }
}
