//! The host executor driving emulated controllers: full IOCBs of 2048 IOCTXs,
//! several drives and queue pairs, data verified byte for byte.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::time::{Duration, Instant};
use tutti_driver::spec::SglDescriptor;
use tutti_driver::transport::DmaBuffer;
use tutti_gio_uring::{ioctx, DataRef, ExecMode, GioOptions, IoCtx, Op, QueueStats};

const BLOCKS_PER_CMD: u32 = 8;
const CMD_BYTES: usize = 4096;

/// Command `k` of a pass: drive k % drives, LBA and buffer slot k / drives.
fn plan(op: Op, total: usize, bufs: &[DmaBuffer]) -> Vec<IoCtx> {
    let drives = bufs.len();
    (0..total)
        .map(|k| {
            let (d, m) = (k % drives, k / drives);
            let sgl = SglDescriptor::data_block(bufs[d].iova_at(m * CMD_BYTES), CMD_BYTES as u32);
            ioctx(op, d as u16, m as u64 * BLOCKS_PER_CMD as u64, BLOCKS_PER_CMD, DataRef::Sgl(sgl))
        })
        .collect()
}

/// Runs `ctxs` in IOCBs of 2048, `at_once` IOCBs in flight, and checks every result.
fn run(rig: &Rig, ctxs: &[IoCtx], at_once: usize, budget: u32) {
    for batch in ctxs.chunks(2048 * at_once) {
        let parts: Vec<&[IoCtx]> = batch.chunks(2048).collect();
        let ids = rig.ring.get_iocb(parts.len()).unwrap();
        for (id, p) in ids.iter().zip(&parts) {
            rig.ring.set_ioctxs(*id, p).unwrap();
        }
        rig.ring.issue(&ids, budget).unwrap();
        let results = rig.ring.wait_cqe(&ids, Duration::from_secs(60)).unwrap();
        for (r, p) in results.iter().zip(&parts) {
            assert_eq!(r.count, p.len() as u32);
            assert_eq!(r.completed, r.count, "{}: completion count", r.id);
            assert!(
                r.is_ok(),
                "{}: {:?}",
                r.id,
                r.failures.iter().take(5).map(|f| f.to_string()).collect::<Vec<_>>()
            );
        }
    }
}

fn total(stats: &[QueueStats], f: impl Fn(&QueueStats) -> u64) -> u64 {
    stats.iter().map(f).sum()
}

fn write_read_verify(spec: RigSpec, iocbs: usize, at_once: usize) -> (Vec<QueueStats>, u64) {
    let rig = rig(spec);
    let drives = rig.ring.drives().len();
    let n = 2048 * iocbs;
    let per_drive = n.div_ceil(drives);
    let src: Vec<DmaBuffer> =
        rig.ctrls.iter().map(|c| c.dma().alloc(per_drive * CMD_BYTES).unwrap()).collect();
    let dst: Vec<DmaBuffer> =
        rig.ctrls.iter().map(|c| c.dma().alloc(per_drive * CMD_BYTES).unwrap()).collect();
    for (d, b) in src.iter().enumerate() {
        fill(b, d as u64 + 1);
    }

    // Watch the queues from the side while the passes run: peak commands in flight.
    let peak = std::sync::atomic::AtomicU64::new(0);
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(q) = rig.ring.queue_stats() {
                    let inflight = total(&q, |s| s.tickets) - total(&q, |s| s.completed + s.expired);
                    peak.fetch_max(inflight, std::sync::atomic::Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        let t = Instant::now();
        run(&rig, &plan(Op::Write, n, &src), at_once, 3);
        run(&rig, &plan(Op::Read, n, &dst), at_once, 3);
        eprintln!("{n} writes + {n} reads in {:?}", t.elapsed());
        done.store(true, std::sync::atomic::Ordering::Relaxed);
    });

    for d in 0..drives {
        let used = (n - d).div_ceil(drives) * CMD_BYTES;
        let (a, b) = (bytes(&src[d]), bytes(&dst[d]));
        assert_eq!(first_diff(&a[..used], &b[..used]), None, "drive {d}: read-back differs");
    }
    let stats = rig.ring.queue_stats().unwrap();
    for (e, emu) in rig.emus.iter().enumerate() {
        let s = emu.stats();
        assert_eq!((s.errors, s.iommu_faults, s.dropped_completions), (0, 0, 0), "emu{e}: {s:?}");
    }
    (stats, peak.into_inner())
}

