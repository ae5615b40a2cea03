//! The doorbell relay (the CUDA executor's fallback where a BAR cannot be
//! mapped for the GPU) on the host executor against emulated controllers:
//! the kernels store doorbell values into mailboxes and only the relay thread
//! writes the controllers' doorbell registers.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tutti_driver::controller::{Controller, ControllerOptions};
use tutti_driver::spec::SglDescriptor;
use tutti_driver::transport::DmaBuffer;
use tutti_emulator::{EmulatedConfig, EmulatedController, NamespaceConfig};
use tutti_gio_uring::executor::{DoorbellMode, RelayConfig};
use tutti_gio_uring::{
    ioctx, DataRef, DriveQueues, ExecMode, Executor, GioOptions, GioUring, HostExecutor, HostExecutorConfig,
    IoCtx, IoStatus, IocbResult, Op, QueueStats,
};

const CMD: usize = 4096;
const BLOCKS: u32 = 8;

/// A ring over `controllers` emulated controllers (one namespace each, `pairs`
/// queue pairs) whose host executor rings doorbells through a relay.
fn relay_rig(mode: ExecMode, controllers: usize, pairs: u32, opts: GioOptions) -> (Rig, Arc<HostExecutor>) {
    relay_rig_with(mode, controllers, pairs, opts, RelayConfig::default()).unwrap()
}

fn relay_rig_with(
    mode: ExecMode,
    controllers: usize,
    pairs: u32,
    opts: GioOptions,
    relay: RelayConfig,
) -> tutti_gio_uring::Result<(Rig, Arc<HostExecutor>)> {
    let mut emus = Vec::new();
    let mut ctrls = Vec::new();
    let mut drives = Vec::new();
    for c in 0..controllers {
        let cfg = EmulatedConfig {
            name: format!("relay{c}"),
            namespaces: vec![NamespaceConfig::with_bytes(16 << 20, 512)],
            ..EmulatedConfig::default()
        };
        let emu = EmulatedController::start(cfg).unwrap();
        let ctrl = Controller::new(emu.registers(), emu.dma_space(), ControllerOptions::default()).unwrap();
        drives.push(DriveQueues::create(&ctrl, 1, pairs, 32).unwrap());
        emus.push(emu);
        ctrls.push(ctrl);
    }
    let exec = Arc::new(HostExecutor::new(HostExecutorConfig {
        mode,
        blocks: 2,
        doorbells: DoorbellMode::Relay(relay),
        ..Default::default()
    })?);
    let ring = GioUring::init_with(opts, drives, exec.clone())?;
    Ok((Rig { ring, ctrls, emus }, exec))
}

fn opts() -> GioOptions {
    GioOptions { depth: 8, ..Default::default() }
}

fn rw(op: Op, drive: u16, m: usize, buf: &DmaBuffer) -> IoCtx {
    let sgl = SglDescriptor::data_block(buf.iova_at(m * CMD), CMD as u32);
    ioctx(op, drive, m as u64 * BLOCKS as u64, BLOCKS, DataRef::Sgl(sgl))
}

fn run(ring: &GioUring, ctxs: &[IoCtx]) -> IocbResult {
    let ids = ring.get_iocb(1).unwrap();
    ring.set_ioctxs(ids[0], ctxs).unwrap();
    ring.issue(&ids, 2).unwrap();
    ring.wait_cqe(&ids, Duration::from_secs(60)).unwrap().remove(0)
}

/// Writes one command and reads it back; only a relay that forwards lets it complete.
fn one_round_trip(rig: &Rig, seed: u64) {
    let src = rig.ctrls[0].dma().alloc(CMD).unwrap();
    let dst = rig.ctrls[0].dma().alloc(CMD).unwrap();
    fill(&src, seed);
    let r = run(&rig.ring, &[rw(Op::Write, 0, 0, &src)]);
    assert!(r.is_ok(), "write: {:?}", r.failures);
    let r = run(&rig.ring, &[rw(Op::Read, 0, 0, &dst)]);
    assert!(r.is_ok(), "read: {:?}", r.failures);
    assert_eq!(first_diff(&bytes(&src), &bytes(&dst)), None);
}

fn kernel_doorbell_writes(stats: &[QueueStats]) -> u64 {
    stats.iter().map(|s| s.sq_doorbells + s.cq_doorbells).sum()
}

