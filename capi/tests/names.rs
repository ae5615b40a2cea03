//! The names of ABI 1.9 (`tutti_<object>_<verb>`) and their old names (aliases): a round trip
//! through the new names moves the same bytes a round trip through the old ones does, both
//! give the same answers, and each names itself in the last error.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::ffi::CString;
use std::ptr::{null, null_mut};
use tutti::*;

/// Hashes of `n` chunks through the new name; the old name gives the same ones.
fn chained(n: usize, salt: u32) -> Vec<tutti_hash_t> {
    let tokens: Vec<u32> = (0..n as u32 * TPB).map(|t| t.wrapping_mul(40_503) ^ salt).collect();
    let mut out = vec![tutti_hash_t::default(); n];
    let mut count = 0;
    // SAFETY: valid buffers of the given lengths.
    ok(unsafe {
        tutti_hash_chain(tokens.as_ptr(), tokens.len(), TPB, null(), out.as_mut_ptr(), n, &mut count)
    });
    assert_eq!(count, n);
    let mut old = vec![tutti_hash_t::default(); n];
    // SAFETY: as above.
    ok(unsafe {
        tutti_chain_hashes(tokens.as_ptr(), tokens.len(), TPB, null(), old.as_mut_ptr(), n, &mut count)
    });
    assert_eq!(old, out);
    out
}

fn stats_new(rt: &Rt) -> tutti_stats_t {
    let mut s = tutti_stats_t { struct_size: size_of::<tutti_stats_t>() as u32, ..Default::default() };
    // SAFETY: a live handle and a full-size struct.
    ok(unsafe { tutti_runtime_stats(rt.0, &mut s) });
    s
}

fn stats_old(rt: &Rt) -> tutti_stats_t {
    let mut s = tutti_stats_t { struct_size: size_of::<tutti_stats_t>() as u32, ..Default::default() };
    // SAFETY: as above.
    ok(unsafe { tutti_get_stats(rt.0, &mut s) });
    s
}

#[test]
fn new_and_old_names_run_the_same_code() {
    let rt = Rt::open(&config());
    const BLOCKS: u32 = 4;
    let mut mem = filled(BLOCKS, 7);
    let per_layer = 2 * BLOCKS as u64 * OBJ as u64;
    let bases: Vec<u64> = (0..LAYERS as u64).map(|l| mem.addr() + l * per_layer).collect();
    let mut l = layout(TUTTI_LAYOUT_VLLM_PER_LAYER, BLOCKS);
    l.num_layers = LAYERS;
    l.k_bases = bases.as_ptr();
    // SAFETY: `mem` holds every object of the layout and outlives the registration.
    ok(unsafe { tutti_kv_register(rt.0, &l, null_mut()) });

    let keys = chained(2, 5);
    let rep = store_all(&rt, &keys, &[0, 1]);
    assert_eq!(rep.stored, 2);

    // Lookup and unpin by the new names; the old lookup sees the same hits.
    let (mut hits, mut pin) = (0usize, 0u64);
    // SAFETY: valid buffers and a live handle.
    ok(unsafe { tutti_kv_lookup(rt.0, keys.as_ptr(), keys.len(), TUTTI_LOOKUP_PIN, &mut hits, &mut pin) });
    assert_eq!((hits, lookup(&rt, &keys, 0).0), (2, 2));
    // SAFETY: a live handle.
    ok(unsafe { tutti_kv_unpin(rt.0, pin) });
    // The pin is gone, whichever name asks.
    // SAFETY: a live handle.
    expect(unsafe { tutti_kv_unpin(rt.0, pin) }, TUTTI_E_NOT_FOUND, "tutti_kv_unpin: ");
    // SAFETY: a live handle.
    expect(unsafe { tutti_unpin(rt.0, pin) }, TUTTI_E_NOT_FOUND, "tutti_unpin: ");

    // A load by the new name and one by the old name bring back the stored bytes.
    let want = pattern(0, BLOCKS, 7);
    for (i, old) in [false, true].into_iter().enumerate() {
        scribble(&mut mem, 2 + i, BLOCKS);
        let target = [2 + i as u32];
        let mut job = null_mut();
        // SAFETY: valid handles and buffers.
        unsafe {
            let code = if old {
                tutti_submit_load(rt.0, keys.as_ptr(), target.as_ptr(), 1, 0, LAYERS, &mut job)
            } else {
                tutti_load_submit(rt.0, keys.as_ptr(), target.as_ptr(), 1, 0, LAYERS, &mut job)
            };
            ok(code);
            let mut st = status();
            ok(tutti_job_wait(job, WAIT_MS, &mut st));
            assert_eq!(st.failed, 0, "old name: {old}");
            ok(tutti_job_destroy(job));
        }
        assert_eq!(block_bytes(&mut mem, 2 + i, BLOCKS), want, "old name: {old}");
    }
    let s = stats_new(&rt);
    assert_eq!(s.jobs, stats_old(&rt).jobs);
    assert!(s.bytes_loaded > 0 && s.lookup_hits >= 2, "{s:?}");

    // Identity checks agree.
    let model = CString::new("test-model").unwrap();
    for contains in [tutti_kv_contains_identity, tutti_contains_identity] {
        let mut hits = 0usize;
        // SAFETY: valid strings, slices and out pointer.
        ok(unsafe {
            contains(
                rt.0,
                model.as_ptr(),
                null(),
                0,
                TUTTI_LAYOUT_VLLM_PER_LAYER,
                keys.as_ptr(),
                keys.len(),
                &mut hits,
            )
        });
        assert_eq!(hits, 2);
    }

    // The data path reads the same by both names.
    // SAFETY: integers and a byte array: all zero is a valid value.
    let mut dp: tutti_data_path_t = unsafe { std::mem::zeroed() };
    dp.struct_size = size_of::<tutti_data_path_t>() as u32;
    let mut dp_old = dp;
    // SAFETY: a live handle and full-size structs.
    unsafe {
        ok(tutti_runtime_data_path(rt.0, &mut dp));
        ok(tutti_data_path(rt.0, &mut dp_old));
    }
    assert_eq!((dp.mode, dp.memory), (dp_old.mode, dp_old.memory));

    // Unregister and register again by the other names.
    // SAFETY: a live handle; `mem` still holds every object of the layout.
    unsafe {
        ok(tutti_unregister_kv(rt.0));
        ok(tutti_register_kv(rt.0, &l, null_mut()));
        ok(tutti_kv_unregister(rt.0));
    }

    // Destroy by the new name; the old name then finds a stale handle and says its own name.
    // SAFETY: a live handle, then a stale one (detected).
    unsafe {
        ok(tutti_runtime_destroy(rt.0));
        expect(tutti_runtime_close(rt.0), TUTTI_E_BAD_HANDLE, "tutti_runtime_close: ");
        expect(tutti_runtime_destroy(rt.0), TUTTI_E_BAD_HANDLE, "tutti_runtime_destroy: ");
    }
    // Registering by the old name on a stale handle names the old name.
    // SAFETY: a stale handle (detected); the layout is not read.
    expect(unsafe { tutti_register_kv(rt.0, &l, null_mut()) }, TUTTI_E_BAD_HANDLE, "tutti_register_kv: ");
    drop(rt); // closing a stale handle again is refused, not a crash
}
