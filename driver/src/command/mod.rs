//! Command builders that read like the spec, and data pointers (PRP or SGL).
//!
//! ```
//! use tutti_driver::command::{Command, DataPtr};
//! use tutti_driver::spec::SglDescriptor;
//! let sqe = Command::read(1, 2048, 8)
//!     .data(DataPtr::Sgl(SglDescriptor::data_block(0x10_0000_0000, 4096)))
//!     .cid(7)
//!     .entry();
//! assert_eq!(sqe.opcode(), 0x02);
//! assert_eq!(sqe.nlb(), 8);
//! ```

pub mod prp;
pub mod sgl;

use crate::spec::opcode::{cns, feature};
use crate::spec::{AdminOpcode, IoOpcode, Psdt, SglDescriptor, SubmissionEntry};

/// Largest number of logical blocks one Read/Write/Write Zeroes can name (NLB is 16 bits, 0-based).
pub const MAX_NLB: u32 = 1 << 16;

/// Where a command's data lives.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DataPtr {
    None,
    /// PRP1 (may carry a dword-aligned offset) and PRP2 (unused, second page, or list pointer).
    Prp {
        prp1: u64,
        prp2: u64,
    },
    /// SGL1: one descriptor inline in the command (§4.4).
    Sgl(SglDescriptor),
}

/// How the driver should describe data to the controller.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum DataMode {
    /// SGL when the controller supports it, PRP otherwise.
    #[default]
    Auto,
    Prp,
    Sgl,
}

/// A submission entry under construction, with a name for messages.
#[derive(Clone, Copy, Debug)]
pub struct Command {
    sqe: SubmissionEntry,
    name: &'static str,
}

impl Command {
    fn new(opcode: u8, nsid: u32, name: &'static str) -> Self {
        Command { sqe: SubmissionEntry { cdw0: opcode as u32, nsid, ..Default::default() }, name }
    }

    fn rw(op: IoOpcode, nsid: u32, slba: u64, blocks: u32, name: &'static str) -> Self {
        let mut c = Command::new(op as u8, nsid, name);
        c.sqe.cdw10 = slba as u32;
        c.sqe.cdw11 = (slba >> 32) as u32;
        // NLB is 0-based; callers keep `blocks` in 1..=MAX_NLB (checked where requests are split).
        c.sqe.cdw12 = blocks.clamp(1, MAX_NLB) - 1;
        c
    }

    /// Read `blocks` logical blocks starting at `slba` (§6.9).
    pub fn read(nsid: u32, slba: u64, blocks: u32) -> Self {
        Self::rw(IoOpcode::Read, nsid, slba, blocks, "Read")
    }
    /// Write `blocks` logical blocks starting at `slba` (§6.15).
    pub fn write(nsid: u32, slba: u64, blocks: u32) -> Self {
        Self::rw(IoOpcode::Write, nsid, slba, blocks, "Write")
    }
    /// Write Zeroes (§6.16): no data pointer.
    pub fn write_zeroes(nsid: u32, slba: u64, blocks: u32) -> Self {
        Self::rw(IoOpcode::WriteZeroes, nsid, slba, blocks, "Write Zeroes")
    }
    /// Flush the volatile write cache (§6.8).
    pub fn flush(nsid: u32) -> Self {
        Command::new(IoOpcode::Flush as u8, nsid, "Flush")
    }
    /// Dataset Management with the Deallocate attribute over `ranges` 16-byte
    /// ranges at the data pointer (§6.7).
    pub fn deallocate(nsid: u32, ranges: u32) -> Self {
        let mut c = Command::new(IoOpcode::DatasetManagement as u8, nsid, "Dataset Management");
        c.sqe.cdw10 = ranges.clamp(1, 256) - 1;
        c.sqe.cdw11 = 1 << 2; // AD: attribute deallocate
        c
    }

