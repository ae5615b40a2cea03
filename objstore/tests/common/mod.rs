//! Shared fixtures: emulated drives, a store on them, KV patterns to verify.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;
use tutti_driver::controller::{Controller, ControllerOptions};
use tutti_driver::spec::SglSupport;
use tutti_emulator::{CostModel, EmulatedConfig, EmulatedController, MediaConfig, NamespaceConfig};
use tutti_objstore::{
    chain_hashes, Backend, BlockHash, DriveSpec, Dtype, Geometry, GioConfig, GioExecutor, HostKvMemory,
    KvLayout, KvStore, LayoutKind, OpenMode, PoolOptions, StoreOptions, StoreReport,
};

pub const WAIT: Duration = Duration::from_secs(30);

/// Whether the suite runs on the CUDA executor (`TUTTI_TEST_EXECUTOR=cuda`,
/// with `TUTTI_CUDA_DRIVER` naming the driver library: the stand-in in CI;
/// unset, the system's libcuda; `TUTTI_GIO_CUBIN` optionally a prebuilt cubin).
pub fn on_cuda() -> bool {
    std::env::var("TUTTI_TEST_EXECUTOR").is_ok_and(|v| v == "cuda")
}

/// One emulated drive's configuration.
#[derive(Clone, Debug)]
pub struct DriveCfg {
    pub lba_size: u32,
    pub bytes: u64,
    /// Identify MDTS (maximum transfer 2^mdts × 4 KiB; 0 = no limit).
    pub mdts: u8,
    pub media: MediaConfig,
    pub cost: CostModel,
    pub sgl: SglSupport,
}

impl DriveCfg {
    pub fn ram(lba_size: u32, bytes: u64) -> Self {
        DriveCfg {
            lba_size,
            bytes,
            mdts: 5,
            media: MediaConfig::Ram,
            cost: CostModel::default(),
            sgl: SglSupport::Supported,
        }
    }
}

/// Emulated controllers that outlive the stores opened on them (their RAM media persists).
pub struct Drives {
    pub emus: Vec<EmulatedController>,
}

impl Drives {
    pub fn start(cfgs: &[DriveCfg]) -> Drives {
        let emus = cfgs
            .iter()
            .enumerate()
            .map(|(i, c)| {
                EmulatedController::start(EmulatedConfig {
                    name: format!("emu{i}"),
                    serial: format!("SN-{i}"),
                    namespaces: vec![NamespaceConfig::with_bytes(c.bytes, c.lba_size)],
                    mdts: c.mdts,
                    media: c.media.clone(),
                    cost: c.cost.clone(),
                    sgl: c.sgl,
                    ..EmulatedConfig::default()
                })
                .expect("emulated controller starts")
            })
            .collect();
        Drives { emus }
    }

    pub fn uniform(n: usize, lba_size: u32, bytes: u64) -> Drives {
        Drives::start(&vec![DriveCfg::ram(lba_size, bytes); n])
    }

    /// Brings every controller up (again) and returns the drives in `order`.
    pub fn specs_in(&self, order: &[usize]) -> Vec<DriveSpec> {
        self.specs_with(order, Duration::from_secs(2))
    }

    /// Like [`specs_in`](Self::specs_in), with the driver's I/O timeout `io_timeout`.
    pub fn specs_with(&self, order: &[usize], io_timeout: Duration) -> Vec<DriveSpec> {
        order
            .iter()
            .map(|&i| {
                let e = &self.emus[i];
                let opts = ControllerOptions { io_timeout, ..Default::default() };
                let ctrl = Controller::new(e.registers(), e.dma_space(), opts).expect("bring-up");
                DriveSpec::first_namespace(ctrl).expect("namespace")
            })
            .collect()
    }

    pub fn specs(&self) -> Vec<DriveSpec> {
        self.specs_in(&(0..self.emus.len()).collect::<Vec<_>>())
    }

    pub fn clear_faults(&self) {
        for e in &self.emus {
            e.faults().clear();
        }
    }
}

pub fn geometry(layers: u32, head_dim: u32) -> Geometry {
    Geometry { layers, kv_heads: 2, head_dim, tokens_per_block: 16, dtype: Dtype::Bf16 }
}

/// The main path (gio_uring, host executor), with short timeouts for tests.
pub fn options(g: Geometry, mode: OpenMode) -> StoreOptions {
    let mut gio = GioConfig::default();
    gio.ring.command_timeout = Duration::from_secs(2);
    gio.ring.submit_timeout = Duration::from_secs(5);
    // One block of 32 lanes: plenty for test sizes, and few threads per store.
    gio.host.blocks = 1;
    gio.sm_budget = 1;
    if on_cuda() {
        // The same shape on the CUDA executor: one SM of a green context, one block of 32 threads.
        let mut cuda = Box::<tutti_objstore::CudaExecutorConfig>::default();
        cuda.mode = gio.host.mode;
        cuda.sm_count = Some(1);
        cuda.block_threads = 32;
        cuda.blocks_per_sm = Some(1);
        cuda.stop_timeout = Duration::from_secs(30);
        // Unset: the system's libcuda (a GPU machine, scripts/gpu-check).
        cuda.driver = std::env::var_os("TUTTI_CUDA_DRIVER").map(Into::into);
        cuda.cubin = std::env::var_os("TUTTI_GIO_CUBIN").map(Into::into);
        gio.executor = GioExecutor::Cuda(cuda);
    }
    StoreOptions { pool: PoolOptions::new(g, mode), backend: Backend::Gio(gio) }
}

