//! `tutti demo`: the main job. A pool of drives (4 emulated by default, or
//! VFIO-bound drives with `--drives`), KV memory registered with a model's
//! geometry (Llama-3-8B by default), the KV of one long request stored layer
//! by layer, looked up by its chained hashes and retrieved layer by layer into
//! other engine slots, every byte verified; then the pool is reopened and the
//! cached prefix found and verified again.

use crate::cmd::ExecFlag;
use crate::emu::{EmulatedArgs, PoolDriveArgs};
use crate::pattern::kv_object;
use crate::progress::byte_bar;
use crate::report::{bytes, print_json};
use anyhow::{bail, Context};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tutti_driver::controller::{Controller, ControllerOptions};
use tutti_driver::emulated::{monotonic_ns, EmulatedController};
use tutti_driver::transport::vfio::{IommuMode, VfioDevice, VfioOptions};
use tutti_gio_uring::mem::{ExecMemory, MemKind};
use tutti_gio_uring::{CudaExecutor, Executor};
use tutti_objstore::{
    chain_hashes, Backend, DriveSpec, Geometry, GioConfig, GioExecutor, HostKvMemory, KvLayout, KvMemoryKind,
    KvStore, LayoutKind, OpenMode, PoolInfo, PoolOptions, StoreOptions, TableSizes,
};

/// Default deadline of every wait on the drives (`--timeout`).
const WAIT_SECS: u64 = 120;

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum LayoutFlag {
    /// vLLM: one `[2, num_blocks, block_size, kv_heads, head_dim]` tensor per layer.
    Vllm,
    /// One `[num_blocks, layers, 2, block_size, kv_heads, head_dim]` region.
    Contiguous,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendFlag {
    /// gio_uring: the executor issues the commands (host executor here).
    Gio,
    /// The CPU-driven baseline: the host submits every command.
    Direct,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KvMemoryFlag {
    /// Page-aligned host memory the drives DMA into directly.
    Host,
    /// CUDA device memory (cuMemAlloc, HBM on a GPU), reached through the staged data path:
    /// the drives DMA into pinned staging, the kernels copy staging <-> KV. Needs --cuda.
    Cuda,
    /// Host memory kept out of the drives' reach and moved on the staged data path, as CUDA
    /// memory is (the staged path on a machine without a GPU).
    HostStaged,
}

impl KvMemoryFlag {
    /// How host KV memory is registered under this flag.
    pub(super) fn host_kind(self) -> KvMemoryKind {
        if self == KvMemoryFlag::HostStaged {
            KvMemoryKind::HostUnmapped
        } else {
            KvMemoryKind::Host
        }
    }
}

/// The CUDA executor (`--cuda`): gio_uring's kernels on a GPU.
#[derive(clap::Args, Debug, Clone)]
pub struct CudaArgs {
    /// Run gio_uring's kernels with the CUDA executor instead of host threads.
    #[arg(long)]
    pub cuda: bool,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0, requires = "cuda")]
    pub cuda_device: i32,
    /// SMs of the I/O partition (a green context). Persistent mode (the default --executor)
    /// needs one; without it the kernels run in launch mode on the primary context.
    #[arg(long, requires = "cuda", value_parser = clap::value_parser!(u32).range(1..))]
    pub cuda_sms: Option<u32>,
    /// Threads per block of the I/O kernels (a multiple of 32, at most 512).
    #[arg(long, default_value_t = 512, requires = "cuda")]
    pub cuda_block_threads: u32,
    /// Blocks per SM at most (default: what occupancy allows).
    #[arg(long, requires = "cuda")]
    pub cuda_blocks_per_sm: Option<u32>,
    /// The CUDA driver library to load instead of libcuda.so (e.g. the workspace's stand-in;
    /// used with --cuda only).
    #[arg(long, env = "TUTTI_CUDA_DRIVER")]
    pub cuda_driver: Option<std::path::PathBuf>,
    /// A cubin of the kernels built elsewhere (`tutti kernels --cubin`) instead of NVRTC
    /// (used with --cuda only).
    #[arg(long, env = "TUTTI_GIO_CUBIN")]
    pub cuda_cubin: Option<std::path::PathBuf>,
}

