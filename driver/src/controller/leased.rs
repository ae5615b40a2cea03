//! A controller another process (the daemon) owns: the checks made when
//! taking the lease, and the admin path that forwards queue management to
//! the owner through [`QueueAdmin`] and refuses every other admin command.

use super::{AdminPath, Controller, ControllerInfo, ControllerOptions, QueueAdmin, DRIVER_MAX_TRANSFER};
use crate::command::Command;
use crate::error::{DriverError, Result};
use crate::queue::Completion;
use crate::spec::registers::offset;
use crate::spec::{Cap, Csts};
use crate::transport::{DmaBuffer, DmaSpace, Registers};
use std::sync::Arc;

/// The admin path of a leased controller: the owner's [`QueueAdmin`].
struct LeasedAdmin {
    name: String,
    owner: Arc<dyn QueueAdmin>,
}

impl QueueAdmin for LeasedAdmin {
    fn claim_qid(&self, purpose: &str) -> Result<u16> {
        self.owner.claim_qid(purpose)
    }
    fn release_qid(&self, qid: u16) {
        self.owner.release_qid(qid)
    }
    fn create_queues(&self, qid: u16, depth: u32, sq_iova: u64, cq_iova: u64) -> Result<()> {
        self.owner.create_queues(qid, depth, sq_iova, cq_iova)
    }
    fn delete_queues(&self, qid: u16) -> Result<()> {
        self.owner.delete_queues(qid)
    }
    fn free(&self) -> u16 {
        self.owner.free()
    }
}

impl AdminPath for LeasedAdmin {
    fn command(&self, cmd: Command, _data: Option<&DmaBuffer>) -> Result<Completion> {
        Err(DriverError::NotOwner {
            device: self.name.clone(),
            what: format!("{} (an admin command)", cmd.name()),
        })
    }

    /// The controller belongs to its owner: nothing is written to it.
    fn shutdown(&self) -> Result<()> {
        Ok(())
    }

    fn is_leased(&self) -> bool {
        true
    }
}

impl Controller {
    /// A controller that another process (a daemon) owns and brought up,
    /// reached through its BAR (`regs`, e.g. a shared
    /// `tutti_emulator::RegisterFile`) and a DMA space that
    /// maps this process's memory for the device (e.g.
    /// [`BrokeredDma`](crate::transport::remote::BrokeredDma)). `info` is what
    /// the owner learned at bring-up; it must agree with CAP, and the
    /// controller must be ready (CSTS.RDY = 1, CFS = 0).
    ///
    /// Nothing is written to the device here or when the controller drops.
    /// Queue pairs are created and deleted through `admin`; any other admin
    /// command is refused with [`DriverError::NotOwner`].
    pub fn leased(
        regs: Arc<dyn Registers>,
        dma: Arc<dyn DmaSpace>,
        info: ControllerInfo,
        admin: Arc<dyn QueueAdmin>,
    ) -> Result<Arc<Self>> {
        let opts = ControllerOptions { io_queue_pairs: info.io_queue_pairs, ..ControllerOptions::default() };
        Self::leased_with_options(regs, dma, info, admin, opts)
    }

    /// [`leased`](Self::leased) with the I/O and admin deadlines of `opts`
    /// (the bring-up fields are not used).
    pub fn leased_with_options(
        regs: Arc<dyn Registers>,
        dma: Arc<dyn DmaSpace>,
        info: ControllerInfo,
        admin: Arc<dyn QueueAdmin>,
        opts: ControllerOptions,
    ) -> Result<Arc<Self>> {
        let name = regs.name().to_string();
        let cap = Cap(regs.read64(offset::CAP)?);
        let csts = Csts(regs.read32(offset::CSTS)?);
        let bad = |what: String| DriverError::invalid(format!("{name}: leased controller: {what}"));
        if csts.fatal() {
            return Err(DriverError::ControllerFatal { device: name, context: " (taking a lease)".into() });
        }
        if !csts.ready() {
            return Err(bad(
                "the controller is not ready (CSTS.RDY = 0); its owner has not brought it up".into()
            ));
        }
        if info.max_queue_entries != cap.max_queue_entries() || info.max_queue_entries < 2 {
            return Err(bad(format!(
                "info says {} entries per queue, CAP.MQES says {}",
                info.max_queue_entries,
                cap.max_queue_entries()
            )));
        }
        if info.doorbell_stride != 4 << cap.dstrd() {
            return Err(bad(format!(
                "info says a doorbell stride of {} bytes, CAP.DSTRD says {}",
                info.doorbell_stride,
                4u32 << cap.dstrd()
            )));
        }
        if info.page_size != 4096 {
            return Err(bad(format!("page size {} (the driver uses 4096)", info.page_size)));
        }
        let page = info.page_size as u64;
        if info.max_transfer < page
            || !info.max_transfer.is_multiple_of(page)
            || info.max_transfer > DRIVER_MAX_TRANSFER
        {
            return Err(bad(format!(
                "maximum transfer {} is not a multiple of {page} in {page}..={DRIVER_MAX_TRANSFER}",
                info.max_transfer
            )));
        }
        if info.io_queue_pairs == 0 {
            return Err(bad("no I/O queue pairs granted".into()));
        }
        let mut seen = std::collections::BTreeSet::new();
        for ns in &info.namespaces {
            let size_ok = ns.lba_size.is_power_of_two() && (512..=65536).contains(&ns.lba_size);
            if ns.nsid == 0
                || ns.nsid == u32::MAX
                || !seen.insert(ns.nsid)
                || !size_ok
                || ns.blocks == 0
                || ns.blocks.checked_mul(ns.lba_size as u64).is_none()
            {
                return Err(bad(format!(
                    "namespace {} of {} blocks of {} bytes is not a namespace the driver can address",
                    ns.nsid, ns.blocks, ns.lba_size
                )));
            }
        }
        tracing::info!(device = %name, io_queue_pairs = info.io_queue_pairs, namespaces = info.namespaces.len(), "leased controller");
        let admin = LeasedAdmin { name: name.clone(), owner: admin };
        Ok(Controller::assemble(name, regs, dma, cap, opts, info, Box::new(admin)))
    }
}
