//! A write the host gave up on may still be executed by the drive ("late
//! DMA"). Its file must never be reused in this process, or the late write
//! would land in the next block stored there and a lookup would serve wrong
//! bytes as a hit. A write that failed with an NVMe status is over, so its
//! file is free again.
//!
//! The gio_uring path recovers the drive instead (its queue pairs are deleted
//! and created again, which completes or aborts every earlier command): the
//! outcome becomes known, and the file is freed as after an NVMe error. With
//! recovery turned off it quarantines. The direct path does the same with
//! its queue pairs (`IoQueuePair::recover`), and can turn recovery off too.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::time::{Duration, Instant};
use tutti_driver::spec::Status;
use tutti_emulator::{FaultAction, FaultMatch};
use tutti_objstore::{Backend, BlockHash, KvStore, LayoutKind, OpenMode, StoreOptions};

const WRITE: u8 = 0x01;
const READ: u8 = 0x02;
/// How long the host waits for a command (driver I/O timeout, gio_uring command timeout).
const TIMEOUT: Duration = Duration::from_millis(300);
/// How long after its fetch the delayed command executes: far past `TIMEOUT`, so
/// the host gives up first even on a loaded machine.
const LATE: Duration = Duration::from_secs(3);
const FILES: u32 = 4;

#[derive(Clone, Copy, Debug)]
enum Path {
    Gio,
    /// gio_uring without drive recovery.
    GioNoRecovery,
    Direct,
    /// The direct path without queue pair recovery.
    DirectNoRecovery,
}

fn store_options(path: Path, g: tutti_objstore::Geometry, mode: OpenMode) -> StoreOptions {
    let mut o = match path {
        Path::Gio | Path::GioNoRecovery => {
            let mut o = options(g, mode);
            if let Backend::Gio(gio) = &mut o.backend {
                gio.ring.command_timeout = TIMEOUT;
                gio.ring.submit_timeout = TIMEOUT * 4;
                gio.recover_drives = matches!(path, Path::Gio);
            }
            o
        }
        Path::Direct | Path::DirectNoRecovery => {
            let mut o = direct_options(g, mode);
            o.backend = Backend::Direct { queue_depth: 64, recover_queues: matches!(path, Path::Direct) };
            o
        }
    };
    o.pool.journal_pages = Some(2);
    o
}

/// One drive holding exactly [`FILES`] files, opened with short command timeouts.
fn pool(path: Path) -> (Drives, KvStore, Kv) {
    let g = geometry(2, 128);
    let bytes = 4096 * (1 + 2 * 2) + FILES as u64 * g.file_bytes();
    let d = Drives::start(&[DriveCfg::ram(512, bytes)]);
    let store = reopen(&d, path, OpenMode::Create);
    assert_eq!(store.stripe_map().files(), FILES);
    let kv = Kv::new(g, LayoutKind::Contiguous, FILES + 8);
    kv.register(&store, "model");
    (d, store, kv)
}

/// Brings the controllers up again (a reset, as in a new process) and opens the pool.
fn reopen(d: &Drives, path: Path, mode: OpenMode) -> KvStore {
    let g = geometry(2, 128);
    KvStore::open(d.specs_with(&[0], TIMEOUT), store_options(path, g, mode)).expect("store opens")
}

fn hash(seed: u64) -> BlockHash {
    BlockHash(seed as u128 * 7919 + 1)
}

/// The LBA range of object 0 of `file` (the first command of its layer 0 K slice).
fn first_object(store: &KvStore, file: u32) -> std::ops::Range<u64> {
    let at = store.stripe_map().locate(file, 0);
    at.lba..at.lba + 1
}

/// The drive executes its next `opcode` command on the first object of `file` only [`LATE`].
fn delay_first_object(d: &Drives, store: &KvStore, opcode: u8, file: u32) {
    let when =
        FaultMatch { opcode: Some(opcode), lba: Some(first_object(store, file)), ..Default::default() };
    d.emus[0].faults().delay_execution_next(when, LATE);
}