impl CudaArgs {
    pub(crate) fn config(&self, mode: tutti_gio_uring::ExecMode) -> tutti_objstore::CudaExecutorConfig {
        // Persistent mode needs an SM partition: without --cuda-sms, launch mode.
        let mode = if self.cuda_sms.is_none() { tutti_gio_uring::ExecMode::Launch } else { mode };
        tutti_objstore::CudaExecutorConfig {
            device: self.cuda_device,
            mode,
            sm_count: self.cuda_sms,
            block_threads: self.cuda_block_threads,
            blocks_per_sm: self.cuda_blocks_per_sm,
            driver: self.cuda_driver.clone(),
            cubin: self.cuda_cubin.clone(),
            ..Default::default()
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub pool_drives: PoolDriveArgs,
    #[command(flatten)]
    pub cuda: CudaArgs,
    /// Where the engine's KV memory lives: host memory (direct DMA), CUDA memory (staged), or host
    /// memory moved on the staged path (host-staged).
    #[arg(long, value_enum, default_value_t = KvMemoryFlag::Host)]
    pub kv_memory: KvMemoryFlag,
    /// Tokens of the request whose KV is stored and retrieved.
    #[arg(long, default_value_t = 16384)]
    pub tokens: u32,
    #[command(flatten)]
    pub geometry: crate::geometry_flags::GeometryArgs,
    /// Model name, part of the cache identity.
    #[arg(long, default_value = "llama-3-8b")]
    pub model: String,
    #[arg(long, value_enum, default_value_t = LayoutFlag::Vllm)]
    pub layout: LayoutFlag,
    #[arg(long, value_enum, default_value_t = BackendFlag::Gio)]
    pub backend: BackendFlag,
    /// Open the pool already on the drives (e.g. from an earlier run with --dir)
    /// instead of formatting them; a stored prefix is then found before storing.
    #[arg(long)]
    pub reuse: bool,
    /// Skip reopening the pool at the end.
    #[arg(long)]
    pub no_reopen: bool,
    /// Seed of the token ids and KV contents.
    #[arg(long, default_value_t = 0x7u64)]
    pub seed: u64,
    /// How gio_uring's host executor runs the CUDA kernel source: `launch` starts the lane
    /// threads for every submission (on a GPU, a kernel launch per layer; on the host, thread
    /// start-up, which dominates the host CPU per layer), `persistent` keeps them polling the
    /// submission ring (like io_uring's SQPOLL), `inline` runs one block's lanes on the calling
    /// thread (like io_uring without SQPOLL; host executor only).
    #[arg(long, value_enum, default_value_t = ExecFlag::Persistent)]
    pub executor: ExecFlag,
    /// OS threads of gio_uring's host executor, each running one block of 32 lanes as
    /// fibers (1 leaves an engine serving on the CPU its other cores).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub exec_threads: u32,
    /// Seconds any one wait on the drives (a stored layer, a loaded layer) may take before
    /// the demo gives up with an error.
    #[arg(long, default_value_t = WAIT_SECS, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub timeout: u64,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Run this many engine processes as clients of one tuttid on the emulated drives, each
    /// storing and retrieving its own request with its own executor (with --cuda: its own I/O
    /// kernels in its own green context), at the same time; then each finds and verifies the
    /// others' requests. Reports every client's rates and the pool's.
    #[arg(long, value_parser = clap::value_parser!(u32).range(2..=8), conflicts_with_all = ["drives", "reuse", "backend"])]
    pub clients: Option<u32>,
    /// (Internal) run as client `--client-index` of the tuttid at this socket, driven by the
    /// process that started it through stdin and stdout.
    #[arg(long, hide = true, requires = "client_index")]
    pub client_of: Option<std::path::PathBuf>,
    #[arg(long, hide = true)]
    pub client_index: Option<u32>,
}

impl Args {
    pub(super) fn wait(&self) -> Duration {
        Duration::from_secs(self.timeout)
    }
}

/// A rate for the text report: GiB/s, or MiB/s below 1 GiB/s (slow media such as QEMU's).
pub(super) fn rate(gib_per_sec: f64) -> String {
    if gib_per_sec >= 1.0 {
        format!("{gib_per_sec:.2} GiB/s")
    } else {
        format!("{:.1} MiB/s", gib_per_sec * 1024.0)
    }
}

#[derive(serde::Serialize, serde::Deserialize, Default, Clone, Debug)]
pub(super) struct Phase {
    pub bytes: u64,
    pub seconds: f64,
    pub gib_per_sec: f64,
    blocks: u32,
    failed_blocks: u32,
    nvme_commands: u64,
    commands_per_layer: f64,
    /// Calls the host made into the I/O path per layer.
    host_calls_per_layer: f64,
    /// Commands per layer whose fields the host wrote (0: the executor built them).
    host_built_per_layer: f64,
    /// Host CPU (the submitting thread's) inside the per-layer submissions, µs per layer.
    host_submit_us_per_layer: f64,
    /// Host CPU of the jobs' setup (validation, registering the pairs once), µs per layer.
    host_setup_us_per_layer: f64,
    pub verified_bytes: u64,
    /// CLOCK_MONOTONIC (ns, the same clock in every process) at the start and end of the
    /// timed part, so the phases of several processes can be laid on one time line.
    pub start_mono_ns: u64,
    pub end_mono_ns: u64,
}

#[derive(serde::Serialize)]
struct Reopen {
    hits: usize,
    verified_bytes: u64,
    journal_records: u64,
    controllers_restarted: bool,
}

#[derive(serde::Serialize)]
struct Report {
    media: String,
    pool: PoolInfo,
    request_tokens: u32,
    request_blocks: u32,
    request_bytes: u64,
    layout: String,
    tables: TableSizes,
    hits_before_store: usize,
    store: Phase,
    retrieve: Phase,
    reopen: Option<Reopen>,
}

/// The drives the demo runs on. Emulated controllers live as long as this
/// value, so RAM media survives the store being closed and reopened.
enum Rig {
    Emulated {
        emus: Vec<EmulatedController>,
        args: EmulatedArgs,
    },
    /// Each device with the namespaces asked for (empty: every usable one).
    Vfio {
        devices: Vec<(VfioDevice, Vec<u32>)>,
    },
}

impl Rig {
    fn start(args: &Args, per_drive: u64) -> anyhow::Result<Rig> {
        if !args.pool_drives.drives.is_empty() {
            let opts = VfioOptions {
                mode: if args.pool_drives.noiommu { IommuMode::NoIommu } else { IommuMode::Type1 },
                ..VfioOptions::default()
            };
            let devices = super::identify::group_drives(&args.pool_drives.drives)?
                .into_iter()
                .map(|(bdf, nsids)| {
                    let dev = VfioDevice::open(&bdf, &opts)
                        .with_context(|| format!("opening {bdf} through VFIO"))?;
                    Ok((dev, nsids))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            return Ok(Rig::Vfio { devices });
        }
        let mut emu = args.pool_drives.emu.clone();
        emu.capacity_mib = emu.capacity_mib.max(per_drive.div_ceil(1 << 20));
        let emus = (0..args.pool_drives.emulated as usize)
            .map(|i| Ok(EmulatedController::start(emu.config(i)?)?))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Rig::Emulated { emus, args: emu })
    }

    /// Brings every controller up and returns the pool's drives in order.
    fn specs(&self) -> anyhow::Result<Vec<DriveSpec>> {
        let ctrls = match self {
            Rig::Emulated { emus, .. } => emus
                .iter()
                .map(|e| Ok((super::identify::bring_up(e)?, Vec::new())))
                .collect::<anyhow::Result<Vec<_>>>()?,
            Rig::Vfio { devices } => devices
                .iter()
                .map(|(d, nsids)| {
                    let c = Controller::new(d.registers(), d.dma_space(), ControllerOptions::default())?;
                    Ok((c, nsids.clone()))
                })
                .collect::<anyhow::Result<Vec<_>>>()?,
        };
        let mut specs = Vec::new();
        for (c, nsids) in ctrls {
            specs.extend(super::identify::namespaces_of(&c, &nsids)?);
        }
        Ok(specs)
    }

    fn is_emulated(&self) -> bool {
        matches!(self, Rig::Emulated { .. })
    }

    /// File-backed emulated drives are stopped and started again from their
    /// files, as after a process restart; RAM media and real drives stay.
    fn restart(self) -> anyhow::Result<(Rig, bool)> {
        match self {
            Rig::Emulated { emus, args } if args.dir.is_some() => {
                let cfgs: Vec<_> = emus.iter().map(|e| e.config().clone()).collect();
                drop(emus);
                let emus = cfgs.into_iter().map(EmulatedController::start).collect::<Result<Vec<_>, _>>()?;
                Ok((Rig::Emulated { emus, args }, true))
            }
            rig => Ok((rig, false)),
        }
    }

    fn media(&self) -> &'static str {
        match self {
            Rig::Emulated { args, .. } if args.dir.is_some() => "emulated (file media)",
            Rig::Emulated { .. } => "emulated (RAM media)",
            Rig::Vfio { .. } => "VFIO",
        }
    }
}

/// Runs `f(block)` for every block on two threads.
pub(super) fn for_blocks(n: u32, f: impl Fn(u32) -> anyhow::Result<()> + Sync) -> anyhow::Result<()> {
    std::thread::scope(|s| {
        let f = &f;
        let halves = [(0, n / 2), (n / 2, n)];
        let handles: Vec<_> = halves.iter().map(|&(a, b)| s.spawn(move || (a..b).try_for_each(f))).collect();
        handles.into_iter().try_for_each(|h| h.join().map_err(|_| anyhow::anyhow!("a worker panicked"))?)
    })
}

/// The engine's KV memory: host memory, or CUDA device memory allocated
/// through an executor of the same driver and device.
enum KvMem {
    /// Host memory registered as `kind` (`Host` or `HostUnmapped`).
    Host(Arc<HostKvMemory>, KvMemoryKind),
    Cuda {
        mem: Box<dyn ExecMemory>,
        _exec: Arc<CudaExecutor>,
    },
}

impl KvMem {
    fn addr(&self) -> u64 {
        match self {
            KvMem::Host(m, _) => m.addr(),
            KvMem::Cuda { mem, .. } => mem.exec_addr(),
        }
    }
    fn copy_in(&self, offset: usize, src: &[u8]) -> anyhow::Result<()> {
        match self {
            KvMem::Host(m, _) => m.copy_in(offset, src)?,
            KvMem::Cuda { mem, .. } => mem.write_bytes(offset, src)?,
        }
        Ok(())
    }
    fn copy_out(&self, offset: usize, dst: &mut [u8]) -> anyhow::Result<()> {
        match self {
            KvMem::Host(m, _) => m.copy_out(offset, dst)?,
            KvMem::Cuda { mem, .. } => mem.read_bytes(offset, dst)?,
        }
        Ok(())
    }
    /// Zeroes every byte.
    fn clear(&self) -> anyhow::Result<()> {
        match self {
            KvMem::Host(m, _) => m.fill(0, m.len(), 0)?,
            KvMem::Cuda { mem, .. } => {
                let zeros = vec![0u8; (4 << 20).min(mem.len())];
                for at in (0..mem.len()).step_by(zeros.len()) {
                    let n = zeros.len().min(mem.len() - at);
                    mem.write_bytes(at, &zeros[..n])?;
                }
            }
        }
        Ok(())
    }
    /// Registers it with `store` under `model`.
    fn register(&self, store: &KvStore, layout: &KvLayout, model: &str) -> anyhow::Result<TableSizes> {
        Ok(match self {
            KvMem::Host(m, kind) => store.register_host_as(m.clone(), layout.clone(), model, b"", *kind)?,
            // SAFETY: the layout lies inside `mem` (Kv::new), which lives as long as the Kv,
            // past every store that registers it (the demo drops its stores first).
            KvMem::Cuda { .. } => unsafe {
                store.register_as(layout.clone(), model, b"", KvMemoryKind::Cuda)?
            },
        })
    }
}

pub(super) struct Kv {
    mem: KvMem,
    layout: KvLayout,
    g: Geometry,
}

impl Kv {
    /// The KV memory of `blocks` blocks the flags ask for (`--kv-memory`, `--layout`).
    pub(super) fn for_args(args: &Args, g: Geometry, blocks: u32) -> anyhow::Result<Kv> {
        let cuda = (args.kv_memory == KvMemoryFlag::Cuda).then_some(&args.cuda);
        Kv::new(g, args.layout, blocks, cuda, args.kv_memory.host_kind())
    }

    pub(super) fn new(
        g: Geometry,
        kind: LayoutFlag,
        blocks: u32,
        cuda: Option<&CudaArgs>,
        host: KvMemoryKind,
    ) -> anyhow::Result<Kv> {
        let (kind, per) = match kind {
            LayoutFlag::Vllm => {
                (LayoutKind::VllmPerLayer, KvLayout::bytes_needed(LayoutKind::VllmPerLayer, &g, blocks))
            }
            LayoutFlag::Contiguous => {
                (LayoutKind::Contiguous, KvLayout::bytes_needed(LayoutKind::Contiguous, &g, blocks))
            }
        };
        let total = if kind == LayoutKind::VllmPerLayer { per * g.layers as u64 } else { per };
        let mem = match cuda {
            None => KvMem::Host(Arc::new(HostKvMemory::new(total as usize)?), host),
            Some(c) => {
                // An executor of the same driver and device allocates it (no kernels run on it).
                let cfg = tutti_objstore::CudaExecutorConfig {
                    mode: tutti_gio_uring::ExecMode::Launch,
                    sm_count: None,
                    ..c.config(tutti_gio_uring::ExecMode::Launch)
                };
                let exec = Arc::new(CudaExecutor::new(cfg).context("the CUDA executor for the KV memory")?);
                let mem =
                    exec.alloc(MemKind::Private, total as usize).context("allocating CUDA KV memory")?;
                KvMem::Cuda { mem, _exec: exec }
            }
        };
        let layout = match kind {
            LayoutKind::VllmPerLayer => {
                let bases: Vec<u64> = (0..g.layers as u64).map(|l| mem.addr() + l * per).collect();
                KvLayout::vllm_per_layer(g, blocks, &bases)?
            }
            _ => KvLayout::contiguous(g, blocks, mem.addr())?,
        };
        Ok(Kv { mem, layout, g })
    }

    fn offset(&self, block: u32, layer: u32, kv: u32) -> usize {
        (self.layout.object_addr(block, layer, kv) - self.mem.addr()) as usize
    }

    /// Writes chunk `chunk`'s KV into engine block `block`.
    pub(super) fn fill(&self, seed: u64, chunk: u32, block: u32) -> anyhow::Result<()> {
        let mut buf = vec![0u8; self.g.object_bytes() as usize];
        for layer in 0..self.g.layers {
            for kv in 0..2 {
                kv_object(seed, chunk, layer, kv, &mut buf);
                self.mem.copy_in(self.offset(block, layer, kv), &buf)?;
            }
        }
        Ok(())
    }

    /// Registers it with `store` under `model`.
    pub(super) fn register_with(&self, store: &KvStore, model: &str) -> anyhow::Result<TableSizes> {
        self.mem.register(store, &self.layout, model)
    }

    /// Zeroes every byte.
    pub(super) fn clear(&self) -> anyhow::Result<()> {
        self.mem.clear()
    }

    /// Checks that engine block `block` holds chunk `chunk`'s KV.
    pub(super) fn verify(&self, seed: u64, chunk: u32, block: u32) -> anyhow::Result<()> {
        let n = self.g.object_bytes() as usize;
        let (mut want, mut got) = (vec![0u8; n], vec![0u8; n]);
        for layer in 0..self.g.layers {
            for kv in 0..2 {
                kv_object(seed, chunk, layer, kv, &mut want);
                self.mem.copy_out(self.offset(block, layer, kv), &mut got)?;
                if want != got {
                    let at = want.iter().zip(&got).position(|(a, b)| a != b).unwrap_or(0);
                    bail!(
                        "chunk {chunk} in block {block}, layer {layer} {}: byte {at} differs",
                        ["K", "V"][kv as usize]
                    );
                }
            }
        }
        Ok(())
    }
}

/// Engine slot of chunk `i` on retrieval: rotated by half, so every chunk
/// lands in a different slot from the one it was stored from.
fn slot(i: u32, n: u32) -> u32 {
    (i + n / 2 + (n % 2)) % n.max(1)
}

/// Why the pool cannot take the request, with remedies that exist for the
/// drives in use (`--capacity-mib` only for emulated ones).
fn too_small(files: u32, blocks: u32, tokens_per_block: u32, emulated: bool, drives: usize) -> String {
    let most = files as u64 * tokens_per_block as u64;
    let remedy = if emulated {
        format!("raise --capacity-mib or --emulated, or lower --tokens to at most {most}")
    } else {
        format!("lower --tokens to at most {most}, or add drives or namespaces to --drives (the pool has {drives})")
    };
    format!("the pool holds {files} blocks; the request needs {blocks}: {remedy}")
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    if let Some(socket) = &args.client_of {
        return super::demo_clients::client(args, socket);
    }
    if let Some(n) = args.clients {
        return super::demo_clients::run(args, n);
    }
    let g = args.geometry.geometry()?;
    if args.tokens < g.tokens_per_block {
        bail!("--tokens {} is less than one block of {} tokens", args.tokens, g.tokens_per_block);
    }
    let blocks = args.tokens / g.tokens_per_block;
    let request_bytes = blocks as u64 * g.file_bytes();
    // Each emulated namespace holds its share of the request, plus room for metadata.
    let namespaces = args.pool_drives.emulated as u64 * args.pool_drives.emu.emu_namespaces as u64;
    let per_drive = request_bytes.div_ceil(namespaces) + request_bytes / 8 + (64 << 20);
    let rig = Rig::start(args, per_drive)?;
    let backend = backend(args);
    if args.kv_memory == KvMemoryFlag::Cuda && !args.cuda.cuda {
        bail!("--kv-memory cuda needs --cuda (the CUDA executor copies between staging and CUDA memory)");
    }
    // The engine's KV memory exists before the store starts its executor, as in an engine. On
    // an H100 (driver 580) a module load in another context waits for every running kernel, so
    // the KV memory's executor, made after a persistent I/O kernel started, would wait forever.
    let kv = Kv::for_args(args, g, blocks)?;
    let mode = if args.reuse { OpenMode::OpenOrCreate } else { OpenMode::Create };
    let opts = StoreOptions { pool: PoolOptions::new(g, mode), backend };
    let store = KvStore::open(rig.specs()?, opts.clone()).context("opening the pool")?;
    if store.stripe_map().files() < blocks {
        let (files, drives) = (store.stripe_map().files(), store.info().drives.len());
        bail!("{}", too_small(files, blocks, g.tokens_per_block, rig.is_emulated(), drives));
    }
    let tables = kv.mem.register(&store, &kv.layout, &args.model)?;
    let tokens: Vec<u32> = {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
        (0..args.tokens).map(|_| rng.gen_range(0..128_256)).collect()
    };
    let hashes = chain_hashes(&tokens, g.tokens_per_block);
    let hits_before_store = store.contains(&hashes)?;

    // Prefill: the engine's KV is computed into blocks 0..n and stored layer by layer.
    for_blocks(blocks, |b| kv.fill(args.seed, b, b))?;
    let store_phase = store_request(&store, &kv, &hashes, args)?;

    // Decode of a new request with the same prompt: its prefix is found and
    // loaded into other slots, each layer waited for before its attention.
    kv.mem.clear()?;
    let loaded = retrieve(&store, &kv, &hashes, args, "retrieve")?;
    if loaded.hits as u32 != blocks {
        bail!("only {} of {blocks} blocks were found after storing them", loaded.hits);
    }

    let pool = store.info();
    let mut report = Report {
        media: rig.media().to_string(),
        pool,
        request_tokens: args.tokens,
        request_blocks: blocks,
        request_bytes,
        layout: kv.layout.kind().name().to_string(),
        tables,
        hits_before_store,
        store: store_phase,
        retrieve: loaded.phase,
        reopen: None,
    };

    if !args.no_reopen {
        drop(store);
        let (rig, restarted) = rig.restart()?;
        let reopts = StoreOptions { pool: PoolOptions::new(g, OpenMode::Open), ..opts };
        let store = KvStore::open(rig.specs()?, reopts).context("reopening the pool")?;
        kv.mem.register(&store, &kv.layout, &args.model)?;
        kv.mem.clear()?;
        let again = retrieve(&store, &kv, &hashes, args, "reopen")?;
        if again.hits as u32 != blocks {
            bail!("after reopening, {} of {blocks} blocks were found", again.hits);
        }
        report.reopen = Some(Reopen {
            hits: again.hits,
            verified_bytes: again.phase.verified_bytes,
            journal_records: store.info().replay.iter().map(|r| r.records).sum(),
            controllers_restarted: restarted,
        });
    }
    if args.json {
        return print_json(&report);
    }
    print(&report);
    Ok(())
}

/// The I/O path the flags ask for.
pub(super) fn backend(args: &Args) -> Backend {
    match args.backend {
        BackendFlag::Gio => {
            let mut cfg = GioConfig::default();
            cfg.host.mode = args.executor.mode();
            cfg.host.blocks = args.exec_threads;
            cfg.sm_budget = args.exec_threads;
            if args.cuda.cuda {
                cfg.executor = GioExecutor::Cuda(Box::new(args.cuda.config(args.executor.mode())));
            }
            Backend::Gio(cfg)
        }
        BackendFlag::Direct => Backend::Direct { queue_depth: 256, recover_queues: true },
    }
}

/// Stores engine blocks 0.. under `hashes`, layer by layer, and commits them.
pub(super) fn store_request(
    store: &KvStore,
    kv: &Kv,
    hashes: &[tutti_objstore::BlockHash],
    args: &Args,
) -> anyhow::Result<Phase> {
    let g = kv.g;
    let blocks = hashes.len() as u32;
    let src: Vec<u32> = (0..blocks).collect();
    let bar = byte_bar(blocks as u64 * g.file_bytes(), "store", args.json);
    let layer_bytes = blocks as u64 * 2 * g.object_bytes();
    let mut store_phase = Phase { blocks, start_mono_ns: monotonic_ns(), ..Default::default() };
    let t = Instant::now();
    let session = store.begin_store(hashes, &src)?;
    let jobs = (0..g.layers).map(|l| store.submit_store(session, l..l + 1)).collect::<Result<Vec<_>, _>>()?;
    for job in jobs {
        let st = store.wait(job, args.wait())?;
        if !st.done {
            bail!("storing a layer did not finish within {} s (--timeout)", args.timeout);
        }
        store.release(job)?;
        store_phase.nvme_commands += st.commands;
        store_phase.host_calls_per_layer += st.host_calls as f64;
        store_phase.host_built_per_layer += st.host_built as f64;
        store_phase.host_submit_us_per_layer += st.submit_ns as f64 / 1e3;
        store_phase.host_setup_us_per_layer += st.setup_ns as f64 / 1e3;
        bar.inc(layer_bytes);
    }
    let rep = store.commit_store(session)?;
    store_phase.seconds = t.elapsed().as_secs_f64();
    store_phase.end_mono_ns = monotonic_ns();
    bar.finish_and_clear();
    if let Some((i, why)) = rep.failed.first() {
        bail!("{} of {blocks} blocks were not stored; block {i}: {why}", rep.failed.len());
    }
    store_phase.bytes = (rep.stored as u64) * g.file_bytes();
    finish_phase(&mut store_phase, g.layers);
    Ok(store_phase)
}

pub(super) struct Retrieved {
    pub hits: usize,
    pub phase: Phase,
}

/// Looks the request up, loads the hit prefix into rotated slots layer by
/// layer, and verifies every byte against the KV of `args.seed`.
pub(super) fn retrieve(
    store: &KvStore,
    kv: &Kv,
    hashes: &[tutti_objstore::BlockHash],
    args: &Args,
    what: &str,
) -> anyhow::Result<Retrieved> {
    retrieve_seed(store, kv, hashes, args, what, args.seed)
}

/// [`retrieve`], verifying against the KV of `seed`.
pub(super) fn retrieve_seed(
    store: &KvStore,
    kv: &Kv,
    hashes: &[tutti_objstore::BlockHash],
    args: &Args,
    what: &str,
    seed: u64,
) -> anyhow::Result<Retrieved> {
    let g = kv.g;
    let hit = store.lookup(hashes)?;
    let n = hit.hits() as u32;
    let mut phase = Phase { blocks: n, ..Default::default() };
    if n == 0 {
        store.unpin(hit.pin)?;
        return Ok(Retrieved { hits: 0, phase });
    }
    let dst: Vec<u32> = (0..n).map(|i| slot(i, n)).collect();
    let bar = byte_bar(n as u64 * g.file_bytes(), what, args.json);
    phase.start_mono_ns = monotonic_ns();
    let t = Instant::now();
    let job = store.submit_load(&hit.files, &dst, 0..g.layers)?;
    for layer in 0..g.layers {
        let st = store.wait_layer(job, layer, args.wait())?;
        if !st.layer_is_done(layer) {
            bail!("layer {layer} did not load within {} s (--timeout)", args.timeout);
        }
        bar.inc(n as u64 * 2 * g.object_bytes());
    }
    let st = store.release(job)?;
    phase.seconds = t.elapsed().as_secs_f64();
    phase.end_mono_ns = monotonic_ns();
    bar.finish_and_clear();
    store.unpin(hit.pin)?;
    if st.failed > 0 {
        bail!("{} blocks failed to load: {}", st.failed, st.first_error.unwrap_or_default());
    }
    phase.bytes = n as u64 * g.file_bytes();
    phase.nvme_commands = st.commands;
    phase.host_calls_per_layer = st.host_calls as f64;
    phase.host_built_per_layer = st.host_built as f64;
    phase.host_submit_us_per_layer = st.submit_ns as f64 / 1e3;
    phase.host_setup_us_per_layer = st.setup_ns as f64 / 1e3;
    finish_phase(&mut phase, g.layers);
    for_blocks(n, |i| kv.verify(seed, i, dst[i as usize]))?;
    phase.verified_bytes = phase.bytes;
    Ok(Retrieved { hits: n as usize, phase })
}

fn finish_phase(p: &mut Phase, layers: u32) {
    p.gib_per_sec = p.bytes as f64 / p.seconds.max(1e-9) / (1u64 << 30) as f64;
    p.commands_per_layer = p.nvme_commands as f64 / layers as f64;
    p.host_calls_per_layer /= layers as f64;
    p.host_built_per_layer /= layers as f64;
    p.host_submit_us_per_layer /= layers as f64;
    p.host_setup_us_per_layer /= layers as f64;
}

fn print(r: &Report) {
    let p = &r.pool;
    let g = &p.geometry;
    println!(
        "pool {} on {} drives ({}): {} files of {} ({} objects of {}, {} command(s) each)",
        p.pool,
        p.drives.len(),
        r.media,
        p.files,
        bytes(p.file_bytes),
        2 * g.layers,
        bytes(p.object_bytes),
        p.chunks
    );
    for d in &p.drives {
        println!(
            "  {:<14} {:<6} {:>5}-byte LBAs, {:>10}, max transfer {}",
            d.device,
            format!("ns {}", d.nsid),
            d.lba_size,
            bytes(d.blocks * d.lba_size as u64),
            bytes(d.max_transfer)
        );
    }
    println!("KV: {g}, {} layout", r.layout);
    println!("I/O: {}", p.io_mode);
    if let Some(dp) = &p.data_path {
        match &dp.p2p_missing {
            Some(why) => println!("data path: {} ({})", dp.mode, why),
            None => println!("data path: {}", dp.mode),
        }
    }
    println!(
        "request: {} tokens = {} blocks = {} of KV ({} already cached)",
        r.request_tokens,
        r.request_blocks,
        bytes(r.request_bytes),
        r.hits_before_store
    );
    let t = &r.tables;
    println!("P2P table: {} SGL descriptors in {} table(s) = {}; PRP lists for the same commands: {} of entries, {} as 4-KiB list pages",
        t.descriptors, t.tables, bytes(t.sgl_bytes), bytes(t.prp_entry_bytes), bytes(t.prp_page_bytes));
    for (name, ph) in [("store", &r.store), ("retrieve", &r.retrieve)] {
        println!("{name:<9} {:>10} in {:.2} s = {}; per layer {:.0} commands, {:.1} host calls ({:.1} µs host CPU + {:.1} µs setup), {:.0} built by the host{}",
            bytes(ph.bytes), ph.seconds, rate(ph.gib_per_sec), ph.commands_per_layer, ph.host_calls_per_layer,
            ph.host_submit_us_per_layer, ph.host_setup_us_per_layer, ph.host_built_per_layer,
            if ph.verified_bytes > 0 { format!("; {} verified", bytes(ph.verified_bytes)) } else { String::new() });
    }
    if let Some(o) = &r.reopen {
        println!(
            "reopen    {} of {} blocks found from {} journal records{}; {} verified",
            o.hits,
            r.request_blocks,
            o.journal_records,
            if o.controllers_restarted { " (controllers restarted from their files)" } else { "" },
            bytes(o.verified_bytes)
        );
    }
    println!("every byte verified");
}

#[cfg(test)]
mod tests {
    use super::too_small;

    #[test]
    fn a_pool_too_small_names_remedies_of_the_drives_in_use() {
        let real = too_small(10, 40, 16, false, 2);
        assert!(real.contains("--tokens to at most 160") && real.contains("--drives"), "{real}");
        assert!(!real.contains("--capacity-mib") && !real.contains("--emulated"), "{real}");
        let emu = too_small(10, 40, 16, true, 4);
        assert!(emu.contains("--capacity-mib"), "{emu}");
    }
}
