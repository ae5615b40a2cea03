//! Issue 14 defect 7 (the part a host can show): `enqueue_wait` runs on an
//! engine's stream, which belongs to the engine's context, not the
//! executor's. A function from `cuModuleGetFunction` belongs to the context
//! it was loaded in; a kernel from `cuLibraryGetKernel` to none. (The
//! defect's fences cannot be shown on x86: kernels/tests/sass.rs checks them.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod executor_common;

use cudarc::driver::sys;
use executor_common::*;
use std::time::{Duration, Instant};
use tutti_gio_uring::ExecMode;

#[test]
fn enqueue_wait_runs_on_another_contexts_stream() {
    let _g = serial();
    let Some((s, path)) = standin() else { return };
    let rig = rig(config(&path, ExecMode::Launch), opts());
    round_trip(&rig, 8, 11);
    // The engine: the device's primary context, a stream of its own, and pinned
    // memory for the ids, the sequence numbers and the result.
    let ok = sys::CUresult::CUDA_SUCCESS;
    // SAFETY: the stand-in is loaded; plain driver calls with valid out pointers.
    let (primary, stream, host, dev) = unsafe {
        assert_eq!(sys::cuInit(0), ok);
        let mut p: sys::CUcontext = std::ptr::null_mut();
        assert_eq!(sys::cuDevicePrimaryCtxRetain(&mut p, 0), ok);
        assert_eq!(sys::cuCtxPushCurrent_v2(p), ok);
        let mut st: sys::CUstream = std::ptr::null_mut();
        assert_eq!(sys::cuStreamCreate(&mut st, sys::CUstream_flags_enum::CU_STREAM_NON_BLOCKING as u32), ok);
        let mut h: *mut std::ffi::c_void = std::ptr::null_mut();
        assert_eq!(
            sys::cuMemHostAlloc(&mut h, 64, sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE),
            ok
        );
        let mut d: sys::CUdeviceptr = 0;
        assert_eq!(sys::cuMemHostGetDevicePointer_v2(&mut d, h, 0), ok);
        (p, st, h.cast::<u32>(), d)
    };
    // Two IOCBs (0 and 1) at issue 0, which both have reached (done_seq starts at 0).
    // SAFETY: 64 bytes of pinned memory: ids at 0, seqs at 8, done at 16.
    unsafe {
        host.write(0);
        host.add(1).write(1);
        host.add(2).write(0);
        host.add(3).write(0);
        host.add(4).write(0);
    }
    // SAFETY: the stream is of a context on the executor's device; the addresses are
    // mapped pinned memory that outlives the kernel (the stream is drained below).
    unsafe { rig.exec.enqueue_wait(stream, dev, dev + 8, 2, Duration::from_secs(5), dev + 16) }
        .expect("tt_gio_wait enqueued on the engine's stream");
    let t = Instant::now();
    // SAFETY: a live stream.
    while unsafe { sys::cuStreamQuery(stream) } != ok {
        assert!(t.elapsed() < Duration::from_secs(20), "the engine's stream never drained");
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: the kernel finished; the word is ours again.
    assert_eq!(unsafe { std::ptr::read_volatile(host.add(4)) }, 2);
    // SAFETY: created above, idle.
    unsafe {
        assert_eq!(sys::cuStreamDestroy_v2(stream), ok);
        assert_eq!(sys::cuMemFreeHost(host.cast()), ok);
        let mut popped: sys::CUcontext = std::ptr::null_mut();
        assert_eq!(sys::cuCtxPopCurrent_v2(&mut popped), ok);
        assert_eq!(popped, primary);
        sys::cuDevicePrimaryCtxRelease_v2(0);
    }
    drop(rig);
    let v = s.violations();
    assert!(v.is_empty(), "stand-in violations: {v:?}");
}
