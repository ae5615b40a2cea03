//! Queue state: where a queue's entries are, submission and completion queues, commands pending completion.

use std::time::Instant;
use tutti_driver::spec::{Status, SubmissionEntry};

/// Where a queue's entries are: one contiguous run, or pages from a PRP list (CAP.CQR = 0).
pub(super) enum QueueMem {
    Contiguous(u64),
    Pages(Vec<u64>),
}

impl QueueMem {
    pub(super) fn entry(&self, index: u32, entry_size: usize, page_size: u64) -> u64 {
        let off = index as u64 * entry_size as u64;
        match self {
            QueueMem::Contiguous(base) => base + off,
            // An index past the list yields address 0, which the IOMMU refuses.
            QueueMem::Pages(pages) => {
                pages.get((off / page_size) as usize).map_or(0, |p| p + off % page_size)
            }
        }
    }

    /// The owner of the region holding the queue's first entry.
    pub(super) fn owner(&self, iommu: &crate::EmuIommu) -> Option<u64> {
        match self {
            QueueMem::Contiguous(base) => iommu.owner_of(*base),
            QueueMem::Pages(pages) => pages.first().and_then(|&p| iommu.owner_of(p)),
        }
    }

    /// Whether any of the queue's memory lies in another process's region.
    pub(super) fn is_remote(&self, iommu: &crate::EmuIommu) -> bool {
        match self {
            QueueMem::Contiguous(base) => iommu.is_remote(*base),
            QueueMem::Pages(pages) => pages.iter().any(|&p| iommu.is_remote(p)),
        }
    }
}

pub(super) struct Sq {
    pub(super) mem: QueueMem,
    pub(super) size: u32,
    pub(super) head: u32,
    pub(super) tail: u32,
    pub(super) cqid: u16,
    /// The last out-of-range doorbell value, so it is reported once.
    pub(super) bad_tail: Option<u32>,
    /// The ring is in another process's memory, which may vanish with it.
    pub(super) remote: bool,
    /// Fetching from the (remote) ring failed: nothing more is fetched until the SQ is deleted.
    pub(super) stopped: bool,
    /// The owner of the ring's memory (`EmuIommu` regions): its commands'
    /// data may touch only that owner's regions. `None` for the admin queue.
    pub(super) owner: Option<u64>,
}

pub(super) struct Cq {
    pub(super) mem: QueueMem,
    pub(super) size: u32,
    /// From the host's head doorbell.
    pub(super) head: u32,
    pub(super) tail: u32,
    pub(super) phase: bool,
    pub(super) bound_sqs: u32,
    /// Slots promised to completions waiting in the pending list.
    pub(super) reserved: u32,
    pub(super) bad_head: Option<u32>,
    /// The ring is in another process's memory, which may vanish with it.
    pub(super) remote: bool,
}

impl Sq {
    pub(super) fn new(mem: QueueMem, size: u32, cqid: u16) -> Sq {
        Sq { mem, size, head: 0, tail: 0, cqid, bad_tail: None, remote: false, stopped: false, owner: None }
    }
}

impl Cq {
    /// An empty CQ; the controller's phase tag starts at 1 over host-zeroed memory (§4.6).
    pub(super) fn new(mem: QueueMem, size: u32, bound_sqs: u32) -> Cq {
        Cq { mem, size, head: 0, tail: 0, phase: true, bound_sqs, reserved: 0, bad_head: None, remote: false }
    }

    /// Empty slots; one slot always stays empty, so full is tail + 1 == head (§4.1).
    pub(super) fn free(&self) -> u32 {
        (self.head + self.size - self.tail - 1) % self.size
    }
    /// Whether one more command may be fetched for this CQ without risking an overwrite.
    pub(super) fn can_accept(&self) -> bool {
        self.free() > self.reserved
    }
}

/// A completion waiting for its due time.
pub(super) struct Pending {
    pub(super) due: Instant,
    pub(super) sqid: u16,
    pub(super) cqid: u16,
    /// SQ head when the command was fetched, used if the SQ is gone at posting time.
    pub(super) sqhd: u16,
    pub(super) cid: u16,
    pub(super) dw0: u32,
    pub(super) status: Status,
    /// A command whose execution was deferred: it runs when due, and its
    /// own status replaces `status`.
    pub(super) deferred: Option<SubmissionEntry>,
}

/// What executing a command produced.
pub(super) struct Done {
    pub(super) status: Status,
    pub(super) dw0: u32,
    /// Post no earlier than this.
    pub(super) due: Option<Instant>,
    /// Not executed yet: run this I/O command when `due` comes, then post its
    /// completion ([`FaultAction::DelayExecution`]).
    pub(super) deferred: Option<SubmissionEntry>,
}

impl Done {
    pub(super) fn ok(dw0: u32) -> Done {
        Done { status: Status::SUCCESS, dw0, due: None, deferred: None }
    }
    pub(super) fn err(status: Status) -> Done {
        Done { status, dw0: 0, due: None, deferred: None }
    }
    pub(super) fn deferred(due: Instant, sqe: SubmissionEntry) -> Done {
        Done { status: Status::SUCCESS, dw0: 0, due: Some(due), deferred: Some(sqe) }
    }
}

impl From<Result<u32, Status>> for Done {
    fn from(r: Result<u32, Status>) -> Done {
        match r {
            Ok(dw0) => Done::ok(dw0),
            Err(status) => Done::err(status),
        }
    }
}
