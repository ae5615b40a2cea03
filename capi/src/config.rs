//! The runtime configuration C passes in, and its translation into drives
//! and object-store options. Every field is checked here; the error names it.
//! The I/O path's settings, which clients of tuttid give too, are in `io_config`.

use crate::error::{CapiError, Result};
use crate::io_config::{io_fields, DEFAULT_IO_TIMEOUT_MS, TUTTI_EXECUTOR_CONTROL};
use crate::ptr::{self, SizePrefixed};
use std::ffi::c_char;
use std::path::PathBuf;
use std::time::Duration;
use tutti_driver::controller::{Controller, ControllerOptions};
use tutti_driver::DriverError;
use tutti_emulator::{
    CostModel, EmulatedConfig, EmulatedController, MediaConfig, MixedModel, NamespaceConfig,
};
use tutti_objstore::{DriveSpec, Dtype, Geometry, ObjError, OpenMode, PoolOptions, StoreOptions};

/// 32-bit float KV.
pub const TUTTI_DTYPE_F32: u32 = 1;
/// IEEE half.
pub const TUTTI_DTYPE_F16: u32 = 2;
/// bfloat16.
pub const TUTTI_DTYPE_BF16: u32 = 3;
/// 8-bit float, E4M3.
pub const TUTTI_DTYPE_FP8_E4M3: u32 = 4;
/// 8-bit float, E5M2.
pub const TUTTI_DTYPE_FP8_E5M2: u32 = 5;
/// 8-bit integer (quantized KV).
pub const TUTTI_DTYPE_I8: u32 = 6;

/// Emulated NVMe controllers in this process (RAM or file media).
pub const TUTTI_DRIVES_EMULATED: u32 = 1;
/// NVMe drives bound to vfio-pci.
pub const TUTTI_DRIVES_VFIO: u32 = 2;

/// Format the drives as a new, empty pool.
pub const TUTTI_OPEN_CREATE: u32 = 1;
/// Open the pool the drives hold; anything else is an error.
pub const TUTTI_OPEN_EXISTING: u32 = 2;
/// Open the pool the drives hold, or format them if every one is blank.
pub const TUTTI_OPEN_OR_CREATE: u32 = 3;

const MAX_EMULATED: u32 = 64;
const MAX_VFIO: u32 = 64;
const MIN_EMULATED_BYTES: u64 = 4 << 20;
const MAX_EMULATED_BYTES: u64 = 1 << 42;

/// The KV-cache shape of one model (per tensor-parallel rank). Embedded in
/// other structs, so it carries no size prefix.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct tutti_geometry_t {
    pub layers: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    /// Tokens per KV block: one block is one chunk of the chained hash.
    pub tokens_per_block: u32,
    /// `TUTTI_DTYPE_*`.
    pub dtype: u32,
}

