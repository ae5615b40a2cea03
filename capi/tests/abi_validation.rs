//! Bad input at every entry point: NULL pointers, zero and huge sizes, wrong
//! struct sizes, unknown enum values, stale and foreign handles, double
//! destroy. Each returns a named error and a message saying what was wrong.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::ffi::c_char;
use std::ptr::{null, null_mut};
use tutti::*;

const BOGUS: usize = 0x7a11_fff0;

#[test]
fn general_calls() {
    assert_eq!(tutti_abi_version(), TUTTI_ABI_VERSION);
    assert_eq!(name(TUTTI_E_BAD_HANDLE), "TUTTI_E_BAD_HANDLE");
    assert_eq!(name(TUTTI_IN_PROGRESS), "TUTTI_IN_PROGRESS");
    assert_eq!(name(-999), "TUTTI_UNKNOWN_STATUS");
    let a = tutti_clock_ns();
    std::thread::sleep(std::time::Duration::from_millis(2));
    assert!(tutti_clock_ns() > a, "the hook clock advances");
    // SAFETY: every pointer below is valid or deliberately NULL.
    unsafe {
        expect(tutti_runtime_info(null_mut(), null_mut()), TUTTI_E_NULL_POINTER, "tutti_runtime_info: ");
        let msg = last_error();
        let mut needed = 0usize;
        expect(tutti_last_error_copy(null_mut(), 0, &mut needed), TUTTI_E_BUFFER_TOO_SMALL, "");
        assert_eq!(needed, msg.len() + 1);
        assert_eq!(last_error(), msg, "copying does not change the message");
        expect(tutti_last_error_copy(null_mut(), 500, null_mut()), TUTTI_E_NULL_POINTER, "");
        let mut buf = vec![0 as c_char; needed];
        ok(tutti_last_error_copy(buf.as_mut_ptr(), needed, null_mut()));
        let copied: Vec<u8> = buf.iter().map(|&c| c as u8).take_while(|&c| c != 0).collect();
        assert_eq!(String::from_utf8(copied).unwrap(), msg);
    }
}

