//! The host executor's inline mode: one block whose lanes run on the threads that
//! call gio_uring, like io_uring without SQPOLL. Always the host executor, whatever
//! TUTTI_TEST_EXECUTOR says (`TUTTI_TEST_EXECUTOR=inline` runs the rest of the
//! suite this way). One test binary of its own, so no other test's threads are counted.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::sync::Arc;
use std::time::Duration;
use tutti_driver::spec::SglDescriptor;
use tutti_gio_uring::{
    ioctx, CudaExecutor, CudaExecutorConfig, DataRef, ExecMode, GioOptions, HostExecutor, HostExecutorConfig,
    Op,
};

/// The host executor's threads (the runtime names each block thread "tutti-block").
fn executor_threads() -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc/self/task").unwrap() {
        let comm = std::fs::read_to_string(e.unwrap().path().join("comm")).unwrap_or_default();
        let comm = comm.trim();
        if comm == "tutti-block" {
            out.push(comm.to_string());
        }
    }
    out
}

fn inline_rig(per_command: Duration) -> Rig {
    let exec =
        HostExecutor::new(HostExecutorConfig { mode: ExecMode::Inline, blocks: 1, ..Default::default() })
            .unwrap();
    rig_on(
        RigSpec {
            controllers: 2,
            per_command,
            opts: GioOptions { depth: 8, ..Default::default() },
            ..Default::default()
        },
        Arc::new(exec),
    )
}

/// `n` commands of 4 KiB per drive from (Write) or into (Read) `bufs`, one IOCB per drive.
fn iocbs(
    rig: &Rig,
    op: Op,
    bufs: &[tutti_driver::transport::DmaBuffer],
    n: usize,
) -> Vec<tutti_gio_uring::IocbId> {
    let ids = rig.ring.get_iocb(bufs.len()).unwrap();
    for (d, (id, buf)) in ids.iter().zip(bufs).enumerate() {
        let ctxs: Vec<_> = (0..n)
            .map(|m| {
                let sgl = SglDescriptor::data_block(buf.iova_at(m * 4096), 4096);
                ioctx(op, d as u16, m as u64 * 8, 8, DataRef::Sgl(sgl))
            })
            .collect();
        rig.ring.set_ioctxs(*id, &ctxs).unwrap();
    }
    ids
}

#[test]
fn an_inline_executor_moves_verified_bytes_on_the_callers_thread_alone() {
    let rig = inline_rig(Duration::ZERO);
    let src: Vec<_> = rig.ctrls.iter().map(|c| c.dma().alloc(96 * 4096).unwrap()).collect();
    let dst: Vec<_> = rig.ctrls.iter().map(|c| c.dma().alloc(96 * 4096).unwrap()).collect();
    for (d, b) in src.iter().enumerate() {
        fill(b, 40 + d as u64);
    }
    for round in 0..3 {
        let w = iocbs(&rig, Op::Write, &src, 96);
        rig.ring.issue(&w, 1).unwrap();
        for r in rig.ring.wait_cqe(&w, Duration::from_secs(30)).unwrap() {
            assert_eq!(r.completed, 96);
            r.check().unwrap();
        }
        let r_ids = iocbs(&rig, Op::Read, &dst, 96);
        rig.ring.issue(&r_ids, 1).unwrap();
        // The executor's own wait (tt_gio_wait) sees them complete: this thread runs the lanes meanwhile.
        assert_eq!(rig.ring.wait_on_executor(&r_ids, Duration::from_secs(30)).unwrap(), 2);
        for r in rig.ring.wait_cqe(&r_ids, Duration::from_secs(30)).unwrap() {
            r.check().unwrap();
        }
        for d in 0..2 {
            assert_eq!(first_diff(&bytes(&src[d]), &bytes(&dst[d])), None, "round {round} drive {d}");
        }
        fill(&dst[0], 1);
        fill(&dst[1], 2);
        // No executor thread, ever: the lanes ran on this one.
        assert_eq!(executor_threads(), Vec::<String>::new());
    }
    // 3 rounds of a write and a read IOCB per drive.
    assert_eq!(rig.ring.executor_stats().iocbs_done, 12);
}

#[test]
fn commands_still_in_flight_when_the_ring_stops_are_finished_not_dropped() {
    // Slow media: issue returns with the commands at the drives, not done.
    let rig = inline_rig(Duration::from_millis(2));
    let src: Vec<_> = rig.ctrls.iter().map(|c| c.dma().alloc(16 * 4096).unwrap()).collect();
    for (d, b) in src.iter().enumerate() {
        fill(b, 70 + d as u64);
    }
    let w = iocbs(&rig, Op::Write, &src, 16);
    rig.ring.issue(&w, 1).unwrap();
    // Stopping runs the lanes until the kernel returns: the writes complete and are posted.
    rig.ring.executor().stop().unwrap();
    let st = rig.ring.executor_stats();
    assert_eq!(st.iocbs_done, 2, "the in-flight IOCBs were finished by stop");
    assert_eq!(st.lost_posts, 0);
}

#[test]
fn inline_mode_is_one_block_and_host_only() {
    let e = HostExecutor::new(HostExecutorConfig { mode: ExecMode::Inline, blocks: 2, ..Default::default() })
        .err()
        .expect("two inline blocks are refused");
    assert!(e.to_string().contains("inline mode runs one block"), "{e}");
    let e = CudaExecutor::new(CudaExecutorConfig { mode: ExecMode::Inline, ..Default::default() })
        .err()
        .expect("the CUDA executor has no inline mode");
    assert!(e.to_string().contains("only the host executor"), "{e}");
}
