//! [`KvStore`]: the object store an engine (or the C ABI) talks to.
//!
//! Life of a request:
//!
//! 1. [`KvStore::open`] a pool on drives, [`KvStore::register_host`] (or
//!    [`KvStore::register`]) the engine's KV memory with its cache identity;
//!    the SGL tables are built here, once.
//! 2. [`KvStore::lookup`] the request's chained hashes: the longest stored
//!    prefix comes back pinned ([`Lookup`]).
//! 3. [`KvStore::submit_load`] those files into engine blocks over a layer
//!    range; [`KvStore::wait_layer`] before each layer's attention (paper
//!    Algorithm 1, `retrieve_layer`); [`KvStore::unpin`] when done.
//! 4. New blocks: [`KvStore::begin_store`] reserves files,
//!    [`KvStore::submit_store`] writes layers as they are computed
//!    (`store_layer`), [`KvStore::commit_store`] makes them durable and visible.
//!
//! The store moves bytes itself and asks its [`PoolControl`] for the pool's
//! side (index, pins, reservations, journal): a [`LocalPool`] it opened
//! ([`KvStore::open`]), or a pool another process owns ([`KvStore::attach`]).
//!
//! Every call takes `&self`; the store is `Send + Sync`. Lock order: jobs,
//! then I/O, then the control path's own locks.

pub(crate) mod job_state;
mod jobs;
mod register;
mod reports;
mod session;
mod session_state;

pub use crate::control::Lookup;
pub use job_state::{thread_cpu_ns, JobId, JobStatus, LAYERS_IN_FLIGHT};
pub use reports::{DriveReport, PoolInfo, StoreStats};
pub use session_state::{StoreId, StoreReport};

use crate::control::{PoolControl, PoolShape};
use crate::drives::{DriveSpec, DriveView};
use crate::error::{ObjError, Result};
use crate::geometry::Geometry;
use crate::hash::BlockHash;
use crate::io::direct::DirectIo;
use crate::io::LayerIo;
use crate::journal::ReplayStats;
use crate::local::LocalPool;
use crate::pool::PoolOptions;
use crate::registration::{DataPath, Registration};
use crate::stripe::{DriveShape, StripeMap};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};

/// Which I/O path moves KV objects.
#[derive(Clone, Debug)]
pub enum Backend {
    /// gio_uring with its host executor (the main path).
    Gio(crate::io::gio::GioConfig),
    /// The CPU-driven baseline: the host submits every command.
    /// `recover_queues`: after commands end without a known outcome, delete
    /// and recreate the queue pairs they went to, so that their outcome
    /// becomes known and the files they wrote need no quarantine.
    Direct { queue_depth: u32, recover_queues: bool },
}

/// How to open a store.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    pub pool: PoolOptions,
    pub backend: Backend,
}

impl StoreOptions {
    pub fn new(pool: PoolOptions) -> Self {
        StoreOptions { pool, backend: Backend::Gio(Default::default()) }
    }
}

#[derive(Default)]
struct Counters {
    lookups: AtomicU64,
    lookup_hits: AtomicU64,
    lookup_misses: AtomicU64,
    files_committed: AtomicU64,
    quarantined_files: AtomicU64,
    jobs: AtomicU64,
    layers: AtomicU64,
    commands: AtomicU64,
    host_calls: AtomicU64,
    host_built: AtomicU64,
    host_pairs: AtomicU64,
    pair_lists: AtomicU64,
    pair_registrations: AtomicU64,
    setup_ns: AtomicU64,
    submit_ns: AtomicU64,
    bytes_loaded: AtomicU64,
    bytes_stored: AtomicU64,
    failed_blocks: AtomicU64,
    recoveries: AtomicU64,
    recovery_failures: AtomicU64,
    layers_loaded: AtomicU64,
    layers_stored: AtomicU64,
    load_latency: Latency,
    store_latency: Latency,
    /// Per pool drive: KV bytes of objects loaded from it and stored on it successfully.
    drive_loaded: Box<[AtomicU64]>,
    drive_stored: Box<[AtomicU64]>,
}

impl Counters {
    fn new(drives: usize) -> Counters {
        let zeros = || (0..drives).map(|_| AtomicU64::new(0)).collect();
        Counters { drive_loaded: zeros(), drive_stored: zeros(), ..Counters::default() }
    }
}

