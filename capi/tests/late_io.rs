//! Commands of unknown outcome through the ABI (1.2): an emulated drive
//! executes a command only after the host gave up on it
//! (`tutti_emulated_delay_next` past `io_timeout_ms`).
//!
//! - direct executor: a late write fails its store block and quarantines its
//!   file, so no later lookup serves the bytes it lands; a late read fails
//!   its load block with an unknown outcome, and the drive does write that
//!   engine block afterwards.
//! - gio_uring: the drive is recovered (its queue pairs deleted and created
//!   again, which aborts the late command), so the block fails with a known
//!   outcome, the file stays in service and nothing lands later.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::ptr::null_mut;
use std::time::{Duration, Instant};
use tutti::*;

const BLOCKS: u32 = 8;
/// The host's deadline per NVMe command.
const IO_TIMEOUT_MS: u32 = 300;
/// How long after its fetch the delayed command executes: far past the
/// deadline, so the host gives up first even on a loaded machine.
const LATE_MS: u32 = 4000;
const FILE: usize = 2 * LAYERS as usize * OBJ;

/// One small emulated drive with short command deadlines, and `BLOCKS`
/// engine blocks of host memory in the contiguous layout.
struct Late {
    rt: Rt,
    mem: Mem,
}

impl Late {
    fn new(executor: u32) -> Late {
        let mut cfg = config();
        cfg.emulated_count = 1;
        cfg.emulated_capacity_bytes = 4 << 20;
        cfg.io_timeout_ms = IO_TIMEOUT_MS;
        cfg.executor = executor;
        let rt = Rt::open(&cfg);
        let mem = Mem::new(BLOCKS as usize * FILE);
        let mut l = layout(TUTTI_LAYOUT_CONTIGUOUS, BLOCKS);
        l.base = mem.addr();
        // SAFETY: `mem` outlives the runtime (see `Drop`).
        ok(unsafe { tutti_register_kv(rt.0, &l, null_mut()) });
        Late { rt, mem }
    }

    fn files(&self) -> u32 {
        // SAFETY: all-integer struct.
        let mut info: tutti_runtime_info_t = unsafe { std::mem::zeroed() };
        info.struct_size = std::mem::size_of::<tutti_runtime_info_t>() as u32;
        // SAFETY: a live handle and a full-size struct.
        ok(unsafe { tutti_runtime_info(self.rt.0, &mut info) });
        info.files
    }

    fn stats(&self) -> tutti_stats_t {
        let mut s =
            tutti_stats_t { struct_size: std::mem::size_of::<tutti_stats_t>() as u32, ..Default::default() };
        // SAFETY: a live handle and a full-size struct.
        ok(unsafe { tutti_get_stats(self.rt.0, &mut s) });
        s
    }

    /// The bytes of a block holding chunk `seed`: every 8-byte word names the seed, its object and itself.
    fn word(seed: u32, obj: usize, i: usize) -> u64 {
        (seed as u64) << 40 | (obj as u64) << 24 | i as u64
    }

    fn block(&mut self, b: u32) -> &mut [u8] {
        let o = b as usize * FILE;
        &mut self.mem.bytes()[o..o + FILE]
    }

    fn fill(&mut self, b: u32, seed: u32) {
        for (i, w) in self.block(b).chunks_exact_mut(8).enumerate() {
            w.copy_from_slice(&Late::word(seed, i * 8 / OBJ, i).to_le_bytes());
        }
    }

    fn holds(&mut self, b: u32, seed: u32) -> bool {
        self.block(b)
            .chunks_exact(8)
            .enumerate()
            .all(|(i, w)| w == Late::word(seed, i * 8 / OBJ, i).to_le_bytes())
    }

    /// Runs one job to its end with both bitmaps attached; returns the status,
    /// failed and unknown words, and the job's error text.
    ///
    /// # Safety
    /// `job` is a live job handle, destroyed here.
    unsafe fn finish(job: *mut tutti_job_t) -> (tutti_job_status_t, u64, u64, String) {
        let (mut failed, mut unknown) = ([0u64; 1], [0u64; 1]);
        let mut st = status();
        st.failed_bitmap = failed.as_mut_ptr();
        st.failed_bitmap_words = 1;
        st.unknown_bitmap = unknown.as_mut_ptr();
        st.unknown_bitmap_words = 1;
        let mut msg = [0u8; 512];
        // SAFETY: forwarded; the buffers outlive the calls.
        unsafe {
            ok(tutti_job_wait(job, WAIT_MS, &mut st));
            ok(tutti_job_error(job, msg.as_mut_ptr() as *mut _, msg.len(), null_mut()));
            ok(tutti_job_destroy(job));
        }
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        (st, failed[0], unknown[0], String::from_utf8_lossy(&msg[..end]).into_owned())
    }
}

