//! The demo's flags: the drives, the executor, where the KV memory lives and the request.

use crate::cmd::ExecFlag;
use crate::emu::PoolDriveArgs;
use std::time::Duration;
use tutti_objstore::{Backend, GioConfig, GioExecutor, KvMemoryKind};

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
    /// CUDA device memory whose GPU pages GDRCopy pins and maps (libgdrapi.so.2, or the
    /// library TUTTI_GDRAPI names) for the drives: peer to peer when the probe at registration
    /// passes, the staged path (naming why) otherwise. Needs --cuda.
    CudaGdr,
    /// Host memory kept out of the drives' reach and moved on the staged data path, as CUDA
    /// memory is (the staged path on a machine without a GPU).
    HostStaged,
}

impl KvMemoryFlag {
    /// How host KV memory is registered under this flag.
    pub(crate) fn host_kind(self) -> KvMemoryKind {
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
    /// PCI address of a device bound to vfio-pci (`tutti admin bind --kv-device`) whose memory
    /// BAR holds the engine's KV memory (e.g. QEMU's ivshmem): the drives DMA into it peer to
    /// peer when the probe at registration passes, through staging otherwise. Replaces
    /// --kv-memory.
    #[arg(long, conflicts_with_all = ["cuda", "clients"])]
    pub kv_device: Option<String>,
    /// The memory BAR of --kv-device that holds the KV memory.
    #[arg(long, default_value_t = 2, requires = "kv_device")]
    pub kv_device_bar: u32,
    /// Where in the BAR the KV memory starts: bytes, or with a K or M suffix (page aligned).
    #[arg(long, default_value = "0", value_parser = parse_size, requires = "kv_device")]
    pub kv_device_offset: u64,
    /// P2P for --kv-device: `auto` (probe, fall back to staging), `require` (fail instead of
    /// falling back) or `off` (staged).
    #[arg(long, default_value = "auto", requires = "kv_device")]
    pub p2p: String,
    /// Testing the fallback: the drives' IOMMU mappings of the --kv-device memory are removed
    /// right after they are made (a range the IOMMU never mapped), so the probe must refuse it.
    #[arg(long, requires = "kv_device")]
    pub kv_device_unreachable: bool,
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

/// `4096`, `64K`, `8M`.
fn parse_size(s: &str) -> Result<u64, String> {
    let (num, unit) = match s.trim().to_ascii_uppercase() {
        t if t.ends_with('K') => (t[..t.len() - 1].to_string(), 1u64 << 10),
        t if t.ends_with('M') => (t[..t.len() - 1].to_string(), 1u64 << 20),
        t => (t, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .ok_or_else(|| format!("{s:?} is not a size (bytes, or a number with K or M)"))
}

impl Args {
    pub(crate) fn wait(&self) -> Duration {
        Duration::from_secs(self.timeout)
    }
}

/// The I/O path the flags ask for.
pub(crate) fn backend(args: &Args) -> Backend {
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
