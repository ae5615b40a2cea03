//! The kernels compiled for the host (build.rs), run by host threads.
//!
//! A launch starts grid x block OS threads ("lanes"), each running the kernel
//! with its own thread and block index; warp collectives and `__syncthreads`
//! are barriers (`host/runtime.cpp`). Keep launches small on small machines:
//! every lane is a thread.

use crate::abi::{ExecCtx, RingHeader};
use crate::error::KernelError;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr::NonNull;

/// `struct tt_host_args`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HostArgs {
    pub ctx: *mut ExecCtx,
    pub ids: *const u32,
    pub seqs: *const u32,
    pub n: u32,
    pub rsvd: u32,
    pub timeout_ns: u64,
    pub result: *mut u32,
    /// `tt_gio_copy`: `[n][2]` source and destination addresses.
    pub pairs: *const u64,
    /// `tt_gio_copy`: bytes per chunk.
    pub bytes: u64,
}

impl HostArgs {
    /// Arguments of `tt_gio_issue` / `tt_gio_persistent`.
    pub fn exec(ctx: *mut ExecCtx) -> Self {
        HostArgs {
            ctx,
            ids: std::ptr::null(),
            seqs: std::ptr::null(),
            n: 0,
            rsvd: 0,
            timeout_ns: 0,
            result: std::ptr::null_mut(),
            pairs: std::ptr::null(),
            bytes: 0,
        }
    }

    /// Arguments of `tt_gio_copy`: `n` chunks of `bytes`, chunk c from `pairs[2c]` to `pairs[2c + 1]`.
    pub fn copy(pairs: *const u64, n: u32, bytes: u64) -> Self {
        HostArgs { pairs, n, bytes, ..HostArgs::exec(std::ptr::null_mut()) }
    }
}

/// The kernels of `cuda/gio.cu`, by the ids `host/gio_host.cpp` dispatches on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostKernel {
    Issue = 1,
    Persistent = 2,
    Wait = 3,
    Copy = 4,
}

impl HostKernel {
    /// Every kernel of the host build.
    pub const ALL: [HostKernel; 4] =
        [HostKernel::Issue, HostKernel::Persistent, HostKernel::Wait, HostKernel::Copy];

    /// The kernel whose entry point is called `name`.
    pub fn from_name(name: &str) -> Option<HostKernel> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            HostKernel::Issue => crate::KERNEL_ISSUE,
            HostKernel::Persistent => crate::KERNEL_PERSISTENT,
            HostKernel::Wait => crate::KERNEL_WAIT,
            HostKernel::Copy => crate::KERNEL_COPY,
        }
    }
}

extern "C" {
    fn tt_host_launch_blocks(
        kernel: u32,
        grid: u32,
        first: u32,
        count: u32,
        block: u32,
        args: *const HostArgs,
        err: *mut c_char,
        errlen: usize,
    ) -> *mut c_void;
    fn tt_host_launch_finished(launch: *mut c_void) -> c_int;
    fn tt_host_inline(
        kernel: u32,
        block: u32,
        args: *const HostArgs,
        err: *mut c_char,
        errlen: usize,
    ) -> *mut c_void;
    fn tt_host_inline_run(h: *mut c_void, start: c_int, wait_ns: u64) -> c_int;
    fn tt_host_inline_free(h: *mut c_void);
    fn tt_host_launch_join(launch: *mut c_void);
    fn tt_host_ring_pop(ring: *mut RingHeader, out: *mut u64) -> c_int;
    fn tt_host_ring_push(ring: *mut RingHeader, value: u64) -> c_int;
    fn tt_host_wake(word: *mut u32);
}

/// A running host launch. Dropping it waits for every lane to return.
pub struct HostLaunch {
    handle: NonNull<c_void>,
    kernel: HostKernel,
}

// SAFETY: the handle is only used through the runtime's thread-safe entry
// points (an atomic counter and pthread_join), from one owner at a time.
unsafe impl Send for HostLaunch {}

impl HostLaunch {
    /// Starts `grid` blocks of `block` lanes (a multiple of 32) running `kernel`.
    ///
    /// # Safety
    /// Every pointer in `args` must stay valid, and the memory it reaches laid
    /// out as `tutti_gio.h` says, until the launch has been joined (dropped).
    pub unsafe fn start(
        kernel: HostKernel,
        grid: u32,
        block: u32,
        args: HostArgs,
    ) -> Result<Self, KernelError> {
        // SAFETY: forwarded contract.
        unsafe { Self::start_blocks(kernel, grid, 0, grid, block, args) }
    }

    /// Starts blocks `first .. first + count` of a grid of `grid` blocks of
    /// `block` lanes: each lane sees its block index within the whole grid and
    /// a grid of `grid` blocks. How a launch is run block by block as an SM has
    /// room for each (the CUDA stand-in's residency model).
    ///
    /// # Safety
    /// As for [`HostLaunch::start`].
    pub unsafe fn start_blocks(
        kernel: HostKernel,
        grid: u32,
        first: u32,
        count: u32,
        block: u32,
        args: HostArgs,
    ) -> Result<Self, KernelError> {
        let mut err = [0 as c_char; 256];
        // SAFETY: `args` is a valid struct for the duration of the call (the runtime copies it);
        // `err` is a writable buffer of the length passed. The caller upholds the pointer contract.
        let handle = unsafe {
            tt_host_launch_blocks(
                kernel as u32,
                grid,
                first,
                count,
                block,
                &args,
                err.as_mut_ptr(),
                err.len(),
            )
        };
        match NonNull::new(handle) {
            Some(handle) => Ok(HostLaunch { handle, kernel }),
            None => {
                // SAFETY: the runtime NUL-terminates the message within the buffer (snprintf).
                let reason = unsafe { CStr::from_ptr(err.as_ptr()) }.to_string_lossy().into_owned();
                Err(KernelError::HostLaunch { kernel: kernel.name(), grid, block, reason })
            }
        }
    }

