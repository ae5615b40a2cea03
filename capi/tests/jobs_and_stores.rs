//! Loads and stores through the ABI: argument checks of the job and store
//! calls, per-layer waits, cancellation, failure bitmaps, every layout kind,
//! eviction, reopening file media, concurrent callers, and the profiler hooks.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::ptr::{null, null_mut};
use tutti::*;

const BLOCKS: u32 = 8;

/// A runtime with `BLOCKS` engine blocks of host memory registered in `kind`'s layout.
struct Kv {
    rt: Rt,
    mem: Mem,
    kind: u32,
    /// (K, V) address of block 0 per layer, and the block stride.
    bases: Vec<(u64, u64)>,
    stride: u64,
}

impl Kv {
    fn new(cfg: &tutti_runtime_config_t, kind: u32) -> Kv {
        let rt = Rt::open(cfg);
        let file = 2 * LAYERS as usize * OBJ;
        let len = BLOCKS as usize * file + 4096;
        let mem = Mem::new(len);
        let a = mem.addr();
        let l = LAYERS as u64;
        let (bases, stride): (Vec<(u64, u64)>, u64) = match kind {
            TUTTI_LAYOUT_VLLM_PER_LAYER => {
                let per = 2 * BLOCKS as u64 * OBJ as u64;
                (
                    (0..l).map(|i| (a + i * per, a + i * per + BLOCKS as u64 * OBJ as u64)).collect(),
                    OBJ as u64,
                )
            }
            TUTTI_LAYOUT_CONTIGUOUS => (
                (0..l).map(|i| (a + 2 * i * OBJ as u64, a + (2 * i + 1) * OBJ as u64)).collect(),
                file as u64,
            ),
            // FlashInfer-like per layer [num_blocks, 2, ...] in one region: layer-major, K and V adjacent.
            _ => {
                let per = 2 * BLOCKS as u64 * OBJ as u64;
                ((0..l).map(|i| (a + i * per, a + i * per + OBJ as u64)).collect(), 2 * OBJ as u64)
            }
        };
        let mut kv = Kv { rt, mem, kind, bases, stride };
        kv.register();
        kv
    }

    fn register(&mut self) {
        let k: Vec<u64> = self.bases.iter().map(|b| b.0).collect();
        let v: Vec<u64> = self.bases.iter().map(|b| b.1).collect();
        let mut l = layout(self.kind, BLOCKS);
        match self.kind {
            TUTTI_LAYOUT_CONTIGUOUS => l.base = self.mem.addr(),
            TUTTI_LAYOUT_VLLM_PER_LAYER => {
                l.num_layers = LAYERS;
                l.k_bases = k.as_ptr();
            }
            _ => {
                l.num_layers = LAYERS;
                l.k_bases = k.as_ptr();
                l.v_bases = v.as_ptr();
                l.block_stride = self.stride;
            }
        }
        // SAFETY: `mem` lives as long as this value, which unregisters nothing
        // but closes the runtime (dropping the registration) before freeing it.
        ok(unsafe { tutti_register_kv(self.rt.0, &l, null_mut()) });
    }

    fn offset(&self, block: u32, layer: u32, kv: u32) -> usize {
        let (k, v) = self.bases[layer as usize];
        ((if kv == 0 { k } else { v }) + block as u64 * self.stride - self.mem.addr()) as usize
    }

    fn fill(&mut self, block: u32, seed: u8) {
        for layer in 0..LAYERS {
            for kv in 0..2 {
                let o = self.offset(block, layer, kv);
                for (i, b) in self.mem.bytes()[o..o + OBJ].iter_mut().enumerate() {
                    *b = seed ^ (layer as u8) << 4 ^ (kv as u8) << 3 ^ (i as u8).wrapping_mul(31);
                }
            }
        }
    }

    fn holds(&mut self, block: u32, seed: u8, layers: std::ops::Range<u32>) -> bool {
        let mut all = true;
        for layer in layers {
            for kv in 0..2 {
                let o = self.offset(block, layer, kv);
                all &= self.mem.bytes()[o..o + OBJ].iter().enumerate().all(|(i, &b)| {
                    b == seed ^ (layer as u8) << 4 ^ (kv as u8) << 3 ^ (i as u8).wrapping_mul(31)
                });
            }
        }
        all
    }

    fn zero(&mut self) {
        self.mem.bytes().fill(0);
    }
}

