//! The main path: layers moved through gio_uring.
//!
//! Two ways to hand a layer to the executor, chosen once at registration:
//!
//! - **Layer IOCBs**: the executor expands each (file, block) pair into
//!   `2 × chunks` NVMe commands from a registered layer table — the stripe
//!   arithmetic plus one SGL descriptor read per command. A job registers its
//!   pairs with the executor once (`register_pairs`) and every layer is a
//!   `submit_layer_list` whose IOCB headers name that list: per layer the
//!   host writes a few words per IOCB, however many blocks move. Without a
//!   free pair list slot the job falls back to `submit_layer`, which copies
//!   the pairs into each layer's IOCBs. Used when every drive sees the KV
//!   memory at the same IOVAs (one table), which is what gio_uring's layer
//!   table describes; drives may differ in LBA size (the table keeps sizes in
//!   the smallest LBA and the executor converts per drive).
//! - **Explicit IOCBs**: otherwise (drives behind separate IOMMU views) the
//!   host fills one IOCTX
//!   per command with the LBA and the SGL descriptor copied from the drive's
//!   own table. Still one `issue` per IOCB; the host writes the 64-byte
//!   IOCTXs instead of 8-byte pairs.
//!
//! Either way the executor builds the NVMe commands, rings the doorbells and
//! reaps completions; a finished IOCB reports every failed IOCTX, which maps
//! back to its pair.
//!
//! A layer whose commands ended without a known outcome (expired, or stranded
//! on a dead queue) is held back: no new layer is submitted until the layers
//! in flight have finished, then the drives those commands went to are
//! recovered (`GioUring::recover_drive`: each queue pair is deleted and
//! created again; §5.6 Delete I/O Submission Queue completes only after every
//! command of the SQ was completed or aborted). Once a drive is recovered
//! nothing submitted to it earlier can move data, so those failures become
//! definite and the store frees the files instead of quarantining them. When
//! a recovery cannot run or fails, the failures stay unknown.

use super::{
    layer_commands, note_failure, settle_by_recovery, sorted_failures, Direction, FailureKind, LayerIo,
    LayerOutcome, Pair, PairFailure,
};
use crate::error::{ObjError, Result};
use crate::registration::KvMemoryKind as MemoryKind;
use crate::registration::Registration;
use crate::stripe::StripeMap;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tutti_driver::command::DataPtr;
use tutti_driver::controller::Controller;
use tutti_gio_uring::mem::{HostMapping, HostRange};
use tutti_gio_uring::{
    ioctx, CudaExecutor, DataRef, DriveQueues, Executor, GioError, GioUring, HostExecutor,
    HostExecutorConfig, IoStatus, IocbId, IocbResult, Kv, LayerGeometry, LayerTable, Op, PairListId,
    PoolDrive, TableId, TableKind,
};
use tutti_kernels::abi::IOCB_MAX_IOCTX;

/// How the gio_uring path is set up.
#[derive(Clone, Debug)]
pub struct GioConfig {
    /// The ring: IOCB pool depth and executor timeouts.
    pub ring: tutti_gio_uring::GioOptions,
    /// Which executor runs the kernels.
    pub executor: GioExecutor,
    /// The host executor (used with [`GioExecutor::Host`]).
    pub host: HostExecutorConfig,
    /// Staging slots (one chunk each, pinned host memory) of a staged
    /// registration: commands in flight at once for KV memory the drives
    /// cannot reach; more wait for a free slot.
    pub staging_slots: u32,
    /// Raw queue pairs the executor drives on each drive.
    pub queues_per_drive: u32,
    pub queue_depth: u32,
    /// SMs (host: lane blocks) an IOCB may use.
    pub sm_budget: u32,
    /// Force explicit IOCBs even when layer IOCBs are possible (for comparisons).
    pub force_explicit: bool,
    /// Recover a drive (delete and recreate its queue pairs) after commands
    /// to it ended without a known outcome, so that their outcome becomes
    /// known and the files they wrote need no quarantine.
    pub recover_drives: bool,
    /// How long one drive recovery waits for commands already admitted to
    /// the drive's queues to finish (`GioUring::recover_drive`).
    pub recovery_timeout: Duration,
}

