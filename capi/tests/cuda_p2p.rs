//! CUDA KV memory peer to peer through GDRCopy, through the C ABI:
//! `TUTTI_EXECUTOR_GIO_CUDA` on the stand-in libcuda.so, whose stand-in
//! gdrapi (`TUTTI_GDRAPI` = the same library) pins the KV tensors' GPU pages
//! and maps them a second time, as BAR1 is a second view of GPU memory. The
//! drives' DMA goes into that mapping: `tutti_data_path` reports P2P with
//! provider `gdrcopy`, no byte goes through a staging slot, and every byte
//! stored and loaded is checked through the device pointer (cuMemcpyDtoH).
//! Unregistering leaves no pin and no mapping, and the stand-in saw no
//! violation (no pinned memory freed). Without a usable gdrapi (an injected
//! `gdr_pin_buffer` failure, a library that is not there) the data path is
//! staged, naming why, and round trips all the same; `TUTTI_P2P=require`
//! turns that into an error. One test: it sets the environment before any
//! other thread runs. Skips (with the reason; under CI=true fails) without
//! NVRTC.

// Test code: a panic is how a test fails (the shared fixtures expect() too).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../tests/support/skip.rs"]
mod skip;

mod common;

use common::device::DeviceMem;
use common::*;
use cudarc::driver::sys::CUresult;
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

fn data_path(rt: &Rt) -> (tutti_data_path_t, String, String) {
    // SAFETY: all-zero bytes are a valid tutti_data_path_t.
    let mut d: tutti_data_path_t = unsafe { std::mem::zeroed() };
    d.struct_size = size_of::<tutti_data_path_t>() as u32;
    // SAFETY: a live handle and a writable struct.
    ok(unsafe { tutti_data_path(rt.0, &mut d) });
    let text = |b: &[std::ffi::c_char]| {
        let v: Vec<u8> = b.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        String::from_utf8_lossy(&v).into_owned()
    };
    let (missing, provider) = (text(&d.p2p_missing), text(&d.p2p_provider));
    (d, missing, provider)
}

/// Stores chunks from blocks 0..3 (the mirror's bytes), zeroes the device memory, loads
/// them into blocks 5, 4, 3 and checks every byte through the device pointer.
fn round_trip(rt: &Rt, dev: &DeviceMem, mirror: &mut Mem, salt: u32) {
    dev.write(mirror);
    let keys = hashes(3, salt);
    let rep = store_all(rt, &keys, &[0, 1, 2]);
    assert_eq!((rep.stored, rep.failed), (3, 0));
    dev.zero();
    let st = load_all(rt, &keys, &[5, 4, 3]);
    assert_eq!((st.done, st.failed), (1, 0));
    let mut back = dev.read();
    for (i, b) in [5usize, 4, 3].into_iter().enumerate() {
        assert!(
            block_bytes(&mut back, b, BLOCKS) == block_bytes(mirror, i, BLOCKS),
            "chunk {i} in block {b}: every byte"
        );
    }
}

