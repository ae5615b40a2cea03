//! What a [`GioUring`](super::GioUring) holds besides its memory layout: the
//! IOCB pool, the slots of its table and pair-list registries, a staged
//! table's slots, and each drive's health. Plain state; the operations on
//! it are in the sibling files.

use crate::error::Result;
use crate::iocb::IocbResult;
use crate::mem::{ExecMemory, HostMapping, HostMemory};
use tutti_driver::transport::{DmaBuffer, DmaMapping};
use tutti_kernels::abi::{RingHeader, StagingDesc};

/// Offsets inside a staging descriptor allocation: the descriptor, the free ring, the data pointers.
pub(super) const RING_AT: usize = 128;

#[derive(Debug)]
pub(crate) enum SlotState {
    Free,
    Filling,
    InFlight,
    Done(Box<IocbResult>),
}

impl SlotState {
    pub(super) fn name(&self) -> &'static str {
        match self {
            SlotState::Free => "free",
            SlotState::Filling => "being filled",
            SlotState::InFlight => "in flight",
            SlotState::Done(_) => "completed",
        }
    }
}

#[derive(Debug)]
pub(crate) struct Slot {
    pub(super) gen: u32,
    pub(super) state: SlotState,
    /// IOCTXs filled in (explicit IOCBs) or to be expanded (layer IOCBs).
    pub(super) count: u32,
    /// Sequence number of the current issue.
    pub(super) seq: u32,
    /// Layer table of a layer IOCB.
    pub(super) table: Option<u8>,
    /// Registered pair list (slot index) a list layer IOCB expands.
    pub(super) pair_list: Option<u32>,
}

pub(crate) struct Pool {
    pub(super) slots: Vec<Slot>,
    pub(super) free: Vec<u32>,
    /// Completed, not yet collected.
    pub(super) done: Vec<u32>,
}

pub(crate) struct TableSlot {
    pub(super) info: TableInfo,
    pub(super) _entries: Box<dyn ExecMemory>,
    /// A staged table's slots; dropped after the entries.
    pub(super) staging: Option<Staging>,
}

/// What `submit_layer` needs to know about a registered table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableInfo {
    pub layers: u32,
    pub files: u32,
    pub blocks: u32,
    pub chunks: u32,
    /// IOCTXs one (file, block) pair expands to: 2 x chunks.
    pub ioctx_per_pair: u32,
}

/// One slot of the pair list registry.
#[derive(Default)]
pub(crate) struct PairListSlot {
    /// Bumped on every registration in this slot.
    pub(super) gen: u32,
    pub(super) list: Option<Registered>,
}

pub(super) struct Registered {
    pub(super) len: u32,
    /// The pairs, where the executor reads them. Freed only after the
    /// descriptor was cleared and no IOCB references the slot.
    pub(super) _mem: Box<dyn ExecMemory>,
}

/// Whether a drive's queues serve commands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum DriveHealth {
    Serving,
    /// A queue pair could not be deleted or created again; the controller
    /// needs a reset. Its queues stay closed.
    Failed(String),
}

/// What a staged table's staging is, for reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct StagingStats {
    pub slots: u32,
    pub slot_bytes: u32,
    /// Bytes of pinned host memory the slots take.
    pub bytes: u64,
    /// Times a lane found no free slot and waited (backpressure).
    pub waits: u64,
    /// Times a slot was taken out of use because its command's outcome was
    /// unknown (the drive might still move data through it).
    pub withheld: u64,
    /// Slots out of use for that reason now.
    pub withheld_now: u64,
    /// Slots a lane holds now: neither free nor withheld (read without stopping the
    /// executor, so a snapshot that may be a slot or two behind while lanes run).
    pub in_use_now: u64,
    /// Withheld slots handed back after the queue pair their command was
    /// submitted on was deleted and created again.
    pub reclaimed_after_reset: u64,
    /// Withheld slots handed back after their command completed late.
    pub reclaimed_late: u64,
    /// Bytes copied between slots and KV memory by the executor.
    pub staged_bytes: u64,
}

/// The slots of one staged table. Fields drop in order: the executor's
/// mapping, the drives' mappings and PRP lists, the descriptor, then the memory.
pub(crate) struct Staging {
    pub(super) _exec: Box<dyn HostMapping>,
    pub(super) _dma: Vec<DmaMapping>,
    pub(super) _lists: Vec<DmaBuffer>,
    pub(super) desc: Box<dyn ExecMemory>,
    pub(super) _mem: HostMemory,
    pub(super) slots: u32,
    pub(super) slot_bytes: u32,
}

impl Staging {
    /// Executor address of the `tt_staging` descriptor.
    pub(crate) fn exec_addr(&self) -> u64 {
        self.desc.exec_addr()
    }

    pub(super) fn stats(&self) -> Result<StagingStats> {
        let d: StagingDesc = self.desc.read_obj(0)?;
        let ring: RingHeader = self.desc.read_obj(RING_AT)?;
        let free = ring.tail.wrapping_sub(ring.head).min(self.slots as u64);
        Ok(StagingStats {
            in_use_now: (self.slots as u64).saturating_sub(free).saturating_sub(d.held_now),
            slots: self.slots,
            slot_bytes: self.slot_bytes,
            bytes: self.slots as u64 * self.slot_bytes as u64,
            waits: d.waits,
            withheld: d.withheld,
            withheld_now: d.held_now,
            reclaimed_after_reset: d.reclaimed_reset,
            reclaimed_late: d.reclaimed_late,
            staged_bytes: d.staged_bytes,
        })
    }
}