impl Default for GioConfig {
    fn default() -> Self {
        GioConfig {
            ring: tutti_gio_uring::GioOptions { depth: 128, ..Default::default() },
            executor: GioExecutor::Host,
            host: HostExecutorConfig::default(),
            staging_slots: 256,
            queues_per_drive: 2,
            queue_depth: 256,
            sm_budget: 3,
            force_explicit: false,
            recover_drives: true,
            recovery_timeout: Duration::from_secs(1),
        }
    }
}

/// The executor of the gio_uring path.
#[derive(Clone, Debug, Default)]
pub enum GioExecutor {
    /// Kernels on host threads (`GioConfig::host`).
    #[default]
    Host,
    /// Kernels on a GPU. Without a CUDA driver opening the store fails with
    /// the executor's `NoCuda` error.
    Cuda(Box<tutti_gio_uring::CudaExecutorConfig>),
}

enum Attached {
    None,
    /// `_kv`: the executor's mappings of staged host KV memory, dropped
    /// after the table is unregistered.
    Layer {
        table: TableId,
        per_iocb: usize,
        per_pair: u32,
        staged: bool,
        _kv: Vec<Box<dyn HostMapping>>,
    },
    Explicit {
        reg: Arc<Registration>,
        map: StripeMap,
    },
}

/// One submitted layer: its IOCBs, and the first pair of each.
struct Transfer {
    iocbs: Vec<(IocbId, u32)>,
    /// IOCTX → pair, for explicit IOCBs (layer IOCBs derive it arithmetically).
    explicit: Option<Vec<Vec<u32>>>,
    ioctx_per_pair: u32,
    pairs: usize,
    commands: u64,
    host_calls: u64,
    host_built: u64,
    host_pairs: u64,
}

/// A finished layer with failures of unknown outcome that a recovery of
/// their drives can make known.
struct Held {
    outcome: LayerOutcome,
    /// Pair → the drives of its unknown-outcome commands, for the pairs whose
    /// every such command a drive recovery bounds.
    drives: BTreeMap<u32, BTreeSet<u16>>,
    since: Instant,
}

pub struct GioIo {
    ring: GioUring,
    cfg: GioConfig,
    attached: Attached,
    /// Layers submitted and not yet finished (or finished and not yet polled).
    transfers: HashMap<u64, Transfer>,
    /// Finished layers waiting for their drives' recovery.
    held: HashMap<u64, Held>,
    /// Drives recovered for the layers now held (a recovery pass that has to
    /// wait for another drive does not recover them twice).
    recovered: BTreeSet<u16>,
    /// Recoveries in `recovered`, not yet reported in an outcome.
    pending_recoveries: u64,
    /// Finished layers ready for `poll`.
    ready: HashMap<u64, LayerOutcome>,
    /// Results collected but not yet claimed by their transfer.
    results: HashMap<IocbId, IocbResult>,
    next_token: u64,
    mode: String,
    /// The executor is a GPU's: it can copy CUDA KV memory.
    gpu: bool,
}

/// Whether the drive may still act on an IOCTX that ended with `status`.
///
/// Only a completion the executor reaped is a known outcome: an NVMe status,
/// or a refusal before the command was built (translation, malformed). A
/// completion timeout means the executor expired the command and reused its
/// slot (`tt_slot_expire`; the CID generation keeps a late completion from
/// being taken for the new command's) while the controller may still execute
/// it. `SubmitTimeout` and `QueueDead` are counted unknown as well: the
/// executor's rules say such a command never passed the doorbell
/// (`gio_queue.cuh`: nothing at or after the dead queue's hole is
/// published), but a dead queue is never deleted or reset in this process,
/// so nothing bounds what its controller does; a file costs less than
/// wrong bytes served as a hit. `QueueRecovering` is definite: the executor
/// refused the command before it took a ticket on the queue; so is
/// `StagingTimeout` (no staging slot came free: the command was never built).
pub(crate) fn failure_kind(status: IoStatus) -> FailureKind {
    match status {
        IoStatus::Nvme(_)
        | IoStatus::Translation(_)
        | IoStatus::Invalid(_)
        | IoStatus::StagingTimeout
        | IoStatus::QueueRecovering { .. } => FailureKind::Definite,
        IoStatus::Success
        | IoStatus::Pending
        | IoStatus::CompletionTimeout
        | IoStatus::SubmitTimeout
        | IoStatus::QueueDead { .. }
        | IoStatus::Unknown(_) => FailureKind::Unknown,
    }
}