    /// Identify (§5.15) with the given CNS.
    pub fn identify(cns: u8, nsid: u32) -> Self {
        let mut c = Command::new(AdminOpcode::Identify as u8, nsid, "Identify");
        c.sqe.cdw10 = cns as u32;
        c
    }
    pub fn identify_controller() -> Self {
        Self::identify(cns::CONTROLLER, 0)
    }
    pub fn identify_namespace(nsid: u32) -> Self {
        Self::identify(cns::NAMESPACE, nsid)
    }
    pub fn identify_active_namespaces(after: u32) -> Self {
        Self::identify(cns::ACTIVE_NAMESPACES, after)
    }
    pub fn identify_namespace_descriptors(nsid: u32) -> Self {
        Self::identify(cns::NAMESPACE_DESCRIPTORS, nsid)
    }
    /// Create I/O Completion Queue (§5.3), polled (interrupts disabled).
    pub fn create_io_cq(qid: u16, entries: u32, iova: u64, contiguous: bool) -> Self {
        let mut c = Command::new(AdminOpcode::CreateIoCq as u8, 0, "Create I/O CQ");
        c.sqe.dptr[0] = iova;
        c.sqe.cdw10 = qid as u32 | (entries.saturating_sub(1) & 0xffff) << 16;
        c.sqe.cdw11 = contiguous as u32; // PC; IEN = 0
        c
    }
    /// Create I/O Submission Queue (§5.4) bound to completion queue `cqid`.
    pub fn create_io_sq(qid: u16, entries: u32, iova: u64, cqid: u16, contiguous: bool) -> Self {
        let mut c = Command::new(AdminOpcode::CreateIoSq as u8, 0, "Create I/O SQ");
        c.sqe.dptr[0] = iova;
        c.sqe.cdw10 = qid as u32 | (entries.saturating_sub(1) & 0xffff) << 16;
        c.sqe.cdw11 = contiguous as u32 | (cqid as u32) << 16;
        c
    }
    pub fn delete_io_sq(qid: u16) -> Self {
        let mut c = Command::new(AdminOpcode::DeleteIoSq as u8, 0, "Delete I/O SQ");
        c.sqe.cdw10 = qid as u32;
        c
    }
    pub fn delete_io_cq(qid: u16) -> Self {
        let mut c = Command::new(AdminOpcode::DeleteIoCq as u8, 0, "Delete I/O CQ");
        c.sqe.cdw10 = qid as u32;
        c
    }
    pub fn set_features(fid: u8, cdw11: u32) -> Self {
        let mut c = Command::new(AdminOpcode::SetFeatures as u8, 0, "Set Features");
        c.sqe.cdw10 = fid as u32;
        c.sqe.cdw11 = cdw11;
        c
    }
    pub fn get_features(fid: u8) -> Self {
        let mut c = Command::new(AdminOpcode::GetFeatures as u8, 0, "Get Features");
        c.sqe.cdw10 = fid as u32;
        c
    }
    /// Set Features / Number of Queues (§5.21.1.7): counts are 1-based here.
    pub fn set_number_of_queues(sq: u16, cq: u16) -> Self {
        Self::set_features(
            feature::NUMBER_OF_QUEUES,
            (sq.saturating_sub(1) as u32) | (cq.saturating_sub(1) as u32) << 16,
        )
    }

    /// Sets the data pointer (and PSDT to match).
    pub fn data(mut self, ptr: DataPtr) -> Self {
        match ptr {
            DataPtr::None => {
                self.sqe.dptr = [0, 0];
                self.sqe.set_psdt(Psdt::Prp);
            }
            DataPtr::Prp { prp1, prp2 } => {
                self.sqe.dptr = [prp1, prp2];
                self.sqe.set_psdt(Psdt::Prp);
            }
            DataPtr::Sgl(d) => {
                self.sqe.dptr = d.to_words();
                self.sqe.set_psdt(Psdt::SglContiguousMeta);
            }
        }
        self
    }
    pub fn cid(mut self, cid: u16) -> Self {
        self.sqe.set_cid(cid);
        self
    }
    /// Force Unit Access for Read/Write (CDW12 bit 30).
    pub fn fua(mut self, on: bool) -> Self {
        self.sqe.cdw12 = (self.sqe.cdw12 & !(1 << 30)) | (on as u32) << 30;
        self
    }
    pub fn name(&self) -> &'static str {
        self.name
    }
    pub fn opcode(&self) -> u8 {
        self.sqe.opcode()
    }
    pub fn entry(&self) -> SubmissionEntry {
        self.sqe
    }
}