/// How to open a runtime. Set `struct_size = sizeof(tutti_runtime_config_t)`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tutti_runtime_config_t {
    pub struct_size: u32,
    /// `TUTTI_DRIVES_*`.
    pub drives: u32,
    /// EMULATED: number of drives, 1..=64.
    pub emulated_count: u32,
    /// EMULATED: 512 or 4096 (0 = 512).
    pub emulated_lba_size: u32,
    /// EMULATED: bytes per drive, at least 4 MiB, a multiple of the LBA size.
    pub emulated_capacity_bytes: u64,
    /// EMULATED, nullable: NULL keeps media in RAM (gone at close); otherwise
    /// media are the files `<dir>/emu<i>.img` (created if absent) and survive.
    /// A directory that does not exist is created (with its parents); a
    /// relative path is taken from the process's current directory. The empty
    /// string is refused (`TUTTI_E_INVALID_ARG`): it names no directory (pass
    /// "." for the current one).
    /// A runtime owns its media files until it is closed: each is locked
    /// (`flock`) and `<dir>/emu<i>.img.owner` names the owner (pid, command
    /// line). A second runtime on the same files, in this process or another,
    /// in any open mode, gets `TUTTI_E_BUSY` naming the holder, before anything
    /// is written; a record left by a dead owner blocks nothing.
    pub emulated_dir: *const c_char,
    /// VFIO: `vfio_count` PCI addresses such as "0000:01:00.0", in pool order.
    pub vfio_bdfs: *const *const c_char,
    pub vfio_count: u32,
    /// VFIO: 1 = vfio's unsafe no-IOMMU mode (testing only).
    pub vfio_noiommu: u32,
    /// `TUTTI_EXECUTOR_*`.
    pub executor: u32,
    /// `TUTTI_OPEN_*`.
    pub open_mode: u32,
    pub geometry: tutti_geometry_t,
    /// Deadline of one NVMe command in ms (0 = 2000).
    pub io_timeout_ms: u32,
    /// Host executor: its OS threads, each running one block of 32 lanes as fibers (0 = 1).
    pub host_lane_blocks: u32,
    /// Alignment padding of ABI 1.0..1.3 (ignored; set 0).
    pub rsvd0: u32,
    /// ABI 1.4, GIO_CUDA: the CUDA device ordinal.
    pub cuda_device: u32,
    /// ABI 1.4, GIO_CUDA: SMs of the I/O partition (a green context); 0 runs
    /// in the primary context with every SM.
    pub cuda_sm_count: u32,
    /// ABI 1.4, GIO_CUDA, nullable: the CUDA driver library to load instead
    /// of `libcuda.so` from the loader path.
    pub cuda_driver: *const c_char,
    /// ABI 1.4: staging slots (one chunk each, pinned host memory) for KV
    /// memory the drives cannot reach (`TUTTI_MEMORY_CUDA`,
    /// `TUTTI_MEMORY_HOST_STAGED`); 0 = 256. More commands than slots wait.
    pub staging_slots: u32,
    /// ABI 1.4, GIO_CUDA: threads per block of the I/O kernels, a multiple of 32
    /// up to 512 (0 = 512). Fewer suit a stand-in driver that runs every GPU
    /// thread as a host thread.
    pub cuda_block_threads: u32,
    /// ABI 1.5, EMULATED: read bandwidth of each drive in bytes/s (0 = unpaced).
    /// Reads and writes are paced on separate channels.
    pub emulated_read_bytes_per_sec: u64,
    /// ABI 1.5, EMULATED: write bandwidth of each drive in bytes/s (0 = unpaced).
    pub emulated_write_bytes_per_sec: u64,
    /// ABI 1.5, EMULATED: latency of every I/O command in µs, up to 10 s (0 = none).
    pub emulated_latency_us: u32,
    /// ABI 1.5, EMULATED: extra latency of each Read in µs, up to 10 s.
    pub emulated_read_latency_us: u32,
    /// ABI 1.5, EMULATED: extra latency of each Write in µs, up to 10 s.
    pub emulated_write_latency_us: u32,
    /// Alignment padding (ignored; set 0).
    pub rsvd1: u32,
    /// ABI 1.5, EMULATED: while reads and writes are both in flight a drive
    /// keeps this fraction, in (0, 1], of its faster direction's bandwidth
    /// (0.4 = a 60% collapse); 0 = no collapse. Needs a read or write bandwidth.
    pub emulated_mixed_efficiency: f64,
    /// ABI 1.5, EMULATED: share of the mixed bandwidth reads get, in (0, 1);
    /// writes get the rest (0 = 0.5).
    pub emulated_mixed_read_share: f64,
    /// ABI 1.8: `TUTTI_EXEC_MODE_*`, how the gio executor runs its kernels
    /// (0 = launch). Leave it 0 with `TUTTI_EXECUTOR_DIRECT`.
    pub exec_mode: u32,
    /// Alignment padding (ignored; set 0).
    pub rsvd2: u32,
}

impl Default for tutti_runtime_config_t {
    fn default() -> Self {
        tutti_runtime_config_t {
            struct_size: 0,
            drives: 0,
            emulated_count: 0,
            emulated_lba_size: 0,
            emulated_capacity_bytes: 0,
            emulated_dir: std::ptr::null(),
            vfio_bdfs: std::ptr::null(),
            vfio_count: 0,
            vfio_noiommu: 0,
            executor: 0,
            open_mode: 0,
            geometry: tutti_geometry_t::default(),
            io_timeout_ms: 0,
            host_lane_blocks: 0,
            rsvd0: 0,
            cuda_device: 0,
            cuda_sm_count: 0,
            cuda_driver: std::ptr::null(),
            staging_slots: 0,
            cuda_block_threads: 0,
            emulated_read_bytes_per_sec: 0,
            emulated_write_bytes_per_sec: 0,
            emulated_latency_us: 0,
            emulated_read_latency_us: 0,
            emulated_write_latency_us: 0,
            rsvd1: 0,
            emulated_mixed_efficiency: 0.0,
            emulated_mixed_read_share: 0.0,
            exec_mode: 0,
            rsvd2: 0,
        }
    }
}