/// Layer transfer times in the buckets of [`crate::report::LATENCY_BOUNDS_S`].
#[derive(Default)]
struct Latency {
    buckets: [AtomicU64; crate::report::LATENCY_BUCKETS],
    sum_ns: AtomicU64,
}

impl Latency {
    fn observe(&self, ns: u64) {
        self.buckets[crate::report::latency_bucket(ns)].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    fn snapshot(&self) -> crate::report::LatencyHistogram {
        crate::report::LatencyHistogram {
            buckets: self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect(),
            sum_ns: self.sum_ns.load(Ordering::Relaxed),
        }
    }
}

pub struct KvStore {
    id: u128,
    name: String,
    formatted: bool,
    replay: Vec<ReplayStats>,
    geometry: Geometry,
    drives: Vec<DriveView>,
    map: StripeMap,
    control: Arc<dyn PoolControl>,
    /// Declared before `reg`: the I/O path (and its executor) goes away
    /// before the memory mappings its tables point into.
    io: Mutex<Box<dyn LayerIo>>,
    reg: RwLock<Option<Arc<Registration>>>,
    jobs: Mutex<job_state::Jobs>,
    sessions: Mutex<HashMap<u64, session_state::Session>>,
    /// Session pair lists whose release the I/O path refused (an IOCB still
    /// referenced them); retried whenever a session ends or registers.
    retired_lists: Mutex<Vec<u64>>,
    next_id: AtomicU64,
    counters: Counters,
    /// Asked before every layer goes to the drives (see [`crate::gate`]).
    gate: RwLock<Option<Arc<dyn crate::gate::IoGate>>>,
    /// Why the pool's owner is gone, once the store learnt it ([`KvStore::owner_gone`]).
    gone: OnceLock<String>,
    /// The I/O path was told (under its lock, on the next advance).
    io_told: AtomicBool,
}

fn lock<'a, T>(m: &'a Mutex<T>, what: &'static str) -> Result<MutexGuard<'a, T>> {
    m.lock().map_err(|_| ObjError::Poisoned(what))
}

impl KvStore {
    /// Opens (or formats, per `opts.pool.mode`) the pool on `drives`, given
    /// in pool order, and replays its journals into the index: the pool's
    /// control path lives in this process (a [`LocalPool`]).
    pub fn open(drives: Vec<DriveSpec>, opts: StoreOptions) -> Result<KvStore> {
        let pool = Arc::new(LocalPool::open(drives.clone(), &opts.pool)?);
        let shape = pool.shape().clone();
        Self::attach(drives, shape, pool, &opts.backend)
    }

    /// A store on a pool whose control path is `control` (the pool's owner
    /// may be another process): `drives` are the pool's drives in pool order,
    /// as this process reaches them, and `shape` what the owner says of the
    /// pool. The stripe map built from the drives must place data where the
    /// owner's does.
    pub fn attach(
        drives: Vec<DriveSpec>,
        shape: PoolShape,
        control: Arc<dyn PoolControl>,
        backend: &Backend,
    ) -> Result<KvStore> {
        Self::attach_with(drives, shape, control, Some(backend), None)
    }

    /// [`attach`](Self::attach) for an engine whose layers the pool's owner
    /// moves ([`crate::io::proxy`]): on controllers with no queue pair left
    /// to lease. `drives` still give the stripe map and the DMA spaces the
    /// engine's memory is registered through.
    pub fn attach_proxied(
        drives: Vec<DriveSpec>,
        shape: PoolShape,
        control: Arc<dyn PoolControl>,
        service: Arc<dyn crate::io::proxy::LayerService>,
    ) -> Result<KvStore> {
        Self::attach_with(drives, shape, control, None, Some(service))
    }

    /// A store that moves no bytes: lookups, pins and stats through
    /// `control`, nothing registered, loaded or stored (an engine's scheduler
    /// process, which leases no queue pairs). `drives` are the pool's drives
    /// in pool order as the owner describes them: (controller, namespace id).
    pub fn attach_control(
        drives: &[(&tutti_driver::controller::ControllerInfo, u32)],
        shape: PoolShape,
        control: Arc<dyn PoolControl>,
    ) -> Result<KvStore> {
        let views = drives
            .iter()
            .map(|&(info, nsid)| DriveView::described(info, nsid))
            .collect::<Result<Vec<_>>>()?;
        let map = Self::map_of(&views, &shape)?;
        Ok(Self::assemble(views, map, shape, control, Box::new(crate::io::none::NoIo)))
    }

