//! Contexts: a green context current on two threads at once is refused; a
//! CUfunction belongs to the context it was loaded in, a CUkernel runs in
//! the stream's context.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod standin_common;

use cudarc::driver::sys::{self, CUresult};
use standin_common::*;
use tutti_kernels::KERNEL_WAIT;

/// A green context of `n` SMs and its context.
fn green(n: u32) -> (sys::CUgreenCtx, sys::CUcontext) {
    // SAFETY: plain driver calls with valid out pointers, following the documented sequence.
    unsafe {
        let (mut all, mut part, mut rest): (sys::CUdevResource, sys::CUdevResource, sys::CUdevResource) =
            (std::mem::zeroed(), std::mem::zeroed(), std::mem::zeroed());
        ok(sys::cuDeviceGetDevResource(0, &mut all, sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM));
        let mut groups = 1;
        ok(sys::cuDevSmResourceSplitByCount(&mut part, &mut groups, &all, &mut rest, 0, n));
        assert_eq!((groups, part.__bindgen_anon_1.sm.smCount), (1, n));
        let mut desc = std::ptr::null_mut();
        ok(sys::cuDevResourceGenerateDesc(&mut desc, &mut part, 1));
        let mut g = std::ptr::null_mut();
        ok(sys::cuGreenCtxCreate(
            &mut g,
            desc,
            0,
            sys::CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM as u32,
        ));
        let mut ctx = std::ptr::null_mut();
        ok(sys::cuCtxFromGreenCtx(&mut ctx, g));
        (g, ctx)
    }
}

fn green_stream(g: sys::CUgreenCtx) -> sys::CUstream {
    let mut s = std::ptr::null_mut();
    // SAFETY: a live green context, valid out pointer.
    ok(unsafe { sys::cuGreenCtxStreamCreate(&mut s, g, NON_BLOCKING, 0) });
    s
}

#[test]
fn a_green_context_current_on_two_threads_is_refused() {
    let Some(env) = env() else { return };
    let (g, gctx) = green(1);
    let addr = gctx as usize;
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        // SAFETY: a live context.
        ok(unsafe { sys::cuCtxSetCurrent(addr as sys::CUcontext) });
        held_tx.send(()).unwrap();
        release_rx.recv().unwrap();
        // Restores "no context" before leaving.
        // SAFETY: NULL pops the current context.
        ok(unsafe { sys::cuCtxSetCurrent(std::ptr::null_mut()) });
    });
    held_rx.recv().unwrap();
    // SAFETY: a live context.
    assert_eq!(unsafe { sys::cuCtxSetCurrent(gctx) }, CUresult::CUDA_ERROR_INVALID_CONTEXT);
    let v = env.standin.violations();
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].contains("current to one thread at a time"), "{}", v[0]);
    release_tx.send(()).unwrap();
    holder.join().unwrap();

    // Once the other thread let go, push/pop on this thread is fine.
    // SAFETY: a live context; popped right after.
    ok(unsafe { sys::cuCtxPushCurrent_v2(gctx) });
    let mut popped = std::ptr::null_mut();
    // SAFETY: valid out pointer.
    ok(unsafe { sys::cuCtxPopCurrent_v2(&mut popped) });
    assert_eq!(popped, gctx);
    assert_eq!(env.standin.violations().len(), 1);
    // SAFETY: a live green context with no work.
    ok(unsafe { sys::cuGreenCtxDestroy(g) });
}

#[test]
fn a_function_runs_only_in_its_context_and_a_library_kernel_in_any() {
    let Some(env) = env() else { return };
    primary();
    let wait = function(load_module(env.cubin), KERNEL_WAIT);
    let (g, _) = green(1);
    let gs = green_stream(g);
    let ctx = Ctx::new(1);
    assert_eq!(launch_wait(wait, gs, &ctx, 0, 0), CUresult::CUDA_ERROR_INVALID_HANDLE);
    let v = env.standin.violations();
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].contains("loaded in context") && v[0].contains(KERNEL_WAIT), "{}", v[0]);

    // A library is context-free: its kernel launches on the green stream.
    let mut lib = std::ptr::null_mut();
    let mut kernel = std::ptr::null_mut();
    // SAFETY: a complete cubin; no options; valid out pointers and a NUL-terminated name.
    unsafe {
        ok(sys::cuLibraryLoadData(
            &mut lib,
            env.cubin.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        ));
        ok(sys::cuLibraryGetKernel(&mut kernel, lib, c"tt_gio_wait".as_ptr()));
    }
    ok(launch_wait(kernel as sys::CUfunction, gs, &ctx, 0, 0));
    sync(gs);
    assert_eq!(env.standin.stat("blocks_run", 0).unwrap(), 1);
    assert_eq!(env.standin.violations().len(), 1);
    // SAFETY: live handles with no work left.
    unsafe {
        ok(sys::cuStreamDestroy_v2(gs));
        ok(sys::cuLibraryUnload(lib));
        ok(sys::cuGreenCtxDestroy(g));
    }
}

#[test]
fn calls_that_need_a_context_fail_without_one() {
    let Some(env) = env() else { return };
    let none = std::thread::spawn(|| {
        let mut p = 0u64;
        // SAFETY: valid out pointer; no context is current on this new thread.
        unsafe { sys::cuMemAlloc_v2(&mut p, 64) }
    });
    assert_eq!(none.join().unwrap(), CUresult::CUDA_ERROR_INVALID_CONTEXT);
    drop(env);
}
