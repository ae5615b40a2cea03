//! The engine's KV memory in the demo: host or CUDA memory laid out as an engine lays it out,
//! filled with each chunk's known bytes and checked against them.

use super::args::{Args, CudaArgs, KvMemoryFlag, LayoutFlag};
use crate::pattern::kv_object;
use anyhow::{bail, Context};
use std::sync::Arc;
use tutti_driver::transport::vfio::{VfioBar, VfioOptions};
use tutti_gio_uring::mem::{ExecMemory, MemKind};
use tutti_gio_uring::{CudaExecutor, Executor};
use tutti_objstore::{
    CpuMapped, DeviceKvMemory, Geometry, HostKvMemory, KvLayout, KvMemoryKind, KvStore, LayoutKind,
    P2pPolicy, TableSizes,
};

/// Runs `f(block)` for every block on two threads.
pub(crate) fn for_blocks(n: u32, f: impl Fn(u32) -> anyhow::Result<()> + Sync) -> anyhow::Result<()> {
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
        /// `--kv-memory cuda-gdr`: each registration pins and maps it through GDRCopy for the
        /// drives (P2P when the probe passes, staged with the reason otherwise).
        gdr: bool,
    },
    /// A vfio-pci device's BAR (`--kv-device`), registered for P2P.
    Device {
        bar: VfioBar,
        dev: DeviceKvMemory,
        /// Where the KV memory starts in the BAR, and its bytes.
        offset: u64,
        len: u64,
    },
}

impl KvMem {
    fn addr(&self) -> u64 {
        match self {
            KvMem::Host(m, _) => m.addr(),
            KvMem::Cuda { mem, .. } => mem.exec_addr(),
            KvMem::Device { bar, offset, .. } => bar.as_ptr() as u64 + offset,
        }
    }
    fn copy_in(&self, offset: usize, src: &[u8]) -> anyhow::Result<()> {
        match self {
            KvMem::Host(m, _) => m.copy_in(offset, src)?,
            KvMem::Cuda { mem, .. } => mem.write_bytes(offset, src)?,
            KvMem::Device { dev, .. } => dev.access.write(self.addr() + offset as u64, src)?,
        }
        Ok(())
    }
    fn copy_out(&self, offset: usize, dst: &mut [u8]) -> anyhow::Result<()> {
        match self {
            KvMem::Host(m, _) => m.copy_out(offset, dst)?,
            KvMem::Cuda { mem, .. } => mem.read_bytes(offset, dst)?,
            KvMem::Device { dev, .. } => dev.access.read(self.addr() + offset as u64, dst)?,
        }
        Ok(())
    }
    /// Zeroes every byte.
    fn clear(&self) -> anyhow::Result<()> {
        match self {
            KvMem::Host(m, _) => m.fill(0, m.len(), 0)?,
            KvMem::Device { bar, dev, offset, len } => {
                dev.access.write(bar.as_ptr() as u64 + offset, &vec![0u8; *len as usize])?
            }
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
            KvMem::Cuda { gdr: false, .. } => unsafe {
                store.register_as(layout.clone(), model, b"", KvMemoryKind::Cuda)?
            },
            KvMem::Cuda { gdr: true, .. } => {
                use tutti_objstore::gdr::GdrMapped;
                let regions: Vec<(u64, u64)> = layout.regions().iter().map(|r| (r.addr, r.len)).collect();
                let library = GdrMapped::library_from_env();
                let provider = GdrMapped::pin(&library, &regions)
                    .map(|m| DeviceKvMemory {
                        provider: "gdrcopy".into(),
                        policy: tutti_objstore::P2pPolicy::Auto,
                        access: Arc::new(m),
                        unreachable: false,
                    })
                    .map_err(|e| format!("CUDA memory: no GDRCopy mapping for the drives ({e})"));
                // SAFETY: as for `cuda` above; the registration holds the GDRCopy pins and
                // releases them when it drops, before the memory is freed.
                unsafe { store.register_cuda(layout.clone(), model, b"", provider)? }
            }
            // SAFETY: the layout lies inside the BAR mapping, which the Kv keeps until after every
            // store that registers it is dropped.
            KvMem::Device { dev, .. } => unsafe {
                store.register_device(layout.clone(), model, b"", dev.clone())?
            },
        })
    }
}

pub(crate) struct Kv {
    mem: KvMem,
    pub layout: KvLayout,
    pub g: Geometry,
    /// Bytes of KV memory from its first address.
    total: u64,
}

/// Device KV memory after the run ([`Kv::device_digest`]).
#[derive(serde::Serialize)]
pub(crate) struct KvDeviceReport {
    pub provider: String,
    pub offset: u64,
    pub bytes: u64,
    pub nonzero: u64,
    pub fnv1a64: String,
}

