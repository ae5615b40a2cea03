//! Host memory for DMA: anonymous mappings that are locked (never swapped),
//! optionally backed by hugepages, and virtual→physical translation through
//! /proc/self/pagemap for no-IOMMU mode.

use crate::error::{DriverError, Result};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::ptr::NonNull;

pub const PAGE: usize = 4096;
/// The x86-64 default hugepage size (Hugepagesize in /proc/meminfo).
pub const HUGE: usize = 2 << 20;

/// Zeroed, locked anonymous memory; unmapped when dropped.
pub struct Memory {
    ptr: NonNull<u8>,
    len: usize,
    huge: bool,
}

// SAFETY: the mapping is owned by this value and only its address is shared.
unsafe impl Send for Memory {}
// SAFETY: as above.
unsafe impl Sync for Memory {}

impl Memory {
    /// Maps `len` bytes (rounded up to the page size in use), populated and locked.
    /// With `huge`, the memory comes from the hugetlb pool, which the kernel never
    /// moves or swaps; that fails when the pool is empty.
    pub fn anonymous(len: usize, huge: bool) -> Result<Memory> {
        let unit = if huge { HUGE } else { PAGE };
        let len = len
            .checked_next_multiple_of(unit)
            .filter(|&l| l > 0)
            .ok_or_else(|| DriverError::invalid(format!("DMA allocation of {len:#x} bytes")))?;
        let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE;
        if huge {
            flags |= libc::MAP_HUGETLB;
        }
        // SAFETY: a fresh anonymous mapping; no existing memory is affected.
        let ptr = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0)
        };
        if ptr == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            let what = if huge { "hugepages (see HugePages_Free in /proc/meminfo)" } else { "pages" };
            return Err(DriverError::io(format!("allocating {len:#x} bytes of DMA memory from {what}"), e));
        }
        let ptr = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| DriverError::dma("vfio", "mmap returned a null mapping"))?;
        let mem = Memory { ptr, len, huge };
        // SAFETY: locks exactly the mapping made above.
        if unsafe { libc::mlock(ptr.as_ptr().cast(), len) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(DriverError::io(
                format!("locking {len:#x} bytes of DMA memory (raise the locked-memory limit: ulimit -l)"),
                e,
            ));
        }
        Ok(mem)
    }

    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_huge(&self) -> bool {
        self.huge
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `anonymous`; callers remove any
        // device mapping of it first (see the release guards in dma.rs).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Physical addresses of this process's pages (proc(5), pagemap).
pub struct Pagemap {
    pagemap: File,
    kpageflags: Option<File>,
}

/// pagemap entry: page present.
const PM_PRESENT: u64 = 1 << 63;
/// pagemap entry: bits 0–54 hold the page frame number.
const PM_PFN_MASK: u64 = (1 << 55) - 1;
/// /proc/kpageflags: KPF_HUGE, the page belongs to a hugepage.
const KPF_HUGE: u64 = 1 << 17;

impl Pagemap {
    pub fn open() -> Result<Pagemap> {
        let pagemap =
            File::open("/proc/self/pagemap").map_err(|e| DriverError::io("opening /proc/self/pagemap", e))?;
        Ok(Pagemap { pagemap, kpageflags: File::open("/proc/kpageflags").ok() })
    }

    /// The physical address of the byte at `vaddr`, which must be resident.
    pub fn phys(&self, vaddr: usize) -> Result<u64> {
        let mut entry = [0u8; 8];
        let at = (vaddr / PAGE * 8) as u64;
        self.pagemap
            .read_exact_at(&mut entry, at)
            .map_err(|e| DriverError::io(format!("reading /proc/self/pagemap for {vaddr:#x}"), e))?;
        let entry = u64::from_ne_bytes(entry);
        if entry & PM_PRESENT == 0 {
            return Err(DriverError::dma("vfio noiommu", format!("page at {vaddr:#x} is not resident")));
        }
        let pfn = entry & PM_PFN_MASK;
        if pfn == 0 {
            return Err(DriverError::dma(
                "vfio noiommu",
                "/proc/self/pagemap hides page frame numbers: physical addresses need CAP_SYS_ADMIN (run as root)",
            ));
        }
        Ok(pfn * PAGE as u64 + (vaddr % PAGE) as u64)
    }

    /// Whether the page at physical address `phys` is part of a hugepage, which
    /// the kernel never migrates. `None` when /proc/kpageflags cannot be read.
    pub fn is_huge(&self, phys: u64) -> Option<bool> {
        let file = self.kpageflags.as_ref()?;
        let mut flags = [0u8; 8];
        file.read_exact_at(&mut flags, phys / PAGE as u64 * 8).ok()?;
        Some(u64::from_ne_bytes(flags) & KPF_HUGE != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locked_memory_is_zeroed_and_page_rounded() {
        let m = Memory::anonymous(100, false).unwrap();
        assert_eq!(m.len(), PAGE);
        assert_eq!(m.ptr().as_ptr() as usize % PAGE, 0);
        // SAFETY: the mapping is PAGE bytes and owned by `m`.
        let bytes = unsafe { std::slice::from_raw_parts(m.ptr().as_ptr(), m.len()) };
        assert!(bytes.iter().all(|&b| b == 0));
        assert!(Memory::anonymous(0, false).is_err());
    }

    #[test]
    fn pagemap_translates_resident_pages() {
        let m = Memory::anonymous(2 * PAGE, false).unwrap();
        let pm = Pagemap::open().unwrap();
        let base = m.ptr().as_ptr() as usize;
        match pm.phys(base) {
            Ok(p0) => {
                assert_eq!(p0 % PAGE as u64, 0);
                assert_eq!(pm.phys(base + 123).unwrap(), p0 + 123, "offset within the page is kept");
                let p1 = pm.phys(base + PAGE).unwrap();
                assert_eq!(p1 % PAGE as u64, 0);
                assert_ne!(p0, p1);
            }
            // Without CAP_SYS_ADMIN the kernel reports PFN 0: the error must say so
            // (the address checks above need the capability and do not run then).
            Err(e) => {
                assert!(e.to_string().contains("CAP_SYS_ADMIN") || e.to_string().contains("pagemap"), "{e}");
            }
        }
    }
}