/// Whether recovering the drive makes the outcome of an IOCTX that ended
/// with `status` known: the command reached (or may have reached) one of the
/// drive's queues, whose deletion completes or aborts it. Statuses the
/// executor should never report for a finished IOCTX (`Pending`, an
/// unrecognised code) say nothing about where the command went.
fn recovery_resolves(status: IoStatus) -> bool {
    matches!(status, IoStatus::CompletionTimeout | IoStatus::SubmitTimeout | IoStatus::QueueDead { .. })
}

fn gio(e: GioError) -> ObjError {
    ObjError::Gio(e.to_string())
}

impl GioIo {
    pub fn new(drives: &[(Arc<Controller>, u32)], cfg: &GioConfig) -> Result<Self> {
        let exec: Arc<dyn Executor> = match &cfg.executor {
            GioExecutor::Host => Arc::new(HostExecutor::new(cfg.host.clone()).map_err(gio)?),
            GioExecutor::Cuda(c) => Arc::new(CudaExecutor::new((**c).clone()).map_err(|e| match e {
                // No driver or no GPU: the configuration cannot be served here, named as such.
                GioError::NoCuda(why) => {
                    ObjError::invalid("executor", format!("the CUDA executor: no CUDA: {why}"))
                }
                e => gio(e),
            })?),
        };
        Self::with_executor(drives, cfg, exec, matches!(cfg.executor, GioExecutor::Cuda(_)))
    }

    /// gio_uring over `drives` (pool order) run by `exec` (e.g. a `CudaExecutor`);
    /// `gpu`: the executor addresses CUDA device memory (registrations of
    /// [`MemoryKind::Cuda`] need it).
    pub fn with_executor(
        drives: &[(Arc<Controller>, u32)],
        cfg: &GioConfig,
        exec: Arc<dyn Executor>,
        gpu: bool,
    ) -> Result<Self> {
        // Each controller's free pairs shared out among the pool's namespaces
        // on it (a controller that grants few, several namespaces of one
        // controller); at least one each, or the driver's error naming the numbers.
        let on_ctrl = |c: &Arc<Controller>| drives.iter().filter(|(d, _)| Arc::ptr_eq(d, c)).count() as u32;
        let share: Vec<u32> =
            drives.iter().map(|(c, _)| (c.free_io_queue_pairs() as u32 / on_ctrl(c).max(1)).max(1)).collect();
        let queues = drives
            .iter()
            .zip(share)
            .map(|((ctrl, nsid), share)| {
                let depth = cfg.queue_depth.clamp(2, ctrl.info().max_queue_entries);
                DriveQueues::create(ctrl, *nsid, cfg.queues_per_drive.clamp(1, share), depth).map_err(gio)
            })
            .collect::<Result<Vec<_>>>()?;
        let ring = GioUring::init_with(cfg.ring.clone(), queues, exec).map_err(gio)?;
        Ok(GioIo {
            ring,
            cfg: cfg.clone(),
            attached: Attached::None,
            transfers: HashMap::new(),
            held: HashMap::new(),
            recovered: BTreeSet::new(),
            pending_recoveries: 0,
            ready: HashMap::new(),
            results: HashMap::new(),
            next_token: 1,
            mode: "gio_uring (no KV memory registered)".into(),
            gpu,
        })
    }

    /// Why layer IOCBs cannot serve this registration, if they cannot.
    fn layer_obstacle(&self, reg: &Registration) -> Option<String> {
        if self.cfg.force_explicit {
            return Some("explicit IOCBs requested".into());
        }
        if reg.tables.len() != 1 {
            return Some(format!("the drives see the KV memory through {} IOMMU views", reg.tables.len()));
        }
        if self.ring.drives().iter().any(|d| !d.sgl.available()) {
            return Some("a drive does not support SGLs".into());
        }
        None
    }

