//! Drive recovery: deleting and recreating a drive's queue pairs aborts a
//! command held past its timeout (no late write reaches the media), brings a
//! dead queue back, and never pulls a queue from under a command in flight.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::time::{Duration, Instant};
use tutti_driver::spec::SglDescriptor;
use tutti_driver::transport::DmaBuffer;
use tutti_emulator::FaultMatch;
use tutti_gio_uring::{ioctx, DataRef, GioError, GioOptions, GioUring, IoCtx, IoStatus, IocbResult, Op};

const CMD: usize = 4096;

fn rw(op: Op, m: usize, buf: &DmaBuffer) -> IoCtx {
    ioctx(op, 0, m as u64 * 8, 8, DataRef::Sgl(SglDescriptor::data_block(buf.iova_at(m * CMD), CMD as u32)))
}

fn run(ring: &GioUring, ctxs: &[IoCtx]) -> IocbResult {
    let ids = ring.get_iocb(1).unwrap();
    ring.set_ioctxs(ids[0], ctxs).unwrap();
    ring.issue(&ids, 1).unwrap();
    ring.wait_cqe(&ids, Duration::from_secs(30)).unwrap().remove(0)
}

/// Writes commands `ms` of `buf`, reads them back and compares.
fn write_verified(ring: &GioUring, buf: &DmaBuffer, back: &DmaBuffer, ms: std::ops::Range<usize>) {
    let w: Vec<IoCtx> = ms.clone().map(|m| rw(Op::Write, m, buf)).collect();
    let r = run(ring, &w);
    assert!(r.is_ok(), "writes after recovery: {:?}", r.failures);
    back.fill(0);
    let rd: Vec<IoCtx> = ms.clone().map(|m| rw(Op::Read, m, back)).collect();
    assert!(run(ring, &rd).is_ok());
    let (a, b) = (bytes(buf), bytes(back));
    let span = ms.start * CMD..ms.end * CMD;
    assert_eq!(first_diff(&a[span.clone()], &b[span]), None);
}

fn short_timeouts() -> GioOptions {
    GioOptions {
        depth: 4,
        command_timeout: Duration::from_millis(200),
        submit_timeout: Duration::from_millis(600),
        ..Default::default()
    }
}

fn write_at(lba: u64) -> FaultMatch {
    FaultMatch { opcode: Some(0x01), lba: Some(lba..lba + 1), ..Default::default() }
}

#[test]
fn recovery_aborts_a_late_write_and_the_recreated_queues_carry_io() {
    let rig =
        rig(RigSpec { controllers: 1, pairs: 1, depth: 16, opts: short_timeouts(), ..Default::default() });
    let ring = &rig.ring;
    let old = rig.ctrls[0].dma().alloc(16 * CMD).unwrap();
    let new = rig.ctrls[0].dma().alloc(16 * CMD).unwrap();
    let back = rig.ctrls[0].dma().alloc(16 * CMD).unwrap();
    fill(&old, 1);
    fill(&new, 2);
    write_verified(ring, &old, &back, 0..16);

    let hold = Duration::from_millis(1500);
    rig.emus[0].faults().delay_execution_next(write_at(0), hold);
    let held_at = Instant::now();
    let r = run(ring, &[rw(Op::Write, 0, &new)]);
    assert_eq!(r.failures.len(), 1);
    assert_eq!(r.failures[0].status, IoStatus::CompletionTimeout);

    let report = ring.recover_drive(0, Duration::from_secs(10)).unwrap();
    assert_eq!(report.expired_commands, 1);
    assert_eq!(report.dead_queues, 0);
    assert_eq!(report.qids.len(), 1);
    let stats = ring.queue_stats().unwrap();
    assert!(!stats[0].dead && !stats[0].recovering);

    // Past the hold, the write would have reached the media had the SQ deletion not aborted it.
    std::thread::sleep(
        (held_at + hold + Duration::from_millis(300)).saturating_duration_since(Instant::now()),
    );
    assert_eq!(rig.emus[0].stats().late_executions, 0);
    back.fill(0);
    assert!(run(ring, &[rw(Op::Read, 0, &back)]).is_ok());
    assert_eq!(
        first_diff(&bytes(&old)[..CMD], &bytes(&back)[..CMD]),
        None,
        "the late write reached the media"
    );

    // The recreated queue pair (fresh tickets, CIDs and phase) carries verified I/O.
    write_verified(ring, &new, &back, 0..16);
}

