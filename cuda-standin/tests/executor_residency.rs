//! Issue 14 defect 2: a persistent grid that fills its SM partition keeps
//! every other kernel of the partition (`tt_gio_wait`) from ever becoming
//! resident; persistent mode without a partition holds the engine's SMs.
//! The stand-in places blocks by the cubin's register counts, per SM.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod executor_common;

use executor_common::*;
use std::time::Duration;
use tutti_gio_uring::{CudaExecutor, CudaExecutorConfig, ExecMode, GioError};

#[test]
fn the_wait_kernel_finds_room_beside_the_persistent_grid() {
    let _g = serial();
    let Some((s, path)) = standin() else { return };
    // A small SM (8192 registers: four 32-thread blocks of the 64-register persistent
    // kernel) keeps the host thread count low; occupancy alone would fill it.
    s.set_knob("regs_per_sm", 8192).unwrap();
    let cfg = CudaExecutorConfig { blocks_per_sm: None, ..config(&path, ExecMode::Persistent) };
    let rig = rig(cfg, opts());
    round_trip(&rig, 16, 5);
    let src = rig.ctrl.dma().alloc(8 * CMD).unwrap();
    let ctxs: Vec<_> = (0..8)
        .map(|m| {
            tutti_gio_uring::ioctx(
                tutti_gio_uring::Op::Write,
                0,
                m as u64 * 8,
                8,
                tutti_gio_uring::DataRef::Sgl(tutti_driver::spec::SglDescriptor::data_block(
                    src.iova_at(m * CMD),
                    CMD as u32,
                )),
            )
        })
        .collect();
    let ids = rig.ring.get_iocb(2).unwrap();
    for id in &ids {
        rig.ring.set_ioctxs(*id, &ctxs).unwrap();
    }
    rig.ring.issue(&ids, 1).unwrap();
    // tt_gio_wait runs on the executor's second stream, beside the persistent grid.
    let done = rig.ring.wait_on_executor(&ids, Duration::from_secs(3)).unwrap();
    assert_eq!(done, 2);
    assert!(rig.ring.wait_cqe(&ids, Duration::from_secs(5)).unwrap().iter().all(|r| r.is_ok()));
    drop(rig);
    let v = s.violations();
    assert!(v.is_empty(), "stand-in violations: {v:?}");
}

#[test]
fn persistent_mode_without_an_sm_partition_is_refused_naming_why() {
    let _g = serial();
    let Some((_s, path)) = standin() else { return };
    let cfg = CudaExecutorConfig { sm_count: None, ..config(&path, ExecMode::Persistent) };
    match CudaExecutor::new(cfg) {
        Err(GioError::Executor { what, .. }) => assert!(what.contains("sm_count"), "{what}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a persistent executor over every SM of the device was accepted"),
    }
}