    /// A staged table over the registration's KV memory, with the executor
    /// mappings host memory needs (CUDA memory is already the executor's).
    fn build_staged_table(
        &self,
        reg: &Registration,
        map: &StripeMap,
    ) -> Result<(LayerTable, Vec<Box<dyn HostMapping>>)> {
        let regions = reg.layout.regions();
        let mut maps: Vec<Box<dyn HostMapping>> = Vec::new();
        let mut bases = Vec::with_capacity(regions.len());
        for r in regions {
            match reg.memory_kind {
                MemoryKind::Cuda => bases.push(r.addr),
                MemoryKind::Host | MemoryKind::HostUnmapped => {
                    // SAFETY: the registration keeps the region allocated while attached
                    // (KvStore::register's contract); the mapping is dropped at detach.
                    let m = unsafe {
                        self.ring.executor().map_host(r.addr as *mut u8, r.len as usize, HostRange::Memory)
                    }
                    .map_err(gio)?;
                    bases.push(m.exec_addr());
                    maps.push(m);
                }
            }
        }
        let g = reg.layout.geometry();
        let obj = g.object_bytes();
        let mut table = LayerTable::new(Self::geometry(reg, map), TableKind::Staged).map_err(gio)?;
        Self::check_chunks(&table, map)?;
        for b in 0..reg.layout.num_blocks() {
            for layer in 0..g.layers {
                for (kv, k) in [(0, Kv::K), (1, Kv::V)] {
                    let addr = reg.layout.object_addr(b, layer, kv);
                    let (region, off) = reg.layout.region_of(addr, obj).ok_or_else(|| {
                        ObjError::invalid("layout", format!("object at {addr:#x} outside every region"))
                    })?;
                    table.set_kv(b, layer, k, bases[region] + off).map_err(gio)?;
                }
            }
        }
        Ok((table, maps))
    }

    fn geometry(reg: &Registration, map: &StripeMap) -> LayerGeometry {
        LayerGeometry {
            layers: reg.layout.geometry().layers,
            files: map.files(),
            blocks: reg.layout.num_blocks(),
            object_bytes: map.object_bytes(),
            max_transfer: map.chunk_bytes(),
            drives: (0..map.drive_count())
                .map(|d| PoolDrive {
                    drive: d,
                    data_start_lba: map.drive(d).data_start_lba,
                    lba_size: map.drive(d).lba_size,
                })
                .collect(),
        }
    }

    fn check_chunks(table: &LayerTable, map: &StripeMap) -> Result<()> {
        if table.geometry().chunks() != map.chunks() {
            return Err(ObjError::Gio(format!(
                "gio_uring splits objects into {} commands, the pool into {}",
                table.geometry().chunks(),
                map.chunks()
            )));
        }
        Ok(())
    }

    /// Staging counters of a staged registration.
    pub fn staging(&self) -> Option<tutti_gio_uring::StagingStats> {
        match &self.attached {
            Attached::Layer { table, staged: true, .. } => self.ring.staging_stats(*table).ok(),
            _ => None,
        }
    }

    fn build_table(reg: &Registration, map: &StripeMap) -> Result<LayerTable> {
        let g = reg.layout.geometry();
        let mut table = LayerTable::new(Self::geometry(reg, map), TableKind::Sgl).map_err(gio)?;
        Self::check_chunks(&table, map)?;
        for b in 0..reg.layout.num_blocks() {
            for layer in 0..g.layers {
                for (kv, k) in [(0, Kv::K), (1, Kv::V)] {
                    for c in 0..map.chunks() {
                        let d = reg.descriptor(0, b, layer, kv, c);
                        table.set_entry(b, layer, k, c, DataPtr::Sgl(d)).map_err(gio)?;
                    }
                }
            }
        }
        Ok(table)
    }

    fn take_results(&mut self) -> Result<()> {
        for r in self.ring.poll_cqe().map_err(gio)? {
            self.results.insert(r.id, r);
        }
        Ok(())
    }

