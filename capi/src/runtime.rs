//! The runtime: drives, the object store on them, and the profiler, behind
//! one opaque handle.

use crate::config::{tutti_geometry_t, tutti_runtime_config_t, Rig, RuntimeConfig};
use crate::error::{guard, Result};
use crate::handles::Registry;
use crate::profile_state::ProfileState;
use crate::ptr::{self, SizePrefixed};
use crate::sched_gate::{self, SchedGate};
use crate::status::TUTTI_OK;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tutti_objstore::{Geometry, KvStore};

/// An open runtime (opaque).
pub struct tutti_runtime_t {
    _private: [u8; 0],
}

pub(crate) struct Runtime {
    /// Declared before the rig: the store goes before the controllers it drives.
    pub store: KvStore,
    /// Held to keep the controllers running; read only by fault injection.
    #[cfg_attr(not(feature = "fault-injection"), allow(dead_code))]
    pub rig: Rig,
    pub executor: u32,
    pub geometry: Geometry,
    /// What the current registration is.
    pub registered: Mutex<Option<Registered>>,
    pub profile: Mutex<ProfileState>,
    /// Queue depth: per live unfinished job, its layers not yet finished.
    pub in_flight: Mutex<HashMap<u64, u32>>,
    pub stores_open: AtomicU64,
    /// Blocks jobs reported failed, each counted once per job (`Job::count_failures`).
    pub failed_blocks: AtomicU64,
    /// The scheduler every layer of every job asks before it goes to the drives.
    pub sched: Arc<SchedGate>,
    next_key: AtomicU64,
}

/// The parts of the current KV registration the C layer checks against.
#[derive(Clone, Debug)]
pub(crate) struct Registered {
    pub model: String,
    pub num_blocks: u32,
}

pub(crate) static RUNTIMES: Registry<Runtime> = Registry::new("tutti_runtime_t", 1);

impl Runtime {
    pub(crate) fn get(rt: *const tutti_runtime_t) -> Result<Arc<Runtime>> {
        RUNTIMES.get(rt)
    }

    pub(crate) fn new(store: KvStore, rig: Rig, executor: u32, geometry: Geometry) -> Result<Runtime> {
        let map = store.stripe_map();
        let sched =
            Arc::new(SchedGate::new(map.drive_count() as usize, geometry.layers, map.object_bytes())?);
        sched_gate::install(&store, &sched)?;
        Ok(Runtime {
            store,
            rig,
            executor,
            geometry,
            registered: Mutex::new(None),
            profile: Mutex::new(ProfileState::new(geometry.layers)?),
            in_flight: Mutex::new(HashMap::new()),
            stores_open: AtomicU64::new(0),
            failed_blocks: AtomicU64::new(0),
            sched,
            next_key: AtomicU64::new(1),
        })
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
        let rt = Runtime::new(store, rig, cfg.executor, geometry)?;
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
        let info = rt.store.info();
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
            pool_id: rt.store.pool_id().to_le_bytes(),
        };
        Ok(TUTTI_OK)
    })
}