impl Drop for Kv {
    fn drop(&mut self) {
        // SAFETY: a live handle; the registration goes before `mem` is freed.
        unsafe { tutti_unregister_kv(self.rt.0) };
    }
}

#[test]
fn every_layout_kind_round_trips_every_byte() {
    for kind in [TUTTI_LAYOUT_VLLM_PER_LAYER, TUTTI_LAYOUT_CONTIGUOUS, TUTTI_LAYOUT_STRIDED] {
        let mut kv = Kv::new(&config(), kind);
        let keys = hashes(3, kind);
        for b in 0..3 {
            kv.fill(b, 0x10 + b as u8);
        }
        let rep = store_all(&kv.rt, &keys, &[0, 1, 2]);
        assert_eq!((rep.stored, rep.present, rep.failed), (3, 0, 0), "kind {kind}");
        kv.zero();
        let st = load_all(&kv.rt, &keys, &[5, 3, 7]);
        assert_eq!((st.done, st.failed, st.blocks), (1, 0, 3));
        for (dst, seed) in [(5, 0x10), (3, 0x11), (7, 0x12)] {
            assert!(kv.holds(dst, seed, 0..LAYERS), "kind {kind}: block {dst}");
        }
        assert!(!kv.holds(0, 0x10, 0..1), "the source blocks were zeroed and not written");
        // Storing the same chunks again finds them present.
        let rep = store_all(&kv.rt, &keys, &[0, 1, 2]);
        assert_eq!((rep.stored, rep.present), (0, 3));
    }
}

#[test]
fn loads_by_layer_range_and_wait_per_layer() {
    let mut kv = Kv::new(&config(), TUTTI_LAYOUT_VLLM_PER_LAYER);
    let keys = hashes(2, 9);
    kv.fill(0, 1);
    kv.fill(1, 2);
    store_all(&kv.rt, &keys, &[0, 1]);
    kv.zero();
    let mut job = null_mut();
    let mut st = status();
    // SAFETY: live handles and valid buffers.
    unsafe {
        ok(tutti_submit_load(kv.rt.0, keys.as_ptr(), [4u32, 6].as_ptr(), 2, 1, 2, &mut job));
        expect(
            tutti_job_wait_layer(job, 0, 1000, &mut st),
            TUTTI_E_INVALID_ARG,
            "layer 0 is not in the job's 1..3",
        );
        expect(tutti_job_layer_done(job, 3), TUTTI_E_INVALID_ARG, "not in the job");
        ok(tutti_job_wait_layer(job, 2, WAIT_MS, &mut st));
        assert_eq!(tutti_job_layer_done(job, 2), TUTTI_OK);
        assert!(st.layers_done >= 1 && st.first_layer == 1 && st.num_layers == 2, "{st:?}");
        ok(tutti_job_wait_layer(job, 1, WAIT_MS, &mut st));
        ok(tutti_job_wait(job, WAIT_MS, &mut st));
        assert_eq!(tutti_job_poll(job, &mut st), TUTTI_OK);
        assert_eq!((st.done, st.layers_done, st.failed, st.direction), (1, 2, 0, TUTTI_DIR_LOAD));
        assert_eq!(st.bytes, 2 * 2 * 2 * OBJ as u64);
        assert!(st.commands > 0);
        let mut needed = 9usize;
        expect(tutti_job_error(job, null_mut(), 1, &mut needed), TUTTI_E_NULL_POINTER, "buf is NULL");
        assert_eq!(needed, 1, "no error: the empty string needs one byte");
    }
    // SAFETY: as above.
    unsafe { ok(tutti_job_destroy(job)) };
    assert!(kv.holds(4, 1, 1..3) && kv.holds(6, 2, 1..3));
    assert!(!kv.holds(4, 1, 0..1) && !kv.holds(6, 2, 3..4), "only layers 1 and 2 were loaded");
}

