//! Controller registers in BAR0 (§3.1) and their bit fields.
//!
//! The fixed registers are described once as [`Bar0`]; offsets are taken from
//! that struct with `offset_of!`, so no offset is written twice. Bit fields are
//! typed getters and builders, never shifts scattered through controller code.

use core::mem::offset_of;

/// The fixed part of BAR0 (§3.1), as laid out by the spec.
#[repr(C)]
pub struct Bar0 {
    pub cap: u64,
    pub vs: u32,
    pub intms: u32,
    pub intmc: u32,
    pub cc: u32,
    pub rsvd0: u32,
    pub csts: u32,
    pub nssr: u32,
    pub aqa: u32,
    pub asq: u64,
    pub acq: u64,
}

const _: () = assert!(offset_of!(Bar0, cap) == 0x00);
const _: () = assert!(offset_of!(Bar0, vs) == 0x08);
const _: () = assert!(offset_of!(Bar0, cc) == 0x14);
const _: () = assert!(offset_of!(Bar0, csts) == 0x1c);
const _: () = assert!(offset_of!(Bar0, aqa) == 0x24);
const _: () = assert!(offset_of!(Bar0, asq) == 0x28);
const _: () = assert!(offset_of!(Bar0, acq) == 0x30);

/// Register offsets in BAR0, derived from [`Bar0`].
pub mod offset {
    use super::Bar0;
    use core::mem::offset_of;
    pub const CAP: usize = offset_of!(Bar0, cap);
    pub const VS: usize = offset_of!(Bar0, vs);
    pub const INTMS: usize = offset_of!(Bar0, intms);
    pub const INTMC: usize = offset_of!(Bar0, intmc);
    pub const CC: usize = offset_of!(Bar0, cc);
    pub const CSTS: usize = offset_of!(Bar0, csts);
    pub const AQA: usize = offset_of!(Bar0, aqa);
    pub const ASQ: usize = offset_of!(Bar0, asq);
    pub const ACQ: usize = offset_of!(Bar0, acq);
    /// First doorbell register (§3.1.24).
    pub const DOORBELLS: usize = 0x1000;
}

/// Offset of the submission queue `qid` tail doorbell: 0x1000 + (2y)·(4 << DSTRD).
pub const fn sq_tail_doorbell(qid: u16, dstrd: u8) -> usize {
    offset::DOORBELLS + (2 * qid as usize) * (4usize << dstrd)
}

/// Offset of the completion queue `qid` head doorbell: 0x1000 + (2y+1)·(4 << DSTRD).
pub const fn cq_head_doorbell(qid: u16, dstrd: u8) -> usize {
    offset::DOORBELLS + (2 * qid as usize + 1) * (4usize << dstrd)
}

/// Bytes of BAR0 needed to reach the doorbells of queues `0..=max_qid`.
pub const fn bar_len_for(max_qid: u16, dstrd: u8) -> usize {
    cq_head_doorbell(max_qid, dstrd) + 4
}

/// Controller Capabilities (§3.1.1).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Cap(pub u64);

impl Cap {
    /// Maximum Queue Entries Supported, as an entry count (the field is 0-based).
    pub fn max_queue_entries(self) -> u32 {
        (self.0 & 0xffff) as u32 + 1
    }
    /// Contiguous Queues Required.
    pub fn contiguous_queues_required(self) -> bool {
        self.0 & (1 << 16) != 0
    }
    /// Worst-case time for CSTS.RDY to follow CC.EN, in milliseconds (TO × 500 ms).
    pub fn timeout_ms(self) -> u64 {
        ((self.0 >> 24) & 0xff) * 500
    }
    /// Doorbell Stride: doorbells are 4 << DSTRD bytes apart.
    pub fn dstrd(self) -> u8 {
        ((self.0 >> 32) & 0xf) as u8
    }
    /// Command Sets Supported: bit 0 is the NVM command set.
    pub fn supports_nvm_command_set(self) -> bool {
        (self.0 >> 37) & 1 != 0
    }
    /// Memory Page Size Minimum as log2 of bytes (12 + MPSMIN).
    pub fn mps_min_shift(self) -> u32 {
        12 + ((self.0 >> 48) & 0xf) as u32
    }
    /// Memory Page Size Maximum as log2 of bytes (12 + MPSMAX).
    pub fn mps_max_shift(self) -> u32 {
        12 + ((self.0 >> 52) & 0xf) as u32
    }

