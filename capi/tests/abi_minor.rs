//! ABI 1 minor versions: a caller built against ABI 1.0 passes the smaller
//! `tutti_stats_t` / `tutti_job_status_t` and gets exactly its fields; a 1.1
//! caller gets the host-work counters but not the 1.2 fields (quarantined
//! files, unknown-outcome blocks); and `failed_blocks` counts every block a
//! job reports failed once.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::mem::{offset_of, size_of};
use std::ptr::null_mut;
use tutti::*;

const BLOCKS: u32 = 4;
/// Bytes past the end of an ABI-1.0 struct that the library must not touch.
const SENTINEL: u8 = 0xA5;
const STATS_V0: usize = 136;
const STATUS_V0: usize = 64;
const STATS_V1: usize = 184;
const STATUS_V1: usize = 120;

/// A runtime with `BLOCKS` engine blocks registered (vLLM per-layer layout), and their memory.
fn kv(executor: u32) -> (Rt, Mem) {
    let mut cfg = config();
    cfg.executor = executor;
    let rt = Rt::open(&cfg);
    let per = 2 * BLOCKS as usize * OBJ;
    let mem = Mem::new(per * LAYERS as usize);
    let k: Vec<u64> = (0..LAYERS as u64).map(|l| mem.addr() + l * per as u64).collect();
    let mut l = layout(TUTTI_LAYOUT_VLLM_PER_LAYER, BLOCKS);
    l.num_layers = LAYERS;
    l.k_bases = k.as_ptr();
    // SAFETY: `mem` is returned after the runtime, so a caller holding the pair
    // drops (closes) the runtime, and with it the registration, before the memory.
    unsafe { ok(tutti_register_kv(rt.0, &l, null_mut())) };
    (rt, mem)
}

fn stats(rt: &Rt) -> tutti_stats_t {
    let mut s = tutti_stats_t { struct_size: size_of::<tutti_stats_t>() as u32, ..Default::default() };
    // SAFETY: a live handle and a full-size struct.
    unsafe { ok(tutti_get_stats(rt.0, &mut s)) };
    s
}

#[test]
fn versions_and_sizes_of_each_minor() {
    assert_eq!((tutti_abi_version(), tutti_abi_minor()), (1, 11));
    assert_eq!((TUTTI_ABI_VERSION, TUTTI_ABI_MINOR), (1, 11));
    // Each minor's structs end where the next one's fields begin.
    assert_eq!(offset_of!(tutti_stats_t, host_calls), STATS_V0);
    assert_eq!(offset_of!(tutti_job_status_t, host_calls), STATUS_V0);
    assert_eq!(offset_of!(tutti_stats_t, quarantined_files), STATS_V1);
    assert_eq!(offset_of!(tutti_job_status_t, unknown), STATUS_V1);
    // 1.11 appended the reconnect counters to the stats (1.2's ended after quarantined_files).
    assert_eq!(offset_of!(tutti_stats_t, reconnects), 192);
    assert_eq!((size_of::<tutti_stats_t>(), size_of::<tutti_job_status_t>()), (224, 136));
    // 1.4 appended the CUDA executor and staging fields to the runtime config,
    // after the 1.3 struct's tail padding (now `rsvd0`).
    assert_eq!(offset_of!(tutti_runtime_config_t, rsvd0), 84);
    assert_eq!(offset_of!(tutti_runtime_config_t, cuda_device), 88);
    // 1.5 appended the emulated drives' bandwidth and latency model.
    assert_eq!(offset_of!(tutti_runtime_config_t, emulated_read_bytes_per_sec), 112);
    assert_eq!(offset_of!(tutti_runtime_config_t, emulated_mixed_efficiency), 144);
    // 1.8 appended the executor mode.
    assert_eq!(offset_of!(tutti_runtime_config_t, exec_mode), 160);
    assert_eq!(size_of::<tutti_runtime_config_t>(), 168);
    // 1.6 added the scheduler's own structs (no struct of an earlier minor changed).
    assert_eq!(size_of::<tutti_sched_config_t>(), 72);
    // 1.7 appended the cross-process arbitration counters to the scheduler's stats.
    assert_eq!(offset_of!(tutti_sched_stats_t, xproc_active), 16 + 18 * 8);
    assert_eq!(size_of::<tutti_sched_stats_t>(), 16 + 22 * 8);
    // 1.8 appended the executor mode, the CUDA executor's and the staging fields to the
    // client config (1.3's ended after the geometry).
    assert_eq!(offset_of!(tutti_client_config_t, exec_mode), 56);
    assert_eq!(offset_of!(tutti_client_config_t, cuda_driver), 72);
    // 1.10 appended the P2P provider to the data path.
    assert_eq!(offset_of!(tutti_data_path_t, p2p_provider), 304);
    assert_eq!(size_of::<tutti_data_path_t>(), 368);
    // 1.11 appended the reconnect fields (1.8's ended after `rsvd0`).
    assert_eq!(offset_of!(tutti_client_config_t, reconnect), 88);
    assert_eq!(size_of::<tutti_client_config_t>(), 104);
}