#[test]
fn job_and_store_calls_validate_their_arguments() {
    let mut kv = Kv::new(&config(), TUTTI_LAYOUT_VLLM_PER_LAYER);
    let keys = hashes(3, 77);
    kv.fill(0, 3);
    let rt = kv.rt.0;
    let b = [0u32, 1, 2];
    let mut job = null_mut();
    let mut store = null_mut();
    let mut st = status();
    // SAFETY: live handles; pointers valid or deliberately wrong in the checked way.
    unsafe {
        expect(
            tutti_submit_load(rt, keys.as_ptr(), b.as_ptr(), 3, 0, LAYERS, null_mut()),
            TUTTI_E_NULL_POINTER,
            "out_job",
        );
        expect(
            tutti_submit_load(rt, keys.as_ptr(), null(), 3, 0, LAYERS, &mut job),
            TUTTI_E_NULL_POINTER,
            "block_ids",
        );
        expect(
            tutti_submit_load(rt, keys.as_ptr(), b.as_ptr(), 0, 0, LAYERS, &mut job),
            TUTTI_E_INVALID_ARG,
            "count",
        );
        expect(
            tutti_submit_load(rt, keys.as_ptr(), b.as_ptr(), 3, u32::MAX, 2, &mut job),
            TUTTI_E_INVALID_ARG,
            "layers",
        );
        expect(
            tutti_submit_load(rt, keys.as_ptr(), [0u32, 9, 1].as_ptr(), 3, 0, 1, &mut job),
            TUTTI_E_INVALID_ARG,
            "block_ids[1] = 9",
        );
        expect(
            tutti_store_begin(rt, keys.as_ptr(), b.as_ptr(), 3, null_mut()),
            TUTTI_E_NULL_POINTER,
            "out_store",
        );
        expect(tutti_store_begin(rt, keys.as_ptr(), b.as_ptr(), 0, &mut store), TUTTI_E_INVALID_ARG, "count");
        expect(
            tutti_store_begin(rt, keys.as_ptr(), [2u32, 2, 1].as_ptr(), 3, &mut store),
            TUTTI_E_INVALID_ARG,
            "twice",
        );
        expect(
            tutti_store_begin(rt, keys.as_ptr(), [0u32, 1, 8].as_ptr(), 3, &mut store),
            TUTTI_E_INVALID_ARG,
            "block",
        );
        assert!(store.is_null());

        ok(tutti_store_begin(rt, keys.as_ptr(), b.as_ptr(), 3, &mut store));
        expect(tutti_store_submit(store, 0, 0, &mut job), TUTTI_E_INVALID_ARG, "layers");
        expect(tutti_store_submit(store, 0, 1, null_mut()), TUTTI_E_NULL_POINTER, "out_job");
        ok(tutti_store_submit(store, 0, LAYERS, &mut job));
        st.struct_size -= 8;
        expect(tutti_job_wait(job, WAIT_MS, &mut st), TUTTI_E_STRUCT_SIZE, "tutti_job_status_t.struct_size");
        st = status();
        expect(tutti_job_wait(job, TUTTI_MAX_TIMEOUT_MS + 1, &mut st), TUTTI_E_INVALID_ARG, "one day");
        let mut words = [0u64; 1];
        st.failed_bitmap = words.as_mut_ptr();
        expect(
            tutti_job_wait(job, WAIT_MS, &mut st),
            TUTTI_E_BUFFER_TOO_SMALL,
            "a buffer of 1 is needed, 0 was given",
        );
        st.failed_bitmap_words = 1;
        ok(tutti_job_wait(job, WAIT_MS, &mut st));
        assert_eq!((st.direction, st.done, st.failed, words[0]), (TUTTI_DIR_STORE, 1, 0, 0));
        let mut rep: tutti_store_report_t = std::mem::zeroed();
        expect(tutti_store_commit(store, &mut rep), TUTTI_E_STRUCT_SIZE, "tutti_store_report_t");
        rep.struct_size = std::mem::size_of::<tutti_store_report_t>() as u32;
        rep.failed_bitmap = words.as_mut_ptr();
        expect(tutti_store_commit(store, &mut rep), TUTTI_E_BUFFER_TOO_SMALL, "failed_bitmap");
        rep.failed_bitmap_words = 1;
        ok(tutti_store_commit(store, &mut rep));
        assert_eq!((rep.stored, rep.failed, words[0]), (3, 0, 0));
        expect(tutti_store_commit(store, &mut rep), TUTTI_E_INVALID_ARG, "already committed");
        let mut again = null_mut();
        expect(tutti_store_submit(store, 0, 1, &mut again), TUTTI_E_INVALID_ARG, "already committed");
        ok(tutti_store_destroy(store));
        expect(tutti_store_destroy(store), TUTTI_E_BAD_HANDLE, "tutti_store_t");
        // The job outlives its store handle.
        ok(tutti_job_poll(job, null_mut()));
        let mut small = [0 as std::ffi::c_char; 1];
        ok(tutti_job_error(job, small.as_mut_ptr(), 1, null_mut()));
        assert_eq!(small[0], 0, "no error: an empty string");
        ok(tutti_job_destroy(job));
        expect(tutti_job_destroy(job), TUTTI_E_BAD_HANDLE, "tutti_job_t");
    }
}

