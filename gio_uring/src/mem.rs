//! Memory an executor works in: shared with the host, or the executor's own.
//!
//! The host executor's memory is ordinary host memory (executor address =
//! host address). The CUDA executor's shared memory is mapped pinned host
//! memory and its private memory is device memory the host reaches only by
//! copies; the rest of gio_uring does not know which.

use crate::error::{GioError, Result};
use std::ptr::NonNull;
use zerocopy::{FromBytes, Immutable, IntoBytes};

/// Who needs to reach a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemKind {
    /// Host and executor both load and store (rings, IOCBs, control block).
    Shared,
    /// Only the executor; the host initialises it with copies (queue state, tables).
    Private,
}

/// A zeroed region an executor allocated.
pub trait ExecMemory: Send + Sync {
    /// Address of byte 0 in the executor's address space.
    fn exec_addr(&self) -> u64;
    /// Host address, for [`MemKind::Shared`] regions.
    fn host_ptr(&self) -> Option<NonNull<u8>>;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies `bytes` to `offset`. The executor must not be using those bytes.
    fn write_bytes(&self, offset: usize, bytes: &[u8]) -> Result<()>;
    /// Copies `out.len()` bytes from `offset`.
    fn read_bytes(&self, offset: usize, out: &mut [u8]) -> Result<()>;
}

impl dyn ExecMemory {
    pub fn write_obj<T: IntoBytes + Immutable>(&self, offset: usize, value: &T) -> Result<()> {
        self.write_bytes(offset, value.as_bytes())
    }
    pub fn read_obj<T: FromBytes + IntoBytes>(&self, offset: usize) -> Result<T> {
        let mut v = T::new_zeroed();
        self.read_bytes(offset, v.as_mut_bytes())?;
        Ok(v)
    }
    /// Executor address of byte `offset`.
    pub fn exec_at(&self, offset: usize) -> u64 {
        self.exec_addr() + offset as u64
    }
}

/// A mapping of host memory the executor did not allocate (queue memory, doorbells).
pub trait HostMapping: Send + Sync {
    fn exec_addr(&self) -> u64;
}

/// Whether a host range is ordinary memory or device registers (a BAR).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostRange {
    Memory,
    Io,
}

pub(crate) fn check_range(len: usize, offset: usize, n: usize) -> Result<()> {
    match offset.checked_add(n) {
        Some(end) if end <= len => Ok(()),
        _ => Err(GioError::invalid(format!("access {offset:#x}+{n:#x} outside a region of {len:#x} bytes"))),
    }
}

/// Page-aligned, zeroed host memory.
pub struct HostMemory {
    ptr: NonNull<u8>,
    layout: std::alloc::Layout,
}

// SAFETY: plain memory owned by this value; concurrent access goes through atomics
// (rings, counters) or is ordered by the ring protocol.
unsafe impl Send for HostMemory {}
// SAFETY: as above.
unsafe impl Sync for HostMemory {}

impl HostMemory {
    pub fn new(len: usize) -> Result<Self> {
        let size = len.max(1).next_multiple_of(4096);
        let layout = std::alloc::Layout::from_size_align(size, 4096)
            .map_err(|e| GioError::invalid(format!("cannot allocate {len} bytes: {e}")))?;
        // SAFETY: non-zero size.
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or_else(|| GioError::invalid(format!("out of memory allocating {size} bytes")))?;
        Ok(HostMemory { ptr, layout })
    }
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl ExecMemory for HostMemory {
    fn exec_addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }
    fn host_ptr(&self) -> Option<NonNull<u8>> {
        Some(self.ptr)
    }
    fn len(&self) -> usize {
        self.layout.size()
    }
    fn write_bytes(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        check_range(self.len(), offset, bytes.len())?;
        // SAFETY: in bounds (checked); `bytes` is a separate slice.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.as_ptr().add(offset), bytes.len()) };
        Ok(())
    }
    fn read_bytes(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        check_range(self.len(), offset, out.len())?;
        // SAFETY: in bounds (checked); `out` is a separate slice.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }
}