/// Waits (bounded) until the drive has executed `n` delayed commands.
fn wait_late_executions(d: &Drives, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while d.emus[0].stats().late_executions < n {
        assert!(Instant::now() < deadline, "the delayed command never executed");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Every stored seed is a hit that loads exactly its own bytes.
fn check_hits(store: &KvStore, kv: &Kv, seeds: &[u64]) {
    for &seed in seeds {
        let l = store.lookup(&[hash(seed)]).expect("lookup");
        assert_eq!(l.hits(), 1, "seed {seed} was stored and not evicted");
        kv.clear();
        let st = store.load_request(&l.files, &[FILES + 7], WAIT).expect("load");
        assert_eq!(st.failed, 0, "{st:?}");
        assert!(
            kv.holds(FILES + 7, seed),
            "the hit for seed {seed} (file {}) returned other bytes",
            l.files[0]
        );
        store.unpin(l.pin).expect("unpin");
    }
}

fn late_write_quarantines_its_file(path: Path) {
    let (d, store, kv) = pool(path);
    // The next store goes to the lowest free file, 0; its first write executes late.
    let victim = 0;
    delay_first_object(&d, &store, WRITE, victim);
    kv.fill(0, 1);
    let rep = store.store_request(&[hash(1)], &[0], WAIT).expect("store");
    assert_eq!(rep.stored, 0, "{rep:?}");
    assert!(rep.failed[0].1.contains("outcome"), "the failure says the outcome is unknown: {rep:?}");
    let s = store.stats();
    assert_eq!((s.quarantined_files, s.index.quarantined), (1, 1), "{s:?}");
    assert_eq!(d.emus[0].stats().late_executions, 0, "the write has not landed yet");

    // Fill the pool and go on storing: without the quarantine, seed 2 would go
    // to file 0 and later seeds would evict it.
    let mut seeds = Vec::new();
    for seed in 2..=7u64 {
        kv.fill(0, seed);
        let rep = store.store_request(&[hash(seed)], &[0], WAIT).expect("store");
        assert_eq!(rep.stored, 1, "{rep:?}");
        assert_ne!(rep.files[0], Some(victim), "seed {seed} was stored in the quarantined file");
        seeds.push(seed);
    }
    let s = store.stats();
    assert_eq!((s.index.quarantined, s.index.valid, s.index.free), (1, FILES - 1, 0), "{s:?}");
    assert!(s.index.evictions >= 3, "the pool was full and kept evicting around the quarantined file");

    // Now the abandoned write lands.
    wait_late_executions(&d, 1);
    let live = &seeds[seeds.len() - (FILES as usize - 1)..];
    check_hits(&store, &kv, live);
    assert_eq!(store.contains(&[hash(1)]).expect("contains"), 0, "the timed-out block is a miss");
    assert_eq!(store.stats().index.quarantined, 1);

    // A new process (the controller is reset at bring-up) finds the file free:
    // it was never journaled, and nothing can land in it any more.
    drop(store);
    let store = reopen(&d, path, OpenMode::Open);
    kv.register(&store, "model");
    let s = store.stats();
    assert_eq!((s.index.quarantined, s.index.free, s.quarantined_files), (0, 1, 0), "{s:?}");
    check_hits(&store, &kv, live);
    kv.fill(0, 100);
    let rep = store.store_request(&[hash(100)], &[0], WAIT).expect("store");
    assert_eq!(rep.files[0], Some(victim), "the file is in service again after a reset");
    check_hits(&store, &kv, &[100]);
}

#[test]
fn gio_without_recovery_late_write_quarantines_its_file() {
    late_write_quarantines_its_file(Path::GioNoRecovery);
}

#[test]
fn direct_without_recovery_late_write_quarantines_its_file() {
    late_write_quarantines_its_file(Path::DirectNoRecovery);
}

fn definite_failure_frees_its_file(path: Path) {
    let (d, store, kv) = pool(path);
    d.emus[0].faults().inject(
        FaultMatch { opcode: Some(WRITE), lba: Some(first_object(&store, 0)), ..Default::default() },
        FaultAction::Fail(Status::WRITE_FAULT),
        Some(1),
    );
    kv.fill(0, 1);
    let rep = store.store_request(&[hash(1)], &[0], WAIT).expect("store");
    assert_eq!(rep.stored, 0, "{rep:?}");
    assert!(!rep.failed[0].1.contains("outcome unknown"), "{rep:?}");
    let s = store.stats();
    assert_eq!((s.quarantined_files, s.index.quarantined, s.index.free), (0, 0, FILES), "{s:?}");
    kv.fill(0, 2);
    let rep = store.store_request(&[hash(2)], &[0], WAIT).expect("store");
    assert_eq!(rep.files[0], Some(0), "the file of a definitely failed write is reused");
    check_hits(&store, &kv, &[2]);
}

#[test]
fn gio_definite_failure_frees_its_file() {
    definite_failure_frees_its_file(Path::Gio);
}

#[test]
fn direct_definite_failure_frees_its_file() {
    definite_failure_frees_its_file(Path::Direct);
}

fn late_read_is_reported_unknown(path: Path) {
    let (d, store, kv) = pool(path);
    kv.fill(0, 5);
    let rep = store.store_request(&[hash(5)], &[0], WAIT).expect("store");
    assert_eq!(rep.stored, 1);
    let l = store.lookup(&[hash(5)]).expect("lookup");
    delay_first_object(&d, &store, READ, l.files[0]);
    kv.clear();
    let st = store.load_request(&l.files, &[3], WAIT).expect("load");
    assert!(st.block_failed(0) && st.block_outcome_unknown(0), "{st:?}");
    let why = st.first_error.clone().unwrap_or_default();
    assert!(why.contains("outcome unknown") && why.contains("engine block 3"), "{why}");
    // The late read does write the engine block after the job reported it failed.
    wait_late_executions(&d, 1);
    assert!(kv.layer_holds(3, 0, 0, 5), "the late read landed in engine block 3");
    // Reads leave the file as it was: still a hit.
    store.unpin(l.pin).expect("unpin");
    assert_eq!(store.stats().index.quarantined, 0);
    check_hits(&store, &kv, &[5]);
}

#[test]
fn gio_without_recovery_late_read_is_reported_unknown() {
    late_read_is_reported_unknown(Path::GioNoRecovery);
}

#[test]
fn direct_without_recovery_late_read_is_reported_unknown() {
    late_read_is_reported_unknown(Path::DirectNoRecovery);
}

/// Sleeps until a command delayed by [`LATE`] from now would have executed.
fn outlast_the_delay() {
    std::thread::sleep(LATE + Duration::from_secs(1));
}

#[test]
fn gio_late_write_is_aborted_by_recovery_and_its_file_reused() {
    late_write_is_aborted_by_recovery_and_its_file_reused(Path::Gio);
}

#[test]
fn direct_late_write_is_aborted_by_recovery_and_its_file_reused() {
    late_write_is_aborted_by_recovery_and_its_file_reused(Path::Direct);
}

fn late_write_is_aborted_by_recovery_and_its_file_reused(path: Path) {
    let (d, store, kv) = pool(path);
    let victim = 0;
    delay_first_object(&d, &store, WRITE, victim);
    kv.fill(0, 1);
    let rep = store.store_request(&[hash(1)], &[0], WAIT).expect("store");
    assert_eq!(rep.stored, 0, "{rep:?}");
    let why = &rep.failed[0].1;
    assert!(!why.contains("outcome"), "a failure of known outcome: {rep:?}");
    let s = store.stats();
    assert_eq!((s.recoveries, s.recovery_failures), (1, 0), "{s:?}");
    assert_eq!((s.quarantined_files, s.index.quarantined, s.index.free), (0, 0, FILES), "{s:?}");

    // The file is in service at once: the next store goes to it, and the pool fills.
    let seeds: Vec<u64> = (2..2 + FILES as u64).collect();
    for &seed in &seeds {
        kv.fill(0, seed);
        let rep = store.store_request(&[hash(seed)], &[0], WAIT).expect("store");
        assert_eq!(rep.stored, 1, "{rep:?}");
        if seed == 2 {
            assert_eq!(rep.files[0], Some(victim), "the recovered file is reused");
        }
    }
    assert_eq!(store.stats().index.valid, FILES);

    // Past the delay, the abandoned write would have landed in seed 2's file.
    outlast_the_delay();
    assert_eq!(d.emus[0].stats().late_executions, 0, "the recovery aborted the late write");
    check_hits(&store, &kv, &seeds);
    assert_eq!(store.contains(&[hash(1)]).expect("contains"), 0, "the failed block is a miss");
    let s = store.stats();
    assert_eq!((s.recoveries, s.quarantined_files), (1, 0), "{s:?}");
}

#[test]
fn gio_late_read_is_definite_after_recovery_and_never_lands() {
    late_read_is_definite_after_recovery_and_never_lands(Path::Gio);
}

#[test]
fn direct_late_read_is_definite_after_recovery_and_never_lands() {
    late_read_is_definite_after_recovery_and_never_lands(Path::Direct);
}

fn late_read_is_definite_after_recovery_and_never_lands(path: Path) {
    let (d, store, kv) = pool(path);
    kv.fill(0, 5);
    let rep = store.store_request(&[hash(5)], &[0], WAIT).expect("store");
    assert_eq!(rep.stored, 1);
    let l = store.lookup(&[hash(5)]).expect("lookup");
    delay_first_object(&d, &store, READ, l.files[0]);
    kv.clear();
    let st = store.load_request(&l.files, &[3], WAIT).expect("load");
    assert!(st.block_failed(0), "{st:?}");
    assert!(!st.block_outcome_unknown(0), "the recovery made the outcome known: {st:?}");
    let why = st.first_error.clone().unwrap_or_default();
    assert!(!why.contains("outcome unknown") && why.contains("recovered"), "{why}");
    assert_eq!(store.stats().recoveries, 1);

    outlast_the_delay();
    assert_eq!(d.emus[0].stats().late_executions, 0, "the recovery aborted the late read");
    assert!(!kv.layer_holds(3, 0, 0, 5), "nothing landed in engine block 3 after the job failed");
    store.unpin(l.pin).expect("unpin");
    check_hits(&store, &kv, &[5]);
}

#[test]
fn gio_failed_recovery_keeps_the_quarantine() {
    let (d, store, kv) = pool(Path::Gio);
    // The controller stops answering, admin commands included: the writes
    // time out, and so does deleting the queues to recover the drive.
    d.emus[0].set_fatal();
    kv.fill(0, 1);
    let rep = store.store_request(&[hash(1)], &[0], WAIT).expect("store");
    assert_eq!(rep.stored, 0, "{rep:?}");
    assert!(rep.failed[0].1.contains("outcome"), "the outcome stays unknown: {rep:?}");
    let s = store.stats();
    assert_eq!((s.recoveries, s.recovery_failures), (0, 1), "{s:?}");
    assert_eq!((s.quarantined_files, s.index.quarantined), (1, 1), "{s:?}");

    // The drive's queues stay closed: the next store is refused before it
    // reaches the drive, a known outcome that quarantines nothing more.
    kv.fill(0, 2);
    let rep = store.store_request(&[hash(2)], &[0], WAIT).expect("store");
    assert_eq!(rep.stored, 0, "{rep:?}");
    assert!(!rep.failed[0].1.contains("outcome"), "{rep:?}");
    let s = store.stats();
    assert_eq!((s.quarantined_files, s.recovery_failures), (1, 1), "{s:?}");
}