/// Waits (bounded) until the kernels' doorbell counters reach `at_least`. A lane
/// counts its doorbell store after making it, and stores the CQ head after it
/// completed the commands, so both can trail the completions a wait returned.
fn kernel_doorbell_writes_reaching(ring: &GioUring, at_least: u64) -> Vec<QueueStats> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = ring.queue_stats().unwrap();
        if kernel_doorbell_writes(&stats) >= at_least || Instant::now() >= deadline {
            return stats;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Writes `n` commands per drive, reads them back into zeroed buffers and
/// checks every byte; then checks that the doorbells went through the relay.
fn round_trip(mode: ExecMode) {
    let (rig, exec) = relay_rig(mode, 2, 2, opts());
    assert!(exec.name().contains("doorbell relay"), "{}", exec.name());
    let relay = exec.relay().unwrap();
    assert_eq!(relay.stats().watched, 2 * 2 * 2, "two doorbells per queue pair");
    let n = 96;
    let src: Vec<DmaBuffer> = rig.ctrls.iter().map(|c| c.dma().alloc(n * CMD).unwrap()).collect();
    let dst: Vec<DmaBuffer> = rig.ctrls.iter().map(|c| c.dma().alloc(n * CMD).unwrap()).collect();
    for (d, b) in src.iter().enumerate() {
        fill(b, 40 + d as u64);
    }
    let all = |op: Op, bufs: &[DmaBuffer]| -> Vec<IoCtx> {
        (0..n)
            .flat_map(|m| (0..bufs.len()).map(move |d| (d, m)))
            .map(|(d, m)| rw(op, d as u16, m, &bufs[d]))
            .collect()
    };
    let r = run(&rig.ring, &all(Op::Write, &src));
    assert!(r.is_ok(), "writes: {:?}", r.failures.iter().take(4).map(|f| f.to_string()).collect::<Vec<_>>());
    let r = run(&rig.ring, &all(Op::Read, &dst));
    assert!(r.is_ok(), "reads: {:?}", r.failures.iter().take(4).map(|f| f.to_string()).collect::<Vec<_>>());
    for (d, (s, t)) in src.iter().zip(&dst).enumerate() {
        assert_eq!(first_diff(&bytes(s), &bytes(t)), None, "drive {d}: read back differs");
    }

    let rs = relay.stats();
    let stats = kernel_doorbell_writes_reaching(&rig.ring, rs.relayed);
    let written = kernel_doorbell_writes(&stats);
    // Every doorbell the controllers saw was written by the relay: the kernels stored only
    // into mailboxes (had they written the registers, the relay would have seen nothing).
    // The relay may merge several stores of one doorbell made between two of its passes.
    assert!(rs.relayed > 0, "the relay forwarded nothing: {rs:?}");
    assert!(rs.relayed <= written, "relayed {} > {written} doorbell stores by the kernels", rs.relayed);
    assert!(stats.iter().all(|s| s.sq_doorbells > 0 && s.cq_doorbells > 0), "{stats:?}");
    assert!(rs.running);
}

#[test]
fn launch_mode_round_trip_goes_through_the_relay() {
    round_trip(ExecMode::Launch);
}

#[test]
fn persistent_mode_round_trip_goes_through_the_relay() {
    round_trip(ExecMode::Persistent);
}

#[test]
fn a_stopped_relay_makes_commands_time_out_and_recovery_flushes_its_mailboxes() {
    let short = GioOptions {
        depth: 4,
        command_timeout: Duration::from_millis(300),
        submit_timeout: Duration::from_millis(900),
        ..Default::default()
    };
    let (rig, exec) = relay_rig(ExecMode::Launch, 1, 1, short);
    let relay = exec.relay().unwrap();
    let src = rig.ctrls[0].dma().alloc(4 * CMD).unwrap();
    let dst = rig.ctrls[0].dma().alloc(4 * CMD).unwrap();
    fill(&src, 7);
    let r = run(&rig.ring, &[rw(Op::Write, 0, 0, &src)]);
    assert!(r.is_ok(), "{:?}", r.failures);
    // The write's CQ head store may trail its completion: let it happen and be forwarded,
    // so that below only the tail of the next command is left in a mailbox.
    let stats = kernel_doorbell_writes_reaching(&rig.ring, 2);
    assert_eq!((stats[0].sq_doorbells, stats[0].cq_doorbells), (1, 1));
    relay.flush().unwrap();

    relay.stop().unwrap();
    assert!(!relay.stats().running);
    let relayed = relay.stats().relayed;
    // The kernel stores the tail into the mailbox; nobody forwards it: the command times
    // out with the executor's status (the wait does not hang).
    let r = run(&rig.ring, &[rw(Op::Read, 0, 0, &dst)]);
    assert_eq!(r.failures.len(), 1);
    assert_eq!(r.failures[0].status, IoStatus::CompletionTimeout);
    assert_eq!(relay.stats().relayed, relayed);
    assert!(bytes(&dst).iter().all(|b| *b == 0), "the controller saw a doorbell the relay did not write");

    // Recovery flushes the mailbox before it deletes the queue pair: the stale tail reaches
    // the old queue (whose deletion finishes or aborts the command, §5.6), never the
    // recreated one.
    rig.ring.recover_drive(0, Duration::from_secs(10)).unwrap();
    assert_eq!(relay.stats().relayed, relayed + 1, "recovery did not flush the pending tail");
    assert_eq!(relay.flush().unwrap(), 0);
}

#[test]
fn the_same_tail_after_a_queue_recovery_is_relayed() {
    // One queue pair: a command before and one after a recovery both store tail 1 and CQ
    // head 1. A relay that forwarded only changed values would lose the second.
    let (rig, exec) = relay_rig(ExecMode::Launch, 1, 1, opts());
    let src = rig.ctrls[0].dma().alloc(4 * CMD).unwrap();
    let dst = rig.ctrls[0].dma().alloc(4 * CMD).unwrap();
    fill(&src, 9);
    let r = run(&rig.ring, &[rw(Op::Write, 0, 0, &src)]);
    assert!(r.is_ok(), "{:?}", r.failures);
    rig.ring.recover_drive(0, Duration::from_secs(10)).unwrap();
    let r = run(&rig.ring, &[rw(Op::Read, 0, 0, &dst)]);
    assert!(r.is_ok(), "after recovery: {:?}", r.failures);
    assert_eq!(first_diff(&bytes(&src)[..CMD], &bytes(&dst)[..CMD]), None);
    assert!(exec.relay().unwrap().stats().relayed >= 2);
}

#[test]
fn dropping_the_ring_unwatches_every_doorbell_and_the_relay_stops() {
    let (rig, exec) = relay_rig(ExecMode::Persistent, 1, 2, opts());
    assert_eq!(exec.relay().unwrap().stats().watched, 4);
    one_round_trip(&rig, 11);
    drop(rig);
    let relay = exec.relay().unwrap();
    assert_eq!(relay.stats().watched, 0, "a mapping dropped with the ring left its doorbell watched");
    relay.stop().unwrap();
    relay.stop().unwrap();
    assert!(!relay.stats().running);
}

#[test]
fn a_relay_too_small_for_the_queues_is_refused_by_name() {
    let e = relay_rig_with(ExecMode::Launch, 1, 2, opts(), RelayConfig { capacity: 3, ..Default::default() })
        .err()
        .expect("four doorbells in three mailboxes");
    assert!(e.to_string().contains("all 3 mailboxes are in use"), "{e}");
    // Exactly enough mailboxes: two per queue pair.
    let (rig, exec) =
        relay_rig_with(ExecMode::Launch, 1, 2, opts(), RelayConfig { capacity: 4, ..Default::default() })
            .unwrap();
    one_round_trip(&rig, 12);
    assert_eq!(exec.relay().unwrap().stats().watched, 4);
}

#[test]
fn relayed_doorbells_wake_a_parked_emulated_controller() {
    let (rig, _exec) = relay_rig(ExecMode::Persistent, 1, 1, opts());
    one_round_trip(&rig, 7);
    for seed in 0..3 {
        // Idle: the controller parks on its register file's wake word.
        let deadline = Instant::now() + Duration::from_secs(10);
        let wake = rig.emus[0].register_file().wake();
        while wake.load(std::sync::atomic::Ordering::Acquire) != tutti_driver::transport::wake::WAKE_PARKED {
            assert!(Instant::now() < deadline, "the idle controller never parked");
            std::thread::sleep(Duration::from_micros(200));
        }
        let before = rig.emus[0].stats().woken;
        one_round_trip(&rig, seed);
        // The lanes store only into mailboxes: the relay's doorbell writes woke it.
        assert!(rig.emus[0].stats().woken > before, "the relay's doorbells did not wake the controller");
    }
}
