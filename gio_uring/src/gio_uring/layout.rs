//! Where everything of a `GioUring` lives, and its initial contents.
//!
//! Shared memory (host and executor): submission ring, completion ring,
//! control block, IOCB pool. Private memory (executor): `tt_exec_ctx`, one
//! `tt_nvmeq` per queue pair, `tt_drive`s, layer table headers, pair list
//! descriptors, and each queue's slot arrays.

use super::{GioOptions, GioUring, Pool, Slot, SlotState};
use crate::drive::{DriveInfo, DriveQueues};
use crate::error::{GioError, Result};
use crate::executor::Executor;
use crate::mem::{ExecMemory, HostRange, MemKind};
use crate::shared_ring::RingView;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};
use tutti_driver::spec::SglSupport;
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
    fn new(opts: &GioOptions, drives: &[DriveQueues]) -> Layout {
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

fn check(opts: &GioOptions, drives: &[DriveQueues]) -> Result<()> {
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

fn ns(d: std::time::Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

pub(super) fn build(
    opts: &GioOptions,
    drives: Vec<DriveQueues>,
    exec: Arc<dyn Executor>,
) -> Result<GioUring> {
    check(opts, &drives)?;
    let layout = Layout::new(opts, &drives);
    let shared = exec.alloc(MemKind::Shared, layout.shared_len)?;
    let private = exec.alloc(MemKind::Private, layout.private_len)?;
    let host = shared.host_ptr().ok_or_else(|| GioError::Executor {
        executor: exec.name().into(),
        what: "shared memory has no host address".into(),
    })?;
    let at = |off: usize| -> Result<NonNull<u8>> {
        // SAFETY: every offset comes from `layout`, inside the `shared_len` bytes allocated.
        NonNull::new(unsafe { host.as_ptr().add(off) }).ok_or_else(|| GioError::invalid("null shared memory"))
    };
    // SAFETY: fresh zeroed memory of the sizes the layout computed, owned by the GioUring.
    let sq = unsafe { RingView::init(at(layout.sq)?, layout.sq_cap)? };
    // SAFETY: as above.
    let cq = unsafe { RingView::init(at(layout.cq)?, layout.cq_cap)? };
    let control = at(layout.control)?.cast::<Control>();
    let iocbs = at(layout.iocbs)?.cast::<Iocb>();
    let gates = at(layout.gates)?.cast::<QueueGate>();
    for i in 0..opts.depth {
        // SAFETY: IOCB `i` lies inside the pool; no executor runs yet.
        unsafe {
            let hdr = &raw mut (*iocbs.as_ptr().add(i as usize)).hdr;
            (*hdr).id = i;
            (*hdr).first_error = abi::NO_ERROR;
        }
    }

    let mut maps = Vec::new();
    let mut drive_info = Vec::new();
    let mut qi = 0usize;
    for (di, d) in drives.iter().enumerate() {
        let first = qi as u32;
        for q in &d.queues {
            let depth = q.depth();
            let ql = &layout.queues[qi];
            let kind = q.doorbell_kind();
            let doorbell = |p: *mut u32| NonNull::new(p).ok_or_else(|| GioError::invalid("null doorbell"));
            // SAFETY: the queue memory and doorbells belong to `q`, which the GioUring owns
            // and drops after these mappings (field order).
            let (sqm, cqm, sdb, cdb) = unsafe {
                (
                    exec.map_host(q.sq_ptr(), depth as usize * 64, HostRange::Memory)?,
                    exec.map_host(q.cq_ptr(), depth as usize * 16, HostRange::Memory)?,
                    exec.map_doorbell(doorbell(q.sq_doorbell_ptr())?, kind)?,
                    exec.map_doorbell(doorbell(q.cq_doorbell_ptr())?, kind)?,
                )
            };
            let wake = match q.sq_doorbell().wake_ptr() {
                // SAFETY: the wake word lives in the same register file as the doorbells
                // (mapped above), which `q` keeps mapped for as long.
                Some(w) => unsafe { exec.map_wake(w)? }.unwrap_or(0),
                None => 0,
            };
            let desc = NvmeQueue {
                sq: sqm.exec_addr(),
                cq: cqm.exec_addr(),
                sq_db: sdb.exec_addr(),
                cq_db: cdb.exec_addr(),
                wake,
                slot_owner: private.exec_at(ql.owner),
                slot_time: private.exec_at(ql.time),
                slot_ready: private.exec_at(ql.ready),
                slot_turn: private.exec_at(ql.turn),
                slot_late: private.exec_at(ql.late),
                depth,
                qid: q.qid() as u32,
                drive: di as u32,
                cid_shift: depth.next_power_of_two().trailing_zeros(),
                gate: shared.exec_at(layout.gates + qi * size_of::<QueueGate>()),
                hole: u64::MAX,
                ..Default::default()
            };
            private.write_obj(ql.desc, &desc)?;
            ql.reset_slots(&*private, depth as usize)?;
            maps.extend([sqm, cqm, sdb, cdb]);
            qi += 1;
        }
        let mut flags = 0;
        match d.sgl {
            SglSupport::None => {}
            SglSupport::Supported => flags |= abi::DRIVE_SGL,
            SglSupport::DwordAligned => flags |= abi::DRIVE_SGL | abi::DRIVE_SGL_DWORD,
        }
        let desc = DriveDesc {
            first_queue: first,
            nqueues: d.queues.len() as u32,
            nsid: d.nsid,
            lba_shift: d.lba_size.trailing_zeros(),
            max_lbas: d.max_lbas(),
            flags,
            rsvd: 0,
        };
        private.write_obj(layout.drives + di * size_of::<DriveDesc>(), &desc)?;
        drive_info.push(DriveInfo {
            name: d.name.clone(),
            nsid: d.nsid,
            lba_size: d.lba_size,
            blocks: d.blocks,
            max_lbas: d.max_lbas(),
            sgl: d.sgl,
            queues: first..qi as u32,
        });
    }

    let ctx = ExecCtx {
        sq_ring: shared.exec_at(layout.sq),
        cq_ring: shared.exec_at(layout.cq),
        control: shared.exec_at(layout.control),
        iocbs: shared.exec_at(layout.iocbs),
        queues: private.exec_at(layout.queues.first().map_or(0, |q| q.desc)),
        drives: private.exec_at(layout.drives),
        tables: private.exec_at(layout.tables),
        niocbs: opts.depth,
        nqueues: layout.queues.len() as u32,
        ndrives: drives.len() as u32,
        ntables: opts.max_tables,
        command_timeout_ns: ns(opts.command_timeout),
        submit_timeout_ns: ns(opts.submit_timeout),
        max_backoff_ns: ns(opts.max_backoff).clamp(32, u32::MAX as u64) as u32,
        idle_sleep_ns: ns(opts.idle_sleep).clamp(256, u32::MAX as u64) as u32,
        pair_lists: private.exec_at(layout.pair_lists),
        npair_lists: opts.max_pair_lists,
        rsvd0: 0,
    };
    private.write_obj(layout.ctx, &ctx)?;

    let slots = (0..opts.depth)
        .map(|_| Slot { gen: 0, state: SlotState::Free, count: 0, seq: 0, table: None, pair_list: None })
        .collect();
    let pool = Pool { slots, free: (0..opts.depth).rev().collect(), done: Vec::new() };
    Ok(GioUring {
        exec,
        opts: opts.clone(),
        layout,
        sq,
        cq,
        control,
        gates,
        iocbs,
        pool: Mutex::new(pool),
        tables: Mutex::new((0..opts.max_tables).map(|_| None).collect()),
        pair_lists: Mutex::new((0..opts.max_pair_lists).map(|_| Default::default()).collect()),
        seq: AtomicU32::new(0),
        drive_info,
        recovery: Mutex::new(vec![super::recover::DriveHealth::Serving; drives.len()]),
        _maps: maps,
        _shared: shared,
        private,
        drives,
    })
}