/// The CPU-driven baseline.
pub fn direct_options(g: Geometry, mode: OpenMode) -> StoreOptions {
    StoreOptions {
        pool: PoolOptions::new(g, mode),
        backend: Backend::Direct { queue_depth: 64, recover_queues: true },
    }
}

pub fn open(drives: &Drives, g: Geometry, mode: OpenMode) -> KvStore {
    KvStore::open(drives.specs(), options(g, mode)).expect("store opens")
}

/// Host KV memory of `num_blocks` blocks in `kind`'s layout.
pub struct Kv {
    pub mem: Arc<HostKvMemory>,
    pub layout: KvLayout,
}

impl Kv {
    pub fn new(g: Geometry, kind: LayoutKind, num_blocks: u32) -> Kv {
        let per = KvLayout::bytes_needed(kind, &g, num_blocks);
        let layout_len = match kind {
            LayoutKind::VllmPerLayer => per * g.layers as u64 + 4096 * g.layers as u64,
            _ => per,
        };
        let mem = Arc::new(HostKvMemory::new(layout_len as usize).expect("memory"));
        let layout = match kind {
            // Layers one page apart so the per-layer tensors are separate regions.
            LayoutKind::VllmPerLayer => {
                let bases: Vec<u64> = (0..g.layers as u64).map(|l| mem.addr() + l * (per + 4096)).collect();
                KvLayout::vllm_per_layer(g, num_blocks, &bases).expect("layout")
            }
            LayoutKind::Contiguous => KvLayout::contiguous(g, num_blocks, mem.addr()).expect("layout"),
            LayoutKind::Strided => panic!("no strided fixture"),
        };
        Kv { mem, layout }
    }

    pub fn register(&self, store: &KvStore, model: &str) {
        store.register_host(self.mem.clone(), self.layout.clone(), model, b"").expect("register");
    }

    fn offset(&self, block: u32, layer: u32, kv: u32) -> usize {
        (self.layout.object_addr(block, layer, kv) - self.mem.addr()) as usize
    }

    /// Fills every object of `block` with the pattern of `seed`.
    pub fn fill(&self, block: u32, seed: u64) {
        let g = *self.layout.geometry();
        for layer in 0..g.layers {
            for kv in 0..2 {
                let data = pattern(seed, layer, kv, g.object_bytes() as usize);
                self.mem.copy_in(self.offset(block, layer, kv), &data).expect("fill");
            }
        }
    }

    /// Whether every object of `block` holds the pattern of `seed`.
    pub fn holds(&self, block: u32, seed: u64) -> bool {
        let g = *self.layout.geometry();
        (0..g.layers).all(|layer| (0..2).all(|kv| self.layer_holds(block, layer, kv, seed)))
    }

    pub fn layer_holds(&self, block: u32, layer: u32, kv: u32, seed: u64) -> bool {
        let g = *self.layout.geometry();
        let mut got = vec![0u8; g.object_bytes() as usize];
        self.mem.copy_out(self.offset(block, layer, kv), &mut got).expect("read");
        got == pattern(seed, layer, kv, got.len())
    }

    pub fn clear(&self) {
        self.mem.fill(0, self.mem.len(), 0).expect("clear");
    }
}

/// Deterministic bytes for object (layer, kv) of the chunk with `seed`.
pub fn pattern(seed: u64, layer: u32, kv: u32, len: usize) -> Vec<u8> {
    let mut x = seed ^ (layer as u64) << 32 ^ (kv as u64) << 48 ^ 0x9e37_79b9_7f4a_7c15;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Token ids of a request whose chunk `i` is seeded by `seed + i`.
pub fn tokens(seed: u64, chunks: usize, per_chunk: u32) -> Vec<u32> {
    (0..chunks as u64 * per_chunk as u64)
        .map(|t| (seed.wrapping_mul(31).wrapping_add(t) % 50_000) as u32)
        .collect()
}

/// Fills blocks `0..n` (block `b` with the chunk seeded by `seed + b`), stores them as one
/// request of `n` chained chunks, and returns the chunks' hashes with the store's report.
pub fn store_seeded(store: &KvStore, kv: &Kv, n: u32, seed: u64) -> (Vec<BlockHash>, StoreReport) {
    let g = *store.geometry();
    let hashes = chain_hashes(&tokens(seed, n as usize, g.tokens_per_block), g.tokens_per_block);
    let src: Vec<u32> = (0..n).collect();
    for &b in &src {
        kv.fill(b, seed + b as u64);
    }
    let rep = store.store_request(&hashes, &src, WAIT).expect("store");
    (hashes, rep)
}

/// A tuttid client's data path in tests: the host executor with one block and short deadlines.
pub fn client_backend() -> Backend {
    let mut gio = GioConfig::default();
    gio.ring.command_timeout = Duration::from_secs(2);
    gio.ring.submit_timeout = Duration::from_secs(5);
    gio.host.blocks = 1;
    gio.sm_budget = 1;
    Backend::Gio(gio)
}