#[test]
fn sizes_between_versions_are_refused() {
    let (rt, _mem) = kv(TUTTI_EXECUTOR_GIO_HOST);
    let mut buf = [0u64; 32];
    for size in [0u32, 4, 8, STATS_V0 as u32 - 8, STATS_V0 as u32 + 8, STATS_V1 as u32 + 4, 200] {
        buf[0] = size as u64; // struct_size is the first u32 (little endian)
                              // SAFETY: a live handle; `buf` is 256 writable, aligned bytes.
        let code = unsafe { tutti_get_stats(rt.0, buf.as_mut_ptr() as *mut tutti_stats_t) };
        expect(code, TUTTI_E_STRUCT_SIZE, "expects 136 or 184 or 192 or 224");
    }
}

#[test]
fn an_abi_1_0_caller_gets_exactly_its_fields() {
    let (rt, _mem) = kv(TUTTI_EXECUTOR_GIO_HOST);
    let keys = hashes(2, 70);
    store_all(&rt, &keys, &[0, 1]);

    // Stats: the 1.0 fields are filled, the bytes after them are left alone.
    let mut stats_v0 = [0u64; size_of::<tutti_stats_t>() / 8];
    let p = stats_v0.as_mut_ptr() as *mut u8;
    // SAFETY: a live handle; `stats_v0` is an aligned 184-byte buffer whose first
    // 136 bytes are a 1.0 `tutti_stats_t`; fields are read at their offsets.
    let (jobs, bytes_stored, stores_open, tail) = unsafe {
        std::ptr::write_bytes(p.add(STATS_V0), SENTINEL, size_of::<tutti_stats_t>() - STATS_V0);
        std::ptr::write(p as *mut u32, STATS_V0 as u32);
        ok(tutti_get_stats(rt.0, p as *mut tutti_stats_t));
        (
            std::ptr::read(p.add(offset_of!(tutti_stats_t, jobs)) as *const u64),
            std::ptr::read(p.add(offset_of!(tutti_stats_t, bytes_stored)) as *const u64),
            std::ptr::read(p.add(offset_of!(tutti_stats_t, stores_open)) as *const u64),
            std::slice::from_raw_parts(p.add(STATS_V0), size_of::<tutti_stats_t>() - STATS_V0).to_vec(),
        )
    };
    assert!(tail.iter().all(|&b| b == SENTINEL), "bytes past struct_size were written");
    let full = stats(&rt);
    assert_eq!((jobs, bytes_stored, stores_open), (full.jobs, full.bytes_stored, 0));
    assert!(jobs == 1 && bytes_stored > 0);

    // Job status: the 1.0 inputs (the bitmap) are honoured; the 1.1 inputs,
    // which a 1.0 caller does not have, are never read: the sentinel bytes
    // where `layer_submit_ns` would be are not a pointer the library follows.
    let mut st = [0u64; size_of::<tutti_job_status_t>() / 8];
    let mut words = [u64::MAX; 1];
    let mut job = null_mut();
    // SAFETY: live handles; `st` is an aligned buffer larger than 64 bytes whose
    // first 64 are a 1.0 status with a one-word bitmap.
    unsafe {
        let p = st.as_mut_ptr() as *mut u8;
        std::ptr::write_bytes(p.add(STATUS_V0), SENTINEL, size_of::<tutti_job_status_t>() - STATUS_V0);
        let v0 = p as *mut tutti_job_status_t;
        std::ptr::write(p as *mut u32, STATUS_V0 as u32);
        std::ptr::write(p.add(offset_of!(tutti_job_status_t, failed_bitmap_words)) as *mut u32, 1);
        std::ptr::write(
            p.add(offset_of!(tutti_job_status_t, failed_bitmap)) as *mut *mut u64,
            words.as_mut_ptr(),
        );
        ok(tutti_submit_load(rt.0, hashes(3, 70).as_ptr(), [2u32, 3, 1].as_ptr(), 3, 0, LAYERS, &mut job));
        ok(tutti_job_wait(job, WAIT_MS, v0));
        ok(tutti_job_poll(job, v0));
        ok(tutti_job_destroy(job));
        let done = std::ptr::read(p.add(offset_of!(tutti_job_status_t, done)) as *const u32);
        let failed = std::ptr::read(p.add(offset_of!(tutti_job_status_t, failed)) as *const u32);
        let commands = std::ptr::read(p.add(offset_of!(tutti_job_status_t, commands)) as *const u64);
        assert_eq!((done, failed, words[0]), (1, 1, 0b100), "block 2's chunk is not stored");
        assert!(commands > 0);
        let tail = std::slice::from_raw_parts(p.add(STATUS_V0), size_of::<tutti_job_status_t>() - STATUS_V0);
        assert!(tail.iter().all(|&b| b == SENTINEL), "bytes past struct_size were written");
    }
}

