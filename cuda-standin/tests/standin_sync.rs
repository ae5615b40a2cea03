//! Synchronising calls behind a kernel that never returns: cuMemFree (and
//! the other freeing calls) would block until it does; the stand-in fails them
//! after its deadline and records a violation.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod standin_common;

use cudarc::driver::sys::{self, CUresult};
use standin_common::*;
use tutti_kernels::KERNEL_PERSISTENT;

#[test]
fn cu_mem_free_behind_a_running_kernel_fails_after_the_deadline_with_a_violation() {
    let Some(env) = env() else { return };
    env.standin.set_knob("sync_deadline_ms", 300).unwrap();
    primary();
    let m = load_module(env.cubin);
    let persistent = function(m, KERNEL_PERSISTENT);
    let ctx = Ctx::new(1);
    let io = stream(NON_BLOCKING);
    let mut scratch = 0u64;
    // SAFETY: valid out pointer; a context is current.
    ok(unsafe { sys::cuMemAlloc_v2(&mut scratch, 64) });
    ok(launch_exec(persistent, 1, 32, io, &ctx));

    // SAFETY: an allocation of this context.
    let rc = unsafe { sys::cuMemFree_v2(scratch) };
    assert_eq!(rc, CUresult::CUDA_ERROR_TIMEOUT);
    let v = env.standin.violations();
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].contains("cuMemFree_v2 blocked") && v[0].contains(KERNEL_PERSISTENT), "{}", v[0]);
    // SAFETY: a loaded module.
    assert_eq!(unsafe { sys::cuModuleUnload(m) }, CUresult::CUDA_ERROR_TIMEOUT);
    // SAFETY: a live stream.
    assert_eq!(unsafe { sys::cuStreamSynchronize(io) }, CUresult::CUDA_ERROR_TIMEOUT);
    assert_eq!(env.standin.violations().len(), 3);
    // Destroying the stream does not end its kernel: freeing still waits for it.
    // SAFETY: a live stream.
    ok(unsafe { sys::cuStreamDestroy_v2(io) });
    // SAFETY: an allocation of this context.
    assert_eq!(unsafe { sys::cuMemFree_v2(scratch) }, CUresult::CUDA_ERROR_TIMEOUT);
    assert_eq!(env.standin.violations().len(), 4);

    ctx.stop();
    // SAFETY: no arguments; waits for the destroyed stream's kernel too.
    ok(unsafe { sys::cuCtxSynchronize() });
    // SAFETY: the allocation was not freed by the failed call; nothing runs now.
    ok(unsafe { sys::cuMemFree_v2(scratch) });
    // SAFETY: as above.
    ok(unsafe { sys::cuModuleUnload(m) });
    assert_eq!(env.standin.violations().len(), 4, "no violation once the kernel returned");
}

#[test]
fn freeing_memory_of_an_idle_context_does_not_wait_for_nothing() {
    let Some(env) = env() else { return };
    primary();
    let mut p = 0u64;
    // SAFETY: valid out pointer; a context is current.
    ok(unsafe { sys::cuMemAlloc_v2(&mut p, 64) });
    // SAFETY: a live allocation.
    ok(unsafe { sys::cuMemFree_v2(p) });
    // SAFETY: freed already: an invalid pointer now.
    assert_eq!(unsafe { sys::cuMemFree_v2(p) }, CUresult::CUDA_ERROR_INVALID_VALUE);
    assert!(env.standin.violations().is_empty());
}