impl Drop for Late {
    fn drop(&mut self) {
        // Closing stops the emulated drive, and with it any command still due,
        // before `mem` is freed.
        // SAFETY: a live handle.
        unsafe { tutti_runtime_close(self.rt.0) };
    }
}

/// Whether the executor recovers a drive after a command of unknown outcome.
fn recovers(executor: u32) -> bool {
    executor != TUTTI_EXECUTOR_DIRECT
}

fn late_write_never_lands_in_a_served_file(executor: u32) {
    let recovers = recovers(executor);
    let quarantined = u64::from(!recovers);
    let mut t = Late::new(executor);
    let files = t.files();
    assert!(files > 2 * BLOCKS && files < 1024, "a small pool: {files} files");
    let rt = t.rt.0;

    // Chunk 0's write executes long after the host gave up on it.
    let victim = hashes(1, 0xdead);
    t.fill(0, 0);
    let start = Instant::now();
    // SAFETY: live handles and valid buffers throughout.
    let (st, failed, unknown, why, rep) = unsafe {
        ok(tutti_emulated_delay_next(rt, 0, TUTTI_DIR_STORE, LATE_MS));
        let mut store = null_mut();
        let mut job = null_mut();
        ok(tutti_store_begin(rt, victim.as_ptr(), [0u32].as_ptr(), 1, &mut store));
        ok(tutti_store_submit(store, 0, LAYERS, &mut job));
        let (st, failed, unknown, why) = Late::finish(job);
        let mut rep: tutti_store_report_t = std::mem::zeroed();
        rep.struct_size = std::mem::size_of::<tutti_store_report_t>() as u32;
        ok(tutti_store_commit(store, &mut rep));
        ok(tutti_store_destroy(store));
        (st, failed, unknown, why, rep)
    };
    let unknown_expected = u32::from(!recovers);
    assert_eq!(
        (st.failed, st.unknown, failed, unknown),
        (1, unknown_expected, 1, u64::from(unknown_expected)),
        "{st:?}"
    );
    assert_eq!(why.contains("outcome unknown"), !recovers, "{why}");
    assert_eq!((rep.stored, rep.failed), (0, 1));
    let s = t.stats();
    let serving = files - quarantined as u32;
    assert_eq!((s.quarantined_files, s.files_free, s.files_valid), (quarantined, serving, 0), "{s:?}");

    // Fill every file still in service. Without the quarantine (or, on
    // gio_uring, the recovery that aborted it) the late write would land in
    // one of these chunks.
    let mut batches = Vec::new();
    let mut total = 0;
    while total < serving {
        let n = BLOCKS.min(serving - total);
        let keys = hashes(n as usize, batches.len() as u32);
        for b in 0..n {
            t.fill(b, 1 + total + b);
        }
        let blocks: Vec<u32> = (0..n).collect();
        let rep = store_all(&t.rt, &keys, &blocks);
        assert_eq!((rep.stored, rep.failed), (n, 0), "batch {}", batches.len());
        batches.push((keys, 1 + total));
        total += n;
    }
    let s = t.stats();
    assert_eq!((s.quarantined_files, s.files_free, s.files_valid), (quarantined, 0, serving), "{s:?}");
    assert!(
        start.elapsed() < Duration::from_millis(LATE_MS as u64),
        "the pool filled only after the late write was due ({:?}): the test would prove nothing",
        start.elapsed()
    );

    // The late write lands now; every chunk still loads exactly its own bytes.
    std::thread::sleep(Duration::from_millis(LATE_MS as u64 + 1000).saturating_sub(start.elapsed()));
    let mut checked = 0;
    for (keys, first) in &batches {
        let n = keys.len() as u32;
        t.mem.bytes().fill(0);
        let blocks: Vec<u32> = (0..n).collect();
        let st = load_all(&t.rt, keys, &blocks);
        assert_eq!((st.failed, st.unknown), (0, 0), "nothing was evicted: {st:?}");
        for b in 0..n {
            assert!(t.holds(b, first + b), "chunk {} came back with other bytes", first + b);
            checked += 1;
        }
    }
    assert_eq!(checked, serving);
    let mut hits = usize::MAX;
    // SAFETY: a live handle and valid buffers.
    ok(unsafe { tutti_lookup(rt, victim.as_ptr(), 1, 0, &mut hits, null_mut()) });
    assert_eq!(hits, 0, "the chunk whose write timed out is a miss");
    assert_eq!(t.stats().quarantined_files, quarantined);
}

