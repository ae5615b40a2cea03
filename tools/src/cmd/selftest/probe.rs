//! Conformance probes: malformed or edge-case commands with the status the
//! NVMe base specification (1.4) requires, sent to a controller through a raw
//! queue pair (or the admin queue) so nothing in the driver fixes them up
//! first. Run against QEMU's controller and the emulated one, the table shows
//! where the two disagree and which of them the spec backs.

use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tutti_driver::command::Command;
use tutti_driver::controller::Controller;
use tutti_driver::queue::RawQueuePair;
use tutti_driver::spec::{CompletionEntry, Psdt, SglDescriptor, Status, SubmissionEntry};
use tutti_driver::transport::DmaBuffer;

const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Identify Controller SGLS bits (§5.15.2.1, Figure 247).
const SGLS_BIT_BUCKET: u32 = 1 << 16;
const SGLS_LONGER_THAN_DATA: u32 = 1 << 18;

/// One probe's outcome.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ProbeResult {
    pub name: &'static str,
    /// The rule, with its section.
    pub rule: &'static str,
    /// What the spec requires.
    pub expected: Option<String>,
    /// What the controller posted (`timeout` when nothing came back).
    pub got: String,
    pub conforms: bool,
}

/// A submission/completion pair driven by hand.
struct Raw {
    qp: RawQueuePair,
    tail: u32,
    head: u32,
    phase: bool,
    cid: u16,
}