    /// Once all IOCBs of `token` are in, its outcome goes to `ready`, or to
    /// `held` when a drive recovery can make some of its failures known.
    fn finish(&mut self, token: u64) -> Result<()> {
        let t = self.transfers.get(&token).ok_or(ObjError::Unknown { what: "layer transfer", id: token })?;
        if !t.iocbs.iter().all(|(id, _)| self.results.contains_key(id)) {
            return Ok(());
        }
        let Some(t) = self.transfers.remove(&token) else { return Ok(()) };
        let mut failed: HashMap<u32, PairFailure> = HashMap::new();
        // Drives of each pair's unknown-outcome commands, and the pairs one of
        // whose unknown outcomes no recovery can settle.
        let mut drives: BTreeMap<u32, BTreeSet<u16>> = BTreeMap::new();
        let mut unresolvable: BTreeSet<u32> = BTreeSet::new();
        for (k, (id, first)) in t.iocbs.iter().enumerate() {
            let Some(r) = self.results.remove(id) else { continue };
            for f in &r.failures {
                let pair = match &t.explicit {
                    Some(maps) => maps[k].get(f.index as usize).copied(),
                    None => Some(first + f.index / t.ioctx_per_pair),
                };
                if let Some(p) = pair.filter(|&p| (p as usize) < t.pairs) {
                    let kind = failure_kind(f.status);
                    if kind == FailureKind::Unknown {
                        if recovery_resolves(f.status) {
                            drives.entry(p).or_default().insert(f.drive);
                        } else {
                            unresolvable.insert(p);
                        }
                    }
                    note_failure(&mut failed, p, PairFailure { kind, why: f.to_string() });
                }
            }
            if r.completed != r.count {
                // Defensive: IOCTXs unaccounted for fail the whole IOCB's pairs.
                let n = r.count.div_ceil(t.ioctx_per_pair);
                let why = format!("{}: {} of {} IOCTXs completed", r.id, r.completed, r.count);
                for p in *first..(*first + n).min(t.pairs as u32) {
                    unresolvable.insert(p);
                    note_failure(&mut failed, p, PairFailure::unknown(why.clone()));
                }
            }
        }
        let outcome = LayerOutcome {
            failed: sorted_failures(failed),
            commands: t.commands,
            host_calls: t.host_calls,
            host_built: t.host_built,
            host_pairs: t.host_pairs,
            ..Default::default()
        };
        drives.retain(|p, _| !unresolvable.contains(p));
        if self.cfg.recover_drives && !drives.is_empty() {
            self.held.insert(token, Held { outcome, drives, since: Instant::now() });
        } else {
            self.ready.insert(token, outcome);
        }
        Ok(())
    }

    /// Whether a submitted layer still has IOCBs with the executor.
    fn in_flight(&self) -> bool {
        self.transfers.values().any(|t| !t.iocbs.iter().all(|(id, _)| self.results.contains_key(id)))
    }

    /// Recovers the drives the held layers' unknown-outcome commands went to
    /// and releases those layers, with the failures a recovery settled made
    /// definite.
    ///
    /// Waits (across calls) until no other layer is in flight, so that no
    /// command of another layer is refused or caught in the recovery; no new
    /// layer is submitted meanwhile. Every command is bounded by the command
    /// and submit timeouts, so after that long the recovery runs anyway (and
    /// may find the drive busy).
    fn recover_held(&mut self) -> Result<()> {
        if self.held.is_empty() {
            return Ok(());
        }
        // Layers that finished meanwhile join this recovery rather than wait for another.
        let done: Vec<u64> = self
            .transfers
            .iter()
            .filter(|(_, t)| t.iocbs.iter().all(|(id, _)| self.results.contains_key(id)))
            .map(|(&token, _)| token)
            .collect();
        for token in done {
            self.finish(token)?;
        }
        let Some(oldest) = self.held.values().map(|h| h.since).min() else { return Ok(()) };
        let patience = self.cfg.ring.submit_timeout + self.cfg.ring.command_timeout;
        let waited = oldest.elapsed();
        if self.in_flight() && waited < patience {
            return Ok(());
        }
        let wanted: BTreeSet<u16> =
            self.held.values().flat_map(|h| h.drives.values().flatten().copied()).collect();
        let mut lost: BTreeMap<u16, String> = BTreeMap::new();
        let (mut recoveries, mut failures) = (0u64, 0u64);
        for d in wanted {
            if self.recovered.contains(&d) {
                continue;
            }
            match self.ring.recover_drive(d, self.cfg.recovery_timeout) {
                Ok(rep) => {
                    tracing::info!(
                        drive = d,
                        expired_commands = rep.expired_commands,
                        dead_queues = rep.dead_queues,
                        elapsed_us = rep.elapsed.as_micros() as u64,
                        "drive recovered after commands of unknown outcome; their outcome is now known"
                    );
                    self.recovered.insert(d);
                    recoveries += 1;
                }
                Err(GioError::RecoveryBusy { .. }) if waited < patience => {
                    // A lane is still inside the queues: try again on a later poll.
                    tracing::debug!(drive = d, "drive recovery deferred: commands still in its queues");
                    self.pending_recoveries += recoveries;
                    return Ok(());
                }
                Err(e) => {
                    tracing::warn!(drive = d, error = %e,
                        "drive recovery failed; outcomes of commands sent to it stay unknown");
                    lost.insert(d, e.to_string());
                    failures += 1;
                }
            }
        }
        let recovered = std::mem::take(&mut self.recovered);
        let mut counts = Some((recoveries + self.pending_recoveries, failures));
        self.pending_recoveries = 0;
        for (token, h) in self.held.drain() {
            let mut outcome = h.outcome;
            for (p, f) in &mut outcome.failed {
                if let Some(ds) = h.drives.get(p) {
                    settle_by_recovery(f, ds, &recovered, &lost);
                }
            }
            if let Some((r, x)) = counts.take() {
                outcome.recoveries = r;
                outcome.recovery_failures = x;
            }
            self.ready.insert(token, outcome);
        }
        Ok(())
    }

