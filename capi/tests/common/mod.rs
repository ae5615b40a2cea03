//! Shared fixtures for the ABI tests: configs, a runtime that closes itself,
//! host KV memory, and status checks that read the last-error message.
#![allow(dead_code)]

pub mod child;
pub mod device;

use std::ffi::CStr;
use std::ptr;
use tutti::*;

pub const LAYERS: u32 = 4;
pub const TPB: u32 = 16;
pub const OBJ: usize = TPB as usize * 2 * 64 * 2; // 16 tokens × 2 heads × 64 dims × bf16
pub const WAIT_MS: u64 = 30_000;

pub fn geometry() -> tutti_geometry_t {
    tutti_geometry_t {
        layers: LAYERS,
        kv_heads: 2,
        head_dim: 64,
        tokens_per_block: TPB,
        dtype: TUTTI_DTYPE_BF16,
    }
}

pub fn config() -> tutti_runtime_config_t {
    tutti_runtime_config_t {
        struct_size: std::mem::size_of::<tutti_runtime_config_t>() as u32,
        drives: TUTTI_DRIVES_EMULATED,
        emulated_count: 2,
        emulated_lba_size: 512,
        emulated_capacity_bytes: 16 << 20,
        emulated_dir: ptr::null(),
        vfio_bdfs: ptr::null(),
        vfio_count: 0,
        vfio_noiommu: 0,
        executor: TUTTI_EXECUTOR_GIO_HOST,
        open_mode: TUTTI_OPEN_CREATE,
        geometry: geometry(),
        io_timeout_ms: 0,
        host_lane_blocks: 0,
        ..Default::default()
    }
}

pub fn last_error() -> String {
    // SAFETY: the library returns a NUL-terminated string valid until the next call.
    unsafe { CStr::from_ptr(tutti_last_error()) }.to_string_lossy().into_owned()
}

pub fn name(code: i32) -> String {
    // SAFETY: a static NUL-terminated string.
    unsafe { CStr::from_ptr(tutti_status_name(code)) }.to_string_lossy().into_owned()
}

/// Asserts `code` is `want` and the message mentions `needle`.
#[track_caller]
pub fn expect(code: i32, want: i32, needle: &str) {
    let msg = last_error();
    assert!(
        code == want && msg.contains(needle),
        "got {} ({code}) \"{msg}\", wanted {} with \"{needle}\"",
        name(code),
        name(want)
    );
}

#[track_caller]
pub fn ok(code: i32) {
    assert_eq!(code, TUTTI_OK, "{} ({code}): {}", name(code), last_error());
}

/// A runtime closed on drop.
pub struct Rt(pub *mut tutti_runtime_t);

impl Rt {
    pub fn open(cfg: &tutti_runtime_config_t) -> Rt {
        let mut rt = ptr::null_mut();
        // SAFETY: valid config and out pointer.
        ok(unsafe { tutti_runtime_open(cfg, &mut rt) });
        Rt(rt)
    }
}

impl Drop for Rt {
    fn drop(&mut self) {
        // SAFETY: a handle from tutti_runtime_open (or already closed: detected).
        unsafe { tutti_runtime_close(self.0) };
    }
}

/// Page-aligned host memory standing in for an engine's KV cache.
pub struct Mem {
    buf: Vec<u8>,
    off: usize,
    pub len: usize,
}

impl Mem {
    pub fn new(len: usize) -> Mem {
        let buf = vec![0u8; len + 4096];
        let off = buf.as_ptr().align_offset(4096);
        Mem { buf, off, len }
    }
    pub fn addr(&self) -> u64 {
        self.buf[self.off..].as_ptr() as u64
    }
    pub fn bytes(&mut self) -> &mut [u8] {
        &mut self.buf[self.off..self.off + self.len]
    }
}

pub fn layout(kind: u32, num_blocks: u32) -> tutti_kv_layout_t {
    tutti_kv_layout_t {
        struct_size: std::mem::size_of::<tutti_kv_layout_t>() as u32,
        kind,
        num_blocks,
        num_layers: 0,
        k_bases: ptr::null(),
        v_bases: ptr::null(),
        base: 0,
        block_stride: 0,
        memory: TUTTI_MEMORY_HOST,
        model: c"test-model".as_ptr(),
        tenant_salt: ptr::null(),
        tenant_salt_len: 0,
    }
}

