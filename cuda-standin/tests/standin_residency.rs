//! Residency: a grid that fills its context's SMs keeps any other kernel of
//! that context from starting until it returns; a smaller grid leaves room.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod standin_common;

use cudarc::driver::sys::{self, CUresult};
use standin_common::*;
use tutti_kernels::{KERNEL_PERSISTENT, KERNEL_WAIT};

/// One SM of 8192 registers: two 64-thread blocks of a 64-register kernel fill it.
fn small_device(env: &Env) {
    env.standin.set_knob("sm_count", 1).unwrap();
    env.standin.set_knob("regs_per_sm", 8192).unwrap();
}

fn occupancy(f: sys::CUfunction, block: i32) -> i32 {
    let mut n = 0;
    // SAFETY: a loaded function, valid out pointer.
    ok(unsafe { sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut n, f, block, 0) });
    n
}

fn wait_running(ctx: &Ctx, n: u32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while ctx.running() < n {
        assert!(std::time::Instant::now() < deadline, "{} of {n} persistent blocks started", ctx.running());
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn a_grid_that_fills_the_partition_keeps_another_kernel_from_starting() {
    let Some(env) = env() else { return };
    small_device(&env);
    let pctx = primary();
    let m = load_module(env.cubin);
    let (persistent, wait) = (function(m, KERNEL_PERSISTENT), function(m, KERNEL_WAIT));
    assert_eq!(occupancy(persistent, 64), 2, "64 regs x 64 threads = 4096 of 8192 registers per block");
    let ctx = Ctx::new(1);
    let (io, aux) = (stream(NON_BLOCKING), stream(NON_BLOCKING));
    ok(launch_exec(persistent, 2, 64, io, &ctx));
    wait_running(&ctx, 2);
    ok(launch_wait(wait, aux, &ctx, 0, 0));
    // However long it waits, the wait kernel cannot become resident.
    for _ in 0..20 {
        std::thread::sleep(std::time::Duration::from_millis(10));
        assert_eq!(query(aux), CUresult::CUDA_ERROR_NOT_READY, "tt_gio_wait started on a full SM");
    }
    assert_eq!(env.standin.stat("resident", pctx as usize).unwrap(), 2);
    ctx.stop();
    sync(aux);
    sync(io);
    assert_eq!(env.standin.stat("peak_resident", pctx as usize).unwrap(), 2, "never more than the grid");
    assert_eq!(env.standin.stat("blocks_run", 0).unwrap(), 3);
}

#[test]
fn a_smaller_grid_leaves_room_for_another_kernel() {
    let Some(env) = env() else { return };
    small_device(&env);
    let pctx = primary();
    let m = load_module(env.cubin);
    let (persistent, wait) = (function(m, KERNEL_PERSISTENT), function(m, KERNEL_WAIT));
    let ctx = Ctx::new(1);
    let (io, aux) = (stream(NON_BLOCKING), stream(NON_BLOCKING));
    ok(launch_exec(persistent, 1, 64, io, &ctx));
    wait_running(&ctx, 1);
    ok(launch_wait(wait, aux, &ctx, 0, 0));
    sync(aux);
    assert_eq!(ctx.running(), 1, "the persistent block still runs");
    assert_eq!(
        env.standin.stat("peak_resident", pctx as usize).unwrap(),
        2,
        "both kernels were resident at once"
    );
    ctx.stop();
    sync(io);
}

#[test]
fn a_block_that_cannot_fit_an_sm_is_refused() {
    let Some(env) = env() else { return };
    small_device(&env);
    primary();
    let persistent = function(load_module(env.cubin), KERNEL_PERSISTENT);
    // 512 threads x 64 registers = 32768 registers > 8192.
    assert_eq!(occupancy(persistent, 512), 0);
    let ctx = Ctx::new(1);
    let rc = launch_exec(persistent, 1, 512, std::ptr::null_mut(), &ctx);
    assert_eq!(rc, CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "{}", env.standin.last_error());
}
