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

use super::{layer_commands, Direction, LayerIo, LayerOutcome, LayerRequest, Pair};
use crate::error::{ObjError, Result};
use crate::registration::KvMemoryKind as MemoryKind;
use crate::registration::Registration;
use crate::stripe::StripeMap;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tutti_driver::controller::Controller;
use tutti_gio_uring::mem::HostMapping;
use tutti_gio_uring::{
    ioctx, CudaExecutor, DataRef, DriveQueues, Executor, GioError, GioUring, HostExecutor,
    HostExecutorConfig, IocbId, IocbResult, Op, PairListId, TableId,
};
use tutti_kernels::abi::IOCB_MAX_IOCTX;

mod recovery;
mod tables;

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

    /// Staging counters of a staged registration.
    pub fn staging(&self) -> Option<tutti_gio_uring::StagingStats> {
        match &self.attached {
            Attached::Layer { table, staged: true, .. } => self.ring.staging_stats(*table).ok(),
            _ => None,
        }
    }

    fn take_results(&mut self) -> Result<()> {
        for r in self.ring.poll_cqe().map_err(gio)? {
            self.results.insert(r.id, r);
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

    fn drive_io(&self) -> Vec<crate::report::DriveIo> {
        let mut out = vec![crate::report::DriveIo::default(); self.ring.drives().len()];
        match self.ring.queue_stats() {
            Ok(queues) => {
                for q in queues {
                    if let Some(d) = out.get_mut(q.drive as usize) {
                        d.commands += q.completed;
                        d.status_errors += q.errors;
                        d.timeouts += q.expired;
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "reading the queue pairs' counters failed"),
        }
        out
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

    fn submit(&mut self, req: LayerRequest<'_>) -> Result<Option<u64>> {
        let LayerRequest { layer, pairs, dir, registered } = req;
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