#[test]
fn thousands_in_flight_on_deep_queues_of_two_drives() {
    // 2 drives x 2 queue pairs x 1024 entries; 4 IOCBs of 2048 in flight at once.
    let spec = RigSpec {
        depth: 1024,
        per_command: Duration::from_micros(200),
        opts: GioOptions { depth: 8, ..Default::default() },
        ..Default::default()
    };
    let (stats, peak) = write_read_verify(spec, 8, 4);
    eprintln!("peak commands in flight (sampled): {peak}");
    assert_eq!(stats.len(), 4);
    let n = 2 * 8 * 2048u64;
    assert_eq!(total(&stats, |s| s.tickets), n);
    assert_eq!(total(&stats, |s| s.completed), n);
    assert_eq!(total(&stats, |s| s.errors + s.expired + s.stale), 0);
    for s in &stats {
        // Work is split evenly over a drive's queues: 8192 commands each, 8 wraps.
        assert_eq!(s.tickets, n / 4, "queue {}", s.queue);
        assert!(!s.dead);
    }
}

#[test]
fn shallow_queues_force_back_pressure_and_wrap_hundreds_of_times() {
    // 2048 IOCTXs per IOCB against 4 queues holding 15 commands each.
    let spec =
        RigSpec { depth: 16, opts: GioOptions { depth: 4, ..Default::default() }, ..Default::default() };
    let (stats, _) = write_read_verify(spec, 4, 2);
    let n = 2 * 4 * 2048u64;
    assert_eq!(total(&stats, |s| s.completed), n);
    for s in &stats {
        assert_eq!(s.tickets / 16, n / 4 / 16, "queue {} wraps", s.queue);
        // One CQ doorbell per reaped batch, one SQ doorbell per published run: never more than commands.
        assert!(s.sq_doorbells <= s.tickets && s.cq_doorbells <= s.completed);
    }
}

#[test]
fn persistent_kernel_polls_the_submission_ring() {
    let spec = RigSpec {
        depth: 32,
        mode: ExecMode::Persistent,
        opts: GioOptions { depth: 4, ..Default::default() },
        ..Default::default()
    };
    let rig = rig(spec);
    let src: Vec<DmaBuffer> = rig.ctrls.iter().map(|c| c.dma().alloc(1024 * CMD_BYTES).unwrap()).collect();
    let dst: Vec<DmaBuffer> = rig.ctrls.iter().map(|c| c.dma().alloc(1024 * CMD_BYTES).unwrap()).collect();
    for (d, b) in src.iter().enumerate() {
        fill(b, 100 + d as u64);
    }
    // Several rounds with idle gaps: the kernel keeps polling between them.
    for round in 0..3 {
        run(&rig, &plan(Op::Write, 2048, &src), 1, 2);
        run(&rig, &plan(Op::Read, 2048, &dst), 1, 2);
        for d in 0..2 {
            assert_eq!(first_diff(&bytes(&src[d]), &bytes(&dst[d])), None, "round {round} drive {d}");
        }
        fill(&dst[0], 7);
        fill(&dst[1], 8);
        std::thread::sleep(Duration::from_millis(20));
    }
    let ex = rig.ring.executor_stats();
    if !on_inline() {
        // (An inline executor has no kernel running between calls: nothing polls.)
        assert_eq!(
            ex.running,
            rig.ring.executor().shape().max_blocks,
            "all persistent blocks are still polling"
        );
    }
    assert_eq!(ex.iocbs_done, 6);
    assert_eq!(ex.lost_posts, 0);
}