#[test]
fn cuda_kv_memory_goes_peer_to_peer_through_gdrcopy_and_falls_back_to_staging() {
    if let Err(e) = tutti_kernels::nvrtc::load() {
        skip::skip(format!("{e} (scripts/nvrtc-check --install installs the NVRTC wheel)"));
        return;
    }
    let standin = tutti_cuda_standin::control::Standin::load().expect("the stand-in libcuda.so");
    let lib = standin.path.to_str().unwrap().to_string();
    // No other thread runs yet in this test binary (one test): nothing reads the
    // environment concurrently.
    std::env::set_var("TUTTI_GDRAPI", &lib);
    std::env::remove_var("TUTTI_P2P");
    let driver = CString::new(lib.clone()).unwrap();
    let mut cfg = config();
    cfg.executor = TUTTI_EXECUTOR_GIO_CUDA;
    cfg.cuda_driver = driver.as_ptr();
    cfg.cuda_sm_count = 1;
    cfg.cuda_block_threads = 32;
    cfg.staging_slots = 8;
    let rt = Rt::open(&cfg);

    let len = 2 * BLOCKS as usize * OBJ * LAYERS as usize;
    assert!(len >= 64 << 10, "the KV memory spans whole GPU pages of a memfd-backed allocation");
    let mut mirror = Mem::new(len);
    for (i, b) in mirror.bytes().iter_mut().enumerate() {
        *b = ((i % 241) as u8).wrapping_add(5);
    }
    let dev = DeviceMem::new(len);

    // P2P: the drives DMA through the GDRCopy mapping.
    ok(register(&rt, dev.ptr));
    let (d, missing, provider) = data_path(&rt);
    assert_eq!((d.mode, d.memory), (TUTTI_DATA_PATH_P2P, TUTTI_MEMORY_CUDA), "{missing}");
    assert_eq!(provider, "gdrcopy");
    assert!(missing.is_empty(), "{missing}");
    assert!(standin.stat("gdr_pins", 0).unwrap() >= 1);
    assert!(standin.stat("gdr_maps", 0).unwrap() >= 1);
    round_trip(&rt, &dev, &mut mirror, 21);
    let (d, _, _) = data_path(&rt);
    assert_eq!(d.staged_bytes, 0, "no byte went through a staging slot");
    // Unregistered: nothing pinned or mapped any more.
    // SAFETY: a live handle.
    ok(unsafe { tutti_kv_unregister(rt.0) });
    assert_eq!((standin.stat("gdr_pins", 0).unwrap(), standin.stat("gdr_maps", 0).unwrap()), (0, 0));

    // The pin refused (as gdrdrv refuses memory it cannot pin): staged, naming the call.
    standin.fail("gdr_pin_buffer", 0, 1, CUresult::CUDA_ERROR_INVALID_VALUE).unwrap();
    ok(register(&rt, dev.ptr));
    let (d, missing, provider) = data_path(&rt);
    assert_eq!((d.mode, d.memory), (TUTTI_DATA_PATH_STAGED, TUTTI_MEMORY_CUDA), "{missing}");
    assert!(missing.contains("gdr_pin_buffer"), "{missing}");
    assert!(provider.is_empty(), "{provider}");
    round_trip(&rt, &dev, &mut mirror, 22);
    let (d, _, _) = data_path(&rt);
    assert!(d.staged_bytes > 0, "moved through staging slots");
    // SAFETY: a live handle.
    ok(unsafe { tutti_kv_unregister(rt.0) });

    // No gdrapi at all: staged, naming the library; TUTTI_P2P=require refuses instead.
    // This test's thread alone reads these variables (at registration).
    std::env::set_var("TUTTI_GDRAPI", "/nonexistent/libgdrapi.so.2");
    ok(register(&rt, dev.ptr));
    let (d, missing, _) = data_path(&rt);
    assert_eq!(d.mode, TUTTI_DATA_PATH_STAGED);
    assert!(missing.contains("cannot load /nonexistent/libgdrapi.so.2"), "{missing}");
    assert!(missing.contains("CUDA memory"), "{missing}");
    round_trip(&rt, &dev, &mut mirror, 23);
    // SAFETY: a live handle.
    ok(unsafe { tutti_kv_unregister(rt.0) });
    std::env::set_var("TUTTI_P2P", "require");
    expect(register(&rt, dev.ptr), TUTTI_E_INVALID_ARG, "TUTTI_P2P=require");
    std::env::set_var("TUTTI_P2P", "off");
    std::env::set_var("TUTTI_GDRAPI", &lib);
    ok(register(&rt, dev.ptr));
    let (d, missing, _) = data_path(&rt);
    assert_eq!(d.mode, TUTTI_DATA_PATH_STAGED);
    assert!(missing.contains("TUTTI_P2P=off"), "{missing}");
    assert_eq!(standin.stat("gdr_pins", 0).unwrap(), 0, "off: nothing pinned");
    // SAFETY: a live handle.
    ok(unsafe { tutti_kv_unregister(rt.0) });
    drop(rt);
    assert!(standin.violations().is_empty(), "{:?}", standin.violations());
}
