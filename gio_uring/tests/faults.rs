//! Failures: NVMe errors injected by the emulated controller, malformed
//! IOCTXs caught by the executor, a completion that never arrives, and host
//! waits that time out. Every failed IOCTX is reported with its own status.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::time::{Duration, Instant};
use tutti_driver::spec::{SglDescriptor, Status};
use tutti_emulator::FaultMatch;
use tutti_gio_uring::{ioctx, DataRef, GioError, GioOptions, Invalid, IoCtx, IoStatus, Op, Translation};

const CMD: usize = 4096;

fn rw(op: Op, drive: u16, m: usize, buf: &tutti_driver::transport::DmaBuffer) -> IoCtx {
    ioctx(
        op,
        drive,
        m as u64 * 8,
        8,
        DataRef::Sgl(SglDescriptor::data_block(buf.iova_at(m * CMD), CMD as u32)),
    )
}

#[test]
fn injected_errors_and_malformed_ioctxs_are_reported_one_by_one() {
    let rig = rig(RigSpec { depth: 32, ..Default::default() });
    let bufs: Vec<_> = rig.ctrls.iter().map(|c| c.dma().alloc(1024 * CMD).unwrap()).collect();
    for (d, b) in bufs.iter().enumerate() {
        fill(b, 40 + d as u64);
    }
    // Write 1024 commands per drive, then read them back with faults armed.
    let writes: Vec<IoCtx> = (0..2048).map(|k| rw(Op::Write, (k % 2) as u16, k / 2, &bufs[k % 2])).collect();
    let ids = rig.ring.get_iocb(1).unwrap();
    rig.ring.set_ioctxs(ids[0], &writes).unwrap();
    rig.ring.issue(&ids, 3).unwrap();
    assert!(rig.ring.wait_cqe(&ids, Duration::from_secs(30)).unwrap()[0].is_ok());

    let reads_into: Vec<_> = rig.ctrls.iter().map(|c| c.dma().alloc(1024 * CMD).unwrap()).collect();
    let mut reads: Vec<IoCtx> =
        (0..2048).map(|k| rw(Op::Read, (k % 2) as u16, k / 2, &reads_into[k % 2])).collect();
    // Device errors: IOCTX 10 (drive 0, LBA 40) and 701 (drive 1, LBA 2800).
    let read_at = |lba: u64| FaultMatch { opcode: Some(0x02), lba: Some(lba..lba + 1), ..Default::default() };
    rig.emus[0].faults().fail_next(read_at(40), Status::UNRECOVERED_READ_ERROR);
    rig.emus[1].faults().fail_next(read_at(2800), Status::LBA_OUT_OF_RANGE.with_dnr(true));
    // Executor-side rejections.
    reads[100].drive = 7; // no such drive
    reads[200].nlb = 0;
    reads[300].dptr = SglDescriptor::data_block(reads_into[0].iova_at(150 * CMD), 512).to_words();
    reads[400].opcode = 0x09; // Dataset Management is not issued from IOCTXs
    reads[500].flags = 0;
    let ids = rig.ring.get_iocb(1).unwrap();
    rig.ring.set_ioctxs(ids[0], &reads).unwrap();
    rig.ring.issue(&ids, 3).unwrap();
    let r = rig.ring.wait_cqe(&ids, Duration::from_secs(30)).unwrap().remove(0);

    assert_eq!((r.count, r.completed, r.failed), (2048, 2048, 7));
    let got: Vec<(u32, IoStatus)> = r.failures.iter().map(|f| (f.index, f.status)).collect();
    assert_eq!(
        got,
        vec![
            (10, IoStatus::Nvme(Status::UNRECOVERED_READ_ERROR)),
            (100, IoStatus::Translation(Translation::Drive)),
            (200, IoStatus::Invalid(Invalid::Length)),
            (300, IoStatus::Invalid(Invalid::SglLength)),
            (400, IoStatus::Invalid(Invalid::Opcode)),
            (500, IoStatus::Invalid(Invalid::DataPointer)),
            (701, IoStatus::Nvme(Status::LBA_OUT_OF_RANGE.with_dnr(true))),
        ]
    );
    let (first, status) = r.first_error.expect("a first error");
    assert!(got.contains(&(first, status)));
    let f = r.failures.iter().find(|f| f.index == 701).unwrap();
    assert_eq!((f.drive, f.slba, f.nlb), (1, 350 * 8, 8));
    assert!(f.to_string().contains("Read drive 1 LBA 2800 x 8: NVMe Generic/LBA Out of Range"), "{f}");
    let err = r.clone().check().unwrap_err().to_string();
    assert!(err.contains("7 of 2048 IOCTXs failed"), "{err}");

    // Every IOCTX that did not fail moved its data.
    let failed: Vec<u32> = r.failures.iter().map(|f| f.index).collect();
    for d in 0..2 {
        let (want, have) = (bytes(&bufs[d]), bytes(&reads_into[d]));
        for m in 0..1024 {
            let k = (2 * m + d) as u32;
            if failed.contains(&k) {
                continue;
            }
            assert_eq!(
                first_diff(&want[m * CMD..(m + 1) * CMD], &have[m * CMD..(m + 1) * CMD]),
                None,
                "IOCTX {k}"
            );
        }
    }
}

