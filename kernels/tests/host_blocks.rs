//! Starting some blocks of a grid (how the CUDA stand-in runs a launch block
//! by block): each lane sees its block index within the whole grid and the
//! whole grid's size.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use tutti_kernels::abi::{ExecCtx, Iocb};
use tutti_kernels::host::{HostArgs, HostKernel, HostLaunch};

/// Runs blocks `first .. first + count` of a `grid` x 32 launch of `tt_gio_wait`
/// over `n` entries that are all complete; returns how many entries they counted.
fn counted(grid: u32, first: u32, count: u32, n: usize) -> u32 {
    // SAFETY: all-zero is a valid IOCB (done_seq 0 completes seq 0).
    let mut iocb: Box<Iocb> = unsafe { Box::new_zeroed().assume_init() };
    let mut ctx =
        ExecCtx { iocbs: &raw mut *iocb as u64, niocbs: 1, max_backoff_ns: 1000, ..Default::default() };
    let (ids, seqs) = (vec![0u32; n], vec![0u32; n]);
    let mut done = 0u32;
    let args = HostArgs {
        ctx: &mut ctx,
        ids: ids.as_ptr(),
        seqs: seqs.as_ptr(),
        n: n as u32,
        result: &mut done,
        ..HostArgs::exec(std::ptr::null_mut())
    };
    // SAFETY: everything `args` reaches lives until the launch is joined right here.
    let launch = unsafe { HostLaunch::start_blocks(HostKernel::Wait, grid, first, count, 32, args) }.unwrap();
    launch.join();
    done
}

#[test]
fn blocks_see_their_index_within_the_whole_grid() {
    // Block 2 of 4 covers entries 64..80 of 80 (block 0 would cover 32).
    assert_eq!(counted(4, 2, 1, 80), 16);
    // Blocks 1 and 2 of 4: 32..64 and 64..80.
    assert_eq!(counted(4, 1, 2, 80), 48);
}

#[test]
fn blocks_stride_by_the_whole_grid() {
    // Block 0 of 2 covers 0..32 only (a grid of 1 would stride over all 64).
    assert_eq!(counted(2, 0, 1, 64), 32);
    assert_eq!(counted(2, 0, 2, 64), 64);
}

#[test]
fn a_range_outside_the_grid_is_refused() {
    let args = HostArgs::exec(std::ptr::null_mut());
    // SAFETY: refused before any lane runs.
    let e = unsafe { HostLaunch::start_blocks(HostKernel::Wait, 4, 3, 2, 32, args) }.err().unwrap();
    assert!(e.to_string().contains("blocks 3..5 of a grid of 4"), "{e}");
}