impl Kv {
    /// The KV memory of `blocks` blocks the flags ask for (`--kv-memory`, `--layout`).
    pub(crate) fn for_args(args: &Args, g: Geometry, blocks: u32) -> anyhow::Result<Kv> {
        if let Some(bdf) = &args.kv_device {
            return Kv::on_device(args, bdf, g, blocks);
        }
        let gdr = args.kv_memory == KvMemoryFlag::CudaGdr;
        let cuda = (args.kv_memory == KvMemoryFlag::Cuda || gdr).then_some(&args.cuda);
        Kv::new(g, args.layout, blocks, cuda, args.kv_memory.host_kind(), gdr)
    }

    /// KV memory in BAR `--kv-device-bar` of the vfio-pci device `bdf`, from the BAR's start.
    fn on_device(args: &Args, bdf: &str, g: Geometry, blocks: u32) -> anyhow::Result<Kv> {
        let addr: tutti_driver::pci::Bdf = bdf.parse()?;
        let bar = VfioBar::open(&addr, args.kv_device_bar, &VfioOptions::default())
            .with_context(|| format!("opening the KV device {bdf}"))?;
        let (kind, per) = match args.layout {
            LayoutFlag::Vllm => {
                (LayoutKind::VllmPerLayer, KvLayout::bytes_needed(LayoutKind::VllmPerLayer, &g, blocks))
            }
            LayoutFlag::Contiguous => {
                (LayoutKind::Contiguous, KvLayout::bytes_needed(LayoutKind::Contiguous, &g, blocks))
            }
        };
        let total = if kind == LayoutKind::VllmPerLayer { per * g.layers as u64 } else { per };
        let offset = args.kv_device_offset;
        if total.saturating_add(offset) > bar.len() as u64
            || !per.is_multiple_of(4096)
            || !offset.is_multiple_of(4096)
        {
            bail!(
                "{}: {blocks} blocks of KV take {total} bytes ({per} per region, whole 4 KiB pages needed) \
                 from offset {offset} (page aligned); the BAR has {} bytes: lower --tokens",
                bar.name(),
                bar.len()
            );
        }
        let base = bar.as_ptr() as u64 + offset;
        let dev = DeviceKvMemory {
            provider: format!("vfio-pci {}", bar.name()),
            policy: P2pPolicy::parse(&args.p2p)?,
            access: Arc::new(CpuMapped { base: bar.as_ptr() as u64, len: bar.len() as u64 }),
            unreachable: args.kv_device_unreachable,
        };
        let layout = match kind {
            LayoutKind::VllmPerLayer => {
                let bases: Vec<u64> = (0..g.layers as u64).map(|l| base + l * per).collect();
                KvLayout::vllm_per_layer(g, blocks, &bases)?
            }
            _ => KvLayout::contiguous(g, blocks, base)?,
        };
        Ok(Kv { mem: KvMem::Device { bar, dev, offset, len: total }, layout, g, total })
    }

    /// For device KV memory: its provider, where it is in the BAR, and the FNV-1a 64 hash
    /// of those bytes read through the provider (the host side compares it with the BAR's
    /// backing store).
    pub(crate) fn device_digest(&self) -> anyhow::Result<Option<KvDeviceReport>> {
        let KvMem::Device { dev, bar, offset, .. } = &self.mem else { return Ok(None) };
        let mut bytes = vec![0u8; self.total as usize];
        dev.access.read(bar.as_ptr() as u64 + offset, &mut bytes)?;
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in &bytes {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        let nonzero = bytes.iter().filter(|&&b| b != 0).count() as u64;
        Ok(Some(KvDeviceReport {
            provider: dev.provider.clone(),
            offset: *offset,
            bytes: self.total,
            nonzero,
            fnv1a64: format!("{h:016x}"),
        }))
    }

    pub(crate) fn new(
        g: Geometry,
        kind: LayoutFlag,
        blocks: u32,
        cuda: Option<&CudaArgs>,
        host: KvMemoryKind,
        gdr: bool,
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
                KvMem::Cuda { mem, _exec: exec, gdr }
            }
        };
        let layout = match kind {
            LayoutKind::VllmPerLayer => {
                let bases: Vec<u64> = (0..g.layers as u64).map(|l| mem.addr() + l * per).collect();
                KvLayout::vllm_per_layer(g, blocks, &bases)?
            }
            _ => KvLayout::contiguous(g, blocks, mem.addr())?,
        };
        Ok(Kv { mem, layout, g, total })
    }

    fn offset(&self, block: u32, layer: u32, kv: u32) -> usize {
        (self.layout.object_addr(block, layer, kv) - self.mem.addr()) as usize
    }

    /// Writes chunk `chunk`'s KV into engine block `block`.
    pub(crate) fn fill(&self, seed: u64, chunk: u32, block: u32) -> anyhow::Result<()> {
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
    pub(crate) fn register_with(&self, store: &KvStore, model: &str) -> anyhow::Result<TableSizes> {
        self.mem.register(store, &self.layout, model)
    }

    /// Zeroes every byte.
    pub(crate) fn clear(&self) -> anyhow::Result<()> {
        self.mem.clear()
    }

    /// Checks that engine block `block` holds chunk `chunk`'s KV.
    pub(crate) fn verify(&self, seed: u64, chunk: u32, block: u32) -> anyhow::Result<()> {
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