#[test]
fn missing_chunks_fail_exactly_their_blocks() {
    let mut kv = Kv::new(&config(), TUTTI_LAYOUT_VLLM_PER_LAYER);
    let keys = hashes(4, 5);
    for b in 0..4 {
        kv.fill(b, b as u8);
    }
    store_all(&kv.rt, &keys[..2], &[0, 1]);
    let mut job = null_mut();
    let mut st = status();
    let mut words = [u64::MAX; 1];
    st.failed_bitmap = words.as_mut_ptr();
    st.failed_bitmap_words = 1;
    // SAFETY: live handles and valid buffers.
    unsafe {
        ok(tutti_submit_load(kv.rt.0, keys.as_ptr(), [4u32, 5, 6, 7].as_ptr(), 4, 0, LAYERS, &mut job));
        ok(tutti_job_wait(job, WAIT_MS, &mut st));
        assert_eq!((st.blocks, st.failed, words[0]), (4, 2, 0b1100));
        let mut needed = 0usize;
        expect(tutti_job_error(job, null_mut(), 0, &mut needed), TUTTI_E_BUFFER_TOO_SMALL, "buf");
        let mut buf = vec![0u8; needed];
        ok(tutti_job_error(job, buf.as_mut_ptr() as *mut _, needed, null_mut()));
        let msg = String::from_utf8(buf[..needed - 1].to_vec()).unwrap();
        assert!(msg.contains("block 2") && msg.contains("not stored"), "{msg}");
        ok(tutti_job_destroy(job));
        // Nothing stored at all: a job that is done at once, every block failed.
        ok(tutti_submit_load(kv.rt.0, keys[2..].as_ptr(), [4u32, 5].as_ptr(), 2, 0, 1, &mut job));
        assert_eq!(tutti_job_poll(job, &mut st), TUTTI_OK);
        assert_eq!((st.done, st.failed, words[0], st.layers_done), (1, 2, 0b11, 1));
        ok(tutti_job_cancel(job));
        ok(tutti_job_destroy(job));
    }
    assert!(kv.holds(4, 0, 0..LAYERS) && kv.holds(5, 1, 0..LAYERS));
}

#[test]
fn cancel_stops_a_job_and_destroy_releases_unfinished_ones() {
    let mut kv = Kv::new(&config(), TUTTI_LAYOUT_VLLM_PER_LAYER);
    let keys = hashes(BLOCKS as usize, 11);
    let blocks: Vec<u32> = (0..BLOCKS).collect();
    for b in 0..BLOCKS {
        kv.fill(b, b as u8);
    }
    store_all(&kv.rt, &keys, &blocks);
    let mut st = status();
    let mut job = null_mut();
    // SAFETY: live handles and valid buffers.
    unsafe {
        ok(tutti_submit_load(kv.rt.0, keys.as_ptr(), blocks.as_ptr(), keys.len(), 0, LAYERS, &mut job));
        ok(tutti_job_cancel(job));
        ok(tutti_job_wait(job, WAIT_MS, &mut st));
        assert_eq!((st.done, st.cancelled, st.layers_done), (1, 1, LAYERS));
        // Layers already on the drives finish; the rest fail every block as "cancelled".
        if st.failed > 0 {
            assert_eq!(st.failed, BLOCKS);
            let mut buf = [0u8; 256];
            ok(tutti_job_error(job, buf.as_mut_ptr() as *mut _, buf.len(), null_mut()));
            assert!(String::from_utf8_lossy(&buf).contains("cancelled"));
        }
        ok(tutti_job_destroy(job));
        // Destroying a job that was never waited for cancels, drains and releases it.
        ok(tutti_submit_load(kv.rt.0, keys.as_ptr(), blocks.as_ptr(), keys.len(), 0, LAYERS, &mut job));
        ok(tutti_job_destroy(job));
        let mut s: tutti_stats_t = std::mem::zeroed();
        s.struct_size = std::mem::size_of::<tutti_stats_t>() as u32;
        ok(tutti_get_stats(kv.rt.0, &mut s));
        assert_eq!(
            (s.jobs_in_flight, s.layers_in_flight, s.files_busy, s.files_pinned),
            (0, 0, 0, 0),
            "{s:?}"
        );
        // With no job left, the memory can be registered again.
        kv.register();
    }
}

