//! Submission (§4.2) and completion (§4.6) queue entries.

use super::sgl::SglDescriptor;
use super::status::Status;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// PRP or SGL for Data Transfer (CDW0 bits 15:14).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Psdt {
    /// PRP1/PRP2.
    Prp = 0,
    /// SGL; MPTR is a contiguous metadata buffer.
    SglContiguousMeta = 1,
    /// SGL; MPTR points at an SGL segment.
    SglMetaSegment = 2,
    Reserved = 3,
}

/// A 64-byte submission queue entry (§4.2).
#[repr(C)]
#[derive(Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct SubmissionEntry {
    /// Opcode \[7:0\], FUSE \[9:8\], PSDT \[15:14\], CID \[31:16\].
    pub cdw0: u32,
    pub nsid: u32,
    pub cdw2: u32,
    pub cdw3: u32,
    pub mptr: u64,
    /// PRP1/PRP2, or SGL1 (16 bytes).
    pub dptr: [u64; 2],
    pub cdw10: u32,
    pub cdw11: u32,
    pub cdw12: u32,
    pub cdw13: u32,
    pub cdw14: u32,
    pub cdw15: u32,
}

const _: () = assert!(core::mem::size_of::<SubmissionEntry>() == 64);
const _: () = assert!(core::mem::offset_of!(SubmissionEntry, dptr) == 24);
const _: () = assert!(core::mem::offset_of!(SubmissionEntry, cdw10) == 40);

impl SubmissionEntry {
    pub fn opcode(&self) -> u8 {
        self.cdw0 as u8
    }
    pub fn fuse(&self) -> u8 {
        ((self.cdw0 >> 8) & 0x3) as u8
    }
    pub fn psdt(&self) -> Psdt {
        match (self.cdw0 >> 14) & 0x3 {
            0 => Psdt::Prp,
            1 => Psdt::SglContiguousMeta,
            2 => Psdt::SglMetaSegment,
            _ => Psdt::Reserved,
        }
    }
    pub fn cid(&self) -> u16 {
        (self.cdw0 >> 16) as u16
    }
    pub fn set_cid(&mut self, cid: u16) {
        self.cdw0 = (self.cdw0 & 0xffff) | (cid as u32) << 16;
    }
    pub fn set_psdt(&mut self, psdt: Psdt) {
        self.cdw0 = (self.cdw0 & !(0x3 << 14)) | (psdt as u32) << 14;
    }
    pub fn prp1(&self) -> u64 {
        self.dptr[0]
    }
    pub fn prp2(&self) -> u64 {
        self.dptr[1]
    }
    /// The data pointer read as SGL1.
    pub fn sgl1(&self) -> SglDescriptor {
        SglDescriptor::from_words(self.dptr)
    }
    /// Starting LBA of a Read/Write/Write Zeroes (CDW10–11).
    pub fn slba(&self) -> u64 {
        self.cdw10 as u64 | (self.cdw11 as u64) << 32
    }
    /// Number of logical blocks of a Read/Write/Write Zeroes (CDW12\[15:0\] + 1).
    pub fn nlb(&self) -> u32 {
        (self.cdw12 & 0xffff) + 1
    }
}

impl core::fmt::Debug for SubmissionEntry {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Sqe")
            .field("opc", &format_args!("{:#04x}", self.opcode()))
            .field("cid", &self.cid())
            .field("psdt", &self.psdt())
            .field("nsid", &self.nsid)
            .field("dptr", &format_args!("{:#x}/{:#x}", self.dptr[0], self.dptr[1]))
            .field("cdw10", &format_args!("{:#x}", self.cdw10))
            .field("cdw11", &format_args!("{:#x}", self.cdw11))
            .field("cdw12", &format_args!("{:#x}", self.cdw12))
            .finish()
    }
}