#[test]
fn host_work_counters_on_the_main_path() {
    let (rt, _mem) = kv(TUTTI_EXECUTOR_GIO_HOST);
    let keys = hashes(BLOCKS as usize, 80);
    let before = stats(&rt);
    assert_eq!((before.host_calls, before.pairs_registered, before.submit_ns), (0, 0, 0));
    let mut store = null_mut();
    let mut job = null_mut();
    let mut per_layer = [u64::MAX; LAYERS as usize];
    let mut st = status();
    st.layer_submit_ns = per_layer.as_mut_ptr();
    st.layer_submit_ns_len = LAYERS;
    let blocks = [0u32, 1, 2, 3];
    let mut jobs = Vec::new();
    // SAFETY: live handles and valid buffers throughout.
    unsafe {
        ok(tutti_store_begin(rt.0, keys.as_ptr(), blocks.as_ptr(), 4, &mut store));
        ok(tutti_store_submit(store, 0, LAYERS, &mut job));
        ok(tutti_job_wait(job, WAIT_MS, &mut st));
        jobs.push((st, per_layer));
        ok(tutti_store_commit(store, null_mut()));
        ok(tutti_job_destroy(job));
        ok(tutti_store_destroy(store));
        per_layer = [u64::MAX; LAYERS as usize];
        ok(tutti_submit_load(rt.0, keys.as_ptr(), blocks.as_ptr(), 4, 0, LAYERS, &mut job));
        for l in 0..LAYERS {
            ok(tutti_job_wait_layer(job, l, WAIT_MS, &mut st));
        }
        ok(tutti_job_wait(job, WAIT_MS, &mut st));
        jobs.push((st, per_layer));
        ok(tutti_job_destroy(job));
    }
    for (st, per_layer) in &jobs {
        assert_eq!((st.done, st.failed), (1, 0), "{st:?}");
        // The executor reads each job's pairs from the list registered at its start.
        assert_eq!((st.pairs_registered, st.host_pairs), (1, 0), "{st:?}");
        assert!(st.host_calls >= LAYERS as u64 && st.commands > 0, "{st:?}");
        assert_eq!(st.submit_ns, per_layer.iter().sum::<u64>(), "{st:?} {per_layer:?}");
        assert!(per_layer.iter().all(|&ns| ns <= st.submit_ns));
    }
    let s = stats(&rt);
    let sum = |f: fn(&tutti_job_status_t) -> u64| jobs.iter().map(|(st, _)| f(st)).sum::<u64>();
    assert_eq!(s.pairs_registered, 2, "{s:?}");
    assert_eq!(s.host_pairs, 0, "{s:?}");
    assert_eq!(s.host_calls, sum(|st| st.host_calls), "{s:?}");
    assert_eq!(s.host_built, sum(|st| st.host_built), "{s:?}");
    assert_eq!(s.submit_ns, sum(|st| st.submit_ns), "{s:?}");
    assert_eq!(s.setup_ns, sum(|st| st.setup_ns), "{s:?}");
    assert_eq!(s.failed_blocks, 0);
}

