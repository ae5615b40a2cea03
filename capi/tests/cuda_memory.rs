//! CUDA KV memory through the C ABI: `TUTTI_EXECUTOR_GIO_CUDA` with a driver
//! library path (here the workspace's stand-in libcuda.so, whose device memory
//! the drives cannot reach), `TUTTI_MEMORY_CUDA` registered on the staged
//! path, stored and loaded back byte for byte, `tutti_data_path` naming the
//! path and what P2P lacks. Skips (with the reason; under CI=true fails)
//! without NVRTC.

// Test code: a panic is how a test fails (the shared fixtures expect() too).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../tests/support/skip.rs"]
mod skip;

mod common;

use common::device::DeviceMem;
use common::*;
use std::ffi::CString;
use std::mem::size_of;
use std::ptr;
use tutti::*;

const BLOCKS: u32 = 6;

fn register(rt: &Rt, base: u64) -> i32 {
    let per_layer = 2 * BLOCKS as u64 * OBJ as u64;
    let bases: Vec<u64> = (0..LAYERS as u64).map(|l| base + l * per_layer).collect();
    let mut l = layout(TUTTI_LAYOUT_VLLM_PER_LAYER, BLOCKS);
    l.num_layers = LAYERS;
    l.k_bases = bases.as_ptr();
    l.memory = TUTTI_MEMORY_CUDA;
    // SAFETY: the device memory holds every object and outlives the registration.
    unsafe { tutti_register_kv(rt.0, &l, ptr::null_mut()) }
}

#[test]
fn cuda_kv_memory_round_trips_on_the_staged_path() {
    if let Err(e) = tutti_kernels::nvrtc::load() {
        skip::skip(format!("{e} (scripts/nvrtc-check --install installs the NVRTC wheel)"));
        return;
    }
    let driver = tutti_cuda_standin::control::library_path().expect("the stand-in libcuda.so");
    let driver = CString::new(driver.to_str().unwrap()).unwrap();
    let mut cfg = config();
    cfg.executor = TUTTI_EXECUTOR_GIO_CUDA;
    cfg.cuda_driver = driver.as_ptr();
    cfg.cuda_sm_count = 1;
    cfg.cuda_block_threads = 32;
    cfg.staging_slots = 8;
    let rt = Rt::open(&cfg);

    let len = 2 * BLOCKS as usize * OBJ * LAYERS as usize;
    let mut mirror = Mem::new(len);
    for (i, b) in mirror.bytes().iter_mut().enumerate() {
        *b = ((i % 239) as u8).wrapping_add(3);
    }
    let dev = DeviceMem::new(len);
    dev.write(&mirror);
    ok(register(&rt, dev.ptr));
    let keys = hashes(3, 9);
    let rep = store_all(&rt, &keys, &[0, 1, 2]);
    assert_eq!((rep.stored, rep.failed), (3, 0));
    dev.zero();
    let st = load_all(&rt, &keys, &[5, 4, 3]);
    assert_eq!((st.done, st.failed), (1, 0));
    let mut back = dev.read();
    for (i, b) in [5usize, 4, 3].into_iter().enumerate() {
        assert!(
            block_bytes(&mut back, b, BLOCKS) == block_bytes(&mut mirror, i, BLOCKS),
            "chunk {i} in block {b}: every byte"
        );
    }
    // SAFETY: all-zero bytes are a valid tutti_data_path_t.
    let mut d: tutti_data_path_t = unsafe { std::mem::zeroed() };
    d.struct_size = size_of::<tutti_data_path_t>() as u32;
    // SAFETY: a live handle and a writable struct.
    ok(unsafe { tutti_data_path(rt.0, &mut d) });
    assert_eq!((d.mode, d.memory, d.staging_slots), (TUTTI_DATA_PATH_STAGED, TUTTI_MEMORY_CUDA, 8));
    assert_eq!(d.staged_bytes, 2 * 3 * (2 * LAYERS as u64 * OBJ as u64), "stored and loaded through slots");
    let why: Vec<u8> = d.p2p_missing.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    assert!(String::from_utf8_lossy(&why).contains("CUDA memory"), "{}", String::from_utf8_lossy(&why));
}
