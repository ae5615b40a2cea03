//! The runtime: drives, the object store on them, and the profiler, behind
//! one opaque handle.

use crate::config::{tutti_geometry_t, tutti_runtime_config_t, Rig, RuntimeConfig};
use crate::error::{guard, CapiError, Result};
use crate::handles::Registry;
use crate::link::{Current, Host, Link, Registered};
use crate::profile_state::ProfileState;
use crate::ptr::{self, SizePrefixed};
use crate::sched_gate::{self, SchedGate};
use crate::status::TUTTI_OK;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use tutti_daemon::arbitration::SharedArbitration;
use tutti_objstore::{Geometry, KvStore, StoreStats};

/// An open runtime (opaque).
pub struct tutti_runtime_t {
    _private: [u8; 0],
}

pub(crate) struct Runtime {
    /// The store of the current connection (a runtime opened in process has one for good; a
    /// client of tuttid gets a new one each time it reconnects, see `link`). Jobs and store
    /// sessions hold the store they were made on. Declared before the rig: the store goes
    /// before the controllers it drives.
    current: RwLock<Current>,
    /// How a client of tuttid reconnects; `None` in process.
    pub link: Option<Link>,
    /// Held to keep the controllers running; read only by fault injection.
    #[cfg_attr(not(feature = "fault-injection"), allow(dead_code))]
    pub rig: Rig,
    pub executor: u32,
    pub geometry: Geometry,
    /// What the current registration is (and, for a client, what to register again after a
    /// reconnect).
    pub registered: Mutex<Option<Registered>>,
    pub profile: Mutex<ProfileState>,
    /// Queue depth: per live unfinished job, its layers not yet finished.
    pub in_flight: Mutex<HashMap<u64, u32>>,
    pub stores_open: AtomicU64,
    /// Blocks jobs reported failed, each counted once per job (`Job::count_failures`).
    pub failed_blocks: AtomicU64,
    /// The counters of the stores of earlier connections (a client that reconnected), so that
    /// the runtime's counters never go down.
    pub retired: Mutex<StoreStats>,
    /// The scheduler every layer of every job asks before it goes to the drives.
    pub sched: Arc<SchedGate>,
    next_key: AtomicU64,
}

pub(crate) static RUNTIMES: Registry<Runtime> = Registry::new("tutti_runtime_t", 1);

impl Runtime {
    pub(crate) fn get(rt: *const tutti_runtime_t) -> Result<Arc<Runtime>> {
        RUNTIMES.get(rt)
    }

    pub(crate) fn new(
        store: KvStore,
        rig: Rig,
        executor: u32,
        geometry: Geometry,
        link: Option<Link>,
    ) -> Result<Runtime> {
        let map = store.stripe_map();
        let sched =
            Arc::new(SchedGate::new(map.drive_count() as usize, geometry.layers, map.object_bytes())?);
        sched_gate::install(&store, &sched, 0)?;
        Ok(Runtime {
            current: RwLock::new(Current { store: Arc::new(store), epoch: 0 }),
            link,
            rig,
            executor,
            geometry,
            registered: Mutex::new(None),
            profile: Mutex::new(ProfileState::new(geometry.layers)?),
            in_flight: Mutex::new(HashMap::new()),
            stores_open: AtomicU64::new(0),
            failed_blocks: AtomicU64::new(0),
            retired: Mutex::new(StoreStats::default()),
            sched,
            next_key: AtomicU64::new(1),
        })
    }

