//! Issue 14 defect 6: when `stop` gives up with kernels still running,
//! teardown must not free what they use. The executor is poisoned instead:
//! later calls fail and its memory is leaked. A `tt_gio_wait` kernel waiting
//! for an issue that never comes outlives a short stop deadline here.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod executor_common;

use executor_common::*;
use std::time::Duration;
use tutti_gio_uring::{CudaExecutorConfig, ExecMode, Executor};

#[test]
fn a_failed_stop_poisons_the_executor_and_frees_nothing_under_its_kernels() {
    let _g = serial();
    let Some((s, path)) = standin() else { return };
    s.set_knob("sync_deadline_ms", 1000).unwrap();
    let cfg =
        CudaExecutorConfig { stop_timeout: Duration::from_millis(300), ..config(&path, ExecMode::Launch) };
    let rig = rig(cfg, opts());
    round_trip(&rig, 8, 9);
    let exec: std::sync::Arc<dyn Executor> = rig.exec.clone();
    let before = s.stat("launches", 0).unwrap();
    // IOCB 0 at an issue it will never reach: the wait kernel runs its whole timeout.
    let waiter = {
        let exec = exec.clone();
        std::thread::spawn(move || exec.wait_kernel(&[0], &[0x4000_0000], Duration::from_secs(4)))
    };
    let launched = std::time::Instant::now();
    while s.stat("launches", 0).unwrap() == before && launched.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let e = exec.stop().unwrap_err().to_string();
    assert!(e.contains("poisoned"), "{e}");
    // Teardown of the ring with the wait kernel still running: the queue pair stays open on
    // the controller and its memory stays allocated (leaked), as the executor's own memory.
    let ctrl = rig.ctrl.clone();
    let free = ctrl.free_io_queue_pairs();
    drop(rig);
    assert_eq!(ctrl.free_io_queue_pairs(), free, "the queue pair was deleted under a running kernel");
    let later = exec.kick(1).unwrap_err().to_string();
    assert!(later.contains("poisoned"), "{later}");
    let _ = waiter.join().unwrap();
    drop(exec);
    let v = s.violations();
    assert!(v.is_empty(), "memory freed under a running kernel: {v:?}");
}
