//! A runtime's life through the ABI: reopening file media, eviction and
//! pins, the CPU-driven executor, concurrent callers, closing with jobs
//! alive, and the profiler hooks producing a slack table.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::ffi::CString;
use std::ptr::null_mut;
use tutti::*;

fn stats(rt: &Rt) -> tutti_stats_t {
    // SAFETY: a zeroed stats struct with its size set; a live handle.
    unsafe {
        let mut s: tutti_stats_t = std::mem::zeroed();
        s.struct_size = std::mem::size_of::<tutti_stats_t>() as u32;
        ok(tutti_get_stats(rt.0, &mut s));
        s
    }
}

#[test]
fn file_media_keep_the_pool_across_runtimes() {
    let dir = std::env::temp_dir().join(format!("tutti-capi-reopen-{}", std::process::id()));
    let cdir = CString::new(dir.to_str().unwrap()).unwrap();
    let mut cfg = config();
    cfg.emulated_dir = cdir.as_ptr();
    let keys = hashes(3, 31);
    let expected: Vec<u8> = {
        let rt = Rt::open(&cfg);
        let mut mem = register_filled(&rt, 4, 0);
        let rep = store_all(&rt, &keys, &[0, 1, 2]);
        assert_eq!(rep.stored, 3);
        let copy = mem.bytes().to_vec();
        // SAFETY: a live handle; the registration goes before `mem`.
        unsafe { ok(tutti_unregister_kv(rt.0)) };
        copy
    };
    cfg.open_mode = TUTTI_OPEN_EXISTING;
    let rt = Rt::open(&cfg);
    let mut mem = register_filled(&rt, 4, 0);
    mem.bytes().fill(0);
    assert_eq!(lookup(&rt, &keys, 0).0, 3, "the chunks survived the runtime");
    let st = load_all(&rt, &keys, &[0, 1, 2]);
    assert_eq!(st.failed, 0);
    let per = 2 * 4 * OBJ;
    for l in 0..LAYERS as usize {
        for kv in 0..2 {
            for b in 0..3 {
                let o = l * per + kv * 4 * OBJ + b * OBJ;
                assert!(mem.bytes()[o..o + OBJ] == expected[o..o + OBJ], "layer {l} kv {kv} block {b}");
            }
        }
    }
    // SAFETY: a live handle; the registration goes before `mem`.
    unsafe { ok(tutti_unregister_kv(rt.0)) };
    drop(rt);
    cfg.open_mode = TUTTI_OPEN_EXISTING;
    cfg.geometry.head_dim = 128;
    let mut out = null_mut();
    // SAFETY: valid config and out pointer.
    let code = unsafe { tutti_runtime_open(&cfg, &mut out) };
    assert_eq!(code, TUTTI_E_POOL, "another geometry: {} {}", name(code), last_error());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_full_pool_evicts_unpinned_chunks_only() {
    let mut cfg = config();
    cfg.emulated_capacity_bytes = 4 << 20;
    cfg.executor = TUTTI_EXECUTOR_DIRECT;
    let rt = Rt::open(&cfg);
    let _mem = register_filled(&rt, 8, 0);
    let files = stats(&rt).files;
    let pinned = hashes(8, 1000);
    store_all(&rt, &pinned, &(0..8).collect::<Vec<_>>());
    let (hits, pin) = lookup(&rt, &pinned, TUTTI_LOOKUP_PIN);
    assert_eq!(hits, 8);
    let first = hashes(8, 2000);
    store_all(&rt, &first, &(0..8).collect::<Vec<_>>());
    for batch in 0..files / 8 + 1 {
        let keys = hashes(8, 3000 + batch);
        let rep = store_all(&rt, &keys, &(0..8).collect::<Vec<_>>());
        assert_eq!((rep.stored, rep.failed), (8, 0), "batch {batch}");
    }
    let s = stats(&rt);
    assert!(s.evictions >= 8, "{files} files, {} evictions", s.evictions);
    assert_eq!(s.files_pinned, 8);
    assert_eq!(lookup(&rt, &pinned, 0).0, 8, "pinned chunks stay");
    assert!(lookup(&rt, &first, 0).0 < 8, "the oldest unpinned chunks were evicted");
    // SAFETY: a live handle.
    unsafe { ok(tutti_unpin(rt.0, pin)) };
    assert_eq!(stats(&rt).files_pinned, 0);
    // SAFETY: a live handle; the registration goes before the memory.
    unsafe { ok(tutti_unregister_kv(rt.0)) };
}

#[test]
fn concurrent_callers_share_one_runtime() {
    let rt = Rt::open(&config());
    let _mem = register_filled(&rt, 8, 0);
    let handle = rt.0 as usize;
    std::thread::scope(|s| {
        for t in 0..2u32 {
            s.spawn(move || {
                let rt = Rt(handle as *mut tutti_runtime_t);
                let blocks = [t * 4, t * 4 + 1, t * 4 + 2, t * 4 + 3];
                for round in 0..5 {
                    let keys = hashes(4, t * 100 + round);
                    let rep = store_all(&rt, &keys, &blocks);
                    assert_eq!(rep.failed, 0);
                    let st = load_all(&rt, &keys, &blocks);
                    assert_eq!((st.done, st.failed), (1, 0));
                    assert_eq!(last_error(), "");
                }
                std::mem::forget(rt); // the main thread closes it
            });
        }
    });
    let s = stats(&rt);
    assert_eq!(s.files_committed, 40);
    assert_eq!(s.bytes_loaded, 40 * LAYERS as u64 * 2 * OBJ as u64);
    // SAFETY: a live handle; the registration goes before the memory.
    unsafe { ok(tutti_unregister_kv(rt.0)) };
}

#[test]
fn jobs_outlive_a_closed_runtime_handle() {
    let rt = Rt::open(&config());
    let mem = register_filled(&rt, 4, 0);
    let keys = hashes(2, 55);
    store_all(&rt, &keys, &[0, 1]);
    let mut job = null_mut();
    let mut st = status();
    // SAFETY: live handles; `mem` outlives the job, which keeps the runtime alive.
    unsafe {
        ok(tutti_submit_load(rt.0, keys.as_ptr(), [2u32, 3].as_ptr(), 2, 0, LAYERS, &mut job));
        ok(tutti_runtime_close(rt.0));
        ok(tutti_job_wait(job, WAIT_MS, &mut st));
        assert_eq!((st.done, st.failed), (1, 0));
        ok(tutti_job_destroy(job));
    }
    drop(mem);
    std::mem::forget(rt);
}

#[test]
fn profile_hooks_build_a_slack_table() {
    let rt = Rt::open(&config());
    let path = std::env::temp_dir().join(format!("tutti-capi-slack-{}.json", std::process::id()));
    let cpath = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a live handle and NUL-terminated strings throughout.
    unsafe {
        expect(tutti_profile_request_begin(rt.0, 1, 0, 0), TUTTI_E_PROFILE, "at least one token");
        expect(
            tutti_profile_save_slack_table(rt.0, cpath.as_ptr(), c"m".as_ptr(), c"cpu".as_ptr(), 4, 1.0),
            TUTTI_E_PROFILE,
            "layer 0",
        );
        expect(
            tutti_profile_save_slack_table(rt.0, cpath.as_ptr(), std::ptr::null(), c"cpu".as_ptr(), 4, 1.0),
            TUTTI_E_INVALID_ARG,
            "no KV memory is registered",
        );
        expect(
            tutti_profile_save_slack_table(rt.0, std::ptr::null(), c"m".as_ptr(), c"cpu".as_ptr(), 4, 1.0),
            TUTTI_E_NULL_POINTER,
            "path is NULL",
        );
        // Layer times from the engine's own clock: fixed + per token + attention.
        let mut id = 10;
        for n in [128u32, 512, 2048, 8192] {
            for p in [0u32, 1024, 4096] {
                id += 1;
                ok(tutti_profile_request_begin(rt.0, id, n, p));
                let attn = n as u64 * p as u64 + n as u64 * (n as u64 + 1) / 2;
                for l in 0..LAYERS {
                    let t = 20_000 + 300 * n as u64 + attn / 50 + l as u64;
                    ok(tutti_profile_layer(rt.0, id, l, 1_000, 1_000 + t));
                }
                ok(tutti_profile_decode_step(rt.0, id, n + p, 5_000, 5_000 + 10_000 + 3 * (n + p) as u64));
            }
        }
        expect(tutti_profile_layer(rt.0, 11, 0, 0, 5), TUTTI_E_PROFILE, "recorded twice");
        expect(tutti_profile_layer(rt.0, 11, 0, 10, 5), TUTTI_E_PROFILE, "before it starts");
        expect(tutti_profile_request_begin(rt.0, 11, 5, 0), TUTTI_E_PROFILE, "began twice");
        // The start/end hooks time a layer with the library's clock.
        ok(tutti_profile_request_begin(rt.0, 1, 64, 0));
        ok(tutti_profile_layer_start(rt.0, 1, 2));
        expect(tutti_profile_layer_start(rt.0, 1, 2), TUTTI_E_INVALID_ARG, "started twice");
        ok(tutti_profile_layer_end(rt.0, 1, 2));
        expect(tutti_profile_layer_end(rt.0, 1, 2), TUTTI_E_INVALID_ARG, "without a start");
        expect(
            tutti_profile_save_slack_table(rt.0, cpath.as_ptr(), c"m".as_ptr(), c"cpu".as_ptr(), 0, 1.0),
            TUTTI_E_PROFILE,
            "SMs",
        );
        ok(tutti_profile_save_slack_table(rt.0, cpath.as_ptr(), c"m".as_ptr(), c"cpu".as_ptr(), 4, 1.0));
    }
    let identity = tutti_scheduler::Identity { model: "m".into(), gpu: "cpu".into(), layers: LAYERS };
    let table = tutti_scheduler::SlackTable::load(&path, &identity).expect("the saved table loads");
    let big = table.lookup(tutti_scheduler::RequestShape::new(8192, 4096), 0).unwrap();
    let small = table.lookup(tutti_scheduler::RequestShape::new(128, 0), 0).unwrap();
    assert!(big.window_ns > small.window_ns, "longer prefills leave more slack: {big:?} {small:?}");
    let _ = std::fs::remove_file(&path);
}

#[test]
fn the_profiler_is_bounded() {
    let rt = Rt::open(&config());
    // SAFETY: a live handle.
    unsafe {
        for id in 0..TUTTI_MAX_PROFILED_REQUESTS {
            ok(tutti_profile_request_begin(rt.0, id, 16, 0));
        }
        expect(tutti_profile_request_begin(rt.0, u64::MAX, 16, 0), TUTTI_E_PROFILE, "save the slack table");
        expect(tutti_profile_layer_start(rt.0, 7, LAYERS), TUTTI_E_INVALID_ARG, "the model has 4 layers");
        for r in 0..MAX_OPEN {
            ok(tutti_profile_layer_start(rt.0, r, 0));
        }
        expect(tutti_profile_layer_start(rt.0, MAX_OPEN, 0), TUTTI_E_INVALID_ARG, "never ended");
    }
}

const MAX_OPEN: u64 = 1 << 16;
