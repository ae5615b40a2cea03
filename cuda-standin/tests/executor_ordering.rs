//! Issue 14 defect 1: host writes to device memory must have landed before a
//! kernel reads them. The stand-in lands legacy-stream copies and memsets
//! late (`landing_delay_ms`) and does not order them with non-blocking
//! streams, as CUDA does; the executor writes through its own non-blocking
//! copy stream and waits for it, so nothing it wrote can be read stale.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod executor_common;

use executor_common::*;
use std::time::Duration;
use tutti_gio_uring::ExecMode;

/// The persistent kernel starts right after `init` wrote its context,
/// queue descriptors and slot arrays: with late landings it would read zeros.
#[test]
fn a_persistent_kernel_reads_the_descriptors_written_before_it_started() {
    let _g = serial();
    let Some((s, path)) = standin() else { return };
    s.set_knob("landing_delay_ms", 300).unwrap();
    let rig = rig(config(&path, ExecMode::Persistent), opts());
    round_trip(&rig, 48, 1);
    // Queue recovery rewrites the queue's descriptor and slot arrays under the running kernel.
    let rep = rig.ring.recover_drive(0, Duration::from_secs(10)).unwrap();
    assert!(!rep.qids.is_empty(), "{rep:?}");
    round_trip(&rig, 48, 2);
    let stats = rig.ring.queue_stats().unwrap();
    assert!(stats.iter().all(|q| q.tickets >= 48 && !q.dead), "{stats:?}");
    drop(rig);
    let v = s.violations();
    assert!(v.is_empty(), "stand-in violations: {v:?}");
}

/// In launch mode the first kick comes right after `init` too; a layer of
/// pair lists registered between kicks must be read as written.
#[test]
fn launched_kernels_read_what_the_host_wrote_before_the_kick() {
    let _g = serial();
    let Some((s, path)) = standin() else { return };
    s.set_knob("landing_delay_ms", 300).unwrap();
    let rig = rig(config(&path, ExecMode::Launch), opts());
    for seed in 0..3 {
        round_trip(&rig, 40, 10 + seed);
    }
    drop(rig);
    let v = s.violations();
    assert!(v.is_empty(), "stand-in violations: {v:?}");
}
