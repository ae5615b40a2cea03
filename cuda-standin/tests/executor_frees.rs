//! Issue 14 defect 3: `cuMemFree` (and `cuMemFreeHost`) wait for the
//! device, so with a persistent kernel they block until it stops, and freeing
//! memory under a running kernel is a use after free. The stand-in fails such
//! a free after `sync_deadline_ms` and records a violation. The executor
//! defers frees while its kernels may run, and allocates `wait_kernel`'s
//! scratch once, before the kernels start.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod executor_common;

use executor_common::*;
use std::time::Duration;
use tutti_gio_uring::ExecMode;

#[test]
fn nothing_is_freed_under_the_persistent_kernel() {
    let _g = serial();
    let Some((s, path)) = standin() else { return };
    s.set_knob("sync_deadline_ms", 1000).unwrap();
    let rig = rig(config(&path, ExecMode::Persistent), opts());
    round_trip(&rig, 8, 3);
    // A pair list registered and given back while the kernel polls.
    for round in 0..3 {
        let id = rig.ring.register_pairs(&[(0, round), (1, round + 1)]).unwrap();
        rig.ring.unregister_pairs(id).unwrap();
    }
    // wait_kernel, twice: its scratch must not come and go per call.
    let ids = rig.ring.get_iocb(1).unwrap();
    let buf = rig.ctrl.dma().alloc(CMD).unwrap();
    let ctx = tutti_gio_uring::ioctx(
        tutti_gio_uring::Op::Read,
        0,
        0,
        8,
        tutti_gio_uring::DataRef::Sgl(tutti_driver::spec::SglDescriptor::data_block(buf.iova(), CMD as u32)),
    );
    rig.ring.set_ioctxs(ids[0], &[ctx]).unwrap();
    rig.ring.issue(&ids, 1).unwrap();
    for _ in 0..2 {
        assert_eq!(rig.ring.wait_on_executor(&ids, Duration::from_secs(5)).unwrap(), 1);
    }
    assert!(rig.ring.wait_cqe(&ids, Duration::from_secs(5)).unwrap()[0].is_ok());
    let v = s.violations();
    assert!(v.is_empty(), "stand-in violations while the kernel ran: {v:?}");
    drop(rig);
    let v = s.violations();
    assert!(v.is_empty(), "stand-in violations at teardown: {v:?}");
}
