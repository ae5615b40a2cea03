//! Recovering a drive's queue pairs: after expired commands (whose late DMA
//! the controller may still perform) or a dead queue.
//!
//! The host closes the drive's queues (`tt_qgate.recovering`), so the
//! executor refuses new commands for them with `IoStatus::QueueRecovering`,
//! and waits, with a deadline, until no admitted command is left on them
//! (`tt_qgate.users` at 0: no lane is inside the queues). It then deletes and
//! recreates each pair on the controller — §5.6: Delete I/O Submission Queue
//! completes only after every command of the SQ was completed or aborted, so
//! nothing submitted earlier can move data afterwards — resets the executor's
//! queue state to that of a fresh pair, bumps each gate's `epoch` (staging
//! slots withheld for commands of the old pairs come back: `tt_stage_reclaim`),
//! and opens the queues again.

use super::state::DriveHealth;
use super::GioUring;
use crate::error::{GioError, Result};
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::time::{Duration, Instant};
use tutti_kernels::abi::NvmeQueue;

/// What [`GioUring::recover_drive`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveryReport {
    pub drive: u16,
    /// NVMe queue ids deleted and created again.
    pub qids: Vec<u16>,
    /// Queues that were dead (a submitter had given up) before the recovery.
    pub dead_queues: u32,
    /// Commands expired on the drive's queues since the ring started (the
    /// executor's counters). Every one of them is now known to be finished:
    /// it was executed before the recovery or aborted by the SQ deletion.
    pub expired_commands: u64,
    /// How long the queues were closed.
    pub elapsed: Duration,
}

/// The words of one `tt_qgate` the host touches.
pub(crate) struct Gate<'a> {
    pub recovering: &'a AtomicU32,
    pub users: &'a AtomicU32,
    pub epoch: &'a AtomicU32,
}

impl GioUring {
    /// The gate of queue `q` (< number of queues).
    pub(crate) fn gate(&self, q: usize) -> Gate<'_> {
        debug_assert!(q < self.layout.queues.len());
        // SAFETY: the gate array holds one `tt_qgate` per queue in shared memory owned by
        // `self`; these words are only ever accessed atomically, by the host and the executor.
        unsafe {
            let g = self.gates.as_ptr().add(q);
            Gate {
                recovering: AtomicU32::from_ptr(&raw mut (*g).recovering),
                users: AtomicU32::from_ptr(&raw mut (*g).users),
                epoch: AtomicU32::from_ptr(&raw mut (*g).epoch),
            }
        }
    }

    /// Deletes and recreates every queue pair of `drive`, so that no command
    /// submitted earlier — one expired after the command timeout, or one
    /// stranded on a dead queue — can still touch memory or media, and a dead
    /// queue serves again.
    ///
    /// While it runs, IOCTXs for the drive fail with
    /// `IoStatus::QueueRecovering` (never sent). It waits until `timeout` for
    /// commands already admitted to the drive's queues to finish (each is
    /// bounded by the command and submit timeouts); if some are still in
    /// flight then, it opens the queues again untouched and returns
    /// [`GioError::RecoveryBusy`]. Each admin command is bounded by the
    /// controller's admin timeout. If a queue pair cannot be deleted or
    /// created again, its state on the controller is unknown: the drive is
    /// reported failed ([`GioError::DriveFailed`]) and its queues stay closed
    /// for the life of the ring.
    pub fn recover_drive(&self, drive: u16, timeout: Duration) -> Result<RecoveryReport> {
        let start = Instant::now();
        let info = self.drive_info.get(drive as usize).ok_or_else(|| {
            GioError::invalid(format!("drive {drive}: the ring has {}", self.drive_info.len()))
        })?;
        let mut health =
            self.recovery.lock().map_err(|_| GioError::invalid("recovery lock poisoned by a panic"))?;
        let failed =
            |what: String, source| GioError::DriveFailed { drive, name: info.name.clone(), what, source };
        if let Some(DriveHealth::Failed(what)) = health.get(drive as usize) {
            return Err(failed(what.clone(), None));
        }
        let queues = info.queues.start as usize..info.queues.end as usize;

        for q in queues.clone() {
            self.gate(q).recovering.store(1, Ordering::SeqCst);
        }
        // Pairs with the executor's fence between joining `users` and reading `recovering`
        // (tt_warp_enter): a lane either sees the queue closed or is counted below.
        fence(Ordering::SeqCst);
        let deadline = start + timeout;
        loop {
            let users: u32 = queues.clone().map(|q| self.gate(q).users.load(Ordering::SeqCst)).sum();
            if users == 0 {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                self.open(queues.clone());
                tracing::warn!(drive, name = %info.name, users, "drive recovery gave up: commands in flight");
                return Err(GioError::RecoveryBusy {
                    drive,
                    name: info.name.clone(),
                    users,
                    waited: now - start,
                });
            }
            std::thread::sleep((deadline - now).min(Duration::from_millis(1)));
        }

        // A relayed doorbell value still in its mailbox belongs to the queues about to be
        // deleted: forward it now, or it would reach the recreated ones.
        if let Err(e) = self.exec.flush_doorbells() {
            self.open(queues.clone());
            tracing::warn!(drive, name = %info.name, error = %e, "drive recovery gave up: doorbells not flushed");
            return Err(e);
        }
        let pairs = &self.drives[drive as usize].queues;
        let mut report = RecoveryReport {
            drive,
            qids: pairs.iter().map(|p| p.qid()).collect(),
            dead_queues: 0,
            expired_commands: 0,
            elapsed: Duration::ZERO,
        };
        for (q, pair) in queues.clone().zip(pairs) {
            let ql = &self.layout.queues[q];
            let mut s: NvmeQueue = self.private.read_obj(ql.desc)?;
            report.dead_queues += u32::from(s.dead != 0);
            report.expired_commands += s.expired;
            if let Err(e) = pair.recreate() {
                let what = format!("qid {}: deleting and creating the queue pair again failed", pair.qid());
                tracing::error!(drive, name = %info.name, qid = pair.qid(), error = %e, "drive recovery failed; queues stay closed");
                if let Some(h) = health.get_mut(drive as usize) {
                    *h = DriveHealth::Failed(format!("{what}: {e}"));
                }
                return Err(failed(what, Some(Box::new(e))));
            }
            // The state of a fresh pair (layout::build), keeping the statistics.
            let depth = s.depth as usize;
            s.ticket = 0;
            s.hole = u64::MAX;
            s.sq_tail = 0;
            s.tail_lock = 0;
            s.dead = 0;
            s.cq_head = 0;
            s.sq_head = 0;
            s.head_lock = 0;
            self.private.write_obj(ql.desc, &s)?;
            ql.reset_slots(&*self.private, depth)?;
            // Nothing submitted to the old pair can move data any more: a staging slot withheld
            // for one of its commands may be handed out again (tt_stage_reclaim). Release: a lane
            // that sees the new epoch sees the reset state too.
            self.gate(q).epoch.fetch_add(1, Ordering::Release);
        }
        self.open(queues);
        report.elapsed = start.elapsed();
        tracing::info!(
            drive,
            name = %info.name,
            qids = ?report.qids,
            dead_queues = report.dead_queues,
            expired_commands = report.expired_commands,
            "drive recovered: queue pairs deleted and created again"
        );
        Ok(report)
    }

    /// Opens queues closed for recovery. The release store orders every reset
    /// of their state before a lane that sees them open.
    fn open(&self, queues: std::ops::Range<usize>) {
        for q in queues {
            self.gate(q).recovering.store(0, Ordering::Release);
        }
    }
}
