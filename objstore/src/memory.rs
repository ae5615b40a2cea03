//! Host memory standing in for the engine's KV memory on machines without a GPU.
//!
//! The drives DMA straight into and out of it, so it is never handed out as a
//! Rust slice: bytes go in and out by copies made while no transfer touches
//! them (callers wait for their jobs first).

use crate::error::{ObjError, Result};
use tutti_driver::transport::pages::HostPages;

/// Page-aligned, zeroed host memory for KV blocks. Send and Sync come from
/// `HostPages`: every access here is a bounds-checked copy, and shared access
/// only copies bytes in or out.
pub struct HostKvMemory {
    pages: HostPages,
}

impl HostKvMemory {
    pub const ALIGN: usize = 4096;

    pub fn new(len: usize) -> Result<Self> {
        if len == 0 {
            return Err(ObjError::invalid("len", "KV memory of zero bytes"));
        }
        let pages = HostPages::alloc("KV memory", len, Self::ALIGN)
            .map_err(|e| ObjError::invalid("len", format!("{len} bytes: {e}")))?;
        Ok(HostKvMemory { pages })
    }

    /// The address engines and layouts use.
    pub fn addr(&self) -> u64 {
        self.pages.addr()
    }
    pub fn as_ptr(&self) -> *mut u8 {
        self.pages.ptr().as_ptr()
    }
    pub fn len(&self) -> usize {
        self.pages.len()
    }
    pub fn is_empty(&self) -> bool {
        false
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(ObjError::invalid(
                "offset",
                format!("{offset:#x}+{len:#x} is outside {:#x} bytes of KV memory", self.len()),
            )),
        }
    }

    pub fn copy_in(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check(offset, src.len())?;
        // SAFETY: in bounds (checked); `src` is a distinct Rust slice.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.as_ptr().add(offset), src.len()) };
        Ok(())
    }

    pub fn copy_out(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check(offset, dst.len())?;
        // SAFETY: in bounds (checked); `dst` is a distinct Rust slice.
        unsafe { std::ptr::copy_nonoverlapping(self.as_ptr().add(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<()> {
        self.check(offset, len)?;
        // SAFETY: in bounds (checked).
        unsafe { std::ptr::write_bytes(self.as_ptr().add(offset), byte, len) };
        Ok(())
    }

    /// Whether `addr..addr+len` lies inside this memory.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr() && addr.checked_add(len).is_some_and(|e| e <= self.addr() + self.len() as u64)
    }
}

impl std::fmt::Debug for HostKvMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostKvMemory({:p}, {:#x} bytes)", self.pages.ptr(), self.len())
    }
}