    fn submit_explicit(
        &mut self,
        reg: &Registration,
        map: &StripeMap,
        layer: u32,
        pairs: &[Pair],
        op: Op,
    ) -> Result<Option<Transfer>> {
        let cmds = layer_commands(map, reg, layer, pairs);
        let per_pair = 2 * map.chunks() as usize;
        // Whole pairs per IOCB, so a pair's commands share one result.
        let per_iocb = (IOCB_MAX_IOCTX / per_pair).max(1) * per_pair;
        let groups: Vec<&[super::Cmd]> = cmds.chunks(per_iocb).collect();
        let ids = match self.ring.get_iocb(groups.len()) {
            Ok(ids) => ids,
            Err(GioError::PoolExhausted { .. }) => return Ok(None),
            Err(e) => return Err(gio(e)),
        };
        let mut maps = Vec::with_capacity(groups.len());
        let mut iocbs = Vec::with_capacity(groups.len());
        for (&id, group) in ids.iter().zip(&groups) {
            let ctxs: Vec<_> =
                group.iter().map(|c| ioctx(op, c.drive as u16, c.lba, c.nlb, DataRef::Sgl(c.desc))).collect();
            if let Err(e) = self.ring.set_ioctxs(id, &ctxs) {
                let _ = self.ring.release(&ids);
                return Err(gio(e));
            }
            maps.push(group.iter().map(|c| c.pair).collect::<Vec<u32>>());
            iocbs.push((id, group.first().map_or(0, |c| c.pair)));
        }
        if let Err(e) = self.ring.issue(&ids, self.cfg.sm_budget) {
            let _ = self.ring.release(&ids);
            return Err(gio(e));
        }
        Ok(Some(Transfer {
            iocbs,
            explicit: Some(maps),
            ioctx_per_pair: per_pair as u32,
            pairs: pairs.len(),
            commands: cmds.len() as u64,
            host_calls: ids.len() as u64 + 1,
            host_built: cmds.len() as u64,
            host_pairs: pairs.len() as u64,
        }))
    }
}

