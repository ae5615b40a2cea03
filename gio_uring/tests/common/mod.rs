//! Emulated controllers, a GioUring over them, and data patterns.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;
use tutti_driver::controller::{Controller, ControllerOptions};
use tutti_driver::spec::SglSupport;
use tutti_driver::transport::DmaBuffer;
use tutti_emulator::{CostModel, EmulatedConfig, EmulatedController, NamespaceConfig};
use tutti_gio_uring::{
    CudaExecutor, CudaExecutorConfig, DriveQueues, ExecMode, Executor, GioOptions, GioUring, HostExecutor,
    HostExecutorConfig,
};

/// Whether the suite runs on the CUDA executor: `TUTTI_TEST_EXECUTOR=cuda`,
/// with `TUTTI_CUDA_DRIVER` naming the driver library (in CI the stand-in,
/// `target/debug/libtutti_cuda_standin.so`; unset: the system's libcuda, on a
/// GPU machine) and `TUTTI_GIO_CUBIN` optionally a prebuilt cubin
/// (`scripts/gpu-check`). Anything else: the host executor.
pub fn on_cuda() -> bool {
    std::env::var("TUTTI_TEST_EXECUTOR").is_ok_and(|v| v == "cuda")
}

/// The CUDA executor the suite runs on, sized like the host executor it
/// replaces: `blocks` SMs of a green context, one block of 32 threads each
/// (every CUDA thread is a host thread under the stand-in).
pub fn cuda_config(mode: ExecMode, blocks: u32) -> CudaExecutorConfig {
    CudaExecutorConfig {
        mode,
        sm_count: Some(blocks.clamp(1, 4)),
        driver: std::env::var_os("TUTTI_CUDA_DRIVER").map(Into::into),
        cubin: std::env::var_os("TUTTI_GIO_CUBIN").map(Into::into),
        block_threads: 32,
        blocks_per_sm: Some(1),
        stop_timeout: Duration::from_secs(30),
        ..Default::default()
    }
}

/// `TUTTI_TEST_EXECUTOR=inline`: every rig's host executor runs in
/// [`ExecMode::Inline`] (one block, on the test's own thread), whatever mode and
/// blocks the test asked for.
pub fn on_inline() -> bool {
    std::env::var("TUTTI_TEST_EXECUTOR").is_ok_and(|v| v == "inline")
}

/// The executor of a test rig: the host executor, or the CUDA one (`on_cuda`).
pub fn executor(mode: ExecMode, blocks: u32) -> Arc<dyn Executor> {
    if on_inline() {
        return Arc::new(
            HostExecutor::new(HostExecutorConfig { mode: ExecMode::Inline, blocks: 1, ..Default::default() })
                .expect("host executor (inline)"),
        );
    }
    if on_cuda() {
        Arc::new(
            CudaExecutor::new(cuda_config(mode, blocks)).expect("CUDA executor (TUTTI_TEST_EXECUTOR=cuda)"),
        )
    } else {
        Arc::new(
            HostExecutor::new(HostExecutorConfig { mode, blocks, ..Default::default() })
                .expect("host executor"),
        )
    }
}

/// A ring over emulated controllers. Fields drop in order: the ring first
/// (stops the executor, deletes the queue pairs), then controllers.
pub struct Rig {
    pub ring: GioUring,
    pub ctrls: Vec<Arc<Controller>>,
    pub emus: Vec<EmulatedController>,
}

pub struct RigSpec {
    pub controllers: usize,
    /// Namespaces per controller; each is one drive of the ring.
    pub namespaces: usize,
    pub ns_bytes: u64,
    /// LBA size of namespace i: `ns_lba_sizes[i % len]` (empty: 512).
    pub ns_lba_sizes: Vec<u32>,
    pub pairs: u32,
    pub depth: u32,
    pub mode: ExecMode,
    pub blocks: u32,
    pub mdts: u8,
    pub per_command: Duration,
    pub opts: GioOptions,
    /// SGL support the controllers report (PRP-only with `SglSupport::None`).
    pub sgl: SglSupport,
}

impl Default for RigSpec {
    fn default() -> Self {
        RigSpec {
            controllers: 2,
            namespaces: 1,
            ns_bytes: 64 << 20,
            ns_lba_sizes: Vec::new(),
            pairs: 2,
            depth: 64,
            mode: ExecMode::Launch,
            blocks: 3,
            mdts: 5,
            per_command: Duration::ZERO,
            opts: GioOptions { depth: 16, ..Default::default() },
            sgl: EmulatedConfig::default().sgl,
        }
    }
}

pub fn rig(spec: RigSpec) -> Rig {
    let exec = executor(spec.mode, spec.blocks);
    rig_on(spec, exec)
}

/// A rig whose ring runs on `exec` (the spec's mode and blocks are then `exec`'s business).
pub fn rig_on(spec: RigSpec, exec: Arc<dyn Executor>) -> Rig {
    let mut emus = Vec::new();
    let mut ctrls = Vec::new();
    let mut drives = Vec::new();
    for c in 0..spec.controllers {
        let cfg = EmulatedConfig {
            name: format!("emu{c}"),
            namespaces: (0..spec.namespaces)
                .map(|i| {
                    let lba = if spec.ns_lba_sizes.is_empty() {
                        512
                    } else {
                        spec.ns_lba_sizes[i % spec.ns_lba_sizes.len()]
                    };
                    NamespaceConfig::with_bytes(spec.ns_bytes, lba)
                })
                .collect(),
            max_queue_entries: 4096,
            mdts: spec.mdts,
            cost: CostModel { per_command: spec.per_command, ..Default::default() },
            sgl: spec.sgl,
            ..EmulatedConfig::default()
        };
        let emu = EmulatedController::start(cfg).expect("emulated controller starts");
        let ctrl = Controller::new(emu.registers(), emu.dma_space(), ControllerOptions::default())
            .expect("bring-up");
        for ns in 1..=spec.namespaces as u32 {
            drives.push(DriveQueues::create(&ctrl, ns, spec.pairs, spec.depth).expect("raw queue pairs"));
        }
        emus.push(emu);
        ctrls.push(ctrl);
    }
    let ring = GioUring::init_with(spec.opts, drives, exec).expect("gio_uring init");
    Rig { ring, ctrls, emus }
}

/// Deterministic bytes for (drive, command, offset): every 8 bytes differ.
pub fn fill(buf: &DmaBuffer, seed: u64) {
    let words: Vec<u8> = (0..buf.len() as u64 / 8)
        .flat_map(|i| {
            (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i.wrapping_mul(0xBF58_476D_1CE4_E5B9)).to_le_bytes()
        })
        .collect();
    buf.copy_in(0, &words).expect("fill");
}

pub fn bytes(buf: &DmaBuffer) -> Vec<u8> {
    let mut v = vec![0u8; buf.len()];
    buf.copy_out(0, &mut v).expect("copy out");
    v
}

/// Index of the first differing byte, for a readable failure.
pub fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y).or((a.len() != b.len()).then_some(a.len().min(b.len())))
}