#[test]
fn a_dead_queue_serves_again_after_recovery() {
    // Depth 2: one command fits. The held command's slot expires, but with no
    // completion the SQ head never moves, so the second submitter gives up.
    let rig =
        rig(RigSpec { controllers: 1, pairs: 1, depth: 2, opts: short_timeouts(), ..Default::default() });
    let ring = &rig.ring;
    let old = rig.ctrls[0].dma().alloc(8 * CMD).unwrap();
    let new = rig.ctrls[0].dma().alloc(8 * CMD).unwrap();
    let back = rig.ctrls[0].dma().alloc(8 * CMD).unwrap();
    fill(&old, 3);
    fill(&new, 4);
    write_verified(ring, &old, &back, 0..8);

    let hold = Duration::from_millis(1500);
    rig.emus[0].faults().delay_execution_next(write_at(0), hold);
    let held_at = Instant::now();
    let r = run(ring, &[rw(Op::Write, 0, &new), rw(Op::Write, 1, &new)]);
    let statuses: Vec<IoStatus> = r.failures.iter().map(|f| f.status).collect();
    assert_eq!(statuses, vec![IoStatus::CompletionTimeout, IoStatus::SubmitTimeout]);
    assert!(ring.queue_stats().unwrap()[0].dead);
    let r = run(ring, &[rw(Op::Write, 2, &new)]);
    assert_eq!(r.failures[0].status, IoStatus::QueueDead { queue: 0 });

    let report = ring.recover_drive(0, Duration::from_secs(10)).unwrap();
    assert_eq!(report.dead_queues, 1);
    let stats = ring.queue_stats().unwrap();
    assert!(!stats[0].dead && !stats[0].recovering);

    std::thread::sleep(
        (held_at + hold + Duration::from_millis(300)).saturating_duration_since(Instant::now()),
    );
    assert_eq!(rig.emus[0].stats().late_executions, 0);
    back.fill(0);
    assert!(run(ring, &[rw(Op::Read, 0, &back)]).is_ok());
    assert_eq!(
        first_diff(&bytes(&old)[..CMD], &bytes(&back)[..CMD]),
        None,
        "the late write reached the media"
    );
    write_verified(ring, &new, &back, 0..8);
}

#[test]
fn recovery_never_takes_a_queue_from_a_command_in_flight() {
    let opts = GioOptions {
        depth: 4,
        command_timeout: Duration::from_secs(10),
        submit_timeout: Duration::from_secs(20),
        ..Default::default()
    };
    let rig = rig(RigSpec { controllers: 1, pairs: 1, depth: 16, opts, ..Default::default() });
    let ring = &rig.ring;
    let data = rig.ctrls[0].dma().alloc(8 * CMD).unwrap();
    let back = rig.ctrls[0].dma().alloc(8 * CMD).unwrap();
    fill(&data, 5);

    // A write the controller holds for a while, admitted to the queue (it took its ticket).
    // Long enough that the refusal below is seen before it ends, even on a loaded machine.
    let hold = Duration::from_millis(3000);
    rig.emus[0].faults().delay_execution_next(write_at(0), hold);
    let held = ring.get_iocb(1).unwrap();
    ring.set_ioctxs(held[0], &[rw(Op::Write, 0, &data)]).unwrap();
    ring.issue(&held, 1).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while ring.queue_stats().unwrap()[0].tickets == 0 {
        assert!(Instant::now() < until, "the write never reached its queue");
        std::thread::sleep(Duration::from_millis(1));
    }

    // A short deadline: recovery gives up, leaving the queue open and untouched.
    match ring.recover_drive(0, Duration::from_millis(100)) {
        Err(GioError::RecoveryBusy { drive: 0, users: 1, .. }) => {}
        other => panic!("expected RecoveryBusy, got {other:?}"),
    }
    assert!(!ring.queue_stats().unwrap()[0].recovering);

    // A long one: recovery waits for the held write; meanwhile new commands are refused.
    std::thread::scope(|s| {
        let recovery = s.spawn(|| ring.recover_drive(0, Duration::from_secs(20)));
        let until = Instant::now() + Duration::from_secs(10);
        while !ring.queue_stats().unwrap()[0].recovering {
            assert!(Instant::now() < until, "recovery never closed the queue");
            std::thread::sleep(Duration::from_millis(1));
        }
        let r = run(ring, &[rw(Op::Write, 1, &data)]);
        assert_eq!(r.failures.len(), 1);
        assert_eq!(r.failures[0].status, IoStatus::QueueRecovering { queue: 0 });
        let report = recovery.join().unwrap().unwrap();
        assert_eq!(report.expired_commands, 0);
    });
    // The held write finished by itself (executed late, as the controller was told to).
    let r = ring.wait_cqe(&held, Duration::from_secs(30)).unwrap().remove(0);
    assert!(r.is_ok(), "{:?}", r.failures);
    assert_eq!(rig.emus[0].stats().late_executions, 1);
    write_verified(ring, &data, &back, 0..8);
}

#[test]
fn a_drive_whose_queues_cannot_be_deleted_is_reported_failed_and_stays_closed() {
    let rig =
        rig(RigSpec { controllers: 1, pairs: 1, depth: 16, opts: short_timeouts(), ..Default::default() });
    let ring = &rig.ring;
    let data = rig.ctrls[0].dma().alloc(CMD).unwrap();
    // The controller raises CSTS.CFS and stops answering, admin commands included.
    rig.emus[0].set_fatal();
    match ring.recover_drive(0, Duration::from_secs(10)) {
        Err(GioError::DriveFailed { drive: 0, source: Some(_), .. }) => {}
        other => panic!("expected DriveFailed, got {other:?}"),
    }
    assert!(ring.queue_stats().unwrap()[0].recovering);
    let r = run(ring, &[rw(Op::Write, 0, &data)]);
    assert_eq!(r.failures[0].status, IoStatus::QueueRecovering { queue: 0 });
    // A second attempt does not touch a queue whose state is unknown.
    assert!(matches!(
        ring.recover_drive(0, Duration::from_secs(1)),
        Err(GioError::DriveFailed { source: None, .. })
    ));
}
