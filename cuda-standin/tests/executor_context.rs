//! Issue 14 defect 4: a green context may be current on one thread at a
//! time, and the executor is called from any thread; a call must also leave
//! the caller's own context current. The stand-in keeps a context stack per
//! thread and records a green context current on two threads as a violation.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod executor_common;

use cudarc::driver::sys;
use executor_common::*;
use tutti_gio_uring::ExecMode;

#[test]
fn two_threads_use_one_green_context_executor() {
    let _g = serial();
    let Some((s, path)) = standin() else { return };
    let rig = rig(config(&path, ExecMode::Launch), opts());
    std::thread::scope(|sc| {
        for t in 0..2u64 {
            let rig = &rig;
            sc.spawn(move || {
                for k in 0..4 {
                    // Each thread on its own LBAs.
                    round_trip_at(rig, 8, 100 * t + k, 4096 * (t + 1));
                    // Reads device memory through the copy stream.
                    assert!(!rig.ring.queue_stats().unwrap().is_empty());
                }
            });
        }
    });
    drop(rig);
    let v = s.violations();
    assert!(v.is_empty(), "stand-in violations: {v:?}");
}

fn current() -> sys::CUcontext {
    let mut c: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out pointer; the stand-in is loaded and initialised.
    assert_eq!(unsafe { sys::cuCtxGetCurrent(&mut c) }, sys::CUresult::CUDA_SUCCESS);
    c
}

#[test]
fn the_callers_context_is_current_again_after_each_call() {
    let _g = serial();
    let Some((s, path)) = standin() else { return };
    let rig = rig(config(&path, ExecMode::Launch), opts());
    // SAFETY: the stand-in is loaded (standin()); plain driver calls with valid out pointers.
    let primary = unsafe {
        assert_eq!(sys::cuInit(0), sys::CUresult::CUDA_SUCCESS);
        let mut p: sys::CUcontext = std::ptr::null_mut();
        assert_eq!(sys::cuDevicePrimaryCtxRetain(&mut p, 0), sys::CUresult::CUDA_SUCCESS);
        assert_eq!(sys::cuCtxSetCurrent(p), sys::CUresult::CUDA_SUCCESS);
        p
    };
    round_trip(&rig, 8, 7);
    rig.ring.queue_stats().unwrap();
    assert_eq!(current(), primary, "the engine's context is no longer current after executor calls");
    // A thread with no context has none afterwards either.
    std::thread::scope(|sc| {
        sc.spawn(|| {
            rig.ring.queue_stats().unwrap();
            assert!(current().is_null(), "the executor's context stayed current on a caller's thread");
        });
    });
    drop(rig);
    // SAFETY: retained above.
    unsafe {
        assert_eq!(sys::cuCtxSetCurrent(std::ptr::null_mut()), sys::CUresult::CUDA_SUCCESS);
        sys::cuDevicePrimaryCtxRelease_v2(0);
    }
    let v = s.violations();
    assert!(v.is_empty(), "stand-in violations: {v:?}");
}
