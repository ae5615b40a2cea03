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
/// A GPU page, GDRCopy's pinning unit: allocations of at least this many bytes are
/// memfd-backed and aligned to it, so `gdr_map` can map their pages a second time.
pub(crate) const GPU_PAGE: usize = 64 << 10;
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
    /// Device memory of at least [`GPU_PAGE`] bytes: the memfd behind it (else -1).
    pub fd: i32,
}

/// A GDRCopy pin (`gdr_pin_buffer`): GPU pages of one device allocation.
#[derive(Clone, Debug)]
pub(crate) struct GdrPin {
    /// The allocation's base.
    pub base: usize,
    /// The first pinned page, and the pinned bytes (whole pages).
    pub va: usize,
    pub len: usize,
    /// Live `gdr_map` mappings: (address, bytes).
    pub maps: Vec<(usize, usize)>,
}

#[derive(Default)]
pub(crate) struct Memory {
    map: BTreeMap<usize, Alloc>,
    device_bytes: usize,
    /// GDRCopy pins by handle.
    pub pins: BTreeMap<u64, GdrPin>,
    pub next_pin: u64,
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
        if len >= GPU_PAGE {
            let (p, fd) = map_shared(len).map_err(|e| fail(CUresult::CUDA_ERROR_OUT_OF_MEMORY, e))?;
            self.device_bytes += len;
            self.map.insert(p, Alloc { len, kind: MemKind::Device, ctx, fd });
            return Ok(p);
        }
        let layout = Layout::from_size_align(len, DEVICE_ALIGN).map_err(|_| oom())?;
        // SAFETY: a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(oom());
        }
        self.device_bytes += len;
        self.map.insert(p as usize, Alloc { len, kind: MemKind::Device, ctx, fd: -1 });
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
        self.map.insert(p as usize, Alloc { len: len.max(1), kind: MemKind::Pinned, ctx, fd: -1 });
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
        self.map.insert(p, Alloc { len, kind: MemKind::Registered { flags }, ctx, fd: -1 });
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
        if a.fd >= 0 {
            // SAFETY: mapped by map_shared at `base` with this length, removed from the map;
            // the memfd is this allocation's alone (gdr_map's mappings hold their own reference).
            unsafe {
                libc::munmap(base as *mut libc::c_void, round_up(a.len, GPU_PAGE));
                libc::close(a.fd);
            }
            return;
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

pub(crate) fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

/// `len` zeroed bytes of a new memfd, mapped shared at a [`GPU_PAGE`]-aligned address.
fn map_shared(len: usize) -> std::result::Result<(usize, i32), String> {
    let bytes = round_up(len, GPU_PAGE);
    // SAFETY: a static NUL-terminated name; no pointers kept.
    let fd = unsafe { libc::memfd_create(c"tutti-standin-device".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
    }
    let fail = |what: &str| {
        let e = std::io::Error::last_os_error();
        // SAFETY: our own fd, not used after this.
        unsafe { libc::close(fd) };
        Err(format!("{what} of {bytes} bytes: {e}"))
    };
    // SAFETY: our fd.
    if unsafe { libc::ftruncate(fd, bytes as libc::off_t) } != 0 {
        return fail("ftruncate");
    }
    // Reserve a page more than needed, then place the shared mapping at the aligned address
    // inside it and give back the rest.
    // SAFETY: a fresh anonymous reservation; nothing else refers to it.
    let r = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes + GPU_PAGE,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if r == libc::MAP_FAILED {
        return fail("reserving address space");
    }
    let start = r as usize;
    let at = round_up(start, GPU_PAGE);
    // SAFETY: `at..at+bytes` lies inside the reservation just made (MAP_FIXED replaces it).
    let p = unsafe {
        libc::mmap(
            at as *mut libc::c_void,
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        // SAFETY: the reservation made above.
        unsafe { libc::munmap(r, bytes + GPU_PAGE) };
        return fail("mmap");
    }
    // SAFETY: the parts of the reservation before and after the shared mapping.
    unsafe {
        if at > start {
            libc::munmap(r, at - start);
        }
        let end = at + bytes;
        let rend = start + bytes + GPU_PAGE;
        if rend > end {
            libc::munmap(end as *mut libc::c_void, rend - end);
        }
    }
    Ok((at, fd))
}
