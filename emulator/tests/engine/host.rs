//! A hand-written host for the emulated controller: admin and I/O rings in DMA
//! memory, doorbells through `Registers`, and command builders, with no driver code.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};
use tutti_driver::spec::registers::{cq_head_doorbell, offset, sq_tail_doorbell};
use tutti_driver::spec::{Aqa, Cc, CompletionEntry, Csts, Psdt, SglDescriptor, Status, SubmissionEntry};
use tutti_driver::transport::{DmaBuffer, DmaSpace, Registers};
use tutti_emulator::{EmulatedConfig, EmulatedController};

pub const DEADLINE: Duration = Duration::from_secs(10);
/// How long a "nothing is posted" check watches the queue.
pub const QUIET: Duration = Duration::from_millis(40);
pub const PAGE: usize = 4096;

pub fn pause(round: u32) {
    if round < 200 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// One SQ/CQ pair in DMA memory, with the host's ring state.
pub struct Ring {
    pub qid: u16,
    pub sq: DmaBuffer,
    pub cq: DmaBuffer,
    pub sq_entries: u32,
    pub cq_entries: u32,
    pub tail: u32,
    pub head: u32,
    pub phase: bool,
}

impl Ring {
    pub fn new(dma: &dyn DmaSpace, qid: u16, sq_entries: u32, cq_entries: u32) -> Ring {
        Ring {
            qid,
            sq: dma.alloc(sq_entries as usize * 64).unwrap(),
            cq: dma.alloc(cq_entries as usize * 16).unwrap(),
            sq_entries,
            cq_entries,
            tail: 0,
            head: 0,
            phase: true,
        }
    }

    /// Places an entry without ringing the doorbell.
    pub fn place(&mut self, mut sqe: SubmissionEntry, cid: u16) {
        sqe.set_cid(cid);
        self.sq.write_obj(self.tail as usize * 64, &sqe).unwrap();
        self.tail = (self.tail + 1) % self.sq_entries;
    }

    pub fn ring_sq(&self, regs: &dyn Registers) {
        regs.write32(sq_tail_doorbell(self.qid, 0), self.tail).unwrap();
    }

    pub fn submit(&mut self, regs: &dyn Registers, sqe: SubmissionEntry, cid: u16) {
        self.place(sqe, cid);
        self.ring_sq(regs);
    }

    /// The raw entry at CQ slot `index`.
    pub fn peek(&self, index: u32) -> CompletionEntry {
        self.cq.read_obj(index as usize * 16).unwrap()
    }

    pub fn posted(&self, index: u32, phase: bool) -> bool {
        let dw3 = self.cq.load_u32(index as usize * 16 + 12).unwrap();
        (dw3 & (1 << 16) != 0) == phase
    }

    pub fn try_reap(&mut self, regs: &dyn Registers) -> Option<CompletionEntry> {
        if !self.posted(self.head, self.phase) {
            return None;
        }
        let cqe = self.peek(self.head);
        self.head += 1;
        if self.head == self.cq_entries {
            self.head = 0;
            self.phase = !self.phase;
        }
        regs.write32(cq_head_doorbell(self.qid, 0), self.head).unwrap();
        Some(cqe)
    }

    pub fn reap(&mut self, regs: &dyn Registers) -> CompletionEntry {
        let start = Instant::now();
        let mut round = 0;
        loop {
            if let Some(c) = self.try_reap(regs) {
                return c;
            }
            assert!(start.elapsed() < DEADLINE, "qid {}: no completion within {DEADLINE:?}", self.qid);
            pause(round);
            round += 1;
        }
    }

    pub fn call(&mut self, regs: &dyn Registers, sqe: SubmissionEntry, cid: u16) -> CompletionEntry {
        self.submit(regs, sqe, cid);
        let c = self.reap(regs);
        assert_eq!(c.cid(), cid);
        assert_eq!(c.sq_id(), self.qid);
        c
    }

    /// Asserts that nothing is posted for a while.
    pub fn assert_quiet(&self) {
        let start = Instant::now();
        while start.elapsed() < QUIET {
            assert!(!self.posted(self.head, self.phase), "unexpected completion {:?}", self.peek(self.head));
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

pub fn cc_enabled() -> Cc {
    Cc::default().with_enable(true).with_page_shift(12).with_iosqes(6).with_iocqes(4)
}

pub struct Host {
    pub ctrl: EmulatedController,
    pub regs: Arc<dyn Registers>,
    pub dma: Arc<dyn DmaSpace>,
    pub admin: Ring,
    pub cid: u16,
}

impl Host {
    pub fn start(cfg: EmulatedConfig) -> Host {
        let ctrl = EmulatedController::start(cfg).unwrap();
        let (regs, dma) = (ctrl.registers(), ctrl.dma_space());
        let admin = Ring::new(&*dma, 0, 16, 16);
        let mut host = Host { ctrl, regs, dma, admin, cid: 0 };
        host.enable();
        host
    }

    pub fn enable(&mut self) {
        self.admin = Ring::new(&*self.dma, 0, 16, 16);
        self.regs.write32(offset::AQA, Aqa::new(16, 16).0).unwrap();
        self.regs.write64(offset::ASQ, self.admin.sq.iova()).unwrap();
        self.regs.write64(offset::ACQ, self.admin.cq.iova()).unwrap();
        self.regs.write32(offset::CC, cc_enabled().0).unwrap();
        self.wait_csts("CSTS.RDY = 1", |c| c.ready());
    }

    pub fn disable(&mut self) {
        self.regs.write32(offset::CC, 0).unwrap();
        self.wait_csts("CSTS = 0 after reset", |c| c.0 == 0);
    }

    pub fn csts(&self) -> Csts {
        Csts(self.regs.read32(offset::CSTS).unwrap())
    }

    pub fn wait_csts(&self, what: &str, done: impl Fn(Csts) -> bool) -> Csts {
        let start = Instant::now();
        let mut round = 0;
        loop {
            let c = self.csts();
            if done(c) {
                return c;
            }
            assert!(start.elapsed() < DEADLINE, "waiting for {what}: CSTS is {c:?}");
            pause(round);
            round += 1;
        }
    }

    pub fn next_cid(&mut self) -> u16 {
        self.cid = self.cid.wrapping_add(1);
        self.cid
    }

    pub fn admin(&mut self, sqe: SubmissionEntry) -> CompletionEntry {
        let cid = self.next_cid();
        self.admin.call(&*self.regs, sqe, cid)
    }

    pub fn io(&mut self, ring: &mut Ring, sqe: SubmissionEntry) -> CompletionEntry {
        let cid = self.next_cid();
        ring.call(&*self.regs, sqe, cid)
    }

    /// Creates CQ `qid` and SQ `qid` bound to it.
    pub fn create_pair(&mut self, qid: u16, entries: u32) -> Ring {
        let ring = Ring::new(&*self.dma, qid, entries, entries);
        assert_ok(self.admin(create_cq(qid, entries, ring.cq.iova())));
        assert_ok(self.admin(create_sq(qid, entries, qid, ring.sq.iova())));
        ring
    }

    pub fn alloc(&self, len: usize) -> DmaBuffer {
        self.dma.alloc(len).unwrap()
    }
}

pub fn assert_ok(c: CompletionEntry) {
    assert!(c.status().is_success(), "command failed: {c:?}");
}

/// Compares status codes; validation errors also carry DNR.
pub fn assert_status(c: CompletionEntry, want: Status) {
    assert_eq!(c.status().code(), want.code(), "got {c:?}, want {want}");
}

pub fn sqe(opcode: u8) -> SubmissionEntry {
    SubmissionEntry { cdw0: opcode as u32, ..Default::default() }
}

pub fn identify(cns: u32, nsid: u32, prp1: u64, prp2: u64) -> SubmissionEntry {
    SubmissionEntry { nsid, dptr: [prp1, prp2], cdw10: cns, ..sqe(0x06) }
}

pub fn create_cq(qid: u16, entries: u32, base: u64) -> SubmissionEntry {
    SubmissionEntry { dptr: [base, 0], cdw10: (entries - 1) << 16 | qid as u32, cdw11: 1, ..sqe(0x05) }
}

pub fn create_sq(qid: u16, entries: u32, cqid: u16, base: u64) -> SubmissionEntry {
    SubmissionEntry {
        dptr: [base, 0],
        cdw10: (entries - 1) << 16 | qid as u32,
        cdw11: (cqid as u32) << 16 | 1,
        ..sqe(0x01)
    }
}

pub fn delete(opcode: u8, qid: u16) -> SubmissionEntry {
    SubmissionEntry { cdw10: qid as u32, ..sqe(opcode) }
}

pub fn set_queues(nsqr: u32, ncqr: u32) -> SubmissionEntry {
    SubmissionEntry { cdw10: 0x07, cdw11: ncqr << 16 | nsqr, ..sqe(0x09) }
}

/// Read (0x02) or Write (0x01) of `nlb` blocks at `slba` of namespace 1 with PRPs.
pub fn rw(opcode: u8, slba: u64, nlb: u32, prp1: u64, prp2: u64) -> SubmissionEntry {
    SubmissionEntry {
        nsid: 1,
        dptr: [prp1, prp2],
        cdw10: slba as u32,
        cdw11: (slba >> 32) as u32,
        cdw12: nlb - 1,
        ..sqe(opcode)
    }
}

pub fn rw_sgl(opcode: u8, slba: u64, nlb: u32, sgl1: SglDescriptor) -> SubmissionEntry {
    let mut e = rw(opcode, slba, nlb, 0, 0);
    e.dptr = sgl1.to_words();
    e.set_psdt(Psdt::SglContiguousMeta);
    e
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| ((i / 512) as u8).wrapping_mul(7) ^ (i as u8).wrapping_add(seed)).collect()
}

pub fn read_buf(buf: &DmaBuffer, offset: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    buf.copy_out(offset, &mut v).unwrap();
    v
}

/// Writes a PRP list of `entries` into `list` (page-aligned data pages of `data` from `first_page`),
/// chaining after 511 entries per list page.
pub fn build_prp_list(list: &DmaBuffer, data: &DmaBuffer, first_page: usize, entries: usize) {
    let mut slot = 0usize;
    for i in 0..entries {
        let left = entries - i;
        if slot % 512 == 511 && left > 1 {
            list.write_obj(slot * 8, &list.iova_at((slot + 1) * 8)).unwrap();
            slot += 1;
        }
        list.write_obj(slot * 8, &data.iova_at((first_page + i) * PAGE)).unwrap();
        slot += 1;
    }
}

pub trait WithNsid {
    fn with_nsid(self, nsid: u32) -> Self;
}
impl WithNsid for SubmissionEntry {
    fn with_nsid(mut self, nsid: u32) -> Self {
        self.nsid = nsid;
        self
    }
}