#[test]
fn runtime_open_rejects_each_bad_field() {
    let mut rt = BOGUS as *mut tutti_runtime_t;
    let bad = |f: &dyn Fn(&mut tutti_runtime_config_t), code: i32, needle: &str| {
        let mut c = config();
        f(&mut c);
        let mut rt = BOGUS as *mut tutti_runtime_t;
        // SAFETY: valid config and out pointer.
        expect(unsafe { tutti_runtime_open(&c, &mut rt) }, code, needle);
        assert!(rt.is_null(), "{needle}: out is cleared on failure");
    };
    // SAFETY: deliberately NULL pointers.
    unsafe {
        expect(tutti_runtime_open(null(), &mut rt), TUTTI_E_NULL_POINTER, "tutti_runtime_config_t is NULL");
        expect(tutti_runtime_open(&config(), null_mut()), TUTTI_E_NULL_POINTER, "out is NULL");
    }
    bad(&|c| c.struct_size = 4, TUTTI_E_STRUCT_SIZE, "struct_size is 4");
    bad(&|c| c.struct_size += 8, TUTTI_E_STRUCT_SIZE, "expects");
    bad(&|c| c.drives = 0, TUTTI_E_INVALID_ARG, "invalid drives");
    bad(&|c| c.emulated_count = 0, TUTTI_E_INVALID_ARG, "emulated_count");
    bad(&|c| c.emulated_count = 100_000, TUTTI_E_INVALID_ARG, "emulated_count");
    bad(&|c| c.emulated_lba_size = 1000, TUTTI_E_INVALID_ARG, "emulated_lba_size");
    bad(&|c| c.emulated_capacity_bytes = 0, TUTTI_E_INVALID_ARG, "emulated_capacity_bytes");
    bad(&|c| c.emulated_capacity_bytes = u64::MAX, TUTTI_E_INVALID_ARG, "emulated_capacity_bytes");
    bad(&|c| c.emulated_capacity_bytes = (16 << 20) + 1, TUTTI_E_INVALID_ARG, "multiple of 512");
    bad(&|c| c.executor = 4, TUTTI_E_INVALID_ARG, "executor");
    bad(&|c| c.staging_slots = 1 << 20, TUTTI_E_INVALID_ARG, "staging_slots");
    bad(
        &|c| (c.executor, c.cuda_device) = (TUTTI_EXECUTOR_GIO_CUDA, u32::MAX),
        TUTTI_E_INVALID_ARG,
        "cuda_device",
    );
    bad(&|c| c.open_mode = 0, TUTTI_E_INVALID_ARG, "open_mode");
    bad(&|c| c.geometry.dtype = 0, TUTTI_E_INVALID_ARG, "dtype");
    bad(&|c| c.geometry.dtype = 1 << 20, TUTTI_E_INVALID_ARG, "dtype");
    bad(&|c| c.geometry.layers = 0, TUTTI_E_INVALID_ARG, "layers");
    bad(&|c| c.geometry.head_dim = 0, TUTTI_E_INVALID_ARG, "head_dim");
    bad(&|c| c.host_lane_blocks = 1000, TUTTI_E_INVALID_ARG, "host_lane_blocks");
    bad(&|c| c.open_mode = TUTTI_OPEN_EXISTING, TUTTI_E_POOL, "pool");
    let dir = [0xffu8, 0xfe, 0];
    bad(&|c| c.emulated_dir = dir.as_ptr() as *const c_char, TUTTI_E_INVALID_ARG, "emulated_dir: not UTF-8");
    bad(
        &|c| {
            c.drives = TUTTI_DRIVES_VFIO;
            c.vfio_count = 0;
        },
        TUTTI_E_INVALID_ARG,
        "vfio_count",
    );
    bad(
        &|c| {
            c.drives = TUTTI_DRIVES_VFIO;
            c.vfio_count = 1;
        },
        TUTTI_E_NULL_POINTER,
        "vfio_bdfs is NULL",
    );
    let entries = [null::<c_char>()];
    bad(
        &|c| {
            c.drives = TUTTI_DRIVES_VFIO;
            c.vfio_count = 1;
            c.vfio_bdfs = entries.as_ptr();
        },
        TUTTI_E_NULL_POINTER,
        "vfio_bdfs[i] is NULL",
    );
    let bdf = [c"0000:ff:1f.7".as_ptr()];
    bad(
        &|c| {
            c.drives = TUTTI_DRIVES_VFIO;
            c.vfio_count = 1;
            c.vfio_bdfs = bdf.as_ptr();
            c.vfio_noiommu = 2;
        },
        TUTTI_E_INVALID_ARG,
        "vfio_noiommu",
    );
    // A drive that is not there: an I/O-level error that names it, not a crash.
    let mut c = config();
    c.drives = TUTTI_DRIVES_VFIO;
    c.vfio_count = 1;
    c.vfio_bdfs = bdf.as_ptr();
    let mut rt = null_mut();
    // SAFETY: valid config and out pointer.
    let code = unsafe { tutti_runtime_open(&c, &mut rt) };
    assert!(code < 0 && rt.is_null(), "{}: {}", name(code), last_error());
    assert!(last_error().contains("ff:1f.7"), "{}", last_error());
}