/// Registers `mem` as vLLM per-layer KV of `num_blocks` blocks (layer `l`'s K|V at
/// `mem + l * 2 * num_blocks * OBJ`). `mem` must outlive the registration.
pub fn register_per_layer(rt: &Rt, mem: &Mem, num_blocks: u32) {
    let per_layer = 2 * num_blocks as u64 * OBJ as u64;
    let bases: Vec<u64> = (0..LAYERS as u64).map(|l| mem.addr() + l * per_layer).collect();
    let mut l = layout(TUTTI_LAYOUT_VLLM_PER_LAYER, num_blocks);
    l.num_layers = LAYERS;
    l.k_bases = bases.as_ptr();
    // SAFETY: `mem` holds every object of the layout; the caller keeps it past the registration.
    ok(unsafe { tutti_register_kv(rt.0, &l, ptr::null_mut()) });
}

/// Memory for [`register_per_layer`] of `num_blocks` blocks, filled with a pattern shifted
/// by `seed`.
pub fn filled(num_blocks: u32, seed: u8) -> Mem {
    let mut mem = Mem::new(2 * num_blocks as usize * OBJ * LAYERS as usize);
    for (i, b) in mem.bytes().iter_mut().enumerate() {
        *b = ((i % 251) as u8).wrapping_add(seed);
    }
    mem
}

/// What [`filled`]`(num_blocks, seed)` holds in `block` (every layer, K and V).
pub fn pattern(block: usize, num_blocks: u32, seed: u8) -> Vec<u8> {
    block_bytes(&mut filled(num_blocks, seed), block, num_blocks)
}

/// Host memory for [`register_per_layer`], filled with a pattern shifted by `seed`, and
/// registered.
pub fn register_filled(rt: &Rt, num_blocks: u32, seed: u8) -> Mem {
    let mem = filled(num_blocks, seed);
    register_per_layer(rt, &mem, num_blocks);
    mem
}

/// Overwrites `block` in every layer of a per-layer registration of `blocks` blocks, so
/// that a load that moved nothing is seen.
pub fn scribble(mem: &mut Mem, block: usize, blocks: u32) {
    let per = 2 * blocks as usize * OBJ;
    for l in 0..LAYERS as usize {
        for kv in 0..2 {
            let o = l * per + kv * blocks as usize * OBJ + block * OBJ;
            mem.bytes()[o..o + OBJ].fill(0xEE);
        }
    }
}

/// `tutti_lookup` of `keys` with `flags`: (hits, pin).
pub fn lookup(rt: &Rt, keys: &[tutti_hash_t], flags: u32) -> (usize, u64) {
    let (mut hits, mut pin) = (0usize, 0u64);
    // SAFETY: valid buffers and a live handle.
    ok(unsafe { tutti_lookup(rt.0, keys.as_ptr(), keys.len(), flags, &mut hits, &mut pin) });
    (hits, pin)
}

pub fn status() -> tutti_job_status_t {
    tutti_job_status_t { struct_size: std::mem::size_of::<tutti_job_status_t>() as u32, ..Default::default() }
}

pub fn hashes(n: usize, salt: u32) -> Vec<tutti_hash_t> {
    let tokens: Vec<u32> = (0..n as u32 * TPB).map(|t| t.wrapping_mul(2_654_435_761) ^ salt).collect();
    let mut out = vec![tutti_hash_t::default(); n];
    let mut count = 0;
    // SAFETY: valid buffers of the given lengths.
    ok(unsafe {
        tutti_chain_hashes(tokens.as_ptr(), tokens.len(), TPB, ptr::null(), out.as_mut_ptr(), n, &mut count)
    });
    assert_eq!(count, n);
    out
}

/// Stores `blocks` under `keys` (all layers) and commits; returns the report.
pub fn store_all(rt: &Rt, keys: &[tutti_hash_t], blocks: &[u32]) -> tutti_store_report_t {
    let mut st = ptr::null_mut();
    let mut job = ptr::null_mut();
    let mut rep = tutti_store_report_t::default();
    // SAFETY: valid handles and buffers throughout.
    unsafe {
        ok(tutti_store_begin(rt.0, keys.as_ptr(), blocks.as_ptr(), keys.len(), &mut st));
        ok(tutti_store_submit(st, 0, LAYERS, &mut job));
        ok(tutti_job_wait(job, WAIT_MS, ptr::null_mut()));
        ok(tutti_store_commit(st, &mut rep));
        ok(tutti_job_destroy(job));
        ok(tutti_store_destroy(st));
    }
    rep
}