    /// Builds a CAP value; used by the emulated controller and tests.
    pub fn build(mqes0: u16, cqr: bool, to_500ms: u8, dstrd: u8, mpsmin: u8, mpsmax: u8) -> Cap {
        Cap(mqes0 as u64
            | (cqr as u64) << 16
            | (to_500ms as u64) << 24
            | ((dstrd & 0xf) as u64) << 32
            | 1u64 << 37
            | ((mpsmin & 0xf) as u64) << 48
            | ((mpsmax & 0xf) as u64) << 52)
    }
}

impl core::fmt::Debug for Cap {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Cap")
            .field("raw", &format_args!("{:#018x}", self.0))
            .field("mqes", &self.max_queue_entries())
            .field("cqr", &self.contiguous_queues_required())
            .field("timeout_ms", &self.timeout_ms())
            .field("dstrd", &self.dstrd())
            .field("mps_min", &(1u64 << self.mps_min_shift()))
            .finish()
    }
}

/// Version (§3.1.2).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Version(pub u32);

impl Version {
    pub fn major(self) -> u16 {
        (self.0 >> 16) as u16
    }
    pub fn minor(self) -> u8 {
        (self.0 >> 8) as u8
    }
    pub fn tertiary(self) -> u8 {
        self.0 as u8
    }
}

impl core::fmt::Display for Version {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}.{}.{}", self.major(), self.minor(), self.tertiary())
    }
}

/// Shutdown Notification values for CC.SHN (§3.1.5).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ShutdownNotification {
    None = 0,
    Normal = 1,
    Abrupt = 2,
}

/// Controller Configuration (§3.1.5).
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Cc(pub u32);

impl Cc {
    pub fn enabled(self) -> bool {
        self.0 & 1 != 0
    }
    pub fn with_enable(self, en: bool) -> Cc {
        Cc((self.0 & !1) | en as u32)
    }
    /// I/O Command Set Selected (0 = NVM).
    pub fn css(self) -> u8 {
        ((self.0 >> 4) & 0x7) as u8
    }
    pub fn with_css(self, css: u8) -> Cc {
        Cc((self.0 & !(0x7 << 4)) | ((css as u32 & 0x7) << 4))
    }
    /// Memory Page Size as log2 of bytes (12 + MPS).
    pub fn page_shift(self) -> u32 {
        12 + ((self.0 >> 7) & 0xf)
    }
    /// Sets MPS from a page size given as log2 of bytes (must be ≥ 12).
    pub fn with_page_shift(self, shift: u32) -> Cc {
        Cc((self.0 & !(0xf << 7)) | ((shift.saturating_sub(12) & 0xf) << 7))
    }
    pub fn shutdown(self) -> u8 {
        ((self.0 >> 14) & 0x3) as u8
    }
    pub fn with_shutdown(self, shn: ShutdownNotification) -> Cc {
        Cc((self.0 & !(0x3 << 14)) | ((shn as u32) << 14))
    }
    /// I/O Submission Queue Entry Size as log2 of bytes.
    pub fn iosqes(self) -> u8 {
        ((self.0 >> 16) & 0xf) as u8
    }
    pub fn with_iosqes(self, log2: u8) -> Cc {
        Cc((self.0 & !(0xf << 16)) | ((log2 as u32 & 0xf) << 16))
    }
    /// I/O Completion Queue Entry Size as log2 of bytes.
    pub fn iocqes(self) -> u8 {
        ((self.0 >> 20) & 0xf) as u8
    }
    pub fn with_iocqes(self, log2: u8) -> Cc {
        Cc((self.0 & !(0xf << 20)) | ((log2 as u32 & 0xf) << 20))
    }
}

impl core::fmt::Debug for Cc {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Cc")
            .field("en", &self.enabled())
            .field("css", &self.css())
            .field("page", &(1u64 << self.page_shift()))
            .field("shn", &self.shutdown())
            .field("iosqes", &self.iosqes())
            .field("iocqes", &self.iocqes())
            .finish()
    }
}

/// Shutdown Status values of CSTS.SHST (§3.1.6).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ShutdownStatus {
    Normal,
    Occurring,
    Complete,
    Reserved,
}

/// Controller Status (§3.1.6).
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Csts(pub u32);

impl Csts {
    pub fn ready(self) -> bool {
        self.0 & 1 != 0
    }
    /// Controller Fatal Status.
    pub fn fatal(self) -> bool {
        self.0 & 2 != 0
    }
    pub fn shutdown_status(self) -> ShutdownStatus {
        match (self.0 >> 2) & 0x3 {
            0 => ShutdownStatus::Normal,
            1 => ShutdownStatus::Occurring,
            2 => ShutdownStatus::Complete,
            _ => ShutdownStatus::Reserved,
        }
    }
    pub fn build(ready: bool, fatal: bool, shst: ShutdownStatus) -> Csts {
        let shst = match shst {
            ShutdownStatus::Normal => 0,
            ShutdownStatus::Occurring => 1,
            ShutdownStatus::Complete => 2,
            ShutdownStatus::Reserved => 3,
        };
        Csts(ready as u32 | (fatal as u32) << 1 | shst << 2)
    }
}

