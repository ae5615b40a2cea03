//! The emulated controller's BAR0: a register file in ordinary memory.
//!
//! Host stores land in atomics that the controller thread polls, exactly as a
//! device sees MMIO writes. Read-only registers (CAP, VS, CSTS) ignore host
//! writes; the controller updates them through [`RegisterFile::set32`].

use crate::error::Result;
use crate::spec::registers::{bar_len_for, offset};
use crate::transport::{check_register, DoorbellKind, Registers};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

pub struct RegisterFile {
    name: String,
    words: Box<[AtomicU32]>,
}

impl RegisterFile {
    /// A zeroed register file with doorbells for queues `0..=max_qid`.
    pub fn new(name: &str, max_qid: u16, dstrd: u8) -> Self {
        let len = bar_len_for(max_qid, dstrd).next_multiple_of(4096);
        let words = (0..len / 4).map(|_| AtomicU32::new(0)).collect();
        RegisterFile { name: name.to_string(), words }
    }

    fn word(&self, offset: usize) -> &AtomicU32 {
        &self.words[offset / 4]
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
}

impl Registers for RegisterFile {
    fn name(&self) -> &str {
        &self.name
    }
    fn len(&self) -> usize {
        self.words.len() * 4
    }
    fn read32(&self, offset: usize) -> Result<u32> {
        check_register(&self.name, self.len(), offset, 4)?;
        Ok(self.word(offset).load(Ordering::Acquire))
    }
    fn write32(&self, offset: usize, value: u32) -> Result<()> {
        check_register(&self.name, self.len(), offset, 4)?;
        if !Self::read_only(offset) {
            self.word(offset).store(value, Ordering::Release);
        }
        Ok(())
    }
    fn doorbell_ptr(&self, offset: usize) -> Result<(NonNull<u32>, DoorbellKind)> {
        check_register(&self.name, self.len(), offset, 4)?;
        Ok((NonNull::from(self.word(offset)).cast(), DoorbellKind::Memory))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_cannot_write_read_only_registers() -> Result<()> {
        let r = RegisterFile::new("t", 2, 0);
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
    fn out_of_range_access_is_an_error() {
        let r = RegisterFile::new("t", 1, 0);
        assert!(r.read32(r.len()).is_err());
        assert!(r.write32(2, 0).is_err());
        assert!(r.doorbell_ptr(0x1000).is_ok());
    }
}