/// Loads `keys` into `blocks` (all layers), waits, and returns the final status.
pub fn load_all(rt: &Rt, keys: &[tutti_hash_t], blocks: &[u32]) -> tutti_job_status_t {
    let mut job = ptr::null_mut();
    let mut st = status();
    // SAFETY: valid handles and buffers throughout.
    unsafe {
        ok(tutti_submit_load(rt.0, keys.as_ptr(), blocks.as_ptr(), keys.len(), 0, LAYERS, &mut job));
        ok(tutti_job_wait(job, WAIT_MS, &mut st));
        ok(tutti_job_destroy(job));
    }
    st
}

/// Bytes of `block` in every layer, K and V, of a per-layer registration of
/// `blocks` blocks (`register_per_layer`, `register_filled`).
pub fn block_bytes(mem: &mut Mem, block: usize, blocks: u32) -> Vec<u8> {
    let per = 2 * blocks as usize * OBJ;
    let mut out = Vec::new();
    for l in 0..LAYERS as usize {
        for kv in 0..2 {
            let o = l * per + kv * blocks as usize * OBJ + block * OBJ;
            out.extend_from_slice(&mem.bytes()[o..o + OBJ]);
        }
    }
    out
}

/// A tuttid in this process on 2 emulated RAM drives with this suite's
/// geometry, its socket in a fresh directory named after `tag` (returned, to
/// remove when done).
pub fn start_daemon(tag: &str) -> (tutti_daemon::Daemon, std::path::PathBuf) {
    start_daemon_with(tag, tutti_driver::emulated::CostModel::default())
}

/// [`start_daemon`] on drives with the cost model `cost`.
pub fn start_daemon_with(
    tag: &str,
    cost: tutti_driver::emulated::CostModel,
) -> (tutti_daemon::Daemon, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("tutti-capi-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    (daemon_in(&dir, LAYERS, 16 << 20, cost), dir)
}

/// A tuttid in this process, its socket `<dir>/tuttid.sock`, on 2 emulated RAM drives of
/// `bytes` each with the cost model `cost`, formatted for this suite's geometry with `layers`
/// layers.
pub fn daemon_in(
    dir: &std::path::Path,
    layers: u32,
    bytes: u64,
    cost: tutti_driver::emulated::CostModel,
) -> tutti_daemon::Daemon {
    use tutti_driver::emulated::{EmulatedConfig, NamespaceConfig};
    use tutti_objstore::{Dtype, Geometry, OpenMode, PoolOptions};
    let g = Geometry { layers, kv_heads: 2, head_dim: 64, tokens_per_block: TPB, dtype: Dtype::Bf16 };
    let tag = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let drives = (0..2)
        .map(|i| EmulatedConfig {
            name: format!("emu{i}"),
            serial: format!("CAPI-{tag}-{i}"),
            namespaces: vec![NamespaceConfig::with_bytes(bytes, 512)],
            cost: cost.clone(),
            ..EmulatedConfig::default()
        })
        .collect();
    tutti_daemon::Daemon::start(tutti_daemon::DaemonConfig {
        socket: dir.join("tuttid.sock"),
        mode: tutti_daemon::SocketMode::Owner,
        drives: tutti_daemon::DriveSource::Emulated(drives),
        pool: PoolOptions::new(g, OpenMode::Create),
        io_timeout: std::time::Duration::from_secs(2),
    })
    .expect("tuttid starts")
}

/// What `tutti_runtime_info` says of `rt`.
pub fn info(rt: &Rt) -> tutti_runtime_info_t {
    let mut i = tutti_runtime_info_t {
        struct_size: std::mem::size_of::<tutti_runtime_info_t>() as u32,
        drives: 0,
        files: 0,
        chunks: 0,
        object_bytes: 0,
        file_bytes: 0,
        geometry: geometry(),
        formatted_now: 0,
        executor: 0,
        pool_id: [0; 16],
    };
    // SAFETY: a live handle and a full-size struct.
    ok(unsafe { tutti_runtime_info(rt.0, &mut i) });
    i
}

/// A client config for the tuttid at `socket`, this suite's geometry.
pub fn client_config(socket: &std::ffi::CString, name: &std::ffi::CString) -> tutti_client_config_t {
    tutti_client_config_t {
        struct_size: std::mem::size_of::<tutti_client_config_t>() as u32,
        executor: TUTTI_EXECUTOR_GIO_HOST,
        socket: socket.as_ptr(),
        client_name: name.as_ptr(),
        control_timeout_ms: 5000,
        io_timeout_ms: 0,
        host_lane_blocks: 0,
        geometry: geometry(),
        ..Default::default()
    }
}
