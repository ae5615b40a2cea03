//! What the stand-in tests share: loading the stand-in before cudarc's first
//! call, the NVRTC cubin of the I/O kernels, one test at a time per process
//! (the stand-in's knobs and statistics are process-wide), and small helpers
//! around the raw driver API.

// Each test file uses a subset.
#![allow(dead_code)]

use cudarc::driver::sys::{self, CUresult};
use std::ffi::c_void;
use std::sync::{Mutex, MutexGuard, OnceLock};
use tutti_cuda_standin::control::Standin;
use tutti_kernels::abi::{Control, ExecCtx, Iocb, RingHeader};

#[path = "../../../tests/support/skip.rs"]
pub mod skip;

pub struct Env {
    pub standin: &'static Standin,
    pub cubin: &'static [u8],
    _serial: MutexGuard<'static, ()>,
}

/// The stand-in loaded and reset, cuInit done, the cubin compiled; None (after
/// `skip::skip`) when NVRTC is missing.
pub fn env() -> Option<Env> {
    static SERIAL: Mutex<()> = Mutex::new(());
    static STANDIN: OnceLock<Standin> = OnceLock::new();
    static CUBIN: OnceLock<Result<Vec<u8>, String>> = OnceLock::new();
    let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let standin = STANDIN.get_or_init(|| Standin::load().expect("load the CUDA stand-in"));
    let cubin = CUBIN.get_or_init(|| {
        tutti_kernels::nvrtc::compile_gio("sm_90").map(|c| c.cubin).map_err(|e| e.to_string())
    });
    let cubin = match cubin {
        Ok(c) => c.as_slice(),
        Err(e) => {
            skip::skip(format!("NVRTC cannot build the sm_90 cubin ({e}); scripts/nvrtc-check --install"));
            return None;
        }
    };
    standin.reset();
    // SAFETY: the stand-in is loaded, so cudarc resolves libcuda to it.
    ok(unsafe { sys::cuInit(0) });
    Some(Env { standin, cubin, _serial: serial })
}

/// Asserts success, with the stand-in's reason otherwise.
#[track_caller]
pub fn ok(rc: CUresult) {
    if rc != CUresult::CUDA_SUCCESS {
        let why = STANDIN_REASON.with(|f| f());
        panic!("{rc:?}: {why}");
    }
}

thread_local! {
    static STANDIN_REASON: fn() -> String = || {
        Standin::load().map(|s| s.last_error()).unwrap_or_default()
    };
}

/// Retains the primary context and makes it current; returns it.
pub fn primary() -> sys::CUcontext {
    let mut ctx = std::ptr::null_mut();
    // SAFETY: valid out pointer; device 0 exists.
    ok(unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, 0) });
    // SAFETY: a live context.
    ok(unsafe { sys::cuCtxSetCurrent(ctx) });
    ctx
}

pub fn stream(flags: u32) -> sys::CUstream {
    let mut s = std::ptr::null_mut();
    // SAFETY: valid out pointer; a context is current.
    ok(unsafe { sys::cuStreamCreate(&mut s, flags) });
    s
}

pub const NON_BLOCKING: u32 = 1;

pub fn load_module(cubin: &[u8]) -> sys::CUmodule {
    let mut m = std::ptr::null_mut();
    // SAFETY: a complete cubin image.
    ok(unsafe { sys::cuModuleLoadData(&mut m, cubin.as_ptr().cast()) });
    m
}

pub fn function(m: sys::CUmodule, name: &str) -> sys::CUfunction {
    let c = std::ffi::CString::new(name).unwrap();
    let mut f = std::ptr::null_mut();
    // SAFETY: a loaded module and a NUL-terminated name.
    ok(unsafe { sys::cuModuleGetFunction(&mut f, m, c.as_ptr()) });
    f
}

/// Zeroed mapped pinned memory of `T`.
pub fn pinned<T>() -> *mut T {
    let mut p: *mut c_void = std::ptr::null_mut();
    let len = std::mem::size_of::<T>();
    // SAFETY: valid out pointer; a context is current.
    ok(unsafe { sys::cuMemHostAlloc(&mut p, len, sys::CU_MEMHOSTALLOC_DEVICEMAP) });
    // SAFETY: `len` bytes were allocated at `p`.
    unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, len) };
    p.cast()
}

