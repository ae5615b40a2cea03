//! The emulated controller's BAR0: a register file in shared memory.
//!
//! Host stores land in atomics that the controller thread polls, exactly as a
//! device sees MMIO writes. Read-only registers (CAP, VS, CSTS) ignore host
//! writes; the controller updates them through [`RegisterFile::set32`].
//!
//! The words live in a `memfd` mapped `MAP_SHARED`, so another process can map
//! the same register file ([`RegisterFile::from_fd`]) and ring doorbells of
//! queues it was leased. Every access on either side is a 32-bit atomic, which
//! is as coherent between processes as between threads. The memfd is sealed
//! against shrinking and growing, so no process holding it can make the
//! mapping shorter under another one (which would raise SIGBUS there).
//!
//! One word of the file, [`WAKE_WORD`], lets the controller thread park
//! instead of polling: it sets the word to
//! [`WAKE_PARKED`](tutti_driver::transport::wake::WAKE_PARKED) before its last look
//! at the doorbells and then waits on it (a shared futex, so a client process
//! ringing through its own mapping wakes it too). Every doorbell writer calls
//! [`wake_controller`] after its store. The wait always has a timeout, so a
//! writer that does not (an older client, a GPU) is served late, never lost.
//! The writer's half of this protocol is the driver's
//! ([`tutti_driver::transport::wake`]): its doorbells follow it, and each
//! register file mapped in this process is registered there so that a writer
//! holding only a doorbell's address finds the wake word.

use memmap2::{MmapOptions, MmapRaw};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use tutti_driver::spec::registers::{bar_len_for, offset};
use tutti_driver::transport::wake::{register_memory_bar, unregister_memory_bar, wake_controller};
use tutti_driver::transport::{check_register, DoorbellKind, Registers};
use tutti_driver::{DriverError, Result};

/// The largest register file [`RegisterFile::from_fd`] maps: doorbells for
/// 65535 queues at the largest stride the emulator supports, rounded up.
pub const MAX_REGISTER_FILE: usize = 16 << 20;

const PAGE: usize = 4096;

/// Offset of the controller's wake word: the last dword of the command-set
/// specific registers (0xF00..0x1000), which the NVM command set leaves unused.
pub const WAKE_WORD: usize = 0xFFC;

pub struct RegisterFile {
    name: String,
    map: MmapRaw,
    fd: OwnedFd,
}

impl RegisterFile {
    /// A zeroed register file with doorbells for queues `0..=max_qid`, in a
    /// new sealed memfd.
    pub fn new(name: &str, max_qid: u16, dstrd: u8) -> Result<Self> {
        let len = bar_len_for(max_qid, dstrd).next_multiple_of(PAGE);
        let fd = tutti_driver::memfd::create_sealed(&format!("tutti-bar0-{name}"), len)
            .map_err(|e| DriverError::io(format!("{name}: the register file's memfd"), e))?;
        Self::map(name, fd, len)
    }

    /// Maps a register file another process created (the client side of a
    /// lease). `len` must be what that process reports as its length: a
    /// multiple of 4096, at least 0x1008 (CAP..the admin doorbells), at most
    /// [`MAX_REGISTER_FILE`], equal to the file's size; and the file must be
    /// a memfd sealed against shrinking, so that it cannot get shorter while
    /// mapped.
    pub fn from_fd(name: &str, fd: OwnedFd, len: usize) -> Result<RegisterFile> {
        let bad = |what: String| DriverError::invalid(format!("register file for {name}: {what}"));
        if !len.is_multiple_of(PAGE) || len < bar_len_for(0, 0) || len > MAX_REGISTER_FILE {
            return Err(bad(format!(
                "length {len:#x} is not a multiple of {PAGE:#x} in {:#x}..={MAX_REGISTER_FILE:#x}",
                bar_len_for(0, 0)
            )));
        }
        tutti_driver::memfd::check_sealed(fd.as_fd(), len).map_err(bad)?;
        Self::map(name, fd, len)
    }

