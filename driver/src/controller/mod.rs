//! One handle to an NVMe controller, whichever process owns it.
//!
//! A [`Controller`] is either owned (this process brought it up and holds
//! its admin queue) or leased (a daemon owns it and creates queue pairs for
//! this process). Which one is chosen once, at construction, as the
//! controller's [`AdminPath`] (the way SPDK picks a transport's function
//! table); no method asks which it is.
//!
//! - [`info`]: options and what bring-up learned (controller, namespaces).
//! - `bringup`: §7.6.1 bring-up, Identify and namespace discovery ([`Controller::new`]).
//! - `owned`: the owner's admin path: the admin queue, queue ids, §7.6.2 shutdown.
//! - `leased`: a leased controller ([`Controller::leased`]), its queue
//!   management forwarded to the owner through [`QueueAdmin`].
//! - `queues`: I/O queue ids and queue pairs, the same calls for both.
//!
//! Queue pairs hold an `Arc<Controller>` and delete themselves; an owned
//! controller is shut down (CC.SHN) when the last handle drops.

mod bringup;
mod csts;
pub mod info;
mod leased;
mod owned;
mod queues;

pub use bringup::namespace_geometry;
pub use info::{ControllerInfo, ControllerOptions, NamespaceFormat, NamespaceInfo, DRIVER_MAX_TRANSFER};

use crate::command::Command;
use crate::error::{DriverError, Result};
use crate::queue::Completion;
use crate::spec::registers::offset;
use crate::spec::{Cap, Csts};
use crate::transport::{DmaBuffer, DmaSpace, Registers};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// An NVMe controller this process owns ([`Controller::new`]) or leases
/// from its owner ([`Controller::leased`]).
pub struct Controller {
    name: String,
    regs: Arc<dyn Registers>,
    dma: Arc<dyn DmaSpace>,
    cap: Cap,
    opts: ControllerOptions,
    /// Admin commands and queue management: the admin queue, or the owner.
    admin: Box<dyn AdminPath>,
    info: ControllerInfo,
    /// The pair handed out by [`shared_io_queue_pair`](Self::shared_io_queue_pair), while anyone holds it.
    /// The controller keeps the slot and the queue module what goes in it
    /// (a `queue::SharedQueuePair`): a queue pair depends on its controller, not the reverse.
    shared: SharedSlot,
    shut_down: AtomicBool,
}

/// Where a controller keeps its shared queue pair (see `queue::shared`).
pub(crate) type SharedSlot = Mutex<Weak<dyn std::any::Any + Send + Sync>>;

/// Queue management for a controller whose admin queue lives in another process (a daemon).
///
/// A [`Controller::leased`] routes every queue-management step here and
/// nothing else. Implementations bound each call with a deadline (the
/// owner may be gone) and answer with an error, never a hang.
pub trait QueueAdmin: Send + Sync {
    /// Claims an I/O queue id for `purpose`; DriverError::NoQueuePair (naming device and numbers) when none is left.
    fn claim_qid(&self, purpose: &str) -> Result<u16>;
    fn release_qid(&self, qid: u16);
    /// Create I/O CQ then SQ `qid` with `depth` entries at these IOVAs (PC=1, CQ interrupts off), as create_queues does.
    fn create_queues(&self, qid: u16, depth: u32, sq_iova: u64, cq_iova: u64) -> Result<()>;
    /// Delete SQ then CQ `qid` (§5.6: commands in flight are completed or aborted first).
    fn delete_queues(&self, qid: u16) -> Result<()>;
    /// I/O queue ids this client could still claim, for
    /// [`Controller::free_io_queue_pairs`]. The default, 0, makes users that
    /// choose between a pair of their own and the shared pair take the shared one.
    fn free(&self) -> u16 {
        0
    }
}

/// Everything that differs between an owned and a leased controller: queue
/// management ([`QueueAdmin`], done here or by the owner), other admin
/// commands, and shutdown. `owned::OwnedAdmin` and `leased::LeasedAdmin`
/// implement it.
pub(crate) trait AdminPath: QueueAdmin {
    /// Runs one admin command and waits for it (an owner only).
    fn command(&self, cmd: Command, data: Option<&DmaBuffer>) -> Result<Completion>;
    /// §7.6.2 orderly shutdown (an owner only; a lease writes nothing).
    fn shutdown(&self) -> Result<()>;
    /// Whether another process owns the controller.
    fn is_leased(&self) -> bool;
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller").field("name", &self.name).field("cap", &self.cap).finish()
    }
}

impl Controller {
    /// Whether this controller is held on a lease ([`leased`](Self::leased)).
    pub fn is_leased(&self) -> bool {
        self.admin.is_leased()
    }

    /// Namespace `nsid`, if it exists and the driver can use it as plain
    /// blocks of data; otherwise an error that names the controller, the
    /// namespace, its format or command set, and what to do.
    pub fn data_namespace(&self, nsid: u32) -> Result<&NamespaceInfo> {
        self.info.data_namespace(nsid)
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn info(&self) -> &ControllerInfo {
        &self.info
    }
    pub fn cap(&self) -> Cap {
        self.cap
    }
    pub fn options(&self) -> &ControllerOptions {
        &self.opts
    }
    pub fn dma(&self) -> &Arc<dyn DmaSpace> {
        &self.dma
    }
    pub fn registers(&self) -> &Arc<dyn Registers> {
        &self.regs
    }

    /// Current CSTS.
    pub fn status(&self) -> Result<Csts> {
        Ok(Csts(self.regs.read32(offset::CSTS)?))
    }

    /// An error if the controller reports Controller Fatal Status.
    pub fn check_fatal(&self) -> Result<()> {
        csts::check_fatal(&*self.regs, &self.name)
    }

    /// Runs one admin command and waits for it; a non-success status is an error.
    /// `data` (at most one page) becomes PRP1.
    /// On a leased controller this is refused with [`DriverError::NotOwner`].
    pub fn admin_command(&self, cmd: Command, data: Option<&DmaBuffer>) -> Result<Completion> {
        self.admin.command(cmd, data)
    }

    /// Orderly shutdown (§7.6.2): CC.SHN = normal, wait for SHST = complete.
    /// A leased controller belongs to its owner: this only marks it shut
    /// down here and writes nothing to the device.
    pub fn shutdown(&self) -> Result<()> {
        if self.shut_down.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.admin.shutdown()
    }

    /// The slot of the shared queue pair.
    pub(crate) fn shared_slot(&self) -> &SharedSlot {
        &self.shared
    }

    /// Whether [`shutdown`](Self::shutdown) has run.
    pub fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }

    /// A controller around `admin`, chosen by [`new`](Self::new) or [`leased`](Self::leased).
    fn assemble(
        name: String,
        regs: Arc<dyn Registers>,
        dma: Arc<dyn DmaSpace>,
        cap: Cap,
        opts: ControllerOptions,
        info: ControllerInfo,
        admin: Box<dyn AdminPath>,
    ) -> Arc<Self> {
        Arc::new(Controller {
            name,
            regs,
            dma,
            cap,
            opts,
            admin,
            info,
            shared: Mutex::new(Weak::<()>::new()),
            shut_down: AtomicBool::new(false),
        })
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::warn!(device = %self.name, error = %e, "shutdown on drop failed");
        }
    }
}

/// The error for a lock some thread panicked while holding.
pub(crate) fn poisoned(device: &str) -> DriverError {
    DriverError::Emulated(format!("{device}: internal lock poisoned"))
}