    fn attach_with(
        drives: Vec<DriveSpec>,
        shape: PoolShape,
        control: Arc<dyn PoolControl>,
        backend: Option<&Backend>,
        service: Option<Arc<dyn crate::io::proxy::LayerService>>,
    ) -> Result<KvStore> {
        let specs: Vec<(Arc<tutti_driver::controller::Controller>, u32)> =
            drives.iter().map(|d| (d.ctrl.clone(), d.nsid)).collect();
        let views = drives.into_iter().map(DriveView::open).collect::<Result<Vec<_>>>()?;
        let map = Self::map_of(&views, &shape)?;
        // gio_uring's executor drives its queue pairs alone; on a controller
        // with none left after the metadata pair (one that grants a single
        // pair) the host drives the layers on the shared pair instead.
        let starved = specs.iter().find(|(c, _)| {
            let namespaces = specs.iter().filter(|(d, _)| Arc::ptr_eq(c, d)).count();
            (c.free_io_queue_pairs() as usize) < namespaces
        });
        let io: Box<dyn LayerIo> = match (backend, service) {
            (_, Some(service)) => Box::new(crate::io::proxy::ProxyIo::new(service)),
            (None, None) => return Err(ObjError::invalid("backend", "no I/O path given")),
            (Some(Backend::Direct { queue_depth, recover_queues }), None) => {
                Box::new(DirectIo::new(&specs, *queue_depth, *recover_queues)?)
            }
            (Some(Backend::Gio(g)), None) => match starved {
                Some((c, _)) => {
                    tracing::warn!(device = %c.name(), granted = c.info().io_queue_pairs,
                        "no I/O queue pair left for gio_uring's executor; the direct backend shares the controller's pair");
                    Box::new(DirectIo::new(&specs, g.queue_depth, g.recover_drives)?)
                }
                None => Box::new(crate::io::gio::GioIo::new(&specs, g)?),
            },
        };
        Ok(Self::assemble(views, map, shape, control, io))
    }

    /// The stripe map of `views`, checked to place data where the pool's owner does.
    fn map_of(views: &[DriveView], shape: &PoolShape) -> Result<StripeMap> {
        let shapes: Vec<DriveShape> = views.iter().map(|d| d.shape).collect();
        let map = StripeMap::new(&shape.geometry, &shapes, shape.journal_pages)?.with_files(shape.files)?;
        let starts: Vec<u64> = map.drives().iter().map(|d| d.data_start_lba).collect();
        if starts != shape.data_start_lba {
            return Err(ObjError::Pool {
                pool: crate::superblock::pool_name(shape.id),
                what: format!(
                    "the drives as seen here put data at LBAs {starts:?}, the pool's owner at {:?}",
                    shape.data_start_lba
                ),
            });
        }
        Ok(map)
    }

    fn assemble(
        views: Vec<DriveView>,
        map: StripeMap,
        shape: PoolShape,
        control: Arc<dyn PoolControl>,
        io: Box<dyn LayerIo>,
    ) -> KvStore {
        let name = crate::superblock::pool_name(shape.id);
        tracing::info!(pool = %name, backend = io.name(), "store open");
        let counters = Counters::new(map.drive_count() as usize);
        KvStore {
            id: shape.id,
            name,
            formatted: shape.formatted,
            replay: shape.replay,
            geometry: shape.geometry,
            drives: views,
            map,
            control,
            io: Mutex::new(io),
            reg: RwLock::new(None),
            jobs: Mutex::new(job_state::Jobs::default()),
            sessions: Mutex::new(HashMap::new()),
            retired_lists: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            counters,
            gate: RwLock::new(None),
            gone: OnceLock::new(),
            io_told: AtomicBool::new(false),
        }
    }

    /// Installs (or with `None` removes) the gate asked before every layer of every later
    /// advance goes to the drives. Jobs already running keep the layers they handed over.
    pub fn set_gate(&self, gate: Option<Arc<dyn crate::gate::IoGate>>) -> Result<()> {
        *self.gate.write().map_err(|_| ObjError::Poisoned("gate"))? = gate;
        Ok(())
    }

