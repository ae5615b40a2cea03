//! The scheduler in the runtime's job path (ABI 1.6): every load and store layer asks it;
//! per-drive arbitration, writes deferred out of windows without slack and drained by decode
//! steps, the bounded backlog, a crash with deferred writes pending, and the policy off (and
//! saying so) when the engine gives no timings. Invariants are checked from the scheduler's
//! recorded decisions and counters, never from durations.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::collections::HashMap;
use std::ffi::CString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::ptr::{null, null_mut};
use tutti::*;
use tutti_scheduler::buckets::Axis;
use tutti_scheduler::{Event, IoKind, SlackEntry, SlackTable, TableGrid};

const BLOCKS: u32 = 8;
/// Set in the child of the crash test: the directory of its media.
const CRASH_ENV: &str = "TUTTI_TEST_SCHED_CRASH_DIR";

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tutti-capi-sched-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A slack table for the test geometry: every prefill layer has `prefill_ns` of slack, every
/// decode step `decode_ns`, each with a generous IOCB cap.
fn table(dir: &Path, prefill_ns: u64, decode_ns: u64) -> CString {
    let grid = TableGrid {
        input: Axis::new(vec![1, 1_000_000]).unwrap(),
        prefix: Axis::new(vec![0, 1_000_000]).unwrap(),
        decode_context: Axis::new(vec![0, 1_000_000]).unwrap(),
    };
    let p = SlackEntry { window_ns: prefill_ns, sm_budget: 4, max_iocbs: 1 << 20 };
    let d = SlackEntry { window_ns: decode_ns, sm_budget: 4, max_iocbs: 1 << 20 };
    let id = tutti_scheduler::Identity { model: "test-model".into(), gpu: "none".into(), layers: LAYERS };
    let t = SlackTable::from_fn(id, "test", grid, |_, _, _| p, |_| d).unwrap();
    let path = dir.join("slack.json");
    t.save(&path).unwrap();
    CString::new(path.to_str().unwrap()).unwrap()
}

fn sched_config(mode: u32, table: Option<&CString>) -> tutti_sched_config_t {
    tutti_sched_config_t {
        mode,
        slack_table: table.map_or(null(), |t| t.as_ptr()),
        // An engine that announced a window and then went quiet is not idle within a test.
        idle_ms: 60_000,
        ..Default::default()
    }
}

fn configure(rt: &Rt, c: &tutti_sched_config_t) {
    // SAFETY: a live handle and a valid config.
    ok(unsafe { tutti_sched_configure(rt.0, c) });
}

fn stats(rt: &Rt) -> tutti_sched_stats_t {
    let mut s = tutti_sched_stats_t {
        struct_size: std::mem::size_of::<tutti_sched_stats_t>() as u32,
        ..Default::default()
    };
    // SAFETY: a live handle and a sized struct.
    ok(unsafe { tutti_sched_stats(rt.0, &mut s) });
    s
}

/// One prefill layer window with no slack for writes (the table's prefill entries are tiny).
fn announce_layer(rt: &Rt) {
    // SAFETY: a live handle.
    unsafe {
        ok(tutti_sched_layer_start(rt.0, 512, 512, 0));
        ok(tutti_sched_layer_end(rt.0, 0));
    }
}

/// Begins a store of `blocks` under `keys` and submits every layer; returns (session, job).
fn store_submit(rt: &Rt, keys: &[tutti_hash_t], blocks: &[u32]) -> (*mut tutti_store_t, *mut tutti_job_t) {
    let mut st = null_mut();
    let mut job = null_mut();
    // SAFETY: valid handles and buffers.
    unsafe {
        ok(tutti_store_begin(rt.0, keys.as_ptr(), blocks.as_ptr(), keys.len(), &mut st));
        ok(tutti_store_submit(st, 0, LAYERS, &mut job));
    }
    (st, job)
}

fn poll(job: *mut tutti_job_t) -> tutti_job_status_t {
    let mut s = status();
    // SAFETY: a live job handle and a sized status.
    let rc = unsafe { tutti_job_poll(job, &mut s) };
    assert!(rc == TUTTI_OK || rc == TUTTI_IN_PROGRESS, "{}: {}", name(rc), last_error());
    s
}

fn report() -> tutti_store_report_t {
    tutti_store_report_t::default()
}

fn hits(rt: &Rt, keys: &[tutti_hash_t]) -> usize {
    let mut n = 0usize;
    // SAFETY: valid buffers; no pin.
    ok(unsafe { tutti_lookup(rt.0, keys.as_ptr(), keys.len(), 0, &mut n, null_mut()) });
    n
}