#[test]
fn handles_are_checked_and_destroy_is_idempotent_on_null() {
    let rt = Rt::open(&config());
    let bogus_rt = BOGUS as *mut tutti_runtime_t;
    let bogus_job = BOGUS as *mut tutti_job_t;
    let mut st = status();
    let mut hits = 0usize;
    let h = hashes(1, 0);
    // SAFETY: handles are live, NULL, or bogus tokens (which must be detected, never read).
    unsafe {
        expect(tutti_runtime_info(bogus_rt, null_mut()), TUTTI_E_BAD_HANDLE, "not a live tutti_runtime_t");
        expect(tutti_get_stats(null_mut(), null_mut()), TUTTI_E_NULL_POINTER, "tutti_runtime_t is NULL");
        expect(
            tutti_lookup(bogus_rt, h.as_ptr(), 1, 0, &mut hits, null_mut()),
            TUTTI_E_BAD_HANDLE,
            "runtime",
        );
        expect(tutti_unpin(bogus_rt, 1), TUTTI_E_BAD_HANDLE, "runtime");
        expect(tutti_unregister_kv(null_mut()), TUTTI_E_NULL_POINTER, "NULL");
        expect(tutti_register_kv(bogus_rt, null(), null_mut()), TUTTI_E_BAD_HANDLE, "runtime");
        expect(tutti_profile_request_begin(bogus_rt, 1, 1, 0), TUTTI_E_BAD_HANDLE, "runtime");
        expect(tutti_profile_layer_start(null_mut(), 1, 0), TUTTI_E_NULL_POINTER, "NULL");
        expect(tutti_job_poll(bogus_job, &mut st), TUTTI_E_BAD_HANDLE, "not a live tutti_job_t");
        expect(tutti_job_wait(null_mut(), 1, &mut st), TUTTI_E_NULL_POINTER, "tutti_job_t is NULL");
        expect(tutti_job_wait_layer(bogus_job, 0, 1, &mut st), TUTTI_E_BAD_HANDLE, "job");
        expect(tutti_job_layer_done(null_mut(), 0), TUTTI_E_NULL_POINTER, "job");
        expect(tutti_job_cancel(bogus_job), TUTTI_E_BAD_HANDLE, "job");
        expect(tutti_job_error(bogus_job, null_mut(), 0, null_mut()), TUTTI_E_BAD_HANDLE, "job");
        expect(tutti_job_destroy(bogus_job), TUTTI_E_BAD_HANDLE, "job");
        let mut job = null_mut();
        expect(tutti_store_submit(BOGUS as *mut _, 0, 1, &mut job), TUTTI_E_BAD_HANDLE, "tutti_store_t");
        expect(tutti_store_commit(null_mut(), null_mut()), TUTTI_E_NULL_POINTER, "tutti_store_t is NULL");
        expect(tutti_store_destroy(BOGUS as *mut _), TUTTI_E_BAD_HANDLE, "store");
        // A runtime passed where a job belongs (and the reverse) is refused.
        expect(tutti_job_poll(rt.0 as *mut tutti_job_t, &mut st), TUTTI_E_BAD_HANDLE, "tutti_job_t");
        ok(tutti_job_destroy(null_mut()));
        ok(tutti_store_destroy(null_mut()));
        ok(tutti_runtime_close(null_mut()));
        let second = Rt::open(&config());
        ok(tutti_runtime_close(second.0));
        expect(tutti_runtime_close(second.0), TUTTI_E_BAD_HANDLE, "tutti_runtime_t");
        expect(tutti_get_stats(second.0, null_mut()), TUTTI_E_BAD_HANDLE, "tutti_runtime_t");
    }
}

#[test]
fn out_structs_are_size_checked_and_alignment_checked() {
    let rt = Rt::open(&config());
    // SAFETY: pointers to live values, a deliberately short struct_size, or a misaligned pointer.
    unsafe {
        let mut s: tutti_stats_t = std::mem::zeroed();
        expect(tutti_get_stats(rt.0, &mut s), TUTTI_E_STRUCT_SIZE, "tutti_stats_t.struct_size is 0");
        s.struct_size = std::mem::size_of::<tutti_stats_t>() as u32;
        ok(tutti_get_stats(rt.0, &mut s));
        assert_eq!(s.struct_size, std::mem::size_of::<tutti_stats_t>() as u32);
        assert!(s.files > 0 && s.files_free == s.files && s.jobs == 0, "{s:?}");
        let mut i: tutti_runtime_info_t = std::mem::zeroed();
        i.struct_size = 12;
        expect(
            tutti_runtime_info(rt.0, &mut i),
            TUTTI_E_STRUCT_SIZE,
            "tutti_runtime_info_t.struct_size is 12",
        );
        i.struct_size = std::mem::size_of::<tutti_runtime_info_t>() as u32;
        ok(tutti_runtime_info(rt.0, &mut i));
        assert_eq!((i.drives, i.object_bytes, i.geometry.layers), (2, OBJ as u64, LAYERS));
        assert_eq!(i.executor, TUTTI_EXECUTOR_GIO_HOST);
        assert_ne!(i.pool_id, [0; 16]);
        let mut raw = vec![0u64; 40];
        let odd = (raw.as_mut_ptr() as *mut u8).add(1) as *mut tutti_stats_t;
        expect(tutti_get_stats(rt.0, odd), TUTTI_E_INVALID_ARG, "not aligned");
    }
}