    pub(crate) fn gate(&self) -> Option<Arc<dyn crate::gate::IoGate>> {
        self.gate.read().ok().and_then(|g| g.clone())
    }

    /// Why the pool's owner (tuttid, for a store attached to a daemon's pool) is gone, if it
    /// is: the first call that finds it so marks the store disconnected, for good. From then
    /// on every call that needs the owner or starts I/O fails at once with
    /// [`ObjError::PeerGone`] (waits of jobs in flight included); layers not yet submitted are
    /// failed without going to the drives; commands already on the drives are still reaped
    /// (on VFIO drives they complete: the drives outlive the daemon), but no drive is
    /// recovered for them and none is blamed: their outcome stays unknown. Cleanup
    /// ([`cancel`](Self::cancel), [`drain`](Self::drain), [`release`](Self::release),
    /// [`abort_store`](Self::abort_store)) still works. Reconnecting is the caller's: a new
    /// store on a new connection (the C ABI's clients do it themselves, `tutti-capi`'s `link`).
    pub fn owner_gone(&self) -> Option<String> {
        if let Some(why) = self.gone.get() {
            return Some(why.clone());
        }
        let why = self.control.gone()?;
        if self.gone.set(why.clone()).is_ok() {
            tracing::error!(pool = %self.name, reason = %why,
                "the pool's owner is gone: this store is disconnected");
        }
        self.gone.get().cloned()
    }

    /// Fails at once when the pool's owner is gone.
    pub(crate) fn check_owner(&self) -> Result<()> {
        match self.owner_gone() {
            Some(why) => Err(ObjError::PeerGone(why)),
            None => Ok(()),
        }
    }

    /// Tells the I/O path, once, that the owner is gone; called with its lock held.
    pub(crate) fn tell_io(&self, io: &mut dyn LayerIo) {
        if let Some(why) = self.gone.get() {
            if !self.io_told.swap(true, Ordering::AcqRel) {
                io.owner_gone(why);
            }
        }
    }

    pub fn pool_id(&self) -> u128 {
        self.id
    }
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }
    pub fn stripe_map(&self) -> &StripeMap {
        &self.map
    }

    pub fn info(&self) -> PoolInfo {
        let (backend, io_mode, staging) =
            self.io.lock().map(|io| (io.name().to_string(), io.mode(), io.staging())).unwrap_or_default();
        let data_path = self.reg.read().ok().and_then(|r| r.clone()).map(|r| DataPath {
            mode: r.mode(),
            memory: r.memory_kind,
            p2p_missing: r.p2p_missing.clone(),
            provider: r.device.as_ref().map(|d| d.provider.clone()),
            staging,
        });
        PoolInfo {
            pool: self.name.clone(),
            formatted_now: self.formatted,
            geometry: self.geometry,
            drives: self
                .drives
                .iter()
                .enumerate()
                .map(|(i, d)| DriveReport {
                    device: d.name().to_string(),
                    serial: d.serial().trim().to_string(),
                    nsid: d.nsid,
                    lba_size: d.shape.lba_size,
                    blocks: d.shape.blocks,
                    max_transfer: d.shape.max_transfer,
                    data_start_lba: self.map.drive(i as u32).data_start_lba,
                })
                .collect(),
            files: self.map.files(),
            object_bytes: self.map.object_bytes(),
            file_bytes: self.geometry.file_bytes(),
            chunk_bytes: self.map.chunk_bytes(),
            chunks: self.map.chunks(),
            slots_per_file: self.map.slots_per_file(),
            backend,
            io_mode,
            data_path,
            replay: self.replay.clone(),
        }
    }

    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The longest prefix of `hashes` stored under the registered identity,
    /// pinned against eviction until [`unpin`](Self::unpin).
    pub fn lookup(&self, hashes: &[BlockHash]) -> Result<Lookup> {
        self.check_owner()?;
        let id = self.registration()?.identity_id;
        let found = self.control.lookup(id, hashes)?;
        self.counters.lookups.fetch_add(1, Ordering::Relaxed);
        self.counters.lookup_hits.fetch_add(found.files.len() as u64, Ordering::Relaxed);
        self.counters.lookup_misses.fetch_add((hashes.len() - found.files.len()) as u64, Ordering::Relaxed);
        Ok(found)
    }

