//! A tuttid SIGKILLed under a 32-layer store written layer by layer (one job per layer, as an
//! engine's `save_kv_layer` does), seen through the C ABI: the first call after the kill learns
//! that tuttid is gone and marks the runtime disconnected; every later call, and the wait of
//! every job in flight, fails at once with an error naming tuttid, all within one control
//! deadline of the kill; no drive is recovered, blamed or quarantined for it; the handles are
//! destroyed and the runtime closed within the command deadline. The daemon is this test
//! binary run again with `TUTTI_TEST_DEAD_DAEMON` set.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../tests/support/reap.rs"]
mod reap;

mod common;

use common::{expect, hashes, last_error, ok, Mem, Rt};
use std::ffi::CString;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::ptr::null_mut;
use std::time::{Duration, Instant};
use tutti::*;

/// Set in the daemon child: its directory.
const ROLE: &str = "TUTTI_TEST_DEAD_DAEMON";
const LAYERS: u32 = 32;
const BLOCKS: u32 = 4;
/// One K or V object: 16 tokens × 2 heads × 64 dims × bf16.
const OBJ: usize = 16 * 2 * 64 * 2;
/// The client's deadline of each request to tuttid, and of each NVMe command.
const CONTROL_MS: u32 = 10_000;
const IO_MS: u32 = 2_000;

fn geometry() -> tutti_geometry_t {
    tutti_geometry_t { layers: LAYERS, ..common::geometry() }
}

/// The daemon child: 2 emulated drives whose every command takes 300 ms (within the client's
/// 2 s command deadline), so that layers submitted just before the kill are on the drives.
fn daemon_role(dir: &str) {
    let cost =
        tutti_driver::emulated::CostModel { per_command: Duration::from_millis(300), ..Default::default() };
    let _d = common::daemon_in(std::path::Path::new(dir), LAYERS, 32 << 20, cost);
    println!("READY");
    // Killed by the test; bounded in case it is not.
    std::thread::sleep(Duration::from_secs(120));
}

/// Registers `mem` as vLLM per-layer KV of `BLOCKS` blocks over `LAYERS` layers.
fn register(rt: &Rt, mem: &Mem) {
    let per_layer = 2 * BLOCKS as u64 * OBJ as u64;
    let bases: Vec<u64> = (0..LAYERS as u64).map(|l| mem.addr() + l * per_layer).collect();
    let mut l = common::layout(TUTTI_LAYOUT_VLLM_PER_LAYER, BLOCKS);
    l.num_layers = LAYERS;
    l.k_bases = bases.as_ptr();
    // SAFETY: `mem` holds every object of the layout and outlives the registration.
    ok(unsafe { tutti_register_kv(rt.0, &l, null_mut()) });
}

fn stats(rt: &Rt) -> tutti_stats_t {
    let mut s =
        tutti_stats_t { struct_size: std::mem::size_of::<tutti_stats_t>() as u32, ..Default::default() };
    // SAFETY: a live handle and a full-size struct.
    ok(unsafe { tutti_get_stats(rt.0, &mut s) });
    s
}

/// The call failed as a dead tuttid makes it fail: an I/O error naming tuttid, gone.
#[track_caller]
fn tuttid_gone(code: i32, call: &str) {
    let msg = last_error();
    expect(code, TUTTI_E_IO, "tuttid");
    assert!(msg.contains("gone"), "{call}: {msg}");
    for blame in ["recovery of drive", "quarantine", "queues stay closed"] {
        assert!(!msg.contains(blame), "{call} blames a drive: {msg}");
    }
}