// SAFETY: repr(C) with `struct_size: u32` first; `rsvd0`, `rsvd1` and `rsvd2` make
// the padding fields, so the struct has none; any bit pattern is a valid f64.
unsafe impl SizePrefixed for tutti_runtime_config_t {
    const NAME: &'static str = "tutti_runtime_config_t";
    const SIZES: &'static [u32] = &[
        std::mem::offset_of!(tutti_runtime_config_t, cuda_device) as u32,
        std::mem::offset_of!(tutti_runtime_config_t, emulated_read_bytes_per_sec) as u32,
        std::mem::offset_of!(tutti_runtime_config_t, exec_mode) as u32,
        std::mem::size_of::<tutti_runtime_config_t>() as u32,
    ];
}

pub(crate) fn dtype(code: u32) -> Result<Dtype> {
    u8::try_from(code).ok().and_then(Dtype::from_code).ok_or_else(|| {
        CapiError::invalid("geometry.dtype", format!("{code} is not a TUTTI_DTYPE_* value (1..=6)"))
    })
}

impl tutti_geometry_t {
    pub(crate) fn to_geometry(self) -> Result<Geometry> {
        let g = Geometry {
            layers: self.layers,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            tokens_per_block: self.tokens_per_block,
            dtype: dtype(self.dtype)?,
        };
        g.validate()?;
        Ok(g)
    }

    pub(crate) fn from_geometry(g: &Geometry) -> Self {
        tutti_geometry_t {
            layers: g.layers,
            kv_heads: g.kv_heads,
            head_dim: g.head_dim,
            tokens_per_block: g.tokens_per_block,
            dtype: g.dtype.code() as u32,
        }
    }
}

/// Where the pool's drives come from.
pub(crate) enum DriveSource {
    Emulated { count: u32, lba_size: u32, bytes: u64, dir: Option<PathBuf>, cost: CostModel },
    Vfio { bdfs: Vec<String>, noiommu: bool },
}

/// A checked configuration.
pub(crate) struct RuntimeConfig {
    pub source: DriveSource,
    pub executor: u32,
    pub options: StoreOptions,
    pub io_timeout: Duration,
}

