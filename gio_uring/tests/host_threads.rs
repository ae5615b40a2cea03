//! The host executor's OS threads: one per configured thread (a block's lanes are
//! fibers on it), and an idle persistent executor blocks instead of polling.
//! Always the host executor, whatever TUTTI_TEST_EXECUTOR says: these are its
//! properties. One test binary of its own, so no other test's threads are counted.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::sync::Arc;
use std::time::Duration;
use tutti_driver::spec::SglDescriptor;
use tutti_gio_uring::{ioctx, DataRef, ExecMode, GioOptions, HostExecutor, HostExecutorConfig, Op};

/// The executor's threads (the runtime names each block thread "tutti-block"): their task ids.
fn block_threads() -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = e.unwrap().path();
        if std::fs::read_to_string(dir.join("comm")).is_ok_and(|c| c.trim() == "tutti-block") {
            out.push(dir.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    out
}

/// The emulated controllers' threads (named "nvme-<name>"): their task ids.
fn controller_threads() -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = e.unwrap().path();
        if std::fs::read_to_string(dir.join("comm")).is_ok_and(|c| c.starts_with("nvme-")) {
            out.push(dir.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    out
}

/// Context switches (voluntary + involuntary) of one task so far.
fn switches(tid: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
    status
        .lines()
        .filter(|l| l.starts_with("voluntary_ctxt_switches") || l.starts_with("nonvoluntary_ctxt_switches"))
        .map(|l| l.split_whitespace().last().unwrap().parse::<u64>().unwrap())
        .sum()
}

fn persistent_rig(threads: u32, lanes: u32) -> Rig {
    let exec = HostExecutor::new(HostExecutorConfig {
        mode: ExecMode::Persistent,
        blocks: threads,
        block_lanes: lanes,
        ..Default::default()
    })
    .unwrap();
    rig_on(
        RigSpec { controllers: 1, opts: GioOptions { depth: 4, ..Default::default() }, ..Default::default() },
        Arc::new(exec),
    )
}

/// Writes 64 pages through the ring and waits for them.
fn some_io(rig: &Rig) {
    let buf = rig.ctrls[0].dma().alloc(64 * 4096).unwrap();
    let ctxs: Vec<_> = (0..64)
        .map(|m| {
            let sgl = SglDescriptor::data_block(buf.iova_at(m * 4096), 4096);
            ioctx(Op::Write, 0, m as u64 * 8, 8, DataRef::Sgl(sgl))
        })
        .collect();
    let ids = rig.ring.get_iocb(1).unwrap();
    rig.ring.set_ioctxs(ids[0], &ctxs).unwrap();
    rig.ring.issue(&ids, 1).unwrap();
    let done = rig.ring.wait_cqe(&ids, Duration::from_secs(30)).unwrap();
    assert_eq!(done[0].completed, 64);
    done[0].clone().check().unwrap();
}

#[test]
fn the_executor_runs_one_os_thread_per_configured_thread_whatever_its_lanes() {
    assert!(block_threads().is_empty());
    {
        // 2 threads of 128 lanes each: 256 lanes, 2 OS threads.
        let rig = persistent_rig(2, 128);
        some_io(&rig);
        // Each thread names itself when it starts; the I/O may finish on the first before the
        // second got that far (seen once after the executor got faster).
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while block_threads().len() < 2 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(block_threads().len(), 2, "threads named tutti-block");
    }
    // Stopped with the ring: the threads are gone.
    assert!(block_threads().is_empty());

    // An idle persistent executor blocks on its empty submission ring: over half a
    // second its thread wakes a few dozen times (the park timeout bounds a missed
    // wake-up at 10 ms), where polling with the ring's 200 us idle sleep would
    // switch thousands of times. A busy machine only lowers the count.
    let rig = persistent_rig(1, 32);
    some_io(&rig);
    let tids = block_threads();
    assert_eq!(tids.len(), 1);
    std::thread::sleep(Duration::from_millis(50));
    let before = switches(&tids[0]);
    std::thread::sleep(Duration::from_millis(500));
    let woke = switches(&tids[0]) - before;
    assert!(woke < 200, "the idle executor thread switched {woke} times in 0.5 s");
    // ... and work pushed after the idle spell wakes it.
    some_io(&rig);

    // The idle emulated controller parks on its wake word too: its thread
    // wakes a few hundred times in half a second (parks grow to 2 ms), where
    // sleeping 200 us steps switched 2,500 times and more.
    let ctl = controller_threads();
    assert_eq!(ctl.len(), 1);
    std::thread::sleep(Duration::from_millis(50));
    let before = switches(&ctl[0]);
    std::thread::sleep(Duration::from_millis(500));
    let woke = switches(&ctl[0]) - before;
    assert!(woke < 800, "the idle controller thread switched {woke} times in 0.5 s");
    // ... and the lanes' doorbell stores wake it (not its park timeout).
    let woken = rig.emus[0].stats().woken;
    some_io(&rig);
    assert!(rig.emus[0].stats().woken > woken, "the lanes' doorbells did not wake the parked controller");
}