#[test]
fn the_direct_path_reads_pairs_per_layer() {
    let (rt, _mem) = kv(TUTTI_EXECUTOR_DIRECT);
    let keys = hashes(BLOCKS as usize, 90);
    store_all(&rt, &keys, &[0, 1, 2, 3]);
    let st = load_all(&rt, &keys, &[0, 1, 2, 3]);
    assert_eq!(st.pairs_registered, 0, "{st:?}");
    assert_eq!(st.host_pairs, (BLOCKS * LAYERS) as u64, "every layer carries its pairs: {st:?}");
    let s = stats(&rt);
    assert_eq!((s.pairs_registered, s.host_pairs), (0, 2 * (BLOCKS * LAYERS) as u64), "{s:?}");
}

#[test]
fn a_short_layer_buffer_is_refused_after_the_status_is_filled() {
    let (rt, _mem) = kv(TUTTI_EXECUTOR_GIO_HOST);
    let keys = hashes(1, 95);
    store_all(&rt, &keys, &[0]);
    let mut per_layer = [0u64; LAYERS as usize - 1];
    let mut st = status();
    st.layer_submit_ns = per_layer.as_mut_ptr();
    st.layer_submit_ns_len = LAYERS - 1;
    let mut job = null_mut();
    // SAFETY: live handles and valid buffers.
    unsafe {
        ok(tutti_submit_load(rt.0, keys.as_ptr(), [1u32].as_ptr(), 1, 0, LAYERS, &mut job));
        expect(tutti_job_wait(job, WAIT_MS, &mut st), TUTTI_E_BUFFER_TOO_SMALL, "layer_submit_ns");
        assert_eq!((st.done, st.num_layers), (1, LAYERS), "{st:?}");
        ok(tutti_job_destroy(job));
    }
}

#[test]
fn failed_blocks_counts_each_failed_block_once() {
    let (rt, _mem) = kv(TUTTI_EXECUTOR_GIO_HOST);
    let keys = hashes(4, 100);
    store_all(&rt, &keys[..2], &[0, 1]);
    let mut job = null_mut();
    let mut st = status();
    // SAFETY: live handles and valid buffers throughout.
    unsafe {
        // Blocks 2 and 3 are not stored: failed at submission, counted once
        // however many times the job is polled and waited for.
        ok(tutti_submit_load(rt.0, keys.as_ptr(), [0u32, 1, 2, 3].as_ptr(), 4, 0, LAYERS, &mut job));
        for _ in 0..3 {
            let _ = tutti_job_poll(job, &mut st);
        }
        ok(tutti_job_wait(job, WAIT_MS, &mut st));
        ok(tutti_job_wait_layer(job, 0, WAIT_MS, &mut st));
        ok(tutti_job_poll(job, &mut st));
        assert_eq!(st.failed, 2);
        assert_eq!(stats(&rt).failed_blocks, 2);
        ok(tutti_job_destroy(job));
        assert_eq!(stats(&rt).failed_blocks, 2, "destroying the job counts nothing again");

        // Nothing stored: no object-store job at all; never polled, still counted.
        ok(tutti_submit_load(rt.0, keys[2..].as_ptr(), [2u32, 3].as_ptr(), 2, 0, 1, &mut job));
        ok(tutti_job_destroy(job));
        assert_eq!(stats(&rt).failed_blocks, 4);

        // A device read error on one block fails it in one layer: one block, once.
        ok(tutti_emulated_fail_next(rt.0, 0, TUTTI_DIR_LOAD, 1));
        ok(tutti_submit_load(rt.0, keys.as_ptr(), [2u32, 3].as_ptr(), 2, 0, LAYERS, &mut job));
        ok(tutti_job_wait(job, WAIT_MS, &mut st));
        ok(tutti_job_wait(job, WAIT_MS, &mut st));
        assert_eq!(st.failed, 1, "{st:?}");
        ok(tutti_job_destroy(job));
        assert_eq!(stats(&rt).failed_blocks, 5);

        // A job destroyed without ever being polled: its device failure still counts.
        ok(tutti_emulated_fail_next(rt.0, 1, TUTTI_DIR_LOAD, 1));
        ok(tutti_submit_load(rt.0, keys.as_ptr(), [2u32, 3].as_ptr(), 2, 0, LAYERS, &mut job));
        ok(tutti_job_destroy(job));
        assert_eq!(stats(&rt).failed_blocks, 6);
    }
}