#[test]
fn gio_late_write_is_aborted_by_recovery() {
    late_write_never_lands_in_a_served_file(TUTTI_EXECUTOR_GIO_HOST);
}

#[test]
fn direct_late_write_quarantines_its_file() {
    late_write_never_lands_in_a_served_file(TUTTI_EXECUTOR_DIRECT);
}

fn late_read_fails_its_block(executor: u32) {
    let recovers = recovers(executor);
    let mut t = Late::new(executor);
    let rt = t.rt.0;
    let keys = hashes(2, 0xbeef);
    t.fill(0, 50);
    t.fill(1, 51);
    assert_eq!(store_all(&t.rt, &keys, &[0, 1]).stored, 2);
    t.mem.bytes().fill(0);
    let start = Instant::now();
    // SAFETY: live handles and valid buffers.
    let (st, failed, unknown, why) = unsafe {
        ok(tutti_emulated_delay_next(rt, 0, TUTTI_DIR_LOAD, LATE_MS));
        let mut job = null_mut();
        ok(tutti_submit_load(rt, keys.as_ptr(), [2u32, 3].as_ptr(), 2, 0, LAYERS, &mut job));
        Late::finish(job)
    };
    assert_eq!((st.failed, st.unknown), (1, u32::from(!recovers)), "{st:?}");
    let bad = failed.trailing_zeros();
    assert!(bad < 2, "{failed:#b}");
    if recovers {
        assert_eq!(unknown, 0, "the recovery made the outcome known");
        assert!(why.contains("recovered"), "{why}");
    } else {
        assert_eq!(failed, unknown, "the one failure is the unknown one");
        assert!(why.contains("outcome unknown") && why.contains("engine block"), "{why}");
    }
    assert!(t.holds(3 - bad, 51 - bad), "the other block loaded");
    assert!(!t.holds(2 + bad, 50 + bad), "the late read has not landed yet");
    let s = t.stats();
    assert_eq!((s.quarantined_files, s.failed_blocks), (0, 1), "reads quarantine nothing: {s:?}");

    // Without a recovery the drive does write the engine block after its job
    // reported it failed: why an engine must not reuse that block's memory
    // before a reset. The recovery aborted the read: nothing lands.
    std::thread::sleep(Duration::from_millis(LATE_MS as u64 + 1000).saturating_sub(start.elapsed()));
    assert_eq!(
        t.holds(2 + bad, 50 + bad),
        !recovers,
        "the late read landed in engine block {} (expected only without a recovery)",
        2 + bad
    );
    // The chunk itself is intact: still a hit that loads its bytes.
    t.mem.bytes().fill(0);
    let st = load_all(&t.rt, &keys, &[4, 5]);
    assert_eq!((st.failed, st.unknown), (0, 0), "{st:?}");
    assert!(t.holds(4, 50) && t.holds(5, 51));
}

#[test]
fn gio_late_read_is_definite_after_recovery() {
    late_read_fails_its_block(TUTTI_EXECUTOR_GIO_HOST);
}

#[test]
fn direct_late_read_is_reported_unknown() {
    late_read_fails_its_block(TUTTI_EXECUTOR_DIRECT);
}

#[test]
fn delay_injection_validates_its_arguments() {
    let t = Late::new(TUTTI_EXECUTOR_GIO_HOST);
    let rt = t.rt.0;
    // SAFETY: a live handle or NULL (detected).
    unsafe {
        expect(tutti_emulated_delay_next(rt, 1, TUTTI_DIR_LOAD, 10), TUTTI_E_INVALID_ARG, "not one of the 1");
        expect(tutti_emulated_delay_next(rt, 0, 0, 10), TUTTI_E_INVALID_ARG, "direction");
        expect(tutti_emulated_delay_next(rt, 0, TUTTI_DIR_LOAD, 0), TUTTI_E_INVALID_ARG, "delay_ms");
        expect(
            tutti_emulated_delay_next(rt, 0, TUTTI_DIR_LOAD, TUTTI_MAX_EMULATED_DELAY_MS + 1),
            TUTTI_E_INVALID_ARG,
            "delay_ms",
        );
        expect(tutti_emulated_delay_next(null_mut(), 0, TUTTI_DIR_LOAD, 10), TUTTI_E_NULL_POINTER, "NULL");
    }
}
