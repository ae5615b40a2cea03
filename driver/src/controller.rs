//! Controller bring-up, admin commands, namespaces and queue-pair creation.
//!
//! Bring-up follows §7.6.1 exactly: CC.EN=0 and wait for CSTS.RDY=0 within
//! CAP.TO; program AQA/ASQ/ACQ; CC with the NVM command set, MPS from
//! MPSMIN, IOSQES=6, IOCQES=4; CC.EN=1 and wait for RDY=1; Identify; Set
//! Features (Number of Queues); discover namespaces. CSTS.CFS is checked at
//! every wait. The controller is shut down (CC.SHN) when the last handle
//! drops. Ownership of the controller and use of a queue pair are separate
//! objects: queue pairs hold an `Arc<Controller>` and delete themselves.

use crate::command::Command;
use crate::error::{DriverError, Result};
use crate::queue::{backoff, Completion, QueueCore};
use crate::spec::registers::{cq_head_doorbell, offset, sq_tail_doorbell, ShutdownNotification};
use crate::spec::{
    Aqa, Cap, Cc, CommandSet, Csts, IdentifyController, IdentifyNamespace, SglSupport, ShutdownStatus,
    Version,
};
use crate::transport::{DmaBuffer, DmaSpace, Doorbell, Registers};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use zerocopy::FromBytes;

/// The driver's own cap on one command's transfer when MDTS reports no limit.
pub const DRIVER_MAX_TRANSFER: u64 = 4 << 20;

/// How to bring a controller up.
#[derive(Clone, Debug)]
pub struct ControllerOptions {
    /// Admin queue entries (bounded by CAP.MQES and 4096).
    pub admin_queue_entries: u16,
    /// I/O queue pairs to ask for with Set Features (the controller may grant fewer).
    pub io_queue_pairs: u16,
    /// Deadline for one admin command.
    pub admin_timeout: Duration,
    /// Deadline for one I/O command in the synchronous helpers.
    pub io_timeout: Duration,
    /// Upper bound on waits for CSTS.RDY/SHST; `None` uses CAP.TO.
    pub ready_timeout: Option<Duration>,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        ControllerOptions {
            admin_queue_entries: 32,
            io_queue_pairs: 16,
            admin_timeout: Duration::from_secs(5),
            io_timeout: Duration::from_secs(10),
            ready_timeout: None,
        }
    }
}

/// The LBA format a namespace is formatted with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NamespaceFormat {
    /// Index of the LBA format in use (FLBAS).
    pub index: u8,
    /// Data bytes per logical block.
    pub data_size: u32,
    /// Metadata bytes per logical block (LBAF MS); 0 = none.
    pub metadata_size: u16,
    /// Metadata at the end of each block's data (FLBAS bit 4) rather than in a separate buffer.
    pub extended: bool,
    /// End-to-end protection information type (DPS bits 2:0); 0 = none.
    pub pi_type: u8,
    /// Protection information in the first bytes of metadata (DPS bit 3).
    pub pi_first: bool,
}

impl std::fmt::Display for NamespaceFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LBA format {}: {} B data", self.index, self.data_size)?;
        if self.metadata_size > 0 {
            let how = if self.extended { "extended LBA" } else { "separate buffer" };
            write!(f, " + {} B metadata ({how})", self.metadata_size)?;
        } else {
            f.write_str(", no metadata")?;
        }
        if self.pi_type > 0 {
            let at = if self.pi_first { "first" } else { "last" };
            write!(f, ", protection information type {} ({at} bytes of metadata)", self.pi_type)?;
        }
        Ok(())
    }
}

/// One active namespace.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NamespaceInfo {
    pub nsid: u32,
    /// Size in logical blocks (NSZE).
    pub blocks: u64,
    /// Logical block size in bytes (data only).
    pub lba_size: u32,
    pub format: NamespaceFormat,
    /// I/O Command Set (from the Namespace Identification Descriptor list; NVM when the controller has none).
    pub command_set: crate::spec::CommandSet,
}

impl NamespaceInfo {
    pub fn bytes(&self) -> u64 {
        self.blocks.saturating_mul(self.lba_size as u64)
    }