impl Raw {
    /// Submits `sqe` and waits for its completion; `None` after the deadline.
    fn exec(&mut self, mut sqe: SubmissionEntry) -> anyhow::Result<Option<CompletionEntry>> {
        self.cid = self.cid.wrapping_add(1);
        sqe.set_cid(self.cid);
        let slot = self.tail as usize * 64;
        // SAFETY: `slot` is one of the `depth` 64-byte entries of the page-aligned SQ
        // memory the queue pair keeps alive; the device reads it only after the doorbell.
        unsafe { self.qp.sq_ptr().add(slot).cast::<SubmissionEntry>().write_volatile(sqe) };
        self.tail = (self.tail + 1) % self.qp.depth();
        fence(Ordering::Release);
        self.qp.sq_doorbell().ring(self.tail);
        let deadline = Instant::now() + PROBE_TIMEOUT;
        loop {
            let at = self.head as usize * 16;
            // SAFETY: DW3 of CQ entry `head`, 4-byte aligned inside the CQ memory the queue
            // pair owns; the device writes it, so it is read with an atomic acquire load.
            let dw3 =
                unsafe { AtomicU32::from_ptr(self.qp.cq_ptr().add(at + 12).cast()) }.load(Ordering::Acquire);
            if (dw3 >> 16) & 1 == self.phase as u32 {
                // SAFETY: the whole aligned 16-byte entry, published before its phase bit (read above).
                let cqe = unsafe { self.qp.cq_ptr().add(at).cast::<CompletionEntry>().read_volatile() };
                self.head = (self.head + 1) % self.qp.depth();
                if self.head == 0 {
                    self.phase = !self.phase;
                }
                self.qp.cq_doorbell().ring(self.head);
                return Ok(Some(cqe));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::yield_now();
        }
    }
}

fn with_prp(cmd: Command, prp1: u64, prp2: u64) -> SubmissionEntry {
    let mut e = cmd.entry();
    e.dptr = [prp1, prp2];
    e.set_psdt(Psdt::Prp);
    e
}

fn with_sgl(cmd: Command, d: SglDescriptor) -> SubmissionEntry {
    let mut e = cmd.entry();
    e.dptr = d.to_words();
    e.set_psdt(Psdt::SglContiguousMeta);
    e
}

fn status_text(s: Status) -> String {
    format!("{s}")
}

/// What the spec requires of a probe.
#[derive(Clone, Copy)]
enum Expect {
    Exactly(Status),
    /// Some error; the spec names no single status.
    AnyError,
}

fn judge(name: &'static str, rule: &'static str, expected: Expect, got: Option<Status>) -> ProbeResult {
    let conforms = match (expected, got) {
        (Expect::Exactly(e), Some(g)) => e.code() == g.code(),
        (Expect::AnyError, Some(g)) => !g.is_success(),
        (_, None) => false,
    };
    ProbeResult {
        name,
        rule,
        expected: Some(match expected {
            Expect::Exactly(e) => status_text(e),
            Expect::AnyError => "any error status".into(),
        }),
        got: got.map_or("timeout (no completion)".into(), status_text),
        conforms,
    }
}

/// Runs every probe on `ctrl` (namespace 1). Leaves the controller usable.
pub fn run(ctrl: &Arc<Controller>) -> anyhow::Result<Vec<ProbeResult>> {
    let info = ctrl.info().clone();
    let ns = info.namespace(1).cloned().ok_or_else(|| anyhow::anyhow!("namespace 1 is missing"))?;
    let lba = ns.lba_size as u64;
    let dma = ctrl.dma().clone();
    let id_page = dma.alloc(4096)?;
    ctrl.admin_command(Command::identify_controller(), Some(&id_page))?;
    let sgls = id_page.read_obj::<u32>(536)?;
    let nn = id_page.read_obj::<u32>(516)?;
    // Data pages for the I/O probes, and a page for PRP lists / SGL segments.
    let buf: DmaBuffer = dma.alloc((info.max_transfer + 2 * 4096) as usize)?;
    let list: DmaBuffer = dma.alloc(4096)?;
    let page = |i: u64| buf.iova() + i * 4096;
    let mut raw = Raw { qp: ctrl.create_raw_queue_pair(16)?, tail: 0, head: 0, phase: true, cid: 0 };
    let mut out = Vec::new();
    out.push(judge(
        "Number of Queues while an I/O queue exists",
        "§5.21.1.7: only before any I/O queue is created → Command Sequence Error",
        Expect::Exactly(Status::COMMAND_SEQUENCE_ERROR),
        match ctrl
            .admin_command(Command::set_number_of_queues(info.io_queue_pairs, info.io_queue_pairs), None)
        {
            Ok(c) => Some(c.status),
            Err(e) => e.status(),
        },
    ));
    let mut io = |name, rule, expected: Expect, sqe: SubmissionEntry| -> anyhow::Result<()> {
        let got = raw.exec(sqe)?.map(|c| c.status());
        out.push(judge(name, rule, expected, got));
        Ok(())
    };
    let blocks_per_page = (4096 / lba).max(1) as u32;

    io(
        "read one block (PRP)",
        "baseline",
        Expect::Exactly(Status::SUCCESS),
        with_prp(Command::read(1, 0, 1), page(0), 0),
    )?;
    io(
        "read past the end",
        "§6.9: SLBA+NLB beyond NSZE → LBA Out of Range",
        Expect::Exactly(Status::LBA_OUT_OF_RANGE),
        with_prp(Command::read(1, ns.blocks, 1), page(0), 0),
    )?;
    io(
        "read straddling the end",
        "§6.9: SLBA+NLB beyond NSZE → LBA Out of Range",
        Expect::Exactly(Status::LBA_OUT_OF_RANGE),
        with_prp(Command::read(1, ns.blocks - 1, 2), page(0), page(1)),
    )?;
    // §6.1.5 (NSID usage): an NSID above NN is invalid → Invalid Namespace or Format;
    // one in 1..=NN that is not active → Invalid Field in Command.
    io(
        "NSID above NN (invalid)",
        "§6.1.5: invalid NSID → Invalid Namespace or Format",
        Expect::Exactly(Status::INVALID_NAMESPACE),
        with_prp(Command::read(nn.saturating_add(1).min(0xffff_fffe), 0, 1), page(0), 0),
    )?;
    if let Some(inactive) = (1..=nn.min(1024)).find(|n| info.namespace(*n).is_none()) {
        io(
            "NSID within NN but inactive",
            "§6.1.5: inactive NSID → Invalid Field in Command",
            Expect::Exactly(Status::INVALID_FIELD),
            with_prp(Command::read(inactive, 0, 1), page(0), 0),
        )?;
    }
    io(
        "Read to the broadcast NSID",
        "§6.9: Read does not take NSID FFFFFFFFh → an error",
        Expect::AnyError,
        with_prp(Command::read(0xffff_ffff, 0, 1), page(0), 0),
    )?;
    let mut bad = Command::read(1, 0, 1).entry();
    bad.cdw0 = (bad.cdw0 & !0xff) | 0x7e;
    bad.dptr = [page(0), 0];
    io(
        "reserved I/O opcode 7Eh",
        "§4.6.1.2.1: Invalid Command Opcode",
        Expect::Exactly(Status::INVALID_OPCODE),
        bad,
    )?;
    let over = (info.max_transfer / lba + 1) as u32;
    let pages_over = (over as u64 * lba).div_ceil(4096);
    for i in 0..pages_over.saturating_sub(1) {
        list.write_obj(i as usize * 8, &page(i + 1))?;
    }
    io(
        "transfer one block above MDTS",
        "§5.15.2.1 (MDTS): a larger command is aborted with Invalid Field in Command",
        Expect::Exactly(Status::INVALID_FIELD),
        with_prp(Command::read(1, 0, over), page(0), list.iova()),
    )?;
    io(
        "PRP1 offset not dword aligned",
        "§4.3: PRP offset bits 1:0 shall be 00b → PRP Offset Invalid",
        Expect::Exactly(Status::PRP_OFFSET_INVALID),
        with_prp(Command::read(1, 0, 1), page(0) + 2, page(1)),
    )?;
    if lba == 512 {
        // 4 blocks from offset 0xe00: 0x200 in the first page, 0x600 in the second.
        io(
            "PRP2 (second page) with an offset",
            "§4.3: entries after the first have offset 0 → PRP Offset Invalid",
            Expect::Exactly(Status::PRP_OFFSET_INVALID),
            with_prp(Command::read(1, 0, 4), page(0) + 0xe00, page(1) + 0x200),
        )?;
    }
    list.write_obj(0, &(page(1) + 0x400))?;
    list.write_obj(8, &page(2))?;
    io(
        "PRP list entry with an offset",
        "§4.3: entries after the first have offset 0 → PRP Offset Invalid",
        Expect::Exactly(Status::PRP_OFFSET_INVALID),
        with_prp(Command::read(1, 0, 3 * blocks_per_page), page(0), list.iova()),
    )?;
    if info.sgl.available() {
        io(
            "SGL data block (baseline)",
            "§4.4: one Data Block describing the transfer",
            Expect::Exactly(Status::SUCCESS),
            with_sgl(Command::read(1, 0, 1), SglDescriptor::data_block(page(0), lba as u32)),
        )?;
        io(
            "SGL shorter than the transfer",
            "§4.4 / §4.6.1.2.1: Data SGL Length Invalid",
            Expect::Exactly(Status::DATA_SGL_LENGTH_INVALID),
            with_sgl(Command::read(1, 0, 2), SglDescriptor::data_block(page(0), lba as u32)),
        )?;
        io(
            "SGL longer than the transfer",
            "§5.15.2.1 SGLS bit 18: only if supported, else Data SGL Length Invalid",
            if sgls & SGLS_LONGER_THAN_DATA != 0 {
                Expect::Exactly(Status::SUCCESS)
            } else {
                Expect::Exactly(Status::DATA_SGL_LENGTH_INVALID)
            },
            with_sgl(Command::read(1, 0, 1), SglDescriptor::data_block(page(0), 2 * lba as u32)),
        )?;
        let mut reserved = SglDescriptor::data_block(page(0), lba as u32);
        reserved.id = 0xe0;
        io(
            "SGL descriptor of reserved type Eh",
            "§4.6.1.2.1: SGL Descriptor Type Invalid",
            Expect::Exactly(Status::SGL_TYPE_INVALID),
            with_sgl(Command::read(1, 0, 1), reserved),
        )?;
        // A Last Segment holding a data block for the first half and a bit bucket for the rest.
        let half = (lba / 2) as u32;
        list.write_obj(0, &SglDescriptor::data_block(page(0), half))?;
        list.write_obj(16, &SglDescriptor::bit_bucket(half))?;
        io(
            "SGL bit bucket in a Read",
            "§4.4 / SGLS bit 16: allowed if supported, else SGL Descriptor Type Invalid",
            if sgls & SGLS_BIT_BUCKET != 0 {
                Expect::Exactly(Status::SUCCESS)
            } else {
                Expect::Exactly(Status::SGL_TYPE_INVALID)
            },
            with_sgl(Command::read(1, 0, 1), SglDescriptor::last_segment(list.iova(), 32)),
        )?;
        list.write_obj(0, &SglDescriptor::data_block(page(0), half))?;
        list.write_obj(16, &SglDescriptor::segment(list.iova(), 16))?;
        io(
            "Segment descriptor inside a Last Segment",
            "§4.4: a Last Segment holds no segment descriptor → Invalid SGL Segment Descriptor",
            Expect::Exactly(Status::INVALID_SGL_SEGMENT),
            with_sgl(Command::read(1, 0, 1), SglDescriptor::last_segment(list.iova(), 32)),
        )?;
        let mut psdt3 = with_prp(Command::read(1, 0, 1), page(0), 0);
        psdt3.set_psdt(Psdt::Reserved);
        io(
            "PSDT 11b (reserved)",
            "§4.2: reserved value → Invalid Field in Command",
            Expect::Exactly(Status::INVALID_FIELD),
            psdt3,
        )?;
    }
    let mut unused = with_prp(Command::read(1, 0, 1), page(0), 0);
    unused.cdw2 = 0xdead_beef;
    io(
        "read one block (PRP) after the probes",
        "the queue still works",
        Expect::Exactly(Status::SUCCESS),
        unused,
    )?;
    drop(raw);

    // Admin probes: the admin queue is the driver's, so these go through it.
    let admin = |name, rule, expected: Expect, cmd: Command, data: Option<&DmaBuffer>| {
        let got = match ctrl.admin_command(cmd, data) {
            Ok(c) => Some(c.status),
            Err(e) => e.status(),
        };
        judge(name, rule, expected, got)
    };
    let spare_qid = info.io_queue_pairs; // granted but never used by these probes
    out.push(admin(
        "Identify with reserved CNS FEh",
        "§5.15: unsupported CNS → Invalid Field in Command",
        Expect::Exactly(Status::INVALID_FIELD),
        Command::identify(0xfe, 0),
        Some(&id_page),
    ));
    out.push(admin(
        "Delete I/O SQ that does not exist",
        "§5.6: Invalid Queue Identifier",
        Expect::Exactly(Status::INVALID_QID),
        Command::delete_io_sq(spare_qid),
        None,
    ));
    out.push(admin(
        "Delete I/O CQ 0 (the admin CQ)",
        "§5.5: Invalid Queue Identifier",
        Expect::Exactly(Status::INVALID_QID),
        Command::delete_io_cq(0),
        None,
    ));
    let qmem = dma.alloc(64 * 4096)?;
    // A create that must be refused; if the controller creates the queue anyway, `undo` deletes it.
    let refused_create = |name, rule, status: Status, cmd: Command, undo: Command| {
        let r = admin(name, rule, Expect::Exactly(status), cmd, None);
        if r.got.contains("Successful") {
            let _ = ctrl.admin_command(undo, None);
        }
        r
    };
    out.push(refused_create(
        "Create I/O CQ larger than MQES",
        "§5.3: Invalid Queue Size",
        Status::INVALID_QUEUE_SIZE,
        Command::create_io_cq(spare_qid, info.max_queue_entries + 1, qmem.iova(), true),
        Command::delete_io_cq(spare_qid),
    ));
    out.push(refused_create(
        "Create I/O CQ of one entry",
        "§4.1.3: the minimum queue size is two entries → Invalid Queue Size",
        Status::INVALID_QUEUE_SIZE,
        Command::create_io_cq(spare_qid, 1, qmem.iova(), true),
        Command::delete_io_cq(spare_qid),
    ));
    out.push(refused_create(
        "Create I/O CQ above the granted count",
        "§5.3 / §5.21.1.7: Invalid Queue Identifier",
        Status::INVALID_QID,
        Command::create_io_cq(spare_qid + 1, 16, qmem.iova(), true),
        Command::delete_io_cq(spare_qid + 1),
    ));
    out.push(refused_create(
        "Create I/O SQ on a CQ that does not exist",
        "§5.4: Completion Queue Invalid",
        Status::CQ_INVALID,
        Command::create_io_sq(spare_qid, 16, qmem.iova(), spare_qid, true),
        Command::delete_io_sq(spare_qid),
    ));
    let mut sgl_identify = Command::identify_controller();
    sgl_identify = sgl_identify
        .data(tutti_driver::command::DataPtr::Sgl(SglDescriptor::data_block(id_page.iova(), 4096)));
    out.push(admin(
        "Identify with an SGL data pointer",
        "§4.2 (PSDT): admin commands over PCIe use PRPs → Invalid Field in Command",
        Expect::Exactly(Status::INVALID_FIELD),
        sgl_identify,
        None,
    ));
    out.push(admin(
        "Number of Queues after I/O queues were deleted",
        "§5.21.1.7: only before any I/O queue is created → Command Sequence Error",
        Expect::Exactly(Status::COMMAND_SEQUENCE_ERROR),
        Command::set_number_of_queues(info.io_queue_pairs, info.io_queue_pairs),
        None,
    ));
    out.push(admin(
        "Get Features, reserved FID 7Eh",
        "§5.9: unsupported feature → Invalid Field in Command",
        Expect::Exactly(Status::INVALID_FIELD),
        Command::get_features(0x7e),
        None,
    ));
    Ok(out)
}

/// Prints the table.
pub fn print(device: &str, results: &[ProbeResult]) {
    let diffs = results.iter().filter(|r| !r.conforms).count();
    println!("probe {device}: {} probes, {diffs} differ from the spec", results.len());
    for r in results {
        println!(
            "probe {device}: {:<44} {:<4} got {}{}",
            r.name,
            if r.conforms { "ok" } else { "DIFF" },
            r.got,
            match (&r.expected, r.conforms) {
                (Some(e), false) => format!("; spec wants {e} ({})", r.rule),
                _ => String::new(),
            }
        );
    }
}
