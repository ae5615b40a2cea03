//! Deferred frees are bounded under a persistent kernel (issue 27).
//!
//! While the persistent kernel runs, `cuMemFree` would block on it, so the
//! executor defers every free until the kernel stops: an engine that
//! registers and drops a pair list per request would pile them up for as
//! long as the executor lives. With `deferred_bound` set, an issue that finds
//! that many waiting stops the kernel (after the queued work), releases them
//! and starts it again. The stand-in fails a free made under a running kernel
//! (after `sync_deadline_ms`) and records a violation, so a release that came
//! too early would show.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod executor_common;

use executor_common::*;
use tutti_gio_uring::{CudaExecutorConfig, ExecMode};

/// Registers and drops one pair list per request, `requests` times, each followed by an
/// I/O round trip; returns the most frees seen waiting after any request.
fn requests(rig: &Rig, requests: u32) -> usize {
    let mut most = 0;
    for r in 0..requests {
        let id = rig.ring.register_pairs(&[(0, r), (1, r + 1)]).unwrap();
        rig.ring.unregister_pairs(id).unwrap();
        round_trip(rig, 2, u64::from(r));
        most = most.max(rig.exec.deferred_frees());
    }
    most
}

#[test]
fn deferred_frees_stay_bounded_under_a_persistent_kernel() {
    let _g = serial();
    let Some((s, path)) = standin() else { return };
    s.set_knob("sync_deadline_ms", 1000).unwrap();
    let bound = 4;
    let rig =
        rig(CudaExecutorConfig { deferred_bound: bound, ..config(&path, ExecMode::Persistent) }, opts());
    let most = requests(&rig, 20);
    assert!(most <= bound, "{most} frees waited at once; the bound is {bound}");
    assert!(rig.exec.restarts() >= 4, "20 dropped lists, a bound of 4: {} restarts", rig.exec.restarts());
    // The restarted kernel serves as before.
    round_trip(&rig, 8, 99);
    let v = s.violations();
    assert!(v.is_empty(), "stand-in violations (a free under a running kernel?): {v:?}");
    drop(rig);
    assert!(s.violations().is_empty(), "stand-in violations at teardown: {:?}", s.violations());
}

#[test]
fn without_a_bound_they_pile_up_until_stop() {
    let _g = serial();
    let Some((s, path)) = standin() else { return };
    s.set_knob("sync_deadline_ms", 1000).unwrap();
    let rig = rig(CudaExecutorConfig { deferred_bound: 0, ..config(&path, ExecMode::Persistent) }, opts());
    let most = requests(&rig, 20);
    assert!(most >= 20, "every dropped list waits for the kernel to stop: {most}");
    assert_eq!(rig.exec.restarts(), 0);
    drop(rig);
    assert!(s.violations().is_empty(), "stand-in violations: {:?}", s.violations());
}