#[test]
fn a_daemon_killed_under_a_32_layer_store_fails_every_call_within_one_deadline_naming_tuttid() {
    if let Ok(dir) = std::env::var(ROLE) {
        daemon_role(&dir);
        return;
    }
    let dir = std::env::temp_dir().join(format!("tutti-dead-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut daemon = reap::Reap(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "a_daemon_killed_under_a_32_layer_store_fails_every_call_within_one_deadline_naming_tuttid",
            ])
            .args(["--nocapture", "--test-threads=1"])
            .env(ROLE, &dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let out = BufReader::new(daemon.stdout.take().unwrap());
    assert!(
        out.lines().map_while(Result::ok).any(|l| l.trim_end().ends_with("READY")),
        "tuttid did not start"
    );

    let socket = CString::new(dir.join("tuttid.sock").to_str().unwrap()).unwrap();
    let name = CString::new("layer-by-layer").unwrap();
    let mut cfg = common::client_config(&socket, &name);
    cfg.geometry = geometry();
    cfg.control_timeout_ms = CONTROL_MS;
    cfg.io_timeout_ms = IO_MS;
    let mut rt = null_mut();
    // SAFETY: a valid config and out pointer.
    ok(unsafe { tutti_runtime_connect(&cfg, &mut rt) });
    let rt = Rt(rt);
    let mut mem = Mem::new(2 * BLOCKS as usize * OBJ * LAYERS as usize);
    for (i, b) in mem.bytes().iter_mut().enumerate() {
        *b = (i % 253) as u8;
    }
    register(&rt, &mem);
    let keys = hashes(BLOCKS as usize, 77);
    let blocks: Vec<u32> = (0..BLOCKS).collect();
    let mut store = null_mut();
    // SAFETY: valid handles and buffers.
    ok(unsafe { tutti_store_begin(rt.0, keys.as_ptr(), blocks.as_ptr(), BLOCKS as usize, &mut store) });
    // Layers go out one job each. The first is written: the daemon is serving; the next seven
    // are on the drives (each command takes 300 ms there) when it is killed.
    let mut jobs = Vec::new();
    for layer in 0..8 {
        let mut job = null_mut();
        // SAFETY: a live store handle.
        ok(unsafe { tutti_store_submit(store, layer, 1, &mut job) });
        jobs.push(job);
        if layer == 0 {
            // SAFETY: a live job handle.
            ok(unsafe { tutti_job_wait(job, 30_000, null_mut()) });
        }
    }

    daemon.kill().unwrap(); // SIGKILL, with layers on its (emulated) drives
    daemon.wait().unwrap();
    let killed = Instant::now();
    // The waits of the jobs in flight: each fails at once, the first one learning it.
    for (layer, &job) in jobs.iter().enumerate().skip(1) {
        let t = Instant::now();
        // SAFETY: a live job handle.
        let code = unsafe { tutti_job_wait(job, 60_000, null_mut()) };
        tuttid_gone(code, &format!("the wait of layer {layer}"));
        assert!(t.elapsed() < Duration::from_millis(CONTROL_MS as u64), "layer {layer}: {:?}", t.elapsed());
    }
    // The layers the engine goes on to write, the commit, and every other call.
    for layer in 8..LAYERS {
        let mut job = null_mut();
        // SAFETY: a live store handle.
        let code = unsafe { tutti_store_submit(store, layer, 1, &mut job) };
        tuttid_gone(code, &format!("the submission of layer {layer}"));
        assert!(job.is_null());
    }
    let mut rep = tutti_store_report_t::default();
    // SAFETY: a live store handle and a full-size report.
    tuttid_gone(unsafe { tutti_store_commit(store, &mut rep) }, "the commit");
    let (mut hits, mut pin) = (0usize, 0u64);
    // SAFETY: valid buffers and a live handle.
    let code =
        unsafe { tutti_lookup(rt.0, keys.as_ptr(), keys.len(), TUTTI_LOOKUP_PIN, &mut hits, &mut pin) };
    tuttid_gone(code, "a lookup");
    let to = [0u32];
    let mut load = null_mut();
    // SAFETY: valid buffers and a live handle.
    let code = unsafe { tutti_submit_load(rt.0, keys.as_ptr(), to.as_ptr(), 1, 0, LAYERS, &mut load) };
    tuttid_gone(code, "a load");
    // SAFETY: valid buffers and a live handle.
    let code = unsafe { tutti_store_begin(rt.0, keys.as_ptr(), blocks.as_ptr(), 1, &mut null_mut()) };
    tuttid_gone(code, "a new store");
    let all = killed.elapsed();
    assert!(all < Duration::from_millis(CONTROL_MS as u64), "every call failed within one deadline: {all:?}");

    // What happened to the layers that were on the drives says so too, once their commands
    // ended (at their deadline: the emulated drives died with the daemon), naming no drive.
    let deadline = Instant::now() + Duration::from_secs(30);
    for (layer, &job) in jobs.iter().enumerate().skip(1) {
        let why = loop {
            let mut buf = vec![0u8; 4096];
            let mut needed = 0usize;
            // SAFETY: a live job handle and a buffer of the size given.
            ok(unsafe { tutti_job_error(job, buf.as_mut_ptr().cast(), buf.len(), &mut needed) });
            let why = String::from_utf8_lossy(&buf[..needed.saturating_sub(1)]).into_owned();
            if !why.is_empty() {
                break why;
            }
            assert!(Instant::now() < deadline, "layer {layer} never ended");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(why.contains("tuttid") && why.contains("gone"), "layer {layer}: {why}");
        for blame in ["recovery of drive", "quarantine", "queues stay closed"] {
            assert!(!why.contains(blame), "layer {layer} blames a drive: {why}");
        }
    }

    // Cleanup works: each job waits (bounded by its commands' deadline) for what was on the
    // drives, then goes; no drive was recovered or quarantined for the daemon's death.
    let t = Instant::now();
    for job in jobs {
        // SAFETY: a live job handle, destroyed once.
        ok(unsafe { tutti_job_destroy(job) });
    }
    // SAFETY: a live store handle, destroyed once.
    ok(unsafe { tutti_store_destroy(store) });
    let s = stats(&rt);
    assert_eq!(s.quarantined_files, 0, "{s:?}");
    // SAFETY: a live runtime.
    ok(unsafe { tutti_unregister_kv(rt.0) });
    drop(rt);
    assert!(
        t.elapsed() < Duration::from_millis(CONTROL_MS as u64 + 3 * IO_MS as u64),
        "cleanup took {:?}",
        t.elapsed()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