    /// The store of the current connection, as it is (no reconnect): for calls that only
    /// report or clean up.
    pub(crate) fn current(&self) -> Current {
        match self.current.read() {
            Ok(c) => c.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// The store to start something on: a client whose tuttid went away reconnects first when
    /// its link allows an attempt now (`link`); while it cannot, this fails at once naming
    /// tuttid and the last attempt.
    pub(crate) fn store(&self) -> Result<Arc<KvStore>> {
        Ok(self.live()?.store)
    }

    /// As [`store`](Self::store), with the connection's epoch.
    pub(crate) fn live(&self) -> Result<Current> {
        let cur = self.current();
        match &self.link {
            Some(link) => link.ensure(self, cur),
            None => Ok(cur),
        }
    }

    /// Puts the store of a new connection in place; returns the one it replaces.
    pub(crate) fn swap(&self, next: Current) -> Result<Current> {
        let mut c = self.current.write().map_err(|_| CapiError::Poisoned("runtime"))?;
        Ok(std::mem::replace(&mut *c, next))
    }

    /// Adds the counters of a store put out of use to the runtime's.
    pub(crate) fn retire(&self, old: &KvStore) {
        let o = old.stats();
        if let Ok(mut r) = self.retired.lock() {
            add_counters(&mut r, &o);
        }
    }

    pub(crate) fn next_key(&self) -> u64 {
        self.next_key.fetch_add(1, Ordering::Relaxed)
    }

    /// Records a job's unfinished layers (0 removes it) for the queue-depth stats.
    pub(crate) fn set_in_flight(&self, key: u64, layers_left: u32) {
        if let Ok(mut m) = self.in_flight.lock() {
            if layers_left == 0 {
                m.remove(&key);
            } else {
                m.insert(key, layers_left);
            }
        }
    }
}

impl Host for Runtime {
    fn current(&self) -> Current {
        Runtime::current(self)
    }
    fn swap(&self, next: Current) -> Result<Current> {
        Runtime::swap(self, next)
    }
    fn registered(&self) -> Result<Option<Registered>> {
        Ok(crate::error::lock(&self.registered, "registration")?.clone())
    }
    fn install_gate(&self, store: &KvStore, epoch: u64) -> Result<()> {
        sched_gate::install(store, &self.sched, epoch)
    }
    fn reshare(&self, board: Arc<SharedArbitration>) -> Result<()> {
        self.sched.reshare(board)
    }
    fn retire(&self, old: &KvStore) {
        Runtime::retire(self, old)
    }
    fn abandon_before(&self, epoch: u64) -> Result<usize> {
        self.sched.abandon_before(epoch)
    }
}

/// Adds the counters of `from` (a store's, since it opened) to `into`; the pool's own
/// (`index`) are left alone.
pub(crate) fn add_counters(into: &mut StoreStats, from: &StoreStats) {
    for (dst, src) in [
        (&mut into.lookups, from.lookups),
        (&mut into.lookup_hits, from.lookup_hits),
        (&mut into.lookup_misses, from.lookup_misses),
        (&mut into.jobs, from.jobs),
        (&mut into.layers, from.layers),
        (&mut into.commands, from.commands),
        (&mut into.host_calls, from.host_calls),
        (&mut into.host_built, from.host_built),
        (&mut into.host_pairs, from.host_pairs),
        (&mut into.pair_lists, from.pair_lists),
        (&mut into.setup_ns, from.setup_ns),
        (&mut into.submit_ns, from.submit_ns),
        (&mut into.bytes_loaded, from.bytes_loaded),
        (&mut into.bytes_stored, from.bytes_stored),
        (&mut into.files_committed, from.files_committed),
        (&mut into.quarantined_files, from.quarantined_files),
    ] {
        *dst = dst.saturating_add(src);
    }
}

/// What the runtime's pool is. Set `struct_size = sizeof(tutti_runtime_info_t)`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tutti_runtime_info_t {
    pub struct_size: u32,
    pub drives: u32,
    /// Pool files: one file holds one KV block (every layer, K and V).
    pub files: u32,
    /// Chunks an object is split into across the drives.
    pub chunks: u32,
    /// One K or V slice of one block in one layer.
    pub object_bytes: u64,
    /// One block: all layers, K and V.
    pub file_bytes: u64,
    pub geometry: tutti_geometry_t,
    /// 1 if opening formatted the drives.
    pub formatted_now: u32,
    /// `TUTTI_EXECUTOR_*`.
    pub executor: u32,
    /// The pool's identity (little endian).
    pub pool_id: [u8; 16],
}

// SAFETY: repr(C) with `struct_size: u32` first.
unsafe impl SizePrefixed for tutti_runtime_info_t {
    const NAME: &'static str = "tutti_runtime_info_t";
}

/// Opens a runtime: starts or opens the drives, opens (or formats) the pool on
/// them per `open_mode`, and starts the I/O path. On success `*out` is a new
/// handle; close it with `tutti_runtime_destroy`. Drives or media that another
/// runtime (in this process or another) owns give `TUTTI_E_BUSY`, naming the
/// holder, before anything is written.
///
/// # Safety
/// `config` is NULL or points to a `tutti_runtime_config_t` whose pointer
/// fields follow their docs; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tutti_runtime_open(
    config: *const tutti_runtime_config_t,
    out: *mut *mut tutti_runtime_t,
) -> i32 {
    guard("tutti_runtime_open", || {
        // SAFETY: forwarded from the caller.
        let out = unsafe { ptr::out(out, "out")? };
        *out = std::ptr::null_mut();
        // SAFETY: forwarded from the caller.
        let cfg = unsafe { RuntimeConfig::from_c(&ptr::sized_in_prefix(config)?)? };
        let (rig, specs) = cfg.start_drives()?;
        let geometry = cfg.options.pool.geometry;
        let store = KvStore::open(specs, cfg.options)?;
        let rt = Runtime::new(store, rig, cfg.executor, geometry, None)?;
        *out = RUNTIMES.insert(Arc::new(rt));
        Ok(TUTTI_OK)
    })
}

/// Closes a runtime handle. Jobs and stores made from it stay valid; the
/// drives and the pool are released when the last of them is destroyed too.
/// NULL is a no-op; a handle already closed gets `TUTTI_E_BAD_HANDLE`.
///
/// # Safety
/// `rt` is NULL or a value returned by `tutti_runtime_open` (a stale one is detected).
#[no_mangle]
pub unsafe extern "C" fn tutti_runtime_destroy(rt: *mut tutti_runtime_t) -> i32 {
    guard("tutti_runtime_destroy", || {
        drop(RUNTIMES.remove(rt)?);
        Ok(TUTTI_OK)
    })
}

/// Describes the runtime's pool.
///
/// # Safety
/// `rt` is a runtime handle (checked); `out` is NULL or points to a
/// `tutti_runtime_info_t` with `struct_size` set.
#[no_mangle]
pub unsafe extern "C" fn tutti_runtime_info(rt: *mut tutti_runtime_t, out: *mut tutti_runtime_info_t) -> i32 {
    guard("tutti_runtime_info", || {
        let rt = Runtime::get(rt)?;
        // SAFETY: forwarded from the caller.
        let out = unsafe { ptr::sized_out(out)? };
        let store = rt.store().unwrap_or_else(|_| rt.current().store);
        let info = store.info();
        *out = tutti_runtime_info_t {
            struct_size: out.struct_size,
            drives: info.drives.len() as u32,
            files: info.files,
            chunks: info.chunks,
            object_bytes: info.object_bytes,
            file_bytes: info.file_bytes,
            geometry: tutti_geometry_t::from_geometry(&rt.geometry),
            formatted_now: info.formatted_now as u32,
            executor: rt.executor,
            pool_id: store.pool_id().to_le_bytes(),
        };
        Ok(TUTTI_OK)
    })
}
