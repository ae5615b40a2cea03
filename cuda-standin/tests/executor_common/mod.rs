//! Shared by the `executor_*` tests: the CUDA executor run through the
//! stand-in driver, over a ring on an emulated controller.
//!
//! The stand-in's state (knobs, failure injection, violations) is
//! process-wide, so every test takes [`serial`] first and resets it.

// Test code: a panic is how a test fails, in helpers as in #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

#[path = "../../../tests/support/skip.rs"]
pub mod skip;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tutti_cuda_standin::control::Standin;
use tutti_driver::controller::{Controller, ControllerOptions};
use tutti_driver::spec::SglDescriptor;
use tutti_driver::transport::DmaBuffer;
use tutti_emulator::{EmulatedConfig, EmulatedController, NamespaceConfig};
use tutti_gio_uring::{
    ioctx, CudaExecutor, CudaExecutorConfig, DataRef, DriveQueues, ExecMode, GioOptions, GioUring, IoCtx, Op,
};

pub const CMD: usize = 4096;

/// One test at a time in a process: the stand-in's state is global.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// The stand-in, loaded and reset; `None` (after a printed skip, or a panic
/// under CI) when the library or NVRTC is missing.
pub fn standin() -> Option<(Standin, PathBuf)> {
    if let Err(why) = tutti_kernels::nvrtc::load() {
        skip::skip(format!("NVRTC is needed to build the kernels' cubin: {why}"));
        return None;
    }
    let s = match Standin::load() {
        Ok(s) => s,
        Err(why) => {
            skip::skip(format!("the stand-in libcuda.so is not available: {why}"));
            return None;
        }
    };
    s.reset();
    let path = s.path.clone();
    Some((s, path))
}

/// A small executor through the stand-in at `driver`.
pub fn config(driver: &std::path::Path, mode: ExecMode) -> CudaExecutorConfig {
    CudaExecutorConfig {
        mode,
        sm_count: Some(1),
        driver: Some(driver.to_path_buf()),
        block_threads: 32,
        blocks_per_sm: Some(1),
        stop_timeout: Duration::from_secs(20),
        ..Default::default()
    }
}

/// A ring on one emulated controller, run by a CUDA executor. Fields drop
/// in order: the ring (stops the executor), then the controller.
pub struct Rig {
    pub ring: GioUring,
    pub exec: Arc<CudaExecutor>,
    pub ctrl: Arc<Controller>,
    pub emu: EmulatedController,
}

pub fn rig(cfg: CudaExecutorConfig, opts: GioOptions) -> Rig {
    let emu = EmulatedController::start(EmulatedConfig {
        name: "emu0".into(),
        namespaces: vec![NamespaceConfig::with_bytes(16 << 20, 512)],
        ..EmulatedConfig::default()
    })
    .expect("emulated controller starts");
    let ctrl =
        Controller::new(emu.registers(), emu.dma_space(), ControllerOptions::default()).expect("bring-up");
    let drives = vec![DriveQueues::create(&ctrl, 1, 1, 32).expect("queue pair")];
    let exec = Arc::new(CudaExecutor::new(cfg).expect("CUDA executor on the stand-in"));
    let ring = GioUring::init_with(opts, drives, exec.clone()).expect("gio_uring init");
    Rig { ring, exec, ctrl, emu }
}

pub fn opts() -> GioOptions {
    GioOptions {
        depth: 8,
        command_timeout: Duration::from_secs(5),
        submit_timeout: Duration::from_secs(12),
        idle_sleep: Duration::from_millis(1),
        ..Default::default()
    }
}

fn rw(op: Op, lba: u64, m: usize, buf: &DmaBuffer) -> IoCtx {
    ioctx(
        op,
        0,
        lba + m as u64 * 8,
        8,
        DataRef::Sgl(SglDescriptor::data_block(buf.iova_at(m * CMD), CMD as u32)),
    )
}

/// Writes `n` 4 KiB commands of a pattern, reads them back into another
/// buffer and checks every byte.
pub fn round_trip(rig: &Rig, n: usize, seed: u64) {
    round_trip_at(rig, n, seed, 0)
}

/// [`round_trip`] at LBAs from `lba` on.
pub fn round_trip_at(rig: &Rig, n: usize, seed: u64, lba: u64) {
    let src = rig.ctrl.dma().alloc(n * CMD).unwrap();
    let dst = rig.ctrl.dma().alloc(n * CMD).unwrap();
    let data: Vec<u8> =
        (0..(n * CMD) as u64 / 8).flat_map(|i| (seed.wrapping_mul(0x9E37_79B9) ^ i).to_le_bytes()).collect();
    src.copy_in(0, &data).unwrap();
    for (op, buf) in [(Op::Write, &src), (Op::Read, &dst)] {
        let ctxs: Vec<IoCtx> = (0..n).map(|m| rw(op, lba, m, buf)).collect();
        let ids = rig.ring.get_iocb(1).unwrap();
        rig.ring.set_ioctxs(ids[0], &ctxs).unwrap();
        rig.ring.issue(&ids, 1).unwrap();
        let r = rig.ring.wait_cqe(&ids, Duration::from_secs(30)).unwrap().remove(0);
        assert!(
            r.is_ok(),
            "{op:?}: {:?}",
            r.failures.iter().take(4).map(|f| f.to_string()).collect::<Vec<_>>()
        );
        assert_eq!(r.completed, n as u32);
    }
    let mut got = vec![0u8; n * CMD];
    dst.copy_out(0, &mut got).unwrap();
    assert!(got == data, "read-back differs from what was written");
}
