//! Failure injection: after `skip` calls of a named function the next
//! `count` return the armed code; `cuMemHostRegister_v2:IOMEMORY` matches
//! only registrations of device registers (IOMEMORY).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod standin_common;

use cudarc::driver::sys::{self, CUresult};
use standin_common::*;

fn alloc() -> CUresult {
    let mut p = 0u64;
    // SAFETY: valid out pointer; a context is current.
    let rc = unsafe { sys::cuMemAlloc_v2(&mut p, 64) };
    if rc == CUresult::CUDA_SUCCESS {
        // SAFETY: just allocated, nothing running.
        ok(unsafe { sys::cuMemFree_v2(p) });
    }
    rc
}

#[test]
fn a_named_call_fails_after_skip_calls_for_count_calls() {
    let Some(env) = env() else { return };
    primary();
    env.standin.fail("cuMemAlloc_v2", 1, 2, CUresult::CUDA_ERROR_OUT_OF_MEMORY).unwrap();
    let got: Vec<CUresult> = (0..4).map(|_| alloc()).collect();
    use CUresult::*;
    assert_eq!(got, [CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS]);
    assert!(env.standin.last_error().contains("injected"), "{}", env.standin.last_error());
}

#[test]
fn iomemory_failures_hit_only_doorbell_registrations() {
    let Some(env) = env() else { return };
    primary();
    env.standin.fail("cuMemHostRegister_v2:IOMEMORY", 0, 1, CUresult::CUDA_ERROR_NOT_SUPPORTED).unwrap();
    let page = vec![0u8; 3 * 4096];
    let base = (page.as_ptr() as usize).next_multiple_of(4096);
    let register = |flags: u32| -> CUresult {
        // SAFETY: a page of `page`, alive for the test and unregistered below.
        unsafe { sys::cuMemHostRegister_v2(base as *mut _, 4096, flags) }
    };
    let unregister = || {
        // SAFETY: registered just before.
        ok(unsafe { sys::cuMemHostUnregister(base as *mut _) })
    };
    ok(register(sys::CU_MEMHOSTREGISTER_DEVICEMAP));
    unregister();
    let io = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_IOMEMORY;
    assert_eq!(register(io), CUresult::CUDA_ERROR_NOT_SUPPORTED);
    ok(register(io));
    let mut dev = 0u64;
    // SAFETY: a registered range, valid out pointer.
    ok(unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, base as *mut _, 0) });
    assert_eq!(dev, base as u64);
    unregister();
    // SAFETY: no longer registered: the driver only looks the address up.
    let again = unsafe { sys::cuMemHostUnregister(base as *mut _) };
    assert_eq!(again, CUresult::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
}
