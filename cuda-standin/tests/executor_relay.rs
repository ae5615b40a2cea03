//! Issue 14 defect 5: registering a drive's doorbell page for the GPU
//! (`cuMemHostRegister`, IOMEMORY for a BAR) may be refused; the executor
//! then rings doorbells through the host relay instead of failing, and says so.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod executor_common;

use cudarc::driver::sys::CUresult;
use executor_common::*;
use tutti_gio_uring::{ExecMode, Executor};

#[test]
fn a_refused_doorbell_registration_falls_back_to_the_relay() {
    let _g = serial();
    let Some((s, path)) = standin() else { return };
    // Registrations in ring order: SQ memory, CQ memory, then the doorbell page. The
    // emulated controller's doorbells are memory, not a BAR, so the failure is armed on
    // every registration (the third) rather than on `cuMemHostRegister_v2:IOMEMORY`.
    for mode in [ExecMode::Launch, ExecMode::Persistent] {
        s.fail("cuMemHostRegister_v2", 2, 1, CUresult::CUDA_ERROR_NOT_SUPPORTED).unwrap();
        let rig = rig(config(&path, mode), opts());
        let name = rig.exec.name().to_string();
        assert!(name.contains("relayed"), "{name}");
        round_trip(&rig, 24, 21);
        let stats = rig.exec.relay_stats().expect("the relay runs");
        assert!(stats.relayed >= 2, "{stats:?}");
        assert_eq!(stats.watched, 2, "both doorbells of the queue pair are relayed: {stats:?}");
        drop(rig);
        let v = s.violations();
        assert!(v.is_empty(), "stand-in violations: {v:?}");
    }
}
