//! Where everything of a `GioUring` lives, and its initial contents.
//!
//! Shared memory (host and executor): submission ring, completion ring,
//! control block, IOCB pool. Private memory (executor): `tt_exec_ctx`, one
//! `tt_nvmeq` per queue pair, `tt_drive`s, layer table headers, pair list
//! descriptors, and each queue's slot arrays.

use super::options::GioOptions;
use crate::drive::DriveQueues;
use crate::error::{GioError, Result};
use crate::mem::ExecMemory;
use crate::shared_ring::RingView;
use tutti_kernels::abi::{
    self, Control, DriveDesc, ExecCtx, Iocb, LayerTableDesc, NvmeQueue, PairListDesc, QueueGate,
};

/// Most parts one IOCB is split into (the submission ring has room for every
/// IOCB of the pool split this far).
pub(crate) const MAX_PARTS: u32 = 64;
/// Largest pool: IOCB indices must fit 21 bits of a slot owner word.
const MAX_DEPTH: u32 = 4096;
/// Most pair lists registered at once.
const MAX_PAIR_LISTS: u32 = 65536;

pub(crate) struct QueueLayout {
    /// Offset of the `tt_nvmeq` in private memory.
    pub desc: usize,
    pub owner: usize,
    pub time: usize,
    pub ready: usize,
    pub turn: usize,
    pub late: usize,
}

impl QueueLayout {
    /// Puts the queue's `depth` slots in the state of a fresh queue: no owner
    /// (`SLOT_FREE`), no submission time, not ready, turn 0, no expired command.
    /// Only while no executor lane can touch the queue (before it starts, or
    /// during a recovery).
    pub(crate) fn reset_slots(&self, private: &dyn ExecMemory, depth: usize) -> Result<()> {
        private.write_bytes(self.owner, &abi::SLOT_FREE.to_ne_bytes().repeat(depth))?;
        private.write_bytes(self.time, &vec![0; 8 * depth])?;
        private.write_bytes(self.ready, &vec![0; 8 * depth])?;
        private.write_bytes(self.turn, &vec![0; 4 * depth])?;
        private.write_bytes(self.late, &vec![0; 4 * depth])
    }
}

pub(crate) struct Layout {
    pub sq: usize,
    pub sq_cap: u32,
    pub cq: usize,
    pub cq_cap: u32,
    pub control: usize,
    /// One `tt_qgate` per queue pair.
    pub gates: usize,
    pub iocbs: usize,
    pub shared_len: usize,
    pub ctx: usize,
    pub queues: Vec<QueueLayout>,
    pub drives: usize,
    pub tables: usize,
    pub pair_lists: usize,
    pub private_len: usize,
}

impl Layout {
    pub(super) fn new(opts: &GioOptions, drives: &[DriveQueues]) -> Layout {
        let sq_cap = (opts.depth * MAX_PARTS).next_power_of_two();
        let cq_cap = opts.depth.next_power_of_two().max(2);
        let sq = 0;
        let cq = (sq + RingView::bytes(sq_cap)).next_multiple_of(64);
        let nq: usize = drives.iter().map(|d| d.queues.len()).sum();
        let control = (cq + RingView::bytes(cq_cap)).next_multiple_of(64);
        let gates = (control + size_of::<Control>()).next_multiple_of(64);
        let iocbs = (gates + nq * size_of::<QueueGate>()).next_multiple_of(4096);
        let shared_len = iocbs + opts.depth as usize * size_of::<Iocb>();

        let ctx = 0;
        let queues_at = (ctx + size_of::<ExecCtx>()).next_multiple_of(128);
        let drives_at = (queues_at + nq * size_of::<NvmeQueue>()).next_multiple_of(64);
        let tables = (drives_at + drives.len() * size_of::<DriveDesc>()).next_multiple_of(64);
        let pair_lists =
            (tables + opts.max_tables as usize * size_of::<LayerTableDesc>()).next_multiple_of(64);
        let mut at =
            (pair_lists + opts.max_pair_lists as usize * size_of::<PairListDesc>()).next_multiple_of(4096);
        let mut queues = Vec::with_capacity(nq);
        let mut take = |bytes: usize| {
            let here = at;
            at = (at + bytes).next_multiple_of(64);
            here
        };
        for (i, q) in drives.iter().flat_map(|d| d.queues.iter()).enumerate() {
            let depth = q.depth();
            let d = depth as usize;
            queues.push(QueueLayout {
                desc: queues_at + i * size_of::<NvmeQueue>(),
                owner: take(8 * d),
                time: take(8 * d),
                ready: take(8 * d),
                turn: take(4 * d),
                late: take(4 * d),
            });
        }
        Layout {
            sq,
            sq_cap,
            cq,
            cq_cap,
            control,
            gates,
            iocbs,
            shared_len,
            ctx,
            queues,
            drives: drives_at,
            tables,
            pair_lists,
            private_len: at,
        }
    }
}

pub(super) fn check(opts: &GioOptions, drives: &[DriveQueues]) -> Result<()> {
    if opts.depth == 0 || opts.depth > MAX_DEPTH {
        return Err(GioError::invalid(format!("depth {} is not 1..={MAX_DEPTH}", opts.depth)));
    }
    if opts.command_timeout.is_zero() || opts.submit_timeout <= opts.command_timeout {
        return Err(GioError::invalid(format!(
            "submit_timeout ({:?}) must exceed command_timeout ({:?}), which must be non-zero",
            opts.submit_timeout, opts.command_timeout
        )));
    }
    if opts.max_tables == 0 || opts.max_tables > 255 {
        return Err(GioError::invalid(format!("max_tables {} is not 1..=255", opts.max_tables)));
    }
    if opts.max_pair_lists == 0 || opts.max_pair_lists > MAX_PAIR_LISTS {
        return Err(GioError::invalid(format!(
            "max_pair_lists {} is not 1..={MAX_PAIR_LISTS}",
            opts.max_pair_lists
        )));
    }
    if drives.is_empty() || drives.len() > u16::MAX as usize {
        return Err(GioError::invalid(format!("{} drives given; 1..=65535 are supported", drives.len())));
    }
    for d in drives {
        if d.queues.is_empty() {
            return Err(GioError::invalid(format!("{}: no queue pairs", d.name)));
        }
        if !d.lba_size.is_power_of_two() || d.lba_size < 512 {
            return Err(GioError::invalid(format!(
                "{}: LBA size {} is not a power of two >= 512",
                d.name, d.lba_size
            )));
        }
        if let Some(q) = d.queues.iter().find(|q| !(2..=65536).contains(&q.depth())) {
            return Err(GioError::invalid(format!(
                "{} qid {}: depth {} is not 2..=65536",
                d.name,
                q.qid(),
                q.depth()
            )));
        }
    }
    // A withheld staging slot names its queue in 16 bits (tt_staging.held).
    let queues: usize = drives.iter().map(|d| d.queues.len()).sum();
    if queues > u16::MAX as usize {
        return Err(GioError::invalid(format!("{queues} queue pairs given; at most 65535 are supported")));
    }
    Ok(())
}