#[test]
fn an_abi_1_1_caller_gets_exactly_its_fields() {
    let (rt, _mem) = kv(TUTTI_EXECUTOR_GIO_HOST);
    let keys = hashes(2, 110);
    store_all(&rt, &keys, &[0, 1]);

    let mut stats_v1 = [0u64; size_of::<tutti_stats_t>() / 8];
    let p = stats_v1.as_mut_ptr() as *mut u8;
    // SAFETY: a live handle; `stats_v1` is an aligned 192-byte buffer whose first
    // 184 bytes are a 1.1 `tutti_stats_t`; fields are read at their offsets.
    let (jobs, submit_ns, tail) = unsafe {
        std::ptr::write_bytes(p.add(STATS_V1), SENTINEL, size_of::<tutti_stats_t>() - STATS_V1);
        std::ptr::write(p as *mut u32, STATS_V1 as u32);
        ok(tutti_get_stats(rt.0, p as *mut tutti_stats_t));
        (
            std::ptr::read(p.add(offset_of!(tutti_stats_t, jobs)) as *const u64),
            std::ptr::read(p.add(offset_of!(tutti_stats_t, submit_ns)) as *const u64),
            std::slice::from_raw_parts(p.add(STATS_V1), size_of::<tutti_stats_t>() - STATS_V1).to_vec(),
        )
    };
    assert!(tail.iter().all(|&b| b == SENTINEL), "bytes past struct_size were written");
    let full = stats(&rt);
    assert_eq!((jobs, submit_ns), (full.jobs, full.submit_ns));
    assert!(jobs == 1 && submit_ns > 0 && full.quarantined_files == 0);

    // Job status: the 1.1 inputs are honoured; the sentinel bytes where the
    // 1.2 `unknown_bitmap` would be are never followed.
    let mut st = [0u64; size_of::<tutti_job_status_t>() / 8];
    let mut words = [u64::MAX; 1];
    let mut per_layer = [u64::MAX; LAYERS as usize];
    let mut job = null_mut();
    // SAFETY: live handles; `st` is an aligned buffer larger than 120 bytes whose
    // first 120 are a 1.1 status with a one-word bitmap and a per-layer buffer.
    unsafe {
        let p = st.as_mut_ptr() as *mut u8;
        std::ptr::write_bytes(p.add(STATUS_V1), SENTINEL, size_of::<tutti_job_status_t>() - STATUS_V1);
        let v1 = p as *mut tutti_job_status_t;
        std::ptr::write(p as *mut u32, STATUS_V1 as u32);
        std::ptr::write(p.add(offset_of!(tutti_job_status_t, failed_bitmap_words)) as *mut u32, 1);
        std::ptr::write(
            p.add(offset_of!(tutti_job_status_t, failed_bitmap)) as *mut *mut u64,
            words.as_mut_ptr(),
        );
        std::ptr::write(p.add(offset_of!(tutti_job_status_t, layer_submit_ns_len)) as *mut u32, LAYERS);
        std::ptr::write(
            p.add(offset_of!(tutti_job_status_t, layer_submit_ns)) as *mut *mut u64,
            per_layer.as_mut_ptr(),
        );
        ok(tutti_submit_load(rt.0, hashes(3, 110).as_ptr(), [2u32, 3, 1].as_ptr(), 3, 0, LAYERS, &mut job));
        ok(tutti_job_wait(job, WAIT_MS, v1));
        ok(tutti_job_destroy(job));
        let failed = std::ptr::read(p.add(offset_of!(tutti_job_status_t, failed)) as *const u32);
        let submit_ns = std::ptr::read(p.add(offset_of!(tutti_job_status_t, submit_ns)) as *const u64);
        assert_eq!((failed, words[0]), (1, 0b100), "block 2's chunk is not stored");
        assert_eq!(submit_ns, per_layer.iter().sum::<u64>());
        let tail = std::slice::from_raw_parts(p.add(STATUS_V1), size_of::<tutti_job_status_t>() - STATUS_V1);
        assert!(tail.iter().all(|&b| b == SENTINEL), "bytes past struct_size were written");
    }
}