#[test]
fn an_abandoned_store_gives_its_files_back() {
    let kv = Kv::new(&config(), TUTTI_LAYOUT_VLLM_PER_LAYER);
    let keys = hashes(3, 21);
    let stats = |rt: &Rt| {
        // SAFETY: a zeroed stats struct with its size set; a live handle.
        unsafe {
            let mut s: tutti_stats_t = std::mem::zeroed();
            s.struct_size = std::mem::size_of::<tutti_stats_t>() as u32;
            ok(tutti_get_stats(rt.0, &mut s));
            s
        }
    };
    let free = stats(&kv.rt).files_free;
    let mut store = null_mut();
    let mut job = null_mut();
    // SAFETY: live handles and valid buffers.
    unsafe {
        ok(tutti_store_begin(kv.rt.0, keys.as_ptr(), [0u32, 1, 2].as_ptr(), 3, &mut store));
        assert_eq!(stats(&kv.rt).stores_open, 1);
        ok(tutti_store_submit(store, 0, 1, &mut job)); // one layer of four: never complete
        ok(tutti_store_destroy(store));
        assert_eq!(stats(&kv.rt).stores_open, 1, "the job still holds the session");
        ok(tutti_job_destroy(job));
    }
    let s = stats(&kv.rt);
    assert_eq!((s.stores_open, s.files_free, s.files_valid), (0, free, 0), "{s:?}");
    let mut hits = 9usize;
    // SAFETY: as above.
    unsafe { ok(tutti_lookup(kv.rt.0, keys.as_ptr(), 3, 0, &mut hits, null_mut())) };
    assert_eq!(hits, 0);
}

/// A job of more layers than the object store keeps in flight cannot finish
/// in one pass, so a zero timeout deterministically sees it unfinished.
#[test]
fn unfinished_jobs_report_progress_and_time_out() {
    const DEEP: u32 = 64;
    let mut cfg = config();
    cfg.geometry.layers = DEEP;
    let rt = Rt::open(&cfg);
    let per = 2 * 2 * OBJ;
    let mem = Mem::new(per * DEEP as usize);
    let bases: Vec<u64> = (0..DEEP as u64).map(|l| mem.addr() + l * per as u64).collect();
    let mut l = layout(TUTTI_LAYOUT_VLLM_PER_LAYER, 2);
    l.num_layers = DEEP;
    l.k_bases = bases.as_ptr();
    let keys = hashes(1, 4);
    let mut job = null_mut();
    let mut store = null_mut();
    let mut st = status();
    // SAFETY: `mem` outlives the registration (unregistered below); live handles and valid buffers.
    unsafe {
        ok(tutti_register_kv(rt.0, &l, null_mut()));
        ok(tutti_store_begin(rt.0, keys.as_ptr(), [0u32].as_ptr(), 1, &mut store));
        ok(tutti_store_submit(store, 0, DEEP, &mut job));
        assert_eq!(tutti_job_poll(job, &mut st), TUTTI_IN_PROGRESS, "{}", last_error());
        assert_eq!(last_error(), "", "in progress is not an error");
        assert!(st.done == 0 && st.layers_done < DEEP, "{st:?}");
        expect(tutti_store_commit(store, null_mut()), TUTTI_E_BUSY, "still running");
        let mut s: tutti_stats_t = std::mem::zeroed();
        s.struct_size = std::mem::size_of::<tutti_stats_t>() as u32;
        ok(tutti_get_stats(rt.0, &mut s));
        assert!(s.jobs_in_flight == 1 && s.layers_in_flight > 0, "{s:?}");
        expect(tutti_job_wait(job, 0, &mut st), TUTTI_E_TIMEOUT, "did not finish within 0 ms");
        assert!(st.done == 0 && st.num_layers == DEEP, "the status is filled on a timeout: {st:?}");
        assert_eq!(tutti_job_layer_done(job, DEEP - 1), TUTTI_IN_PROGRESS);
        expect(tutti_job_wait_layer(job, DEEP - 1, 0, &mut st), TUTTI_E_TIMEOUT, "layer 63");
        ok(tutti_job_wait(job, WAIT_MS, &mut st));
        assert_eq!((st.done, st.layers_done, st.failed), (1, DEEP, 0));
        ok(tutti_store_commit(store, null_mut()));
        ok(tutti_job_destroy(job));
        ok(tutti_store_destroy(store));
        ok(tutti_get_stats(rt.0, &mut s));
        assert_eq!((s.jobs_in_flight, s.layers_in_flight, s.files_committed), (0, 0, 1));
        ok(tutti_unregister_kv(rt.0));
    }
}