/// An executor context in pinned memory: one IOCB whose `done_seq` is `done`,
/// an empty submission ring, a control block; `ids`/`seqs` for `tt_gio_wait`.
pub struct Ctx {
    pub ctx: *mut ExecCtx,
    pub control: *mut Control,
    pub ids: *mut [u32; 1],
    pub seqs: *mut [u32; 1],
}

impl Ctx {
    pub fn new(done_seq: u32) -> Ctx {
        let ctx = pinned::<ExecCtx>();
        let control = pinned::<Control>();
        let iocb = pinned::<Iocb>();
        // An all-zero ring of one cell reads as empty (cell 0's sequence is not head + 1).
        let ring = pinned::<(RingHeader, [u64; 2])>();
        let ids = pinned::<[u32; 1]>();
        let seqs = pinned::<[u32; 1]>();
        // SAFETY: all freshly allocated, zeroed, and only written here.
        unsafe {
            (*iocb).hdr.done_seq = done_seq;
            (*seqs)[0] = done_seq;
            *ctx = ExecCtx {
                sq_ring: ring as u64,
                cq_ring: ring as u64,
                control: control as u64,
                iocbs: iocb as u64,
                niocbs: 1,
                max_backoff_ns: 100_000,
                idle_sleep_ns: 100_000,
                ..Default::default()
            };
        }
        Ctx { ctx, control, ids, seqs }
    }

    /// Persistent kernels return once they see this.
    pub fn stop(&self) {
        // SAFETY: a live pinned control block; the kernels read it with acquire loads.
        unsafe { std::sync::atomic::AtomicU32::from_ptr(&raw mut (*self.control).stop) }
            .store(1, std::sync::atomic::Ordering::Release);
    }

    /// Blocks inside `tt_gio_persistent` now.
    pub fn running(&self) -> u32 {
        // SAFETY: as above; the kernels update it atomically.
        unsafe { std::sync::atomic::AtomicU32::from_ptr(&raw mut (*self.control).running) }
            .load(std::sync::atomic::Ordering::Acquire)
    }
}

/// Launches `f` (one pointer parameter, the context) with `grid` x `block`.
pub fn launch_exec(f: sys::CUfunction, grid: u32, block: u32, stream: sys::CUstream, ctx: &Ctx) -> CUresult {
    let mut c = ctx.ctx as u64;
    let mut params: [*mut c_void; 1] = [(&raw mut c).cast()];
    // SAFETY: the parameter matches the kernel's; the context outlives the launch (tests stop it).
    unsafe {
        sys::cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, stream, params.as_mut_ptr(), std::ptr::null_mut())
    }
}

/// Launches `tt_gio_wait(ctx, ids, seqs, n, timeout_ns, done)` as one block of 32.
pub fn launch_wait(f: sys::CUfunction, stream: sys::CUstream, ctx: &Ctx, n: u32, done: u64) -> CUresult {
    let (mut c, mut ids, mut seqs, mut n, mut t, mut d) =
        (ctx.ctx as u64, ctx.ids as u64, ctx.seqs as u64, n, 0u64, done);
    let mut params: [*mut c_void; 6] = [
        (&raw mut c).cast(),
        (&raw mut ids).cast(),
        (&raw mut seqs).cast(),
        (&raw mut n).cast(),
        (&raw mut t).cast(),
        (&raw mut d).cast(),
    ];
    // SAFETY: the parameters match tt_gio_wait's; everything they point at outlives the launch.
    unsafe { sys::cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, stream, params.as_mut_ptr(), std::ptr::null_mut()) }
}

pub fn query(s: sys::CUstream) -> CUresult {
    // SAFETY: a live stream.
    unsafe { sys::cuStreamQuery(s) }
}

pub fn sync(s: sys::CUstream) {
    // SAFETY: a live stream.
    ok(unsafe { sys::cuStreamSynchronize(s) });
}