    /// A namespace of `blocks` plain `lba_size`-byte blocks (NVM command set, no metadata).
    pub fn plain(nsid: u32, blocks: u64, lba_size: u32) -> Self {
        NamespaceInfo {
            nsid,
            blocks,
            lba_size,
            format: NamespaceFormat {
                index: 0,
                data_size: lba_size,
                metadata_size: 0,
                extended: false,
                pi_type: 0,
                pi_first: false,
            },
            command_set: crate::spec::CommandSet::Nvm,
        }
    }

    /// Why the driver cannot read and write this namespace as plain blocks
    /// of data, and what to do about it; `None` if it can.
    pub fn unusable(&self) -> Option<(String, String)> {
        use crate::spec::CommandSet;
        if self.command_set != CommandSet::Nvm {
            let remedy = match self.command_set {
                CommandSet::Zoned => "zoned namespaces accept only sequential writes within zones; use a namespace of the NVM command set (create one with `nvme create-ns --csi=0`, or a QEMU nvme-ns without zoned=true)",
                _ => "use a namespace of the NVM command set (CSI 0)",
            };
            return Some((format!("uses the {} command set, not NVM", self.command_set), remedy.into()));
        }
        if self.format.metadata_size > 0 || self.format.pi_type > 0 {
            return Some((
                format!("is formatted with {}", self.format),
                "the driver moves plain data blocks only; reformat the namespace to an LBA format without metadata or protection information (`nvme format --lbaf=N --pi=0`, N a format whose metadata size is 0; `nvme id-ns -H` lists them)".into(),
            ));
        }
        None
    }
}

/// What the driver learned about a controller at bring-up.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ControllerInfo {
    pub device: String,
    pub vid: u16,
    pub model: String,
    pub serial: String,
    pub firmware: String,
    pub version: String,
    /// Memory page size in use (bytes).
    pub page_size: u32,
    /// Identify MDTS decoded to bytes; `None` = the controller reports no limit.
    pub mdts_bytes: Option<u64>,
    /// Largest transfer one command carries (MDTS, or the driver's own cap).
    pub max_transfer: u64,
    pub sgl: SglSupport,
    /// Maximum entries per queue (CAP.MQES + 1).
    pub max_queue_entries: u32,
    pub contiguous_queues_required: bool,
    pub doorbell_stride: u32,
    /// I/O queue pairs granted by Set Features (Number of Queues).
    pub io_queue_pairs: u16,
    pub volatile_write_cache: bool,
    pub write_zeroes: bool,
    pub dataset_management: bool,
    /// CAP.TO in milliseconds.
    pub ready_timeout_ms: u64,
    pub namespaces: Vec<NamespaceInfo>,
}

impl ControllerInfo {
    pub fn namespace(&self, nsid: u32) -> Option<&NamespaceInfo> {
        self.namespaces.iter().find(|n| n.nsid == nsid)
    }

    /// Namespace `nsid`, if it is active and holds plain data blocks (no
    /// metadata, protection information or other command set).
    pub fn data_namespace(&self, nsid: u32) -> Result<&NamespaceInfo> {
        let ns = self.namespace(nsid).ok_or_else(|| {
            let have: Vec<u32> = self.namespaces.iter().map(|n| n.nsid).collect();
            DriverError::invalid(format!("{}: no active namespace {nsid} (active: {have:?})", self.device))
        })?;
        match ns.unusable() {
            None => Ok(ns),
            Some((what, remedy)) => {
                Err(DriverError::UnusableNamespace { device: self.device.clone(), nsid, what, remedy })
            }
        }
    }
}

/// A controller brought up and owned by this process.
pub struct Controller {
    name: String,
    regs: Arc<dyn Registers>,
    dma: Arc<dyn DmaSpace>,
    cap: Cap,
    opts: ControllerOptions,
    /// The admin queue; `None` on a leased controller.
    admin: Option<Mutex<QueueCore>>,
    /// One page for Identify data and other small admin payloads (guarded by `admin`).
    admin_page: Option<DmaBuffer>,
    /// Queue management of a leased controller, done by its owner.
    lease: Option<Arc<dyn QueueAdmin>>,
    info: ControllerInfo,
    /// Which I/O queue ids are claimed (owner only; index 0 is the admin queue).
    qids: Mutex<Vec<bool>>,
    /// The pair handed out by [`shared_io_queue_pair`](Self::shared_io_queue_pair), while anyone holds it.
    shared: Mutex<Weak<SharedQueuePair>>,
    shut_down: AtomicBool,
}