    fn map(name: &str, fd: OwnedFd, len: usize) -> Result<RegisterFile> {
        let map = MmapOptions::new()
            .len(len)
            .map_raw(&fd)
            .map_err(|e| DriverError::io(format!("{name}: mapping the register file"), e))?;
        let start = map.as_ptr() as usize;
        match NonNull::new((start + WAKE_WORD) as *mut u32) {
            Some(wake) => register_memory_bar(start, map.len(), wake),
            None => {
                return Err(DriverError::invalid(format!("{name}: the register file mapped at address 0")))
            }
        }
        Ok(RegisterFile { name: name.to_string(), map, fd })
    }

    /// The memfd behind this register file, to hand to another process
    /// (with [`len`](Registers::len)) for [`from_fd`](Self::from_fd).
    pub fn memfd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn words(&self) -> &[AtomicU32] {
        // SAFETY: the mapping is page aligned, `len` bytes long and lives as
        // long as `self`; every access to it (here and in other processes)
        // is a 32-bit atomic, and the memfd's seals keep it from shrinking.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().cast::<AtomicU32>(), self.map.len() / 4) }
    }

    fn word(&self, offset: usize) -> &AtomicU32 {
        &self.words()[offset / 4]
    }

    /// Controller-side load (acquire): sees every host store made before it.
    pub fn get32(&self, offset: usize) -> u32 {
        self.word(offset).load(Ordering::Acquire)
    }
    pub fn get64(&self, offset: usize) -> u64 {
        self.get32(offset) as u64 | (self.get32(offset + 4) as u64) << 32
    }
    /// Controller-side store, allowed on read-only registers.
    pub fn set32(&self, offset: usize, value: u32) {
        self.word(offset).store(value, Ordering::Release)
    }
    pub fn set64(&self, offset: usize, value: u64) {
        self.set32(offset, value as u32);
        self.set32(offset + 4, (value >> 32) as u32);
    }

    fn read_only(offset: usize) -> bool {
        offset < offset::VS + 4 || offset == offset::CSTS
    }

    /// The controller's wake word ([`WAKE_WORD`]).
    pub fn wake(&self) -> &AtomicU32 {
        self.word(WAKE_WORD)
    }
}

impl Drop for RegisterFile {
    fn drop(&mut self) {
        let start = self.map.as_ptr() as usize;
        unregister_memory_bar(start);
    }
}

impl Registers for RegisterFile {
    fn name(&self) -> &str {
        &self.name
    }
    fn len(&self) -> usize {
        self.map.len()
    }
    fn read32(&self, offset: usize) -> Result<u32> {
        check_register(&self.name, self.len(), offset, 4)?;
        Ok(self.word(offset).load(Ordering::Acquire))
    }
    fn write32(&self, offset: usize, value: u32) -> Result<()> {
        check_register(&self.name, self.len(), offset, 4)?;
        if !Self::read_only(offset) {
            self.word(offset).store(value, Ordering::Release);
            wake_controller(self.wake());
        }
        Ok(())
    }
    fn doorbell_ptr(&self, offset: usize) -> Result<(NonNull<u32>, DoorbellKind)> {
        check_register(&self.name, self.len(), offset, 4)?;
        Ok((NonNull::from(self.word(offset)).cast(), DoorbellKind::Memory))
    }
    fn wake_word(&self) -> Option<NonNull<u32>> {
        Some(NonNull::from(self.wake()).cast())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_cannot_write_read_only_registers() -> Result<()> {
        let r = RegisterFile::new("t", 2, 0)?;
        r.set64(offset::CAP, 0x1234_5678_9abc);
        r.write32(offset::CAP, 0)?;
        r.write32(offset::CSTS, 1)?;
        assert_eq!(r.read64(offset::CAP)?, 0x1234_5678_9abc);
        assert_eq!(r.read32(offset::CSTS)?, 0);
        r.write32(offset::CC, 0x46_0001)?;
        assert_eq!(r.get32(offset::CC), 0x46_0001);
        Ok(())
    }

    #[test]
    fn out_of_range_access_is_an_error() -> Result<()> {
        let r = RegisterFile::new("t", 1, 0)?;
        assert!(r.read32(r.len()).is_err());
        assert!(r.write32(2, 0).is_err());
        assert!(r.doorbell_ptr(0x1000).is_ok());
        Ok(())
    }
}