impl RuntimeConfig {
    /// # Safety
    /// The pointers in `c` follow the field docs of [`tutti_runtime_config_t`].
    pub(crate) unsafe fn from_c(c: &tutti_runtime_config_t) -> Result<Self> {
        let source = match c.drives {
            TUTTI_DRIVES_EMULATED => {
                if c.emulated_count == 0 || c.emulated_count > MAX_EMULATED {
                    return Err(CapiError::invalid(
                        "emulated_count",
                        format!("{} is not within 1..={MAX_EMULATED}", c.emulated_count),
                    ));
                }
                let lba_size = match c.emulated_lba_size {
                    0 | 512 => 512,
                    4096 => 4096,
                    n => {
                        return Err(CapiError::invalid(
                            "emulated_lba_size",
                            format!("{n} is not 512 or 4096"),
                        ))
                    }
                };
                let bytes = c.emulated_capacity_bytes;
                if !(MIN_EMULATED_BYTES..=MAX_EMULATED_BYTES).contains(&bytes)
                    || !bytes.is_multiple_of(lba_size as u64)
                {
                    return Err(CapiError::invalid(
                        "emulated_capacity_bytes",
                        format!(
                            "{bytes} is not a multiple of {lba_size} within {MIN_EMULATED_BYTES}..={MAX_EMULATED_BYTES}"
                        ),
                    ));
                }
                let dir = if c.emulated_dir.is_null() {
                    None
                } else {
                    // SAFETY: forwarded from the caller.
                    let d = unsafe { ptr::str_in(c.emulated_dir, "emulated_dir", 4096)? };
                    if d.is_empty() {
                        return Err(CapiError::invalid(
                            "emulated_dir",
                            "the empty string names no directory (NULL keeps media in RAM; \".\" is the current directory)",
                        ));
                    }
                    Some(PathBuf::from(d))
                };
                let cost = emulated_cost(c)?;
                DriveSource::Emulated { count: c.emulated_count, lba_size, bytes, dir, cost }
            }
            TUTTI_DRIVES_VFIO => {
                if let Some(field) = emulated_cost_field_set(c) {
                    return Err(CapiError::invalid(
                        field,
                        "applies only to TUTTI_DRIVES_EMULATED (leave it 0 with VFIO drives)",
                    ));
                }
                if c.vfio_count == 0 || c.vfio_count > MAX_VFIO {
                    return Err(CapiError::invalid(
                        "vfio_count",
                        format!("{} is not within 1..={MAX_VFIO}", c.vfio_count),
                    ));
                }
                // SAFETY: forwarded from the caller.
                let ptrs = unsafe {
                    ptr::slice_in(c.vfio_bdfs, c.vfio_count as usize, "vfio_bdfs", MAX_VFIO as u64)?
                };
                let bdfs = ptrs
                    .iter()
                    // SAFETY: each entry is a NUL-terminated string, per the field docs.
                    .map(|&p| unsafe { ptr::str_in(p, "vfio_bdfs[i]", 64) }.map(str::to_string))
                    .collect::<Result<Vec<_>>>()?;
                DriveSource::Vfio { bdfs, noiommu: ptr::flag(c.vfio_noiommu, "vfio_noiommu")? }
            }
            n => {
                return Err(CapiError::invalid(
                    "drives",
                    format!("{n} is not TUTTI_DRIVES_EMULATED (1) or TUTTI_DRIVES_VFIO (2)"),
                ))
            }
        };
        let mode = match c.open_mode {
            TUTTI_OPEN_CREATE => OpenMode::Create,
            TUTTI_OPEN_EXISTING => OpenMode::Open,
            TUTTI_OPEN_OR_CREATE => OpenMode::OpenOrCreate,
            n => {
                return Err(CapiError::invalid(
                    "open_mode",
                    format!("{n} is not a TUTTI_OPEN_* value (1..=3)"),
                ))
            }
        };
        let io_timeout_ms = if c.io_timeout_ms == 0 { DEFAULT_IO_TIMEOUT_MS } else { c.io_timeout_ms };
        let io_timeout = Duration::from_millis(io_timeout_ms as u64);
        if c.executor == TUTTI_EXECUTOR_CONTROL {
            return Err(CapiError::invalid(
                "executor",
                "TUTTI_EXECUTOR_CONTROL (4) is for tuttid clients (tutti_runtime_connect); a runtime that owns its drives moves its own bytes",
            ));
        }
        // SAFETY: forwarded from the caller.
        let backend = unsafe { io_fields!(c).backend()? };
        let geometry = c.geometry.to_geometry()?;
        Ok(RuntimeConfig {
            source,
            executor: c.executor,
            options: StoreOptions { pool: PoolOptions::new(geometry, mode), backend },
            io_timeout,
        })
    }
}

/// Most latency one emulated command may be given, in µs (10 s).
const MAX_EMULATED_LATENCY_US: u32 = 10_000_000;

/// The first ABI 1.5 field that is not 0, if any.
fn emulated_cost_field_set(c: &tutti_runtime_config_t) -> Option<&'static str> {
    [
        ("emulated_read_bytes_per_sec", c.emulated_read_bytes_per_sec != 0),
        ("emulated_write_bytes_per_sec", c.emulated_write_bytes_per_sec != 0),
        ("emulated_latency_us", c.emulated_latency_us != 0),
        ("emulated_read_latency_us", c.emulated_read_latency_us != 0),
        ("emulated_write_latency_us", c.emulated_write_latency_us != 0),
        ("emulated_mixed_efficiency", c.emulated_mixed_efficiency != 0.0),
        ("emulated_mixed_read_share", c.emulated_mixed_read_share != 0.0),
    ]
    .into_iter()
    .find_map(|(name, set)| set.then_some(name))
}