/// An I/O queue pair several users of one controller take turns on: each
/// holds the lock for a whole operation (every command it submitted has
/// completed, or was abandoned, when it lets go).
pub type SharedQueuePair = Mutex<crate::queue::IoQueuePair>;

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

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller").field("name", &self.name).field("cap", &self.cap).finish()
    }
}

impl Controller {
    /// Brings the controller behind `regs`/`dma` up from whatever state it is in.
    pub fn new(
        regs: Arc<dyn Registers>,
        dma: Arc<dyn DmaSpace>,
        opts: ControllerOptions,
    ) -> Result<Arc<Self>> {
        let name = regs.name().to_string();
        let cap = Cap(regs.read64(offset::CAP)?);
        let version = Version(regs.read32(offset::VS)?);
        tracing::debug!(device = %name, ?cap, %version, "bring-up");
        if !cap.supports_nvm_command_set() {
            return Err(DriverError::Unsupported {
                device: name,
                what: "CAP.CSS: NVM command set not supported".into(),
            });
        }
        let page_shift = 12u32;
        if cap.mps_min_shift() > page_shift || cap.mps_max_shift() < page_shift {
            return Err(DriverError::Unsupported {
                device: name,
                what: format!(
                    "memory page sizes {}..={} bytes exclude the host's 4096",
                    1u64 << cap.mps_min_shift(),
                    1u64 << cap.mps_max_shift()
                ),
            });
        }
        if cap.max_queue_entries() < 2 {
            // §3.1.1: MQES is 0-based and 0 is invalid; a 1-entry queue holds nothing.
            return Err(DriverError::BadDeviceResponse {
                device: name,
                what: format!(
                    "CAP.MQES = {} (queues of {} entry); at least 2 are needed",
                    cap.0 & 0xffff,
                    cap.max_queue_entries()
                ),
            });
        }
        let ready_wait = opts.ready_timeout.unwrap_or(Duration::from_millis(cap.timeout_ms().max(500)));

        // §7.6.1 step 1: disable and wait for RDY=0.
        let cc = Cc(regs.read32(offset::CC)?);
        if cc.enabled() {
            regs.write32(offset::CC, cc.with_enable(false).0)?;
        }
        wait_csts(&*regs, &name, ready_wait, "CSTS.RDY=0 after disabling", false, |c| !c.ready())?;

        // Admin queue.
        let admin_entries = (opts.admin_queue_entries as u32).clamp(2, cap.max_queue_entries().min(4096));
        let asq = dma.alloc(admin_entries as usize * 64)?;
        let acq = dma.alloc(admin_entries as usize * 16)?;
        regs.write32(offset::AQA, Aqa::new(admin_entries as u16, admin_entries as u16).0)?;
        regs.write64(offset::ASQ, asq.iova())?;
        regs.write64(offset::ACQ, acq.iova())?;
        let cc = Cc::default().with_css(0).with_page_shift(page_shift).with_iosqes(6).with_iocqes(4);
        regs.write32(offset::CC, cc.0)?;
        regs.write32(offset::CC, cc.with_enable(true).0)?;
        wait_csts(&*regs, &name, ready_wait, "CSTS.RDY=1 after enabling", true, |c| c.ready())?;

        let dstrd = cap.dstrd();
        let admin = QueueCore::new(
            &name,
            0,
            admin_entries,
            asq,
            acq,
            Doorbell::new(&regs, sq_tail_doorbell(0, dstrd))?,
            Doorbell::new(&regs, cq_head_doorbell(0, dstrd))?,
        )?;
        let admin_page = dma.alloc(4096)?;
        let mut ctrl = Controller {
            name: name.clone(),
            regs,
            dma,
            cap,
            opts,
            admin: Some(Mutex::new(admin)),
            admin_page: Some(admin_page),
            lease: None,
            info: ControllerInfo {
                device: name,
                vid: 0,
                model: String::new(),
                serial: String::new(),
                firmware: String::new(),
                version: version.to_string(),
                page_size: 1 << page_shift,
                mdts_bytes: None,
                max_transfer: DRIVER_MAX_TRANSFER,
                sgl: SglSupport::None,
                max_queue_entries: cap.max_queue_entries(),
                contiguous_queues_required: cap.contiguous_queues_required(),
                doorbell_stride: 4 << dstrd,
                io_queue_pairs: 0,
                volatile_write_cache: false,
                write_zeroes: false,
                dataset_management: false,
                ready_timeout_ms: cap.timeout_ms(),
                namespaces: Vec::new(),
            },
            qids: Mutex::new(Vec::new()),
            shared: Mutex::new(Weak::new()),
            shut_down: AtomicBool::new(false),
        };
        ctrl.identify()?;
        Ok(Arc::new(ctrl))
    }

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
        Ok(Arc::new(Controller {
            name,
            regs,
            dma,
            cap,
            opts,
            admin: None,
            admin_page: None,
            lease: Some(admin),
            info,
            qids: Mutex::new(Vec::new()),
            shared: Mutex::new(Weak::new()),
            shut_down: AtomicBool::new(false),
        }))
    }

    /// Whether this controller is held on a lease ([`leased`](Self::leased)).
    pub fn is_leased(&self) -> bool {
        self.lease.is_some()
    }

    fn not_owner(&self, what: impl Into<String>) -> DriverError {
        DriverError::NotOwner { device: self.name.clone(), what: what.into() }
    }

    fn identify(&mut self) -> Result<()> {
        let id: IdentifyController = self.admin_read(Command::identify_controller())?;
        if id.sqes_required() > 6 || id.sqes_max() < 6 || id.cqes_required() > 4 || id.cqes_max() < 4 {
            return Err(DriverError::Unsupported {
                device: self.name.clone(),
                what: format!(
                    "queue entry sizes SQES={:#x} CQES={:#x} exclude 64/16 bytes",
                    id.sqes, id.cqes
                ),
            });
        }
        let mdts = id.max_transfer_bytes(self.cap.mps_min_shift());
        let info = &mut self.info;
        info.vid = id.vid;
        info.model = id.model();
        info.serial = id.serial();
        info.firmware = id.firmware();
        info.mdts_bytes = mdts;
        info.max_transfer = mdts.map_or(DRIVER_MAX_TRANSFER, |m| m.min(DRIVER_MAX_TRANSFER));
        info.sgl = id.sgl_support();
        info.volatile_write_cache = id.volatile_write_cache();
        info.write_zeroes = id.supports_write_zeroes();
        info.dataset_management = id.supports_dataset_management();

        // Number of Queues: DW0 returns the granted counts, 0-based (§5.21.1.7).
        let want = self.opts.io_queue_pairs.max(1);
        let c = self.admin_command(Command::set_number_of_queues(want, want), None)?;
        let granted = ((c.dw0 & 0xffff) as u16).min((c.dw0 >> 16) as u16).saturating_add(1).min(want);
        self.info.io_queue_pairs = granted;
        *self.qids.lock().map_err(|_| self.poisoned())? = vec![false; granted as usize + 1];

        // Active namespaces (CNS 02h), then each one's geometry.
        let list: [u32; 1024] = self.admin_read(Command::identify_active_namespaces(0))?;
        let mut namespaces = Vec::new();
        let mut last = 0u32;
        for &nsid in list.iter().take_while(|&&n| n != 0) {
            // §5.15.4: the list is in increasing order of NSID, each at most NN.
            if nsid > id.nn || nsid <= last || nsid == u32::MAX {
                return Err(self
                    .bad(format!("active namespace list names nsid {nsid} (after {last}; NN = {})", id.nn)));
            }
            last = nsid;
            let ns: IdentifyNamespace = self.admin_read(Command::identify_namespace(nsid))?;
            let lba_size = match namespace_geometry(&ns) {
                Ok(Some(l)) => l,
                Ok(None) => {
                    tracing::warn!(device = %self.name, nsid, nsze = ns.nsze, lbads = ns.active_format().lbads(), "namespace empty or its LBA size unusable; skipped");
                    continue;
                }
                Err(what) => return Err(self.bad(format!("namespace {nsid}: {what}"))),
            };
            let command_set = self.command_set(nsid)?;
            let format = NamespaceFormat {
                index: ns.format_index(),
                data_size: lba_size,
                metadata_size: ns.active_format().metadata_size(),
                extended: ns.metadata_extended(),
                pi_type: ns.pi_type(),
                pi_first: ns.pi_first(),
            };
            namespaces.push(NamespaceInfo { nsid, blocks: ns.nsze, lba_size, format, command_set });
        }
        self.info.namespaces = namespaces;
        tracing::info!(device = %self.name, model = %self.info.model, namespaces = self.info.namespaces.len(), io_queue_pairs = granted, "controller ready");
        Ok(())
    }

    /// The namespace's I/O command set from its Namespace Identification
    /// Descriptor list (CNS 03h). A controller that does not implement the
    /// list (before NVMe 1.3) has only the NVM command set.
    fn command_set(&self, nsid: u32) -> Result<CommandSet> {
        let page: [u8; 4096] = match self.admin_read(Command::identify_namespace_descriptors(nsid)) {
            Ok(p) => p,
            Err(DriverError::CommandFailed { status, .. }) => {
                tracing::debug!(device = %self.name, nsid, %status, "no namespace descriptor list; NVM command set assumed");
                return Ok(CommandSet::Nvm);
            }
            Err(e) => return Err(e),
        };
        match crate::spec::identify::descriptor_csi(&page) {
            Ok(csi) => Ok(csi.map_or(CommandSet::Nvm, CommandSet::from_csi)),
            Err(what) => Err(self.bad(format!("namespace {nsid} descriptor list: {what}"))),
        }
    }

    /// Namespace `nsid`, if it exists and the driver can use it as plain
    /// blocks of data; otherwise an error that names the controller, the
    /// namespace, its format or command set, and what to do.
    pub fn data_namespace(&self, nsid: u32) -> Result<&NamespaceInfo> {
        self.info.data_namespace(nsid)
    }

    fn bad(&self, what: String) -> DriverError {
        DriverError::BadDeviceResponse { device: self.name.clone(), what }
    }
    fn poisoned(&self) -> DriverError {
        DriverError::Emulated(format!("{}: internal lock poisoned", self.name))
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
        if self.status()?.fatal() {
            return Err(DriverError::ControllerFatal { device: self.name.clone(), context: String::new() });
        }
        Ok(())
    }

    /// Runs one admin command and waits for it; a non-success status is an error.
    /// `data` (at most one page) becomes PRP1.
    /// On a leased controller this is refused with [`DriverError::NotOwner`].
    pub fn admin_command(&self, cmd: Command, data: Option<&DmaBuffer>) -> Result<Completion> {
        let Some(admin) = &self.admin else {
            return Err(self.not_owner(format!("{} (an admin command)", cmd.name())));
        };
        let mut q = admin.lock().map_err(|_| self.poisoned())?;
        self.admin_locked(&mut q, cmd, data.map(|d| d.iova()))
    }

    fn admin_locked(&self, q: &mut QueueCore, cmd: Command, prp1: Option<u64>) -> Result<Completion> {
        let mut entry = cmd.entry();
        if let Some(p) = prp1 {
            entry.dptr = [p, 0];
        }
        let cid = q.submit(entry, cmd.name(), 0)?;
        q.ring();
        let c = q.wait(cid, self.opts.admin_timeout, || self.check_fatal())?;
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

    /// Runs an admin command that returns one page and decodes it as `T`.
    fn admin_read<T: FromBytes>(&self, cmd: Command) -> Result<T> {
        let (Some(admin), Some(admin_page)) = (&self.admin, &self.admin_page) else {
            return Err(self.not_owner(format!("{} (an admin command)", cmd.name())));
        };
        let mut q = admin.lock().map_err(|_| self.poisoned())?;
        admin_page.fill(0);
        self.admin_locked(&mut q, cmd, Some(admin_page.iova()))?;
        let mut page = vec![0u8; 4096];
        admin_page.copy_out(0, &mut page)?;
        T::read_from_prefix(&page)
            .map(|(t, _)| t)
            .map_err(|_| self.bad(format!("{} returned a short payload", cmd.name())))
    }

    /// Claims a free I/O queue id for `purpose` (named in the error when none
    /// is left). The owner of a controller serves a lease with this; on a
    /// leased controller it asks the owner.
    pub fn claim_io_qid(&self, purpose: &str) -> Result<u16> {
        if let Some(lease) = &self.lease {
            return lease.claim_qid(purpose);
        }
        let mut qids = self.qids.lock().map_err(|_| self.poisoned())?;
        let qid = (1..qids.len()).find(|&q| !qids[q]).ok_or_else(|| DriverError::NoQueuePair {
            device: self.name.clone(),
            purpose: purpose.to_string(),
            granted: self.info.io_queue_pairs,
            requested: self.opts.io_queue_pairs.max(1),
        })?;
        qids[qid] = true;
        Ok(qid as u16)
    }

    pub(crate) fn claim_qid(&self, purpose: &str) -> Result<u16> {
        self.claim_io_qid(purpose)
    }

    /// I/O queue pairs granted and not held by anyone now (on a leased
    /// controller: what its owner says this client may still claim).
    pub fn free_io_queue_pairs(&self) -> u16 {
        if let Some(lease) = &self.lease {
            return lease.free();
        }
        self.qids.lock().map_or(0, |q| q.iter().skip(1).filter(|&&used| !used).count() as u16)
    }

    /// The controller's shared I/O queue pair: created with `depth` entries
    /// (clamped to 2..=CAP.MQES+1) by the first caller, and the same pair for
    /// every caller while any of them holds it. Users that need few commands
    /// (metadata), or that cannot get a pair of their own on a controller
    /// that grants few, take turns on it.
    pub fn shared_io_queue_pair(self: &Arc<Self>, depth: u32) -> Result<Arc<SharedQueuePair>> {
        let mut slot = self.shared.lock().map_err(|_| self.poisoned())?;
        if let Some(pair) = slot.upgrade() {
            return Ok(pair);
        }
        let depth = depth.clamp(2, self.info.max_queue_entries.max(2));
        let pair =
            Arc::new(Mutex::new(crate::queue::IoQueuePair::create(self, depth, "the shared queue pair")?));
        *slot = Arc::downgrade(&pair);
        Ok(pair)
    }

    pub(crate) fn release_qid(&self, qid: u16) {
        self.release_io_qid(qid)
    }

    /// Gives back an I/O queue id from [`claim_io_qid`](Self::claim_io_qid)
    /// (its queues deleted first). Unknown ids are ignored.
    pub fn release_io_qid(&self, qid: u16) {
        if let Some(lease) = &self.lease {
            return lease.release_qid(qid);
        }
        if qid == 0 {
            return;
        }
        if let Ok(mut qids) = self.qids.lock() {
            if let Some(q) = qids.get_mut(qid as usize) {
                *q = false;
            }
        }
    }

    /// Creates the CQ and SQ of queue `qid` on the controller, with memory of
    /// `depth` entries. On failure nothing is left behind.
    pub(crate) fn create_queues(
        &self,
        qid: u16,
        depth: u32,
    ) -> Result<(DmaBuffer, DmaBuffer, Doorbell, Doorbell)> {
        let max = self.info.max_queue_entries;
        if depth < 2 || depth > max {
            return Err(DriverError::invalid(format!(
                "{}: queue depth {depth} is outside 2..={max} (CAP.MQES)",
                self.name
            )));
        }
        let sq = self.dma.alloc(depth as usize * 64)?;
        let cq = self.dma.alloc(depth as usize * 16)?;
        self.create_queues_at(qid, depth, sq.iova(), cq.iova())?;
        let dstrd = self.cap.dstrd();
        let sq_db = Doorbell::new(&self.regs, sq_tail_doorbell(qid, dstrd))?;
        let cq_db = Doorbell::new(&self.regs, cq_head_doorbell(qid, dstrd))?;
        Ok((sq, cq, sq_db, cq_db))
    }

    /// Creates the CQ then the SQ of claimed queue `qid`, `depth` entries
    /// each, at device addresses `sq_iova`/`cq_iova` (IOVA-contiguous memory
    /// of `depth` × 64 and × 16 bytes; PC = 1, CQ interrupts off). On
    /// failure nothing is left behind. The owner of a controller serves a
    /// lease with this; on a leased controller it asks the owner.
    pub fn create_queues_at(&self, qid: u16, depth: u32, sq_iova: u64, cq_iova: u64) -> Result<()> {
        let max = self.info.max_queue_entries;
        if depth < 2 || depth > max {
            return Err(DriverError::invalid(format!(
                "{}: queue depth {depth} is outside 2..={max} (CAP.MQES)",
                self.name
            )));
        }
        if let Some(lease) = &self.lease {
            return lease.create_queues(qid, depth, sq_iova, cq_iova);
        }
        self.check_claimed(qid)?;
        let page = self.info.page_size as u64;
        if !sq_iova.is_multiple_of(page) || !cq_iova.is_multiple_of(page) {
            return Err(DriverError::invalid(format!(
                "{}: queue memory at SQ {sq_iova:#x} / CQ {cq_iova:#x} is not page aligned",
                self.name
            )));
        }
        // Queue memory is always IOVA-contiguous, so PC=1 whether or not CQR requires it.
        self.admin_command(Command::create_io_cq(qid, depth, cq_iova, true), None)?;
        if let Err(e) = self.admin_command(Command::create_io_sq(qid, depth, sq_iova, qid, true), None) {
            let _ = self.admin_command(Command::delete_io_cq(qid), None);
            return Err(e);
        }
        Ok(())
    }

    /// An error unless `qid` is an I/O queue id claimed on this (owned) controller.
    fn check_claimed(&self, qid: u16) -> Result<()> {
        let qids = self.qids.lock().map_err(|_| self.poisoned())?;
        if qid == 0 || !qids.get(qid as usize).copied().unwrap_or(false) {
            return Err(DriverError::invalid(format!(
                "{}: I/O queue {qid} is not claimed (granted: 1..={})",
                self.name,
                qids.len().saturating_sub(1)
            )));
        }
        Ok(())
    }

    /// Deletes I/O queue pair `qid` (SQ, then CQ) and creates it again at
    /// the same memory, with both rings zeroed, so the host side can start
    /// over at SQ tail 0, CQ head 0, expected phase 1.
    ///
    /// §5.6: the controller completes or aborts every command of the SQ
    /// before Delete I/O Submission Queue completes, so once this returns no
    /// command submitted before it can still move data. The caller must make
    /// sure nobody touches the queue memory or doorbells meanwhile. Every
    /// admin command is bounded by `ControllerOptions::admin_timeout`.
    ///
    /// Errors say which step failed; after a failure the pair's state on the
    /// controller is unknown, and only a controller reset recovers it.
    pub(crate) fn recreate_queues(&self, qid: u16, depth: u32, sq: &DmaBuffer, cq: &DmaBuffer) -> Result<()> {
        let step = |what: &str, r: Result<_>| {
            r.map_err(|e| {
                tracing::error!(device = %self.name, qid, step = what, error = %e, "queue pair recreation failed");
                e
            })
        };
        if let Some(lease) = &self.lease {
            step("delete queues", lease.delete_queues(qid))?;
            sq.fill(0);
            cq.fill(0);
            step("create queues", lease.create_queues(qid, depth, sq.iova(), cq.iova()))?;
            tracing::info!(device = %self.name, qid, "leased I/O queue pair deleted and created again");
            return Ok(());
        }
        step("delete SQ", self.admin_command(Command::delete_io_sq(qid), None).map(drop))?;
        step("delete CQ", self.admin_command(Command::delete_io_cq(qid), None).map(drop))?;
        // Stale phase tags in the old CQ would read as fresh completions.
        sq.fill(0);
        cq.fill(0);
        step(
            "create CQ",
            self.admin_command(Command::create_io_cq(qid, depth, cq.iova(), true), None).map(drop),
        )?;
        let create_sq = Command::create_io_sq(qid, depth, sq.iova(), qid, true);
        if let Err(e) = step("create SQ", self.admin_command(create_sq, None).map(drop)) {
            if let Err(e2) = self.admin_command(Command::delete_io_cq(qid), None) {
                tracing::warn!(device = %self.name, qid, error = %e2, "deleting the recreated CQ failed");
            }
            return Err(e);
        }
        tracing::info!(device = %self.name, qid, "I/O queue pair deleted and created again");
        Ok(())
    }

    /// Deletes the SQ then the CQ of `qid` (§5.5, §5.6 order).
    pub(crate) fn delete_queues(&self, qid: u16) -> Result<()> {
        self.delete_io_queues(qid)
    }

    /// Deletes the SQ then the CQ of claimed queue `qid` (§5.6: the
    /// controller completes or aborts every command of the SQ first, so
    /// none of them moves data afterwards). Both deletions are tried; the
    /// qid stays claimed ([`release_io_qid`](Self::release_io_qid) gives it
    /// back). The owner serves a lease, and cleans up after a client that
    /// went away, with this; on a leased controller it asks the owner.
    pub fn delete_io_queues(&self, qid: u16) -> Result<()> {
        if let Some(lease) = &self.lease {
            return lease.delete_queues(qid);
        }
        self.check_claimed(qid)?;
        let sq = self.admin_command(Command::delete_io_sq(qid), None);
        let cq = self.admin_command(Command::delete_io_cq(qid), None);
        sq.and(cq).map(|_| ())
    }

    /// Orderly shutdown (§7.6.2): CC.SHN = normal, wait for SHST = complete.
    /// A leased controller belongs to its owner: this only marks it shut
    /// down here and writes nothing to the device.
    pub fn shutdown(&self) -> Result<()> {
        if self.shut_down.swap(true, Ordering::AcqRel) || self.lease.is_some() {
            return Ok(());
        }
        let cc = Cc(self.regs.read32(offset::CC)?);
        self.regs.write32(offset::CC, cc.with_shutdown(ShutdownNotification::Normal).0)?;
        let wait = self.opts.ready_timeout.unwrap_or(Duration::from_millis(self.cap.timeout_ms().max(500)));
        wait_csts(
            &*self.regs,
            &self.name,
            wait,
            "CSTS.SHST=complete after shutdown notification",
            false,
            |c| c.shutdown_status() == ShutdownStatus::Complete,
        )?;
        tracing::info!(device = %self.name, "controller shut down");
        Ok(())
    }

    /// Whether [`shutdown`](Self::shutdown) has run.
    pub fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::warn!(device = %self.name, error = %e, "shutdown on drop failed");
        }
    }
}