#[test]
fn register_kv_rejects_each_bad_field() {
    let rt = Rt::open(&config());
    let num_blocks = 4u32;
    let per_layer = 2 * num_blocks as usize * OBJ;
    let mem = Mem::new(per_layer * LAYERS as usize);
    let bases: Vec<u64> = (0..LAYERS as u64).map(|l| mem.addr() + l * per_layer as u64).collect();
    let good = || {
        let mut l = layout(TUTTI_LAYOUT_VLLM_PER_LAYER, num_blocks);
        l.num_layers = LAYERS;
        l.k_bases = bases.as_ptr();
        l
    };
    let odd_bases: Vec<u64> = bases.iter().map(|b| b + 2).collect();
    let salt = [1u8; 8];
    let bad = |f: &dyn Fn(&mut tutti_kv_layout_t), code: i32, needle: &str| {
        let mut l = good();
        f(&mut l);
        // SAFETY: the layout's pointers are valid or deliberately wrong in the checked way.
        expect(unsafe { tutti_register_kv(rt.0, &l, null_mut()) }, code, needle);
    };
    // SAFETY: deliberately NULL.
    expect(
        unsafe { tutti_register_kv(rt.0, null(), null_mut()) },
        TUTTI_E_NULL_POINTER,
        "tutti_kv_layout_t is NULL",
    );
    bad(&|l| l.struct_size = 0, TUTTI_E_STRUCT_SIZE, "tutti_kv_layout_t.struct_size");
    bad(&|l| l.kind = 0, TUTTI_E_INVALID_ARG, "kind");
    bad(&|l| l.memory = 0, TUTTI_E_INVALID_ARG, "memory");
    bad(&|l| l.memory = TUTTI_MEMORY_CUDA, TUTTI_E_UNSUPPORTED, "CUDA");
    bad(&|l| l.model = null(), TUTTI_E_NULL_POINTER, "model is NULL");
    bad(&|l| l.model = c"".as_ptr(), TUTTI_E_INVALID_ARG, "model");
    bad(&|l| l.num_blocks = 0, TUTTI_E_INVALID_ARG, "num_blocks");
    bad(&|l| l.num_layers = 3, TUTTI_E_INVALID_ARG, "num_layers");
    bad(&|l| l.k_bases = null(), TUTTI_E_NULL_POINTER, "k_bases is NULL");
    bad(&|l| l.k_bases = odd_bases.as_ptr(), TUTTI_E_INVALID_ARG, "aligned");
    bad(&|l| l.v_bases = bases.as_ptr(), TUTTI_E_INVALID_ARG, "v_bases");
    bad(&|l| l.base = 4096, TUTTI_E_INVALID_ARG, "base");
    bad(&|l| l.block_stride = 4096, TUTTI_E_INVALID_ARG, "block_stride");
    bad(&|l| l.tenant_salt_len = 4, TUTTI_E_NULL_POINTER, "tenant_salt is NULL");
    bad(
        &|l| {
            l.tenant_salt = salt.as_ptr();
            l.tenant_salt_len = 1 << 20;
        },
        TUTTI_E_INVALID_ARG,
        "tenant_salt",
    );
    // Two layers on the same memory overlap.
    let same: Vec<u64> = vec![mem.addr(); LAYERS as usize];
    bad(&|l| l.k_bases = same.as_ptr(), TUTTI_E_INVALID_ARG, "layer");
    bad(
        &|l| {
            l.kind = TUTTI_LAYOUT_CONTIGUOUS;
            l.num_layers = 0;
            l.k_bases = null();
            l.base = 0;
        },
        TUTTI_E_INVALID_ARG,
        "null address",
    );
    bad(
        &|l| {
            l.kind = TUTTI_LAYOUT_STRIDED;
            l.block_stride = OBJ as u64;
        },
        TUTTI_E_NULL_POINTER,
        "v_bases is NULL",
    );
    // SAFETY: a plain-data C struct of integers, for which all-zero bytes are a valid value.
    let mut sizes: tutti_table_sizes_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid layout; a zero struct_size in the optional out struct is refused.
    expect(
        unsafe { tutti_register_kv(rt.0, &good(), &mut sizes) },
        TUTTI_E_STRUCT_SIZE,
        "tutti_table_sizes_t",
    );
    sizes.struct_size = std::mem::size_of::<tutti_table_sizes_t>() as u32;
    // SAFETY: valid layout over `mem`, which outlives the runtime's use of it (unregistered below).
    unsafe {
        ok(tutti_register_kv(rt.0, &good(), &mut sizes));
        assert_eq!(sizes.descriptors % (num_blocks as u64 * LAYERS as u64 * 2), 0);
        assert!(sizes.sgl_bytes > 0 && sizes.tables == 1, "{sizes:?}");
        ok(tutti_unregister_kv(rt.0));
    }
}