/// The recorded decisions keep the invariants: no drive ever has a read and a write in flight
/// together, and no write starts on a drive between a read's readiness and its start there.
/// Returns (reads, writes) started.
fn check_invariants(events: &[Event]) -> (usize, usize) {
    let mut in_flight: HashMap<usize, (i64, i64)> = HashMap::new();
    let mut running: HashMap<(u64, u32), (IoKind, Vec<usize>)> = HashMap::new();
    let mut ready: HashMap<(u64, u32), Vec<usize>> = HashMap::new();
    let (mut reads, mut writes) = (0, 0);
    for e in events {
        match e {
            Event::Ready { job, layer, drives, .. } => {
                ready.insert((*job, *layer), drives.clone());
            }
            Event::Issue { job, layer, kind, drives, .. } => {
                for &d in drives {
                    let c = in_flight.entry(d).or_default();
                    match kind {
                        IoKind::Read => c.0 += 1,
                        IoKind::Write => {
                            c.1 += 1;
                            assert!(
                                !ready.iter().any(|(k, ds)| ds.contains(&d) && k.0 != *job),
                                "a write started on drive {d} while a read there was ready: {e:?}"
                            );
                        }
                    }
                    assert!(c.0 == 0 || c.1 == 0, "drive {d} has reads and writes in flight: {e:?}");
                }
                match kind {
                    IoKind::Read => {
                        reads += 1;
                        ready.remove(&(*job, *layer));
                    }
                    IoKind::Write => writes += 1,
                }
                running.insert((*job, *layer), (*kind, drives.clone()));
            }
            Event::Complete { job, layer, .. } => {
                if let Some((kind, ds)) = running.remove(&(*job, *layer)) {
                    for d in ds {
                        let c = in_flight.entry(d).or_default();
                        match kind {
                            IoKind::Read => c.0 -= 1,
                            IoKind::Write => c.1 -= 1,
                        }
                    }
                }
            }
            Event::Release { .. } | Event::Accept { .. } => {}
        }
    }
    (reads, writes)
}

/// Slow emulated drives (the bandwidth model), so that layers overlap.
fn slow_config() -> tutti_runtime_config_t {
    let mut cfg = config();
    cfg.emulated_read_bytes_per_sec = 20_000_000;
    cfg.emulated_write_bytes_per_sec = 10_000_000;
    cfg
}

#[test]
fn loads_and_stores_in_flight_together_never_share_a_drive() {
    let rt = Rt::open(&slow_config());
    let mem = register_filled(&rt, BLOCKS, 3);
    let old = hashes(4, 1);
    let rep = store_all(&rt, &old, &[0, 1, 2, 3]);
    assert_eq!(rep.stored, 4);
    sched_record(rt.0, true).unwrap();
    // A load of the stored blocks and a store of new ones, in flight together, twice over.
    for round in 0..2u32 {
        let mut load = null_mut();
        // SAFETY: valid handles and buffers.
        unsafe {
            ok(tutti_submit_load(rt.0, old.as_ptr(), [4u32, 5, 6, 7].as_ptr(), 4, 0, LAYERS, &mut load))
        };
        let new = hashes(4, 100 + round);
        let (st, job) = store_submit(&rt, &new, &[0, 1, 2, 3]);
        // SAFETY: live handles.
        unsafe {
            ok(tutti_job_wait(load, WAIT_MS, null_mut()));
            ok(tutti_job_wait(job, WAIT_MS, null_mut()));
            let mut r = report();
            ok(tutti_store_commit(st, &mut r));
            assert_eq!(r.stored, 4);
            ok(tutti_job_destroy(load));
            ok(tutti_job_destroy(job));
            ok(tutti_store_destroy(st));
        }
        assert_eq!(hits(&rt, &new), 4);
    }
    let events = sched_record(rt.0, false).unwrap();
    let (reads, writes) = check_invariants(&events);
    // Every layer of every job went through the scheduler.
    assert_eq!((reads, writes), (2 * LAYERS as usize, 2 * LAYERS as usize));
    let s = stats(&rt);
    assert_eq!(s.mode, TUTTI_SCHED_ARBITRATE);
    assert_eq!(s.mixed_issues, 0);
    assert!(s.write_waits_for_reads > 0, "the stores were held behind the loads: {s:?}");
    assert_eq!(s.backlog_bytes, 0, "every store's bytes left the backlog");
    drop(mem);
}

