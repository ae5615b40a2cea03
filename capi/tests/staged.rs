//! The staged data path through the C ABI: host memory registered as
//! `TUTTI_MEMORY_HOST_STAGED` (never mapped for the drives) round trips byte
//! for byte and `tutti_data_path` says it is staged and why; CUDA memory and
//! the CUDA executor fail with clear statuses where they cannot work.

// Test code: a panic is how a test fails (the shared fixtures expect() too).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::mem::{offset_of, size_of};
use std::ptr;
use tutti::*;

const BLOCKS: u32 = 6;

fn data_path(rt: &Rt) -> tutti_data_path_t {
    // SAFETY: all-zero bytes are a valid tutti_data_path_t (integers and bytes).
    let mut d: tutti_data_path_t = unsafe { std::mem::zeroed() };
    d.struct_size = size_of::<tutti_data_path_t>() as u32;
    // SAFETY: a live handle and a writable struct.
    ok(unsafe { tutti_data_path(rt.0, &mut d) });
    d
}

fn reason(d: &tutti_data_path_t) -> String {
    let bytes: Vec<u8> = d.p2p_missing.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Registers `mem` per layer with memory kind `memory`; returns the status.
fn register(rt: &Rt, mem: &Mem, memory: u32) -> i32 {
    let per_layer = 2 * BLOCKS as u64 * OBJ as u64;
    let bases: Vec<u64> = (0..LAYERS as u64).map(|l| mem.addr() + l * per_layer).collect();
    let mut l = layout(TUTTI_LAYOUT_VLLM_PER_LAYER, BLOCKS);
    l.num_layers = LAYERS;
    l.k_bases = bases.as_ptr();
    l.memory = memory;
    // SAFETY: `mem` holds every object and outlives the runtime's registration.
    unsafe { tutti_register_kv(rt.0, &l, ptr::null_mut()) }
}

fn filled() -> Mem {
    let mut mem = Mem::new(2 * BLOCKS as usize * OBJ * LAYERS as usize);
    for (i, b) in mem.bytes().iter_mut().enumerate() {
        *b = ((i % 241) as u8).wrapping_add(17);
    }
    mem
}

#[test]
fn host_staged_memory_round_trips_and_reports_the_staged_path() {
    let mut cfg = config();
    cfg.staging_slots = 4;
    let rt = Rt::open(&cfg);
    assert_eq!(data_path(&rt).mode, TUTTI_DATA_PATH_NONE);
    let mut mem = filled();
    ok(register(&rt, &mem, TUTTI_MEMORY_HOST_STAGED));
    let keys = hashes(3, 5);
    let want: Vec<Vec<u8>> = (0..3).map(|b| block_bytes(&mut mem, b, BLOCKS)).collect();
    let rep = store_all(&rt, &keys, &[0, 1, 2]);
    assert_eq!((rep.stored, rep.failed), (3, 0));
    mem.bytes().fill(0);
    let st = load_all(&rt, &keys, &[5, 4, 3]);
    assert_eq!((st.done, st.failed), (1, 0));
    for (i, b) in [5usize, 4, 3].into_iter().enumerate() {
        assert!(block_bytes(&mut mem, b, BLOCKS) == want[i], "chunk {i} in block {b}: every byte");
    }
    let d = data_path(&rt);
    assert_eq!((d.mode, d.memory, d.staging_slots), (TUTTI_DATA_PATH_STAGED, TUTTI_MEMORY_HOST_STAGED, 4));
    assert_eq!(d.staged_bytes, 2 * 3 * (2 * LAYERS as u64 * OBJ as u64), "stored and loaded through slots");
    assert!(reason(&d).contains("not DMA-mappable"), "{}", reason(&d));

    // The same memory registered as plain host memory is direct.
    // SAFETY: a live handle.
    ok(unsafe { tutti_unregister_kv(rt.0) });
    ok(register(&rt, &mem, TUTTI_MEMORY_HOST));
    let d = data_path(&rt);
    assert_eq!(
        (d.mode, d.memory, d.staging_slots, reason(&d)),
        (TUTTI_DATA_PATH_DIRECT, TUTTI_MEMORY_HOST, 0, String::new())
    );
}

#[test]
fn memory_an_executor_cannot_move_is_refused_with_the_reason() {
    let mem = filled();
    // The direct backend cannot stage.
    let mut cfg = config();
    cfg.executor = TUTTI_EXECUTOR_DIRECT;
    let rt = Rt::open(&cfg);
    expect(register(&rt, &mem, TUTTI_MEMORY_HOST_STAGED), TUTTI_E_INVALID_ARG, "direct backend cannot run");
    expect(register(&rt, &mem, TUTTI_MEMORY_CUDA), TUTTI_E_UNSUPPORTED, "needs TUTTI_EXECUTOR_GIO_CUDA");
    assert_eq!(data_path(&rt).mode, TUTTI_DATA_PATH_NONE, "nothing was registered");
    // Nor can the host executor address CUDA memory.
    let rt = Rt::open(&config());
    expect(register(&rt, &mem, TUTTI_MEMORY_CUDA), TUTTI_E_UNSUPPORTED, "TUTTI_EXECUTOR_GIO_HOST");
    expect(register(&rt, &mem, 5), TUTTI_E_INVALID_ARG, "not a TUTTI_MEMORY_* value (1..=4)");
}

#[test]
fn the_cuda_executor_without_a_driver_is_unsupported_naming_why() {
    let mut cfg = config();
    cfg.executor = TUTTI_EXECUTOR_GIO_CUDA;
    let mut rt = ptr::null_mut();
    // SAFETY: valid config and out pointer.
    let code = unsafe { tutti_runtime_open(&cfg, &mut rt) };
    if code == TUTTI_OK {
        // A machine with a GPU: the executor runs, and host-staged memory goes through it.
        let rt = Rt(rt);
        let mem = filled();
        ok(register(&rt, &mem, TUTTI_MEMORY_HOST_STAGED));
        assert_eq!(data_path(&rt).mode, TUTTI_DATA_PATH_STAGED);
        return;
    }
    expect(code, TUTTI_E_UNSUPPORTED, "no CUDA");
    assert!(rt.is_null());
    // A driver library that is not there is named.
    cfg.cuda_driver = c"/nonexistent/libcuda.so".as_ptr();
    // SAFETY: as above.
    expect(unsafe { tutti_runtime_open(&cfg, &mut rt) }, TUTTI_E_UNSUPPORTED, "/nonexistent/libcuda.so");
    cfg.cuda_driver = ptr::null();
    cfg.cuda_block_threads = 48;
    // SAFETY: as above.
    expect(unsafe { tutti_runtime_open(&cfg, &mut rt) }, TUTTI_E_INVALID_ARG, "cuda_block_threads");
}

#[test]
fn a_runtime_config_of_abi_1_3_is_still_accepted() {
    let mut cfg = config();
    cfg.struct_size = offset_of!(tutti_runtime_config_t, cuda_device) as u32;
    // What the 1.3 struct had as tail padding (and anything after it) is never read.
    cfg.rsvd0 = 0xdead_beef;
    cfg.executor = TUTTI_EXECUTOR_GIO_HOST;
    cfg.staging_slots = 1 << 30;
    let rt = Rt::open(&cfg);
    let mem = filled();
    ok(register(&rt, &mem, TUTTI_MEMORY_HOST_STAGED));
    assert_eq!(data_path(&rt).staging_slots, 256, "the default, not the bytes past struct_size");
    cfg.struct_size = offset_of!(tutti_runtime_config_t, cuda_device) as u32 + 4;
    let mut h = ptr::null_mut();
    // SAFETY: valid config and out pointer.
    expect(unsafe { tutti_runtime_open(&cfg, &mut h) }, TUTTI_E_STRUCT_SIZE, "tutti_runtime_config_t");
    cfg.struct_size = size_of::<tutti_runtime_config_t>() as u32;
    // SAFETY: as above.
    expect(unsafe { tutti_runtime_open(&cfg, &mut h) }, TUTTI_E_INVALID_ARG, "staging_slots");
}