#[test]
fn hashes_lookup_and_pins_validate_their_arguments() {
    let rt = Rt::open(&config());
    let tokens: Vec<u32> = (0..40).collect();
    let mut out = [tutti_hash_t::default(); 2];
    let mut n = 0usize;
    let mut hits = 0usize;
    let mut pin = 0u64;
    // SAFETY: buffers as described, or deliberately NULL / too small.
    unsafe {
        expect(
            tutti_chain_hashes(tokens.as_ptr(), 40, TPB, null(), out.as_mut_ptr(), 2, null_mut()),
            TUTTI_E_NULL_POINTER,
            "out_count",
        );
        expect(
            tutti_chain_hashes(null(), 40, TPB, null(), out.as_mut_ptr(), 2, &mut n),
            TUTTI_E_NULL_POINTER,
            "tokens is NULL",
        );
        expect(
            tutti_chain_hashes(tokens.as_ptr(), 40, TPB, null(), null_mut(), 2, &mut n),
            TUTTI_E_NULL_POINTER,
            "out is NULL",
        );
        expect(
            tutti_chain_hashes(tokens.as_ptr(), 40, TPB, null(), out.as_mut_ptr(), 1, &mut n),
            TUTTI_E_BUFFER_TOO_SMALL,
            "needed",
        );
        assert_eq!(n, 2);
        expect(
            tutti_chain_hashes(tokens.as_ptr(), usize::MAX, TPB, null(), out.as_mut_ptr(), 2, &mut n),
            TUTTI_E_INVALID_ARG,
            "one call accepts",
        );
        ok(tutti_chain_hashes(null(), 0, TPB, null(), null_mut(), 0, &mut n));
        assert_eq!(n, 0, "no tokens, no hashes");
        ok(tutti_chain_hashes(tokens.as_ptr(), 40, TPB, null(), out.as_mut_ptr(), 2, &mut n));
        assert_ne!(out[0], out[1]);
        let mut again = [tutti_hash_t::default(); 2];
        ok(tutti_chain_hashes(tokens.as_ptr(), 32, TPB, null(), again.as_mut_ptr(), 2, &mut n));
        assert_eq!(again, out, "deterministic, and the partial chunk was ignored");
        // The same chain as the object store's helper, byte for byte.
        let reference = tutti_objstore::chain_hashes(&tokens, TPB);
        assert_eq!(out[1].bytes, reference[1].to_bytes());

        expect(
            tutti_lookup(rt.0, out.as_ptr(), 2, 0, &mut hits, null_mut()),
            TUTTI_E_NOT_REGISTERED,
            "registered",
        );
        let per_layer = 2 * 4 * OBJ;
        let mem = Mem::new(per_layer * LAYERS as usize);
        let bases: Vec<u64> = (0..LAYERS as u64).map(|l| mem.addr() + l * per_layer as u64).collect();
        let mut l = layout(TUTTI_LAYOUT_VLLM_PER_LAYER, 4);
        l.num_layers = LAYERS;
        l.k_bases = bases.as_ptr();
        ok(tutti_register_kv(rt.0, &l, null_mut()));
        expect(
            tutti_lookup(rt.0, null(), 2, 0, &mut hits, null_mut()),
            TUTTI_E_NULL_POINTER,
            "hashes is NULL",
        );
        expect(
            tutti_lookup(rt.0, out.as_ptr(), 2, 0, null_mut(), null_mut()),
            TUTTI_E_NULL_POINTER,
            "out_hits",
        );
        expect(tutti_lookup(rt.0, out.as_ptr(), 2, 2, &mut hits, &mut pin), TUTTI_E_INVALID_ARG, "flags");
        expect(
            tutti_lookup(rt.0, out.as_ptr(), 2, TUTTI_LOOKUP_PIN, &mut hits, null_mut()),
            TUTTI_E_NULL_POINTER,
            "out_pin",
        );
        expect(
            tutti_lookup(rt.0, out.as_ptr(), 1 << 30, 0, &mut hits, null_mut()),
            TUTTI_E_INVALID_ARG,
            "hashes",
        );
        ok(tutti_lookup(rt.0, null(), 0, TUTTI_LOOKUP_PIN, &mut hits, &mut pin));
        assert_eq!((hits, pin), (0, 0));
        ok(tutti_unpin(rt.0, 0));
        expect(tutti_unpin(rt.0, 12345), TUTTI_E_NOT_FOUND, "unknown pin 12345");
        ok(tutti_unregister_kv(rt.0));
    }
}