/// The ABI 1.5 fields: the emulated drives' bandwidth and latency model (all 0 = none).
fn emulated_cost(c: &tutti_runtime_config_t) -> Result<CostModel> {
    for (name, us) in [
        ("emulated_latency_us", c.emulated_latency_us),
        ("emulated_read_latency_us", c.emulated_read_latency_us),
        ("emulated_write_latency_us", c.emulated_write_latency_us),
    ] {
        if us > MAX_EMULATED_LATENCY_US {
            return Err(CapiError::invalid(name, format!("{us} µs is more than {MAX_EMULATED_LATENCY_US}")));
        }
    }
    let rate = |r: u64| (r != 0).then_some(r);
    let (read, write) = (rate(c.emulated_read_bytes_per_sec), rate(c.emulated_write_bytes_per_sec));
    let (eff, share) = (c.emulated_mixed_efficiency, c.emulated_mixed_read_share);
    let mixed = if eff == 0.0 {
        if share != 0.0 {
            return Err(CapiError::invalid(
                "emulated_mixed_read_share",
                format!("{share} is set but emulated_mixed_efficiency is 0 (no collapse)"),
            ));
        }
        None
    } else {
        if !(eff > 0.0 && eff <= 1.0) {
            return Err(CapiError::invalid("emulated_mixed_efficiency", format!("{eff} is not in (0, 1]")));
        }
        if read.is_none() && write.is_none() {
            return Err(CapiError::invalid(
                "emulated_mixed_efficiency",
                "a collapse needs emulated_read_bytes_per_sec or emulated_write_bytes_per_sec",
            ));
        }
        let read_share = if share == 0.0 { 0.5 } else { share };
        if !(read_share > 0.0 && read_share < 1.0) {
            return Err(CapiError::invalid("emulated_mixed_read_share", format!("{share} is not in (0, 1)")));
        }
        Some(MixedModel { efficiency: eff, read_share })
    };
    let us = |n: u32| Duration::from_micros(n as u64);
    Ok(CostModel {
        per_command: us(c.emulated_latency_us),
        bytes_per_sec: None,
        read_bytes_per_sec: read,
        write_bytes_per_sec: write,
        read_latency: us(c.emulated_read_latency_us),
        write_latency: us(c.emulated_write_latency_us),
        mixed,
    })
}

/// Controllers the runtime owns; they outlive the store opened on them.
pub(crate) struct Rig {
    /// Emulated controllers (empty on VFIO drives), in pool order. Held to
    /// keep them running; read only by fault injection.
    #[cfg_attr(not(feature = "fault-injection"), allow(dead_code))]
    pub emulated: Vec<EmulatedController>,
}

impl RuntimeConfig {
    /// Starts (or opens) the drives and brings their controllers up, in pool order.
    pub(crate) fn start_drives(&self) -> Result<(Rig, Vec<DriveSpec>)> {
        match &self.source {
            DriveSource::Emulated { count, lba_size, bytes, dir, cost } => {
                if let Some(d) = dir {
                    std::fs::create_dir_all(d).map_err(|e| {
                        CapiError::invalid("emulated_dir", format!("cannot create {}: {e}", d.display()))
                    })?;
                }
                let mut emulated = Vec::with_capacity(*count as usize);
                let mut specs = Vec::with_capacity(*count as usize);
                for i in 0..*count {
                    let media = match dir {
                        Some(d) => MediaConfig::File(d.join(format!("emu{i}.img"))),
                        None => MediaConfig::Ram,
                    };
                    let emu = EmulatedController::start(EmulatedConfig {
                        name: format!("emu{i}"),
                        serial: format!("TUTTI-CAPI-{i}"),
                        namespaces: vec![NamespaceConfig::with_bytes(*bytes, *lba_size)],
                        media,
                        cost: cost.clone(),
                        ..EmulatedConfig::default()
                    })
                    .map_err(|e| match e {
                        // Another runtime (here or in another process) owns the media file.
                        DriverError::InUse(m) => CapiError::Busy(format!("emulated drive {i}: {m}")),
                        e => CapiError::Io(format!("starting emulated drive {i}: {e}")),
                    })?;
                    let opts = ControllerOptions { io_timeout: self.io_timeout, ..Default::default() };
                    let ctrl = Controller::new(emu.registers(), emu.dma_space(), opts)
                        .map_err(|e| CapiError::Io(format!("bringing up emulated drive {i}: {e}")))?;
                    specs.push(DriveSpec::first_namespace(ctrl)?);
                    emulated.push(emu);
                }
                Ok((Rig { emulated }, specs))
            }
            DriveSource::Vfio { bdfs, noiommu } => {
                let specs = bdfs
                    .iter()
                    .map(|b| {
                        DriveSpec::open_vfio(b, *noiommu).map_err(|e| match e {
                            ObjError::Driver(DriverError::InUse(m)) => CapiError::Busy(m),
                            e => CapiError::from(e),
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok((Rig { emulated: Vec::new() }, specs))
            }
        }
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