/// A 16-byte completion queue entry (§4.6).
#[repr(C)]
#[derive(Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct CompletionEntry {
    /// Command specific.
    pub dw0: u32,
    pub dw1: u32,
    /// SQ Head Pointer \[15:0\], SQ Identifier \[31:16\].
    pub dw2: u32,
    /// CID \[15:0\], phase tag \[16\], status \[31:17\].
    pub dw3: u32,
}

const _: () = assert!(core::mem::size_of::<CompletionEntry>() == 16);

impl CompletionEntry {
    pub fn new(dw0: u32, sq_head: u16, sq_id: u16, cid: u16, phase: bool, status: Status) -> Self {
        CompletionEntry {
            dw0,
            dw1: 0,
            dw2: sq_head as u32 | (sq_id as u32) << 16,
            dw3: Self::pack_dw3(cid, phase, status),
        }
    }
    /// DW3 as the controller writes it: CID | phase << 16 | status << 17.
    pub fn pack_dw3(cid: u16, phase: bool, status: Status) -> u32 {
        cid as u32 | (phase as u32) << 16 | (status.to_field() as u32) << 17
    }
    pub fn sq_head(&self) -> u16 {
        self.dw2 as u16
    }
    pub fn sq_id(&self) -> u16 {
        (self.dw2 >> 16) as u16
    }
    pub fn cid(&self) -> u16 {
        self.dw3 as u16
    }
    pub fn phase(&self) -> bool {
        self.dw3 & (1 << 16) != 0
    }
    pub fn status(&self) -> Status {
        Status::from_field((self.dw3 >> 17) as u16)
    }
}

impl core::fmt::Debug for CompletionEntry {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Cqe")
            .field("cid", &self.cid())
            .field("sqid", &self.sq_id())
            .field("sqhd", &self.sq_head())
            .field("phase", &self.phase())
            .field("status", &self.status())
            .field("dw0", &format_args!("{:#x}", self.dw0))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::IntoBytes;

    #[test]
    fn sqe_cdw0_fields() {
        let mut e = SubmissionEntry { cdw0: 0x02, ..Default::default() };
        e.set_cid(0xbeef);
        e.set_psdt(Psdt::SglContiguousMeta);
        assert_eq!(e.opcode(), 0x02);
        assert_eq!(e.cid(), 0xbeef);
        assert_eq!(e.psdt(), Psdt::SglContiguousMeta);
        assert_eq!(e.cdw0, 0xbeef_4002);
        assert_eq!(&e.as_bytes()[0..4], &[0x02, 0x40, 0xef, 0xbe]);
    }

    #[test]
    fn sqe_lba_fields() {
        let e = SubmissionEntry { cdw10: 0x89ab_cdef, cdw11: 0x0123_4567, cdw12: 7, ..Default::default() };
        assert_eq!(e.slba(), 0x0123_4567_89ab_cdef);
        assert_eq!(e.nlb(), 8);
        // SLBA sits at byte 40 of the entry (§6.9 Read, CDW10).
        assert_eq!(&e.as_bytes()[40..44], &0x89ab_cdefu32.to_le_bytes());
    }

    #[test]
    fn cqe_round_trips() {
        let st = Status::generic(0x80);
        let c = CompletionEntry::new(5, 17, 3, 0x1234, true, st.with_dnr(true));
        assert_eq!(c.sq_head(), 17);
        assert_eq!(c.sq_id(), 3);
        assert_eq!(c.cid(), 0x1234);
        assert!(c.phase());
        assert_eq!(c.status().code(), 0x0080);
        assert!(c.status().dnr());
        // Status field: SC at bits 24:17, DNR at bit 31.
        assert_eq!((c.dw3 >> 17) & 0xff, 0x80);
        assert_eq!(c.dw3 >> 31, 1);
        let ok = CompletionEntry::new(0, 0, 0, 9, false, Status::SUCCESS);
        assert!(ok.status().is_success());
        assert!(!ok.phase());
    }
}
