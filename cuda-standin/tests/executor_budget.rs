//! Issue 14 defect 2, its last part: `sm_budget` in persistent mode. The
//! persistent grid is sized once for the partition; a submission's budget
//! says how many of its blocks may take work (`tt_control.active_blocks`),
//! the others idle. With a budget of one block, a second IOCB waits while the
//! first block is busy with a command the controller holds; with two, the
//! second block takes it at once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod executor_common;

use executor_common::*;
use std::time::{Duration, Instant};
use tutti_driver::spec::SglDescriptor;
use tutti_emulator::FaultMatch;
use tutti_gio_uring::{ioctx, CudaExecutorConfig, DataRef, ExecMode, Executor, GioError, Op};

#[test]
fn the_sm_budget_limits_the_persistent_blocks_that_take_work() {
    let _g = serial();
    let Some((s, path)) = standin() else { return };
    // Two SMs, one 32-thread block each: a persistent grid of two blocks.
    let cfg = CudaExecutorConfig { sm_count: Some(2), ..config(&path, ExecMode::Persistent) };
    let rig = rig(cfg, opts());
    assert_eq!(rig.exec.shape().max_blocks, 2, "{}", rig.exec.name());
    assert_eq!(rig.exec.shape().blocks_per_unit, 1);
    let buf = rig.ctrl.dma().alloc(2 * CMD).unwrap();
    let write = |lba: u64, m: usize| {
        ioctx(Op::Write, 0, lba, 8, DataRef::Sgl(SglDescriptor::data_block(buf.iova_at(m * CMD), CMD as u32)))
    };
    let hold = Duration::from_secs(4);
    // Issues a write the controller holds for `hold`, waits until a block took it, then
    // issues a second, ordinary one; both with `budget`.
    let pair = |budget: u32, lba: u64| {
        rig.emu.faults().delay_execution_next(
            FaultMatch { opcode: Some(0x01), lba: Some(lba..lba + 1), ..Default::default() },
            hold,
        );
        let tickets = rig.ring.queue_stats().unwrap()[0].tickets;
        let a = rig.ring.get_iocb(1).unwrap();
        rig.ring.set_ioctxs(a[0], &[write(lba, 0)]).unwrap();
        rig.ring.issue(&a, budget).unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        while rig.ring.queue_stats().unwrap()[0].tickets == tickets {
            assert!(Instant::now() < until, "the held write never reached its queue");
            std::thread::sleep(Duration::from_millis(1));
        }
        let b = rig.ring.get_iocb(1).unwrap();
        rig.ring.set_ioctxs(b[0], &[write(lba + 64, 1)]).unwrap();
        rig.ring.issue(&b, budget).unwrap();
        (a, b)
    };

    // Budget 1: the one block that may take work is busy with the held write.
    let (a, b) = pair(1, 0);
    match rig.ring.wait_cqe(&b, hold / 2) {
        Err(GioError::WaitTimeout { .. }) => {}
        other => panic!("with a budget of one block the second IOCB ran beside the held one: {other:?}"),
    }
    assert!(rig.ring.wait_cqe(&a, Duration::from_secs(20)).unwrap()[0].is_ok());
    assert!(rig.ring.wait_cqe(&b, Duration::from_secs(20)).unwrap()[0].is_ok());

    // Budget 2: the second block takes the second IOCB while the first is held.
    let (a, b) = pair(2, 256);
    assert!(rig.ring.wait_cqe(&b, hold - Duration::from_millis(500)).unwrap()[0].is_ok());
    assert!(
        matches!(rig.ring.wait_cqe(&a, Duration::ZERO), Err(GioError::WaitTimeout { .. })),
        "the held write finished first: the second block did not take work"
    );
    assert!(rig.ring.wait_cqe(&a, Duration::from_secs(20)).unwrap()[0].is_ok());
    drop(rig);
    let v = s.violations();
    assert!(v.is_empty(), "stand-in violations: {v:?}");
}