#[test]
fn injected_device_errors_fail_exactly_the_blocks_they_hit() {
    let mut kv = Kv::new(&config(), TUTTI_LAYOUT_VLLM_PER_LAYER);
    let keys = hashes(4, 600);
    for b in 0..4 {
        kv.fill(b, 0x40 + b as u8);
    }
    let rt = kv.rt.0;
    let load_failed;
    // SAFETY: live handles and valid buffers throughout.
    unsafe {
        expect(tutti_emulated_fail_next(rt, 2, TUTTI_DIR_LOAD, 1), TUTTI_E_INVALID_ARG, "not one of the 2");
        expect(tutti_emulated_fail_next(rt, 0, 3, 1), TUTTI_E_INVALID_ARG, "direction");
        expect(tutti_emulated_fail_next(rt, 0, TUTTI_DIR_LOAD, 0), TUTTI_E_INVALID_ARG, "count");
        expect(tutti_emulated_fail_next(null_mut(), 0, TUTTI_DIR_LOAD, 1), TUTTI_E_NULL_POINTER, "NULL");

        // A failed write: its block is not stored; the others are.
        let mut store = null_mut();
        let mut job = null_mut();
        let mut words = [0u64; 1];
        let mut st = status();
        st.failed_bitmap = words.as_mut_ptr();
        st.failed_bitmap_words = 1;
        ok(tutti_emulated_fail_next(rt, 1, TUTTI_DIR_STORE, 1));
        ok(tutti_store_begin(rt, keys.as_ptr(), [0u32, 1, 2, 3].as_ptr(), 4, &mut store));
        ok(tutti_store_submit(store, 0, LAYERS, &mut job));
        ok(tutti_job_wait(job, WAIT_MS, &mut st));
        assert_eq!(st.failed, 1, "{st:?}");
        let write_failed = words[0];
        let mut rep: tutti_store_report_t = std::mem::zeroed();
        rep.struct_size = std::mem::size_of::<tutti_store_report_t>() as u32;
        let mut rep_words = [0u64; 1];
        rep.failed_bitmap = rep_words.as_mut_ptr();
        rep.failed_bitmap_words = 1;
        ok(tutti_store_commit(store, &mut rep));
        assert_eq!((rep.stored, rep.failed, rep_words[0]), (3, 1, write_failed));
        let mut msg = [0u8; 256];
        ok(tutti_job_error(job, msg.as_mut_ptr() as *mut _, msg.len(), null_mut()));
        assert!(String::from_utf8_lossy(&msg).contains("Write Fault"), "{}", String::from_utf8_lossy(&msg));
        ok(tutti_job_destroy(job));
        ok(tutti_store_destroy(store));
        let bad = write_failed.trailing_zeros() as usize;

        // Store the missing block again, then fail one read on each drive.
        let rep = store_all(&kv.rt, &keys, &[0, 1, 2, 3]);
        assert_eq!((rep.stored, rep.present), (1, 3), "block {bad} is stored on the retry");
        kv.zero();
        ok(tutti_emulated_fail_next(rt, 0, TUTTI_DIR_LOAD, 1));
        ok(tutti_submit_load(rt, keys.as_ptr(), [4u32, 5, 6, 7].as_ptr(), 4, 0, LAYERS, &mut job));
        ok(tutti_job_wait(job, WAIT_MS, &mut st));
        assert_eq!((st.failed, words[0].count_ones()), (1, 1), "{st:?}");
        load_failed = words[0];
        ok(tutti_job_error(job, msg.as_mut_ptr() as *mut _, msg.len(), null_mut()));
        assert!(String::from_utf8_lossy(&msg).contains("Unrecovered Read Error"));
        ok(tutti_job_destroy(job));
    }
    for i in 0..4u32 {
        let failed = load_failed >> i & 1 == 1;
        assert_eq!(kv.holds(4 + i, 0x40 + i as u8, 0..LAYERS), !failed, "block {i}");
    }
}