impl core::fmt::Debug for Csts {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Csts")
            .field("rdy", &self.ready())
            .field("cfs", &self.fatal())
            .field("shst", &self.shutdown_status())
            .finish()
    }
}

/// Admin Queue Attributes (§3.1.8): both sizes are 0-based entry counts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Aqa(pub u32);

impl Aqa {
    /// Builds AQA from entry counts (1-based), each 2..=4096.
    pub fn new(sq_entries: u16, cq_entries: u16) -> Aqa {
        Aqa((sq_entries.saturating_sub(1) as u32 & 0xfff)
            | ((cq_entries.saturating_sub(1) as u32 & 0xfff) << 16))
    }
    pub fn sq_entries(self) -> u32 {
        (self.0 & 0xfff) + 1
    }
    pub fn cq_entries(self) -> u32 {
        ((self.0 >> 16) & 0xfff) + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemu_cap_decodes() {
        // CAP reported by QEMU 10's NVMe controller.
        let cap = Cap(0x004018200f0107ff);
        assert_eq!(cap.max_queue_entries(), 2048);
        assert!(cap.contiguous_queues_required());
        assert_eq!(cap.timeout_ms(), 7500);
        assert_eq!(cap.dstrd(), 0);
        assert!(cap.supports_nvm_command_set());
        assert_eq!(cap.mps_min_shift(), 12);
        assert_eq!(cap.mps_max_shift(), 16);
    }

    #[test]
    fn cap_build_round_trips() {
        let cap = Cap::build(1023, true, 20, 2, 0, 4);
        assert_eq!(cap.max_queue_entries(), 1024);
        assert!(cap.contiguous_queues_required());
        assert_eq!(cap.timeout_ms(), 10_000);
        assert_eq!(cap.dstrd(), 2);
        assert_eq!(cap.mps_min_shift(), 12);
        assert_eq!(cap.mps_max_shift(), 16);
    }

    #[test]
    fn cc_fields_encode_where_the_spec_puts_them() {
        let cc =
            Cc::default().with_enable(true).with_css(0).with_page_shift(12).with_iosqes(6).with_iocqes(4);
        assert_eq!(cc.0, 0x0046_0001);
        assert!(cc.enabled());
        assert_eq!(cc.iosqes(), 6);
        assert_eq!(cc.iocqes(), 4);
        let cc = cc.with_page_shift(16).with_shutdown(ShutdownNotification::Normal);
        assert_eq!(cc.page_shift(), 16);
        assert_eq!(cc.shutdown(), 1);
        assert_eq!((cc.0 >> 7) & 0xf, 4);
        assert_eq!((cc.0 >> 14) & 0x3, 1);
        assert!(!cc.with_enable(false).enabled());
    }

    #[test]
    fn csts_decodes() {
        assert!(Csts(1).ready());
        assert!(Csts(2).fatal());
        assert_eq!(Csts(0b1000).shutdown_status(), ShutdownStatus::Complete);
        let c = Csts::build(true, false, ShutdownStatus::Occurring);
        assert_eq!(c.0, 0b101);
    }

    #[test]
    fn doorbells_follow_the_stride() {
        assert_eq!(sq_tail_doorbell(0, 0), 0x1000);
        assert_eq!(cq_head_doorbell(0, 0), 0x1004);
        assert_eq!(sq_tail_doorbell(1, 0), 0x1008);
        assert_eq!(cq_head_doorbell(3, 0), 0x101c);
        // DSTRD = 2: doorbells 16 bytes apart.
        assert_eq!(sq_tail_doorbell(1, 2), 0x1020);
        assert_eq!(cq_head_doorbell(1, 2), 0x1030);
        assert_eq!(bar_len_for(1, 0), 0x1010);
    }

    #[test]
    fn aqa_is_zero_based() {
        let aqa = Aqa::new(32, 64);
        assert_eq!(aqa.0, 31 | (63 << 16));
        assert_eq!(aqa.sq_entries(), 32);
        assert_eq!(aqa.cq_entries(), 64);
    }

    #[test]
    fn version_prints() {
        assert_eq!(Version(0x0001_0400).to_string(), "1.4.0");
    }
}