impl LayerIo for GioIo {
    fn name(&self) -> &'static str {
        "gio_uring"
    }

    fn mode(&self) -> String {
        self.mode.clone()
    }

    fn staging(&self) -> Option<tutti_gio_uring::StagingStats> {
        GioIo::staging(self)
    }

    fn accepts(&self, kind: MemoryKind) -> Result<()> {
        if kind == MemoryKind::Cuda && !self.gpu {
            return Err(ObjError::invalid(
                "memory",
                format!(
                    "CUDA KV memory needs the CUDA executor, and this store runs the {}: configure the gio \
                     backend with GioExecutor::Cuda",
                    self.ring.executor().name()
                ),
            ));
        }
        Ok(())
    }

    fn detach(&mut self) -> Result<()> {
        if let Attached::Layer { table, .. } = &self.attached {
            // On failure the table (and the executor's mappings of its memory) stays attached.
            self.ring.unregister_table(*table).map_err(gio)?;
        }
        self.attached = Attached::None;
        self.mode = "gio_uring (no KV memory registered)".into();
        Ok(())
    }

    fn attach(&mut self, reg: &Arc<Registration>, map: &StripeMap) -> Result<()> {
        self.detach()?;
        let exec = self.ring.executor().name().to_string();
        if reg.staged() {
            let (table, kv) = self.build_staged_table(reg, map)?;
            let id = self.ring.register_staged_table(&table, self.cfg.staging_slots).map_err(gio)?;
            let per_pair = table.geometry().ioctx_per_pair();
            let per_iocb = tutti_gio_uring::pairs_per_iocb(per_pair) as usize;
            self.attached = Attached::Layer { table: id, per_iocb, per_pair, staged: true, _kv: kv };
            self.mode = format!(
                "gio_uring layer IOCBs on the {exec}, staged: the executor copies each chunk between {} KV \
                 memory and {} pinned staging slots",
                reg.memory_kind.name(),
                self.cfg.staging_slots
            );
            tracing::info!(mode = %self.mode, "gio_uring path attached");
            return Ok(());
        }
        match self.layer_obstacle(reg) {
            None => {
                let table = Self::build_table(reg, map)?;
                let id = self.ring.register_table(&table).map_err(gio)?;
                let per_pair = table.geometry().ioctx_per_pair();
                // gio_uring's own split, so IOCB k's first pair is known here.
                let per_iocb = tutti_gio_uring::pairs_per_iocb(per_pair) as usize;
                self.attached =
                    Attached::Layer { table: id, per_iocb, per_pair, staged: false, _kv: Vec::new() };
                self.mode =
                    format!("gio_uring layer IOCBs on the {exec}: the executor expands (file, block) pairs");
            }
            Some(why) => {
                if let Some(d) = self.ring.drives().iter().find(|d| !d.sgl.available()) {
                    return Err(ObjError::drive(
                        d.name.clone(),
                        "has no SGL support; the gio_uring path needs SGLs (use the direct backend)",
                    ));
                }
                self.attached = Attached::Explicit { reg: reg.clone(), map: map.clone() };
                self.mode = format!("gio_uring explicit IOCBs on the {exec}: the host fills IOCTXs ({why})");
            }
        }
        tracing::info!(mode = %self.mode, "gio_uring path attached");
        Ok(())
    }

    fn register_pairs(&mut self, pairs: &[Pair]) -> Result<Option<u64>> {
        if pairs.is_empty() || !matches!(self.attached, Attached::Layer { .. }) {
            return Ok(None);
        }
        let raw: Vec<(u32, u32)> = pairs.iter().map(|p| (p.file, p.block)).collect();
        match self.ring.register_pairs(&raw) {
            Ok(id) => Ok(Some(id.to_raw())),
            Err(e @ GioError::PairListsFull { .. }) => {
                tracing::debug!(error = %e, "job submits its layers with inline pairs");
                Ok(None)
            }
            Err(e) => Err(gio(e)),
        }
    }

    fn unregister_pairs(&mut self, handle: u64) -> Result<()> {
        self.ring.unregister_pairs(PairListId::from_raw(handle)).map_err(gio)
    }

    fn submit(
        &mut self,
        layer: u32,
        pairs: &[Pair],
        dir: Direction,
        registered: Option<u64>,
    ) -> Result<Option<u64>> {
        if !self.held.is_empty() {
            // Drives wait for recovery: let the layers in flight drain first.
            return Ok(None);
        }
        if pairs.is_empty() {
            let token = self.next_token;
            self.next_token += 1;
            let t = Transfer {
                iocbs: Vec::new(),
                explicit: None,
                ioctx_per_pair: 1,
                pairs: 0,
                commands: 0,
                host_calls: 0,
                host_built: 0,
                host_pairs: 0,
            };
            self.transfers.insert(token, t);
            return Ok(Some(token));
        }
        let op = match dir {
            Direction::Load => Op::Read,
            Direction::Store => Op::Write,
        };
        let transfer = match &self.attached {
            Attached::None => return Err(ObjError::NotRegistered),
            Attached::Layer { table, per_iocb, per_pair, .. } => {
                let (table, per_iocb, per_pair) = (*table, *per_iocb, *per_pair);
                let budget = self.cfg.sm_budget;
                // With a registered list nothing here touches the pairs: O(IOCBs) per layer.
                let (submitted, host_pairs) = match registered {
                    Some(h) => {
                        let list = PairListId::from_raw(h);
                        let range = 0..pairs.len() as u32;
                        (self.ring.submit_layer_list(table, layer, list, range, op, budget), 0)
                    }
                    None => {
                        let raw: Vec<(u32, u32)> = pairs.iter().map(|p| (p.file, p.block)).collect();
                        (self.ring.submit_layer(table, layer, &raw, op, budget), pairs.len() as u64)
                    }
                };
                let ids = match submitted {
                    Ok(ids) => ids,
                    Err(GioError::PoolExhausted { .. }) => return Ok(None),
                    Err(e) => return Err(gio(e)),
                };
                Transfer {
                    iocbs: ids.iter().enumerate().map(|(k, &id)| (id, (k * per_iocb) as u32)).collect(),
                    explicit: None,
                    ioctx_per_pair: per_pair,
                    pairs: pairs.len(),
                    commands: pairs.len() as u64 * per_pair as u64,
                    host_calls: 1,
                    host_built: 0,
                    host_pairs,
                }
            }
            Attached::Explicit { reg, map } => {
                let (reg, map) = (reg.clone(), map.clone());
                match self.submit_explicit(&reg, &map, layer, pairs, op)? {
                    Some(t) => t,
                    None => return Ok(None),
                }
            }
        };
        let token = self.next_token;
        self.next_token += 1;
        self.transfers.insert(token, transfer);
        Ok(Some(token))
    }

    fn progress(&mut self) -> Result<()> {
        self.take_results()?;
        self.recover_held()
    }

    fn owner_gone(&mut self, why: &str) {
        self.cfg.recover_drives = false;
        // Layers held for a recovery are reported as they are: their unknown outcomes stay unknown.
        let held = self.held.len();
        for (token, h) in self.held.drain() {
            self.ready.insert(token, h.outcome);
        }
        self.recovered.clear();
        self.pending_recoveries = 0;
        tracing::warn!(held, reason = why, "the pool's owner is gone: no drive is recovered from here on");
    }

    fn poll(&mut self, token: u64) -> Result<Option<LayerOutcome>> {
        self.take_results()?;
        if self.transfers.contains_key(&token) {
            self.finish(token)?;
        } else if !self.held.contains_key(&token) && !self.ready.contains_key(&token) {
            return Err(ObjError::Unknown { what: "layer transfer", id: token });
        }
        self.recover_held()?;
        Ok(self.ready.remove(&token))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tutti_driver::spec::Status;
    use tutti_gio_uring::Translation;

    #[test]
    fn only_reaped_or_refused_commands_have_a_known_outcome() {
        for s in [
            IoStatus::Nvme(Status::WRITE_FAULT),
            IoStatus::Translation(Translation::File),
            IoStatus::Invalid(tutti_gio_uring::Invalid::Length),
        ] {
            assert_eq!(failure_kind(s), FailureKind::Definite, "{s}");
        }
        for s in [
            IoStatus::CompletionTimeout,
            IoStatus::SubmitTimeout,
            IoStatus::QueueDead { queue: 1 },
            IoStatus::Pending,
            IoStatus::Unknown(0x7700_0001),
        ] {
            assert_eq!(failure_kind(s), FailureKind::Unknown, "{s}");
        }
    }

    #[test]
    fn a_drive_recovery_settles_only_commands_that_reached_its_queues() {
        for s in [IoStatus::CompletionTimeout, IoStatus::SubmitTimeout, IoStatus::QueueDead { queue: 0 }] {
            assert!(recovery_resolves(s), "{s}");
        }
        for s in [IoStatus::Pending, IoStatus::Unknown(0x7700_0001), IoStatus::Nvme(Status::WRITE_FAULT)] {
            assert!(!recovery_resolves(s), "{s}");
        }
    }
}