#[test]
fn deferred_writes_wait_for_a_decode_step_and_are_misses_until_durable() {
    let dir = temp_dir("defer");
    // No write fits a prefill layer's 1 ns window; a decode step has a second.
    let t = table(&dir, 1, 1_000_000_000);
    let rt = Rt::open(&config());
    let mut mem = register_filled(&rt, BLOCKS, 7);
    configure(&rt, &sched_config(TUTTI_SCHED_SLACK, Some(&t)));
    announce_layer(&rt);
    let keys = hashes(3, 9);
    let (st, job) = store_submit(&rt, &keys, &[1, 2, 3]);
    let s = poll(job);
    assert_eq!((s.done, s.layers_done), (0, 0), "the store waits for slack");
    let sched = stats(&rt);
    assert_eq!((sched.slack_active, sched.policy_off), (1, TUTTI_SCHED_POLICY_ON));
    assert!(sched.write_waits_for_slack > 0);
    assert_eq!(sched.writes_issued, 0);
    // Not durable: the commit is refused and the blocks are misses.
    let mut r = report();
    // SAFETY: a live store handle.
    expect(unsafe { tutti_store_commit(st, &mut r) }, TUTTI_E_BUSY, "");
    assert_eq!(hits(&rt, &keys), 0);
    // A decode step drains the backlog.
    // SAFETY: a live handle.
    unsafe { ok(tutti_sched_decode_start(rt.0, 2048)) };
    // SAFETY: live handles.
    unsafe {
        ok(tutti_job_wait(job, WAIT_MS, null_mut()));
        ok(tutti_sched_decode_end(rt.0));
        ok(tutti_store_commit(st, &mut r));
    }
    assert_eq!((r.stored, r.failed), (3, 0));
    let sched = stats(&rt);
    assert_eq!(sched.writes_issued, LAYERS as u64);
    assert!(sched.writes_in_decode >= 1, "{sched:?}");
    assert_eq!(sched.backlog_bytes, 0);
    // Durable and served with the right bytes.
    let want: Vec<Vec<u8>> = (1..4).map(|b| block_bytes(&mut mem, b, BLOCKS)).collect();
    let st2 = load_all(&rt, &keys, &[5, 6, 7]);
    assert_eq!(st2.failed, 0);
    for (i, b) in (5..8).enumerate() {
        assert!(block_bytes(&mut mem, b, BLOCKS) == want[i], "block {b}");
    }
    // SAFETY: live handles.
    unsafe {
        ok(tutti_job_destroy(job));
        ok(tutti_store_destroy(st));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_policy_is_off_without_timings_and_says_so() {
    let dir = temp_dir("off");
    let t = table(&dir, 1, 1);
    let rt = Rt::open(&config());
    let _mem = register_filled(&rt, BLOCKS, 1);
    configure(&rt, &sched_config(TUTTI_SCHED_SLACK, Some(&t)));
    let s = stats(&rt);
    assert_eq!(
        (s.mode, s.slack_active, s.policy_off),
        (TUTTI_SCHED_SLACK, 0, TUTTI_SCHED_POLICY_OFF_NO_TIMINGS)
    );
    // With no timings, a store is not held for slack (the table would allow none).
    let keys = hashes(2, 5);
    let (st, job) = store_submit(&rt, &keys, &[0, 1]);
    // SAFETY: live handles.
    unsafe {
        ok(tutti_job_wait(job, WAIT_MS, null_mut()));
        let mut r = report();
        ok(tutti_store_commit(st, &mut r));
        assert_eq!(r.stored, 2);
        ok(tutti_job_destroy(job));
        ok(tutti_store_destroy(st));
    }
    let s = stats(&rt);
    assert_eq!((s.writes_issued, s.write_waits_for_slack), (LAYERS as u64, 0));
    // The default mode arbitrates only, and says that is why writes are not held.
    let rt2 = Rt::open(&config());
    let s = stats(&rt2);
    assert_eq!(
        (s.mode, s.slack_active, s.policy_off),
        (TUTTI_SCHED_ARBITRATE, 0, TUTTI_SCHED_POLICY_OFF_MODE)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_backlog_bound_refuses_or_drops_stores_and_counts_them() {
    let dir = temp_dir("backlog");
    let t = table(&dir, 1, 1);
    // One store of 2 blocks holds 2 blocks × LAYERS × K,V objects.
    let two_blocks = 2 * LAYERS as u64 * 2 * OBJ as u64;
    for drop_mode in [false, true] {
        let rt = Rt::open(&config());
        let _mem = register_filled(&rt, BLOCKS, 2);
        let mut c = sched_config(TUTTI_SCHED_SLACK, Some(&t));
        c.backlog_bytes = two_blocks + two_blocks / 2;
        c.backlog_full = if drop_mode { TUTTI_BACKLOG_DROP } else { TUTTI_BACKLOG_BACKPRESSURE };
        configure(&rt, &c);
        announce_layer(&rt);
        let a = hashes(2, 20);
        let (st_a, job_a) = store_submit(&rt, &a, &[0, 1]);
        assert_eq!(poll(job_a).done, 0, "deferred: no slack");
        let b = hashes(2, 21);
        let mut st_b = null_mut();
        let mut job_b = null_mut();
        // SAFETY: valid handles and buffers.
        unsafe { ok(tutti_store_begin(rt.0, b.as_ptr(), [2u32, 3].as_ptr(), 2, &mut st_b)) };
        // SAFETY: a live store handle.
        let rc = unsafe { tutti_store_submit(st_b, 0, LAYERS, &mut job_b) };
        let msg = last_error();
        let s = stats(&rt);
        assert!(s.backlog_peak_bytes <= s.backlog_capacity, "{s:?}");
        assert_eq!(s.backlog_bytes, two_blocks);
        if drop_mode {
            ok(rc);
            let jb = poll(job_b);
            assert_eq!((jb.done, jb.failed), (1, 2));
            let mut buf = [0u8; 256];
            // SAFETY: a live job and a buffer of the given size.
            ok(unsafe { tutti_job_error(job_b, buf.as_mut_ptr().cast(), buf.len(), null_mut()) });
            assert!(String::from_utf8_lossy(&buf).contains("dropped"));
            assert_eq!((s.stores_dropped, s.bytes_dropped, s.stores_refused), (1, two_blocks, 0));
            let mut r = report();
            // SAFETY: live handles.
            unsafe {
                ok(tutti_store_commit(st_b, &mut r));
                ok(tutti_job_destroy(job_b));
            }
            assert_eq!((r.stored, r.failed), (0, 2), "a dropped store stores nothing");
            assert_eq!(hits(&rt, &b), 0);
        } else {
            assert_eq!(rc, TUTTI_E_BUSY, "{msg}");
            assert!(msg.contains("write backlog full"), "{msg}");
            assert!(job_b.is_null());
            assert_eq!((s.stores_refused, s.stores_dropped), (1, 0));
        }
        // The deferred store is still written when the engine blocks on it (urgent).
        // SAFETY: live handles.
        unsafe {
            ok(tutti_job_wait(job_a, WAIT_MS, null_mut()));
            let mut r = report();
            ok(tutti_store_commit(st_a, &mut r));
            assert_eq!(r.stored, 2);
            ok(tutti_job_destroy(job_a));
            ok(tutti_store_destroy(st_a));
            ok(tutti_store_destroy(st_b));
        }
        assert_eq!(stats(&rt).backlog_bytes, 0);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn configuration_is_checked_before_anything_changes() {
    let dir = temp_dir("cfg");
    let rt = Rt::open(&config());
    let bad = |c: tutti_sched_config_t, needle: &str| {
        // SAFETY: a live handle and a config whose pointers are valid or NULL.
        expect(unsafe { tutti_sched_configure(rt.0, &c) }, TUTTI_E_INVALID_ARG, needle);
    };
    bad(sched_config(0, None), "mode");
    bad(sched_config(TUTTI_SCHED_SLACK, None), "slack_table");
    let mut c = sched_config(TUTTI_SCHED_ARBITRATE, None);
    c.write_guard = 1.5;
    bad(c, "write_guard");
    let mut c = sched_config(TUTTI_SCHED_ARBITRATE, None);
    c.backlog_full = 9;
    bad(c, "backlog_full");
    // A table for another layer count.
    let grid = TableGrid {
        input: Axis::new(vec![1, 10]).unwrap(),
        prefix: Axis::new(vec![0, 10]).unwrap(),
        decode_context: Axis::new(vec![0, 10]).unwrap(),
    };
    let e = SlackEntry { window_ns: 1, sm_budget: 1, max_iocbs: 1 };
    let id = tutti_scheduler::Identity { model: "m".into(), gpu: "g".into(), layers: LAYERS + 1 };
    let path = dir.join("other.json");
    SlackTable::from_fn(id, "t", grid, |_, _, _| e, |_| e).unwrap().save(&path).unwrap();
    let p = CString::new(path.to_str().unwrap()).unwrap();
    bad(sched_config(TUTTI_SCHED_SLACK, Some(&p)), "layers");
    // SAFETY: a live handle; layer out of range.
    expect(unsafe { tutti_sched_layer_start(rt.0, 1, 0, LAYERS) }, TUTTI_E_INVALID_ARG, "layer");
    // Nothing changed.
    assert_eq!(stats(&rt).mode, TUTTI_SCHED_ARBITRATE);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The child of the crash test: stores set A (committed), then set B deferred for lack of
/// slack, reports, and aborts with B's writes pending.
fn crash_child(dir: &Path) {
    let t = table(dir, 1, 1);
    let cdir = CString::new(dir.join("media").to_str().unwrap()).unwrap();
    let mut cfg = config();
    cfg.emulated_dir = cdir.as_ptr();
    let rt = Rt::open(&cfg);
    let _mem = register_filled(&rt, BLOCKS, 0x40);
    let a = hashes(2, 30);
    assert_eq!(store_all(&rt, &a, &[0, 1]).stored, 2);
    configure(&rt, &sched_config(TUTTI_SCHED_SLACK, Some(&t)));
    announce_layer(&rt);
    // B comes from blocks filled with other bytes than A's.
    let b = hashes(2, 31);
    let (_st, job) = store_submit(&rt, &b, &[4, 5]);
    let s = poll(job);
    let sched = stats(&rt);
    println!(
        "crash-child layers_done={} writes_issued={} backlog={}",
        s.layers_done, sched.writes_issued, sched.backlog_bytes
    );
    std::process::abort();
}

#[test]
fn a_crash_with_deferred_writes_pending_serves_no_wrong_bytes() {
    if let Some(dir) = std::env::var_os(CRASH_ENV) {
        crash_child(Path::new(&dir));
        return;
    }
    let dir = temp_dir("crash");
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "a_crash_with_deferred_writes_pending_serves_no_wrong_bytes", "--nocapture"])
        .env(CRASH_ENV, &dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(!out.status.success(), "the child aborts");
    let line = BufReader::new(&out.stdout[..])
        .lines()
        .map_while(Result::ok)
        .find(|l| l.starts_with("crash-child"))
        .expect("the child reported before aborting");
    // B's writes were deferred when the process died: nothing of it reached the drives.
    assert!(line.contains("layers_done=0 writes_issued=0"), "{line}");
    assert!(!line.contains("backlog=0"), "{line}");

    let cdir = CString::new(dir.join("media").to_str().unwrap()).unwrap();
    let mut cfg = config();
    cfg.emulated_dir = cdir.as_ptr();
    cfg.open_mode = TUTTI_OPEN_EXISTING;
    let rt = Rt::open(&cfg);
    let mut mem = Mem::new(2 * BLOCKS as usize * OBJ * LAYERS as usize);
    register_per_layer(&rt, &mem, BLOCKS);
    let a = hashes(2, 30);
    let b = hashes(2, 31);
    assert_eq!(hits(&rt, &a), 2, "the committed store survived");
    assert_eq!(hits(&rt, &b), 0, "the deferred store is a miss");
    // A loads with exactly the bytes the child stored (its blocks 0 and 1 of seed 0x40).
    let mut src = Mem::new(mem.len);
    for (i, x) in src.bytes().iter_mut().enumerate() {
        *x = ((i % 251) as u8).wrapping_add(0x40);
    }
    let st = load_all(&rt, &a, &[6, 7]);
    assert_eq!(st.failed, 0);
    for (from, to) in [(0, 6), (1, 7)] {
        assert!(block_bytes(&mut mem, to, BLOCKS) == block_bytes(&mut src, from, BLOCKS), "block {to}");
    }
    // SAFETY: a live handle.
    unsafe { ok(tutti_unregister_kv(rt.0)) };
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_client_of_tuttid_schedules_its_loads_and_stores_too() {
    let (daemon, dir) = start_daemon("sched");
    let socket = CString::new(daemon.socket().to_str().unwrap()).unwrap();
    let name = CString::new("engine").unwrap();
    let mut rt = null_mut();
    // SAFETY: a valid config and out pointer.
    ok(unsafe { tutti_runtime_connect(&client_config(&socket, &name), &mut rt) });
    let rt = Rt(rt);
    let _mem = register_filled(&rt, BLOCKS, 4);
    sched_record(rt.0, true).unwrap();
    let keys = hashes(2, 40);
    assert_eq!(store_all(&rt, &keys, &[0, 1]).stored, 2);
    assert_eq!(load_all(&rt, &keys, &[2, 3]).failed, 0);
    let (reads, writes) = check_invariants(&sched_record(rt.0, false).unwrap());
    assert_eq!((reads, writes), (LAYERS as usize, LAYERS as usize));
    let s = stats(&rt);
    assert_eq!((s.reads_issued, s.writes_issued, s.mixed_issues), (LAYERS as u64, LAYERS as u64, 0));
    // SAFETY: a live handle.
    unsafe { ok(tutti_unregister_kv(rt.0)) };
    drop(rt);
    drop(daemon);
    let _ = std::fs::remove_dir_all(dir);
}