    /// How many leading chunks are stored. A query only: nothing is pinned
    /// and the LRU order does not change.
    pub fn contains(&self, hashes: &[BlockHash]) -> Result<usize> {
        self.check_owner()?;
        let id = self.registration()?.identity_id;
        self.control.contains(id, hashes)
    }

    /// Releases a lookup's pins (0 is accepted and does nothing).
    pub fn unpin(&self, pin: u64) -> Result<()> {
        if pin == 0 {
            return Ok(());
        }
        // Pins live in the owner: with it gone, there is nothing left to release.
        if self.owner_gone().is_some() {
            return Ok(());
        }
        self.control.unpin(pin)
    }

    /// The pool's control path.
    pub fn control(&self) -> &Arc<dyn PoolControl> {
        &self.control
    }

    pub fn stats(&self) -> StoreStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        // With the pool's owner gone its counters are not there to read (said once, by
        // `owner_gone`); this process's own counters still are.
        let pool = if self.owner_gone().is_some() {
            Default::default()
        } else {
            self.control.stats().unwrap_or_else(|e| {
                tracing::warn!(error = %e, "the pool's counters could not be read");
                Default::default()
            })
        };
        StoreStats {
            index: pool.index,
            lookups: get(&c.lookups),
            lookup_hits: get(&c.lookup_hits),
            lookup_misses: get(&c.lookup_misses),
            jobs: get(&c.jobs),
            layers: get(&c.layers),
            commands: get(&c.commands),
            host_calls: get(&c.host_calls),
            host_built: get(&c.host_built),
            host_pairs: get(&c.host_pairs),
            pair_lists: get(&c.pair_lists),
            pair_registrations: get(&c.pair_registrations),
            setup_ns: get(&c.setup_ns),
            submit_ns: get(&c.submit_ns),
            bytes_loaded: get(&c.bytes_loaded),
            bytes_stored: get(&c.bytes_stored),
            failed_blocks: get(&c.failed_blocks),
            files_committed: get(&c.files_committed),
            journal_appends: pool.journal_appends,
            quarantined_files: get(&c.quarantined_files),
            recoveries: get(&c.recoveries),
            recovery_failures: get(&c.recovery_failures),
        }
    }
}

impl KvStore {
    /// The data path's counters since the store was opened: what a client of tuttid reports
    /// to it (see [`crate::report`]).
    pub fn data_report(&self) -> crate::report::DataPathReport {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (mut drives, staging) = match self.io.lock() {
            Ok(io) => (io.drive_io(), io.staging()),
            Err(_) => (Vec::new(), None),
        };
        let n = c.drive_loaded.len();
        if drives.len() < n {
            drives.resize(n, crate::report::DriveIo::default());
        }
        for (d, io) in drives.iter_mut().enumerate().take(n) {
            io.bytes_loaded = get(&c.drive_loaded[d]);
            io.bytes_stored = get(&c.drive_stored[d]);
        }
        let gate = self.gate().map(|g| g.waits()).unwrap_or_default();
        crate::report::DataPathReport {
            layers_loaded: get(&c.layers_loaded),
            layers_stored: get(&c.layers_stored),
            bytes_loaded: get(&c.bytes_loaded),
            bytes_stored: get(&c.bytes_stored),
            commands: get(&c.commands),
            failed_blocks: get(&c.failed_blocks),
            queue_recoveries: get(&c.recoveries),
            queue_recovery_failures: get(&c.recovery_failures),
            load_latency: c.load_latency.snapshot(),
            store_latency: c.store_latency.snapshot(),
            drives,
            gate,
            staging: staging.map(|s| crate::report::StagingNow {
                slots: s.slots as u64,
                in_use: s.in_use_now,
                withheld: s.withheld_now,
                waits: s.waits,
            }),
        }
    }

    /// Hands the owner of the pool the data path's counters, if it collects them; called
    /// just before each `end_load` and `settle`.
    pub(crate) fn offer_report(&self) {
        if self.control.wants_reports() {
            self.control.report(self.data_report());
        }
    }
}

impl Drop for KvStore {
    fn drop(&mut self) {
        // Nothing is written on the way out: every durable state was reached
        // by an explicit commit, so dropping the store is a crash-equivalent stop.
        tracing::debug!(pool = %self.name, "store closed");
    }
}