/// Checks the sizes Identify Namespace reports: `Ok(Some(lba_size))` for a
/// namespace the driver can address, `Ok(None)` for one to skip (no blocks,
/// or blocks below 512 B or above 64 KiB), an error for values no
/// controller may report (a format index past NLBAF, a size in bytes past
/// 2^64).
pub fn namespace_geometry(ns: &IdentifyNamespace) -> std::result::Result<Option<u32>, String> {
    if ns.format_index() > ns.nlbaf {
        return Err(format!(
            "FLBAS selects LBA format {} of the {} it has (NLBAF {})",
            ns.format_index(),
            ns.nlbaf as u32 + 1,
            ns.nlbaf
        ));
    }
    if ns.nsze == 0 {
        return Ok(None);
    }
    let Some(lba_size) = ns.lba_size() else { return Ok(None) };
    if ns.nsze.checked_mul(lba_size as u64).is_none() {
        return Err(format!("NSZE {} blocks of {lba_size} bytes is more than 2^64 bytes", ns.nsze));
    }
    Ok(Some(lba_size))
}

/// Polls CSTS until `done` holds, CFS appears, or `timeout` passes.
fn wait_csts(
    regs: &dyn Registers,
    name: &str,
    timeout: Duration,
    what: &str,
    fatal_is_error: bool,
    done: impl Fn(Csts) -> bool,
) -> Result<()> {
    let start = Instant::now();
    let mut spins = 0;
    loop {
        let csts = Csts(regs.read32(offset::CSTS)?);
        if csts.fatal() && fatal_is_error {
            return Err(DriverError::ControllerFatal {
                device: name.to_string(),
                context: format!(" while waiting for {what}"),
            });
        }
        if done(csts) {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            if csts.fatal() {
                return Err(DriverError::ControllerFatal {
                    device: name.to_string(),
                    context: format!("; gave up after {timeout:?} waiting for {what}"),
                });
            }
            return Err(DriverError::Timeout {
                device: name.to_string(),
                what: what.to_string(),
                waited: timeout,
            });
        }
        backoff(&mut spins);
    }
}

#[cfg(test)]
mod tests {
    use super::namespace_geometry;
    use crate::spec::{IdentifyNamespace, LbaFormat};

    #[test]
    fn namespace_sizes_from_the_device_are_bounded() {
        let mut ns = IdentifyNamespace::new_zeroed();
        ns.lbaf[0] = LbaFormat::new(12, 0).0;
        ns.nsze = 1 << 20;
        assert_eq!(namespace_geometry(&ns), Ok(Some(4096)));
        ns.nsze = 0;
        assert_eq!(namespace_geometry(&ns), Ok(None));
        ns.nsze = u64::MAX / 1024;
        assert!(namespace_geometry(&ns).unwrap_err().contains("2^64"));
        ns.nsze = 8;
        ns.flbas = 3; // format 3 of 1
        assert!(namespace_geometry(&ns).unwrap_err().contains("NLBAF 0"));
        ns.flbas = 0;
        ns.lbaf[0] = LbaFormat::new(40, 0).0;
        assert_eq!(namespace_geometry(&ns), Ok(None), "a 2^40-byte block is skipped, not shifted");
    }
}