    pub fn kernel(&self) -> HostKernel {
        self.kernel
    }

    /// True once every lane has returned.
    pub fn finished(&self) -> bool {
        // SAFETY: `handle` is a live launch until `drop`.
        unsafe { tt_host_launch_finished(self.handle.as_ptr()) != 0 }
    }

    /// Waits for every lane.
    pub fn join(self) {
        drop(self)
    }
}

impl Drop for HostLaunch {
    fn drop(&mut self) {
        // SAFETY: joined and freed exactly once, here.
        unsafe { tt_host_launch_join(self.handle.as_ptr()) }
    }
}

/// One block of a kernel run on the threads of its callers, one call at a time,
/// instead of on a thread of its own: [`HostInline::run`] switches the calling
/// thread onto the block's lanes (fibers) until none can run before a deadline,
/// or the kernel returns. Between runs the lanes stay where they wait.
pub struct HostInline {
    handle: NonNull<c_void>,
    kernel: HostKernel,
}

// SAFETY: the block's state is only touched inside `run`, which takes `&mut self`; the lanes
// keep nothing tied to the OS thread between runs (the runtime saves and restores its
// thread-locals around each run).
unsafe impl Send for HostInline {}

impl HostInline {
    /// A block of `block` lanes (a multiple of 32) of `kernel`, not started.
    ///
    /// # Safety
    /// As for [`HostLaunch::start`], until the block is dropped.
    pub unsafe fn new(kernel: HostKernel, block: u32, args: HostArgs) -> Result<Self, KernelError> {
        let mut err = [0 as c_char; 256];
        // SAFETY: as in `HostLaunch::start_blocks`.
        let handle = unsafe { tt_host_inline(kernel as u32, block, &args, err.as_mut_ptr(), err.len()) };
        match NonNull::new(handle) {
            Some(handle) => Ok(HostInline { handle, kernel }),
            None => {
                // SAFETY: the runtime NUL-terminates the message within the buffer (snprintf).
                let reason = unsafe { CStr::from_ptr(err.as_ptr()) }.to_string_lossy().into_owned();
                Err(KernelError::HostLaunch { kernel: kernel.name(), grid: 1, block, reason })
            }
        }
    }

    pub fn kernel(&self) -> HostKernel {
        self.kernel
    }

    /// Runs the lanes on this thread until none can run and `wait` has passed,
    /// sleeping meanwhile as a block thread would (never past `wait`), or until
    /// the kernel returns. A kernel that has returned is started again first if
    /// `start`. True once it has returned.
    pub fn run(&mut self, start: bool, wait: std::time::Duration) -> bool {
        let wait_ns = wait.as_nanos().min(u64::MAX as u128) as u64;
        // SAFETY: `handle` is live until drop; `&mut self` keeps runs one at a time.
        unsafe { tt_host_inline_run(self.handle.as_ptr(), c_int::from(start), wait_ns) != 0 }
    }
}

impl Drop for HostInline {
    fn drop(&mut self) {
        // SAFETY: freed exactly once, here.
        unsafe { tt_host_inline_free(self.handle.as_ptr()) }
    }
}

/// The executor's consumer side of a ring (the code `tt_gio_issue` uses).
///
/// # Safety
/// `ring` must point at a ring header followed by its cells, laid out as in `tutti_gio.h`.
pub unsafe fn executor_ring_pop(ring: *mut RingHeader) -> Option<u64> {
    let mut v = 0u64;
    // SAFETY: the caller guarantees the ring; `v` is a valid out pointer.
    (unsafe { tt_host_ring_pop(ring, &mut v) } != 0).then_some(v)
}

/// Wakes the host lanes blocked on `ring` because they found it empty, if any:
/// a producer calls this after publishing a value (and the host after asking
/// persistent kernels to stop). Costs a fence and a load when none sleeps,
/// which is always the case for GPU consumers.
///
/// # Safety
/// `ring` must point at a live ring header laid out as in `tutti_gio.h`.
pub unsafe fn wake_ring_sleepers(ring: *mut RingHeader) {
    use std::sync::atomic::{fence, AtomicU32, Ordering};
    // Pairs with the consumer's fence between counting itself in `sleepers` and looking
    // at the ring again (`tt_ring_idle`): one of the two sees the other.
    fence(Ordering::SeqCst);
    // SAFETY: the fields lie in the live header; every access to them is atomic.
    let (sleepers, seq) = unsafe {
        (AtomicU32::from_ptr(&raw mut (*ring).sleepers), AtomicU32::from_ptr(&raw mut (*ring).wake_seq))
    };
    if sleepers.load(Ordering::SeqCst) != 0 {
        seq.fetch_add(1, Ordering::SeqCst);
        // SAFETY: a futex wake on a live, aligned u32.
        unsafe { tt_host_wake(seq.as_ptr()) };
    }
}

/// The executor's producer side of a ring (how completions are posted).
///
/// # Safety
/// As for [`executor_ring_pop`].
pub unsafe fn executor_ring_push(ring: *mut RingHeader, value: u64) -> bool {
    // SAFETY: the caller guarantees the ring.
    unsafe { tt_host_ring_push(ring, value) != 0 }
}