#[test]
fn a_dropped_completion_times_out_one_ioctx_and_the_queue_keeps_working() {
    let opts = GioOptions {
        depth: 4,
        command_timeout: Duration::from_millis(300),
        submit_timeout: Duration::from_millis(1500),
        ..Default::default()
    };
    // One queue pair of 16 per drive, so later commands must reuse the lost command's slot.
    let rig = rig(RigSpec { pairs: 1, depth: 16, opts, ..Default::default() });
    let bufs: Vec<_> = rig.ctrls.iter().map(|c| c.dma().alloc(1024 * CMD).unwrap()).collect();
    rig.emus[1].faults().drop_next(FaultMatch {
        opcode: Some(0x01),
        lba: Some(88..89),
        ..Default::default()
    });
    let writes: Vec<IoCtx> = (0..2048).map(|k| rw(Op::Write, (k % 2) as u16, k / 2, &bufs[k % 2])).collect();
    let ids = rig.ring.get_iocb(1).unwrap();
    rig.ring.set_ioctxs(ids[0], &writes).unwrap();
    let t = Instant::now();
    rig.ring.issue(&ids, 3).unwrap();
    let r = rig.ring.wait_cqe(&ids, Duration::from_secs(20)).unwrap().remove(0);
    eprintln!("IOCB with a lost completion finished in {:?}", t.elapsed());
    assert_eq!(rig.emus[1].stats().dropped_completions, 1);
    let shown: Vec<String> = r.failures.iter().map(|f| f.to_string()).collect();
    assert_eq!((r.completed, r.failed), (2048, 1), "{shown:#?}");
    // Drive 1, LBA 88 is its 11th command: IOCTX 2 * 11 + 1.
    assert_eq!(r.failures[0].index, 23);
    assert_eq!(r.failures[0].status, IoStatus::CompletionTimeout);
    let stats = rig.ring.queue_stats().unwrap();
    assert_eq!(stats.iter().map(|s| s.expired).sum::<u64>(), 1);
    assert!(stats.iter().all(|s| !s.dead));

    // The same queues serve the next IOCB in full.
    let ids = rig.ring.get_iocb(1).unwrap();
    rig.ring.set_ioctxs(ids[0], &writes).unwrap();
    rig.ring.issue(&ids, 3).unwrap();
    assert!(rig.ring.wait_cqe(&ids, Duration::from_secs(20)).unwrap()[0].is_ok());
}

#[test]
fn host_waits_time_out_with_the_iocbs_still_in_flight() {
    let rig = rig(RigSpec {
        pairs: 1,
        depth: 8,
        per_command: Duration::from_millis(20),
        opts: GioOptions { depth: 4, ..Default::default() },
        ..Default::default()
    });
    let bufs: Vec<_> = rig.ctrls.iter().map(|c| c.dma().alloc(64 * CMD).unwrap()).collect();
    let ctxs: Vec<IoCtx> = (0..64).map(|k| rw(Op::Write, (k % 2) as u16, k / 2, &bufs[k % 2])).collect();
    let ids = rig.ring.get_iocb(1).unwrap();
    rig.ring.set_ioctxs(ids[0], &ctxs).unwrap();
    rig.ring.issue(&ids, 1).unwrap();
    let t = Instant::now();
    match rig.ring.wait_cqe(&ids, Duration::from_millis(30)) {
        Err(GioError::WaitTimeout { pending, .. }) => assert_eq!(pending, ids),
        other => panic!("expected a wait timeout, got {other:?}"),
    }
    assert!(t.elapsed() < Duration::from_secs(5));
    // The executor's own wait gives up too, and reports nothing completed.
    assert_eq!(rig.ring.wait_on_executor(&ids, Duration::from_millis(20)).unwrap(), 0);
    // Waiting longer collects it.
    assert!(rig.ring.wait_cqe(&ids, Duration::from_secs(20)).unwrap()[0].is_ok());
}

#[test]
fn a_controller_that_stops_answering_fails_its_ioctxs_without_a_hang() {
    let opts = GioOptions {
        depth: 4,
        command_timeout: Duration::from_millis(200),
        submit_timeout: Duration::from_millis(600),
        ..Default::default()
    };
    let rig = rig(RigSpec { pairs: 1, depth: 16, opts, ..Default::default() });
    let bufs: Vec<_> = rig.ctrls.iter().map(|c| c.dma().alloc(1024 * CMD).unwrap()).collect();
    // Drive 1's controller raises CSTS.CFS and stops fetching and completing.
    rig.emus[1].set_fatal();
    let ctxs: Vec<IoCtx> = (0..2048).map(|k| rw(Op::Write, (k % 2) as u16, k / 2, &bufs[k % 2])).collect();
    let ids = rig.ring.get_iocb(1).unwrap();
    rig.ring.set_ioctxs(ids[0], &ctxs).unwrap();
    let t = Instant::now();
    rig.ring.issue(&ids, 3).unwrap();
    let r = rig.ring.wait_cqe(&ids, Duration::from_secs(30)).unwrap().remove(0);
    eprintln!("IOCB against a dead controller finished in {:?}", t.elapsed());
    assert_eq!((r.completed, r.failed), (2048, 1024));
    let mut kinds = std::collections::BTreeMap::new();
    for f in &r.failures {
        assert_eq!(f.index % 2, 1, "IOCTX {} on the healthy drive failed: {}", f.index, f.status);
        let kind = match f.status {
            IoStatus::CompletionTimeout => "completion timeout",
            IoStatus::SubmitTimeout => "submit timeout",
            IoStatus::QueueDead { queue: 1 } => "queue dead",
            other => panic!("IOCTX {}: unexpected {other}", f.index),
        };
        *kinds.entry(kind).or_insert(0) += 1;
    }
    eprintln!("{kinds:?}");
    // Some commands reached the queue (and timed out), one submitter gave up, the rest failed fast.
    assert!(kinds.get("completion timeout").copied().unwrap_or(0) >= 1);
    assert!(kinds.get("submit timeout").copied().unwrap_or(0) >= 1);
    let stats = rig.ring.queue_stats().unwrap();
    assert!(!stats[0].dead && stats[1].dead);
}
