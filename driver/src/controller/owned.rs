//! The owner's admin path: the admin queue (with one page for Identify data
//! and other small payloads), the I/O queue ids granted at bring-up, queue
//! creation and deletion by admin command, and §7.6.2 shutdown.

use super::{csts, poisoned, AdminPath, QueueAdmin};
use crate::command::Command;
use crate::error::{DriverError, Result};
use crate::queue::{Completion, QueueCore};
use crate::transport::{DmaBuffer, Registers};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use zerocopy::FromBytes;

/// The admin path of a controller this process brought up.
pub(super) struct OwnedAdmin {
    name: String,
    regs: Arc<dyn Registers>,
    queue: Mutex<AdminQueue>,
    /// Which I/O queue ids are claimed (index 0 is the admin queue).
    qids: Mutex<Vec<bool>>,
    /// I/O queue pairs asked for at bring-up (named when none is left).
    requested: u16,
    /// Memory page size in use: queue memory must be aligned to it.
    page_size: u64,
    admin_timeout: Duration,
    /// How long shutdown waits for SHST.
    ready_wait: Duration,
}

/// The admin queue and its payload page, locked together.
struct AdminQueue {
    core: QueueCore,
    page: DmaBuffer,
}

/// How an [`OwnedAdmin`] runs its commands.
pub(super) struct AdminSettings {
    pub requested: u16,
    pub page_size: u64,
    pub admin_timeout: Duration,
    pub ready_wait: Duration,
}

impl OwnedAdmin {
    /// The admin path over admin queue `core` (created and enabled), with
    /// `page` for small payloads. No I/O queue id is granted until [`grant`](Self::grant).
    pub(super) fn new(
        name: String,
        regs: Arc<dyn Registers>,
        core: QueueCore,
        page: DmaBuffer,
        settings: AdminSettings,
    ) -> Self {
        OwnedAdmin {
            name,
            regs,
            queue: Mutex::new(AdminQueue { core, page }),
            qids: Mutex::new(Vec::new()),
            requested: settings.requested,
            page_size: settings.page_size,
            admin_timeout: settings.admin_timeout,
            ready_wait: settings.ready_wait,
        }
    }

    /// Makes I/O queue ids 1..=`granted` claimable (Set Features, Number of Queues, granted them).
    pub(super) fn grant(&self, granted: u16) -> Result<()> {
        *self.qids.lock().map_err(|_| poisoned(&self.name))? = vec![false; granted as usize + 1];
        Ok(())
    }

    /// Runs an admin command that returns one page and decodes it as `T`.
    pub(super) fn read<T: FromBytes>(&self, cmd: Command) -> Result<T> {
        let mut q = self.queue.lock().map_err(|_| poisoned(&self.name))?;
        let AdminQueue { core, page } = &mut *q;
        page.fill(0);
        self.run(core, cmd, Some(page.iova()))?;
        let mut bytes = vec![0u8; 4096];
        page.copy_out(0, &mut bytes)?;
        T::read_from_prefix(&bytes).map(|(t, _)| t).map_err(|_| DriverError::BadDeviceResponse {
            device: self.name.clone(),
            what: format!("{} returned a short payload", cmd.name()),
        })
    }

    fn run(&self, q: &mut QueueCore, cmd: Command, prp1: Option<u64>) -> Result<Completion> {
        let mut entry = cmd.entry();
        if let Some(p) = prp1 {
            entry.dptr = [p, 0];
        }
        let cid = q.submit(entry, cmd.name(), 0)?;
        q.ring();
        let c = q.wait(cid, self.admin_timeout, || csts::check_fatal(&*self.regs, &self.name))?;
        if !c.status.is_success() {
            return Err(DriverError::CommandFailed {
                device: self.name.clone(),
                qid: 0,
                cid,
                command: cmd.name(),
                status: c.status,
            });
        }
        Ok(c)
    }

    /// An error unless `qid` is a claimed I/O queue id.
    fn check_claimed(&self, qid: u16) -> Result<()> {
        let qids = self.qids.lock().map_err(|_| poisoned(&self.name))?;
        if qid == 0 || !qids.get(qid as usize).copied().unwrap_or(false) {
            return Err(DriverError::invalid(format!(
                "{}: I/O queue {qid} is not claimed (granted: 1..={})",
                self.name,
                qids.len().saturating_sub(1)
            )));
        }
        Ok(())
    }
}

impl QueueAdmin for OwnedAdmin {
    fn claim_qid(&self, purpose: &str) -> Result<u16> {
        let mut qids = self.qids.lock().map_err(|_| poisoned(&self.name))?;
        let qid = (1..qids.len()).find(|&q| !qids[q]).ok_or_else(|| DriverError::NoQueuePair {
            device: self.name.clone(),
            purpose: purpose.to_string(),
            granted: qids.len().saturating_sub(1) as u16,
            requested: self.requested,
        })?;
        qids[qid] = true;
        Ok(qid as u16)
    }

    fn release_qid(&self, qid: u16) {
        if qid == 0 {
            return;
        }
        if let Ok(mut qids) = self.qids.lock() {
            if let Some(q) = qids.get_mut(qid as usize) {
                *q = false;
            }
        }
    }

    fn create_queues(&self, qid: u16, depth: u32, sq_iova: u64, cq_iova: u64) -> Result<()> {
        self.check_claimed(qid)?;
        if !sq_iova.is_multiple_of(self.page_size) || !cq_iova.is_multiple_of(self.page_size) {
            return Err(DriverError::invalid(format!(
                "{}: queue memory at SQ {sq_iova:#x} / CQ {cq_iova:#x} is not page aligned",
                self.name
            )));
        }
        // Queue memory is always IOVA-contiguous, so PC=1 whether or not CQR requires it.
        self.command(Command::create_io_cq(qid, depth, cq_iova, true), None)?;
        if let Err(e) = self.command(Command::create_io_sq(qid, depth, sq_iova, qid, true), None) {
            let _ = self.command(Command::delete_io_cq(qid), None);
            return Err(e);
        }
        Ok(())
    }

    fn delete_queues(&self, qid: u16) -> Result<()> {
        self.check_claimed(qid)?;
        let sq = self.command(Command::delete_io_sq(qid), None);
        let cq = self.command(Command::delete_io_cq(qid), None);
        sq.and(cq).map(|_| ())
    }

    fn free(&self) -> u16 {
        self.qids.lock().map_or(0, |q| q.iter().skip(1).filter(|&&used| !used).count() as u16)
    }
}

impl AdminPath for OwnedAdmin {
    fn command(&self, cmd: Command, data: Option<&DmaBuffer>) -> Result<Completion> {
        let mut q = self.queue.lock().map_err(|_| poisoned(&self.name))?;
        self.run(&mut q.core, cmd, data.map(|d| d.iova()))
    }

    fn shutdown(&self) -> Result<()> {
        csts::shut_down(&*self.regs, &self.name, self.ready_wait)
    }

    fn is_leased(&self) -> bool {
        false
    }
}
