//! The legacy default stream: a memset issued on it returns before it lands.
//! A kernel on a non-blocking stream is not ordered after it and runs first
//! (its update is then overwritten by the late landing); a kernel on a
//! blocking stream waits for it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod standin_common;

use cudarc::driver::sys;
use standin_common::*;
use tutti_kernels::KERNEL_WAIT;

fn read_u32(dev: u64) -> u32 {
    let mut v = 0u32;
    // SAFETY: `dev` is a 4-byte device allocation; valid destination.
    ok(unsafe { sys::cuMemcpyDtoH_v2((&raw mut v).cast(), dev, 4) });
    v
}

#[test]
fn a_legacy_memset_lands_after_a_non_blocking_kernel_but_before_a_blocking_one() {
    let Some(env) = env() else { return };
    primary();
    let wait = function(load_module(env.cubin), KERNEL_WAIT);
    // The IOCB has completed issue 1: tt_gio_wait adds 1 to `done` at once.
    let ctx = Ctx::new(1);
    let mut done = 0u64;
    // SAFETY: valid out pointer; a context is current.
    ok(unsafe { sys::cuMemAlloc_v2(&mut done, 4) });
    // SAFETY: a 4-byte allocation.
    ok(unsafe { sys::cuMemsetD8_v2(done, 0, 4) });
    // SAFETY: no arguments.
    ok(unsafe { sys::cuCtxSynchronize() });

    // Long enough that the kernel surely ran before the memset lands.
    env.standin.set_knob("landing_delay_ms", 1500).unwrap();
    let non_blocking = stream(NON_BLOCKING);
    // SAFETY: a 4-byte allocation.
    ok(unsafe { sys::cuMemsetD8_v2(done, 0x10, 4) });
    ok(launch_wait(wait, non_blocking, &ctx, 1, done));
    sync(non_blocking);
    assert_eq!(env.standin.stat("pending_writes", 0).unwrap(), 1, "the memset has not landed yet");
    assert_eq!(env.standin.stat("launches_before_landing", 0).unwrap(), 1);
    // cuMemcpyDtoH waits for the legacy stream: the memset lands over the kernel's add.
    assert_eq!(read_u32(done), 0x1010_1010, "the kernel's increment was overwritten by the late memset");
    assert_eq!(env.standin.stat("late_landings", 0).unwrap(), 1);

    let blocking = stream(0);
    // SAFETY: a 4-byte allocation.
    ok(unsafe { sys::cuMemsetD8_v2(done, 0x10, 4) });
    ok(launch_wait(wait, blocking, &ctx, 1, done));
    sync(blocking);
    assert_eq!(read_u32(done), 0x1010_1011, "the blocking stream's kernel ran after the memset landed");
    assert_eq!(env.standin.stat("launches_before_landing", 0).unwrap(), 1, "no new overtaking launch");
    assert_eq!(env.standin.stat("late_landings", 0).unwrap(), 1);
    assert_eq!(env.standin.stat("legacy_writes", 0).unwrap(), 3);
}

#[test]
fn a_copy_from_pageable_memory_lands_late_and_a_read_back_waits_for_it() {
    let Some(env) = env() else { return };
    primary();
    env.standin.set_knob("landing_delay_ms", 200).unwrap();
    let mut dev = 0u64;
    // SAFETY: valid out pointer; a context is current.
    ok(unsafe { sys::cuMemAlloc_v2(&mut dev, 8) });
    let mut src = 0x1122_3344_5566_7788u64;
    // SAFETY: an 8-byte allocation and source.
    ok(unsafe { sys::cuMemcpyHtoD_v2(dev, (&raw const src).cast(), 8) });
    // The source may change at once: the driver staged it.
    src = 0;
    assert_eq!(env.standin.stat("pending_writes", 0).unwrap(), 1, "returned before landing");
    let mut back = 0u64;
    // SAFETY: an 8-byte allocation and destination.
    ok(unsafe { sys::cuMemcpyDtoH_v2((&raw mut back).cast(), dev, 8) });
    assert_eq!(back, 0x1122_3344_5566_7788, "the staged bytes landed (source was {src:#x} by then)");
    assert_eq!(env.standin.stat("pending_writes", 0).unwrap(), 0);
    // SAFETY: an allocation with no work pending.
    ok(unsafe { sys::cuMemFree_v2(dev) });
}