#[test]
fn unknown_is_a_subset_of_failed_and_checks_its_buffer() {
    let (rt, _mem) = kv(TUTTI_EXECUTOR_GIO_HOST);
    let keys = hashes(2, 120);
    store_all(&rt, &keys[..1], &[0]);
    let mut job = null_mut();
    let mut failed = [u64::MAX; 1];
    let mut unknown = [u64::MAX; 1];
    let mut st = status();
    st.failed_bitmap = failed.as_mut_ptr();
    st.failed_bitmap_words = 1;
    st.unknown_bitmap = unknown.as_mut_ptr();
    st.unknown_bitmap_words = 1;
    // SAFETY: live handles and valid buffers throughout.
    unsafe {
        // A missing chunk and a media error: definite failures, none unknown.
        ok(tutti_emulated_fail_next(rt.0, 0, TUTTI_DIR_LOAD, 1));
        ok(tutti_submit_load(rt.0, keys.as_ptr(), [1u32, 2].as_ptr(), 2, 0, LAYERS, &mut job));
        ok(tutti_job_wait(job, WAIT_MS, &mut st));
        assert_eq!((st.failed, st.unknown, failed[0], unknown[0]), (2, 0, 0b11, 0), "{st:?}");

        // A too-small unknown bitmap is refused after the rest is filled.
        failed = [u64::MAX; 1];
        let mut per_layer = [u64::MAX; LAYERS as usize];
        st.layer_submit_ns = per_layer.as_mut_ptr();
        st.layer_submit_ns_len = LAYERS;
        st.unknown_bitmap_words = 0;
        st.failed = 99;
        expect(tutti_job_poll(job, &mut st), TUTTI_E_BUFFER_TOO_SMALL, "unknown_bitmap");
        assert_eq!((st.failed, failed[0]), (2, 0b11), "{st:?}");
        assert!(per_layer.iter().all(|&ns| ns != u64::MAX), "{per_layer:?}");
        // And a too-small failed bitmap does not keep the unknown one from being filled.
        unknown = [u64::MAX; 1];
        st.unknown_bitmap_words = 1;
        st.failed_bitmap_words = 0;
        expect(tutti_job_poll(job, &mut st), TUTTI_E_BUFFER_TOO_SMALL, "failed_bitmap");
        assert_eq!(unknown[0], 0);
        ok(tutti_job_destroy(job));
    }
    assert_eq!(stats(&rt).quarantined_files, 0);
}

#[test]
fn an_abi_1_6_caller_of_the_scheduler_stats_gets_exactly_its_fields() {
    let (rt, _mem) = kv(TUTTI_EXECUTOR_GIO_HOST);
    store_all(&rt, &hashes(1, 71), &[0]);
    const V6: usize = 16 + 18 * 8;
    let mut buf = [0u64; size_of::<tutti_sched_stats_t>() / 8];
    let p = buf.as_mut_ptr() as *mut u8;
    // SAFETY: a live handle; `buf` is an aligned full-size buffer whose first V6 bytes are a
    // 1.6 `tutti_sched_stats_t`.
    let (writes, tail) = unsafe {
        std::ptr::write_bytes(p.add(V6), SENTINEL, size_of::<tutti_sched_stats_t>() - V6);
        std::ptr::write(p as *mut u32, V6 as u32);
        ok(tutti_sched_stats(rt.0, p as *mut tutti_sched_stats_t));
        (
            std::ptr::read(p.add(offset_of!(tutti_sched_stats_t, writes_issued)) as *const u64),
            std::slice::from_raw_parts(p.add(V6), size_of::<tutti_sched_stats_t>() - V6).to_vec(),
        )
    };
    assert_eq!(writes, LAYERS as u64);
    assert!(tail.iter().all(|&b| b == SENTINEL), "bytes past struct_size were written");
    // A size between the versions is refused.
    buf[0] = (V6 + 8) as u64;
    // SAFETY: as above.
    let code = unsafe { tutti_sched_stats(rt.0, buf.as_mut_ptr() as *mut tutti_sched_stats_t) };
    expect(code, TUTTI_E_STRUCT_SIZE, "expects 160 or 192");
}