/// Name of an I/O opcode for messages.
pub fn io_opcode_name(opcode: u8) -> &'static str {
    match IoOpcode::from_raw(opcode) {
        Some(IoOpcode::Read) => "Read",
        Some(IoOpcode::Write) => "Write",
        Some(IoOpcode::Flush) => "Flush",
        Some(IoOpcode::WriteZeroes) => "Write Zeroes",
        Some(IoOpcode::DatasetManagement) => "Dataset Management",
        None => "I/O command",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::IntoBytes;

    #[test]
    fn read_encodes_per_spec() {
        let e = Command::read(1, 0x1_0000_0010, 8).cid(9).fua(true).entry();
        assert_eq!(e.opcode(), 0x02);
        assert_eq!(e.cid(), 9);
        assert_eq!(e.nsid, 1);
        assert_eq!(e.slba(), 0x1_0000_0010);
        assert_eq!(e.cdw12 & 0xffff, 7);
        assert_eq!(e.cdw12 >> 30, 1);
        assert_eq!(e.psdt(), Psdt::Prp);
    }

    #[test]
    fn sgl_data_pointer_sets_psdt_and_dptr_bytes() {
        let d = SglDescriptor::data_block(0xabc0, 512);
        let e = Command::write(1, 0, 1).data(DataPtr::Sgl(d)).entry();
        assert_eq!(e.psdt(), Psdt::SglContiguousMeta);
        assert_eq!(&e.as_bytes()[24..40], d.as_bytes());
        assert_eq!(e.sgl1(), d);
        let e = Command::write(1, 0, 1).data(DataPtr::Prp { prp1: 0x1004, prp2: 0x2000 }).entry();
        assert_eq!((e.prp1(), e.prp2(), e.psdt()), (0x1004, 0x2000, Psdt::Prp));
    }

    #[test]
    fn nlb_is_zero_based_and_clamped() {
        assert_eq!(Command::read(1, 0, MAX_NLB).entry().nlb(), MAX_NLB);
        assert_eq!(Command::read(1, 0, 1).entry().cdw12 & 0xffff, 0);
    }

    #[test]
    fn admin_commands_encode_per_spec() {
        let e = Command::create_io_cq(3, 1024, 0x4000, true).entry();
        assert_eq!(e.opcode(), 0x05);
        assert_eq!(e.cdw10, 3 | 1023 << 16);
        assert_eq!(e.cdw11, 1);
        assert_eq!(e.prp1(), 0x4000);
        let e = Command::create_io_sq(3, 64, 0x8000, 3, true).entry();
        assert_eq!(e.opcode(), 0x01);
        assert_eq!(e.cdw10, 3 | 63 << 16);
        assert_eq!(e.cdw11, 1 | 3 << 16);
        let e = Command::set_number_of_queues(8, 8).entry();
        assert_eq!((e.opcode(), e.cdw10, e.cdw11), (0x09, 0x07, 7 | 7 << 16));
        let e = Command::identify_controller().entry();
        assert_eq!((e.opcode(), e.cdw10), (0x06, 1));
        let e = Command::deallocate(1, 2).entry();
        assert_eq!((e.opcode(), e.cdw10, e.cdw11), (0x09, 1, 4));
        assert_eq!(Command::delete_io_cq(2).entry().opcode(), 0x04);
        assert_eq!(Command::delete_io_sq(2).entry().opcode(), 0x00);
    }
}
