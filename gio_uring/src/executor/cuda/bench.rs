//! The copy benchmark on the CUDA executor (`copy_bench.rs` says what it
//! measures): `tt_gio_copy` on the I/O stream against `cuMemcpyAsync` of the
//! same bytes on the same stream (the copy engine), each timed between two
//! CUDA events (`cuEventElapsedTime`).
//!
//! Verified only through the stand-in driver (`cuda-standin/`), which runs
//! the kernel's host build and the copies as host memcpy, and times events
//! by the host clock: there it checks the calls, the ordering and every byte,
//! not a GPU's speed. No GPU has run it yet; `scripts/gpu-check` runs it
//! (`tutti bench staged --cuda`) when one is lent.

use super::super::copy_bench::{CopyReport, CopySpec, CopyTimes, Prepared};
use super::context::check;
use super::memory::{Device, Pinned};
use super::CudaExecutor;
use crate::error::Result;
use crate::mem::ExecMemory;
use cudarc::driver::sys;
use std::ffi::c_void;
use std::time::{Duration, Instant};

/// `cuEventElapsedTime_v2` from 12.8 on (the older name may be gone from newer drivers).
const ELAPSED_V2_DRIVER: i32 = 12080;
/// Longest one timed copy may take.
const COPY_DEADLINE: Duration = Duration::from_secs(60);

/// Two events of the executor's context, destroyed on drop.
struct Events<'a> {
    exec: &'a CudaExecutor,
    start: sys::CUevent,
    end: sys::CUevent,
}

impl<'a> Events<'a> {
    fn new(exec: &'a CudaExecutor) -> Result<Self> {
        let _cur = exec.ctx.enter()?;
        let mut ev = Events { exec, start: std::ptr::null_mut(), end: std::ptr::null_mut() };
        // SAFETY: valid out pointers; the context is current. Default flags: timing enabled.
        check("cuEventCreate", unsafe { sys::cuEventCreate(&mut ev.start, 0) })?;
        // SAFETY: as above (`ev` destroys the first one if this fails).
        check("cuEventCreate", unsafe { sys::cuEventCreate(&mut ev.end, 0) })?;
        Ok(ev)
    }

    /// Runs `work` (which enqueues on the I/O stream) between the two events and returns
    /// the time between them, waiting for the second with a deadline.
    fn time(&self, work: impl FnOnce() -> Result<()>) -> Result<Duration> {
        let exec = self.exec;
        {
            let _cur = exec.ctx.enter()?;
            // SAFETY: a live event and stream of this context.
            check("cuEventRecord", unsafe { sys::cuEventRecord(self.start, exec.stream) })?;
        }
        work()?;
        {
            let _cur = exec.ctx.enter()?;
            // SAFETY: as above.
            check("cuEventRecord", unsafe { sys::cuEventRecord(self.end, exec.stream) })?;
        }
        let deadline = Instant::now() + COPY_DEADLINE;
        let mut nap = Duration::from_micros(20);
        loop {
            let rc = {
                let _cur = exec.ctx.enter()?;
                // SAFETY: a live event.
                unsafe { sys::cuEventQuery(self.end) }
            };
            match rc {
                sys::CUresult::CUDA_SUCCESS => break,
                sys::CUresult::CUDA_ERROR_NOT_READY if Instant::now() < deadline => {
                    std::thread::sleep(nap);
                    nap = (nap * 2).min(Duration::from_millis(1));
                }
                sys::CUresult::CUDA_ERROR_NOT_READY => {
                    return Err(exec.err(format!("a timed copy did not finish within {COPY_DEADLINE:?}")))
                }
                rc => return check("cuEventQuery", rc).map(|_| Duration::ZERO),
            }
        }
        let _cur = exec.ctx.enter()?;
        let mut ms = 0f32;
        // SAFETY: both events were recorded and the second has completed; valid out pointer.
        let rc = unsafe {
            if exec.driver_version >= ELAPSED_V2_DRIVER {
                sys::cuEventElapsedTime_v2(&mut ms, self.start, self.end)
            } else {
                sys::cuEventElapsedTime(&mut ms, self.start, self.end)
            }
        };
        check("cuEventElapsedTime", rc)?;
        Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
    }
}

impl Drop for Events<'_> {
    fn drop(&mut self) {
        let Ok(_cur) = self.exec.ctx.enter() else { return };
        for e in [self.start, self.end] {
            if !e.is_null() {
                // SAFETY: created in `new`, destroyed once; nothing is recorded on it any more
                // (every timed run waited for its second event).
                let _ = unsafe { sys::cuEventDestroy_v2(e) };
            }
        }
    }
}

/// Where a region of the bench lives: its executor address, and its host address when the
/// host reaches it directly (pinned slots), else `None` (device memory).
fn place(mem: &dyn ExecMemory) -> (u64, Option<*mut u8>) {
    (mem.exec_addr(), mem.host_ptr().map(|p| p.as_ptr()))
}

impl CudaExecutor {
    /// See `copy_bench.rs`. Launch mode only, and with no ring bound to the executor: the
    /// bench launches on the I/O stream, which a persistent kernel or a ring's launches use.
    pub(super) fn run_copy_bench(&self, spec: &CopySpec) -> Result<CopyReport> {
        self.live_check()?;
        let total = spec.check()? as usize;
        if self.cfg.mode != super::ExecMode::Launch {
            return Err(self.err("the copy bench needs launch mode (it launches on the I/O stream)"));
        }
        if self.state.lock().map_err(|_| self.err("state lock poisoned"))?.binding.is_some() {
            return Err(self.err("the copy bench needs an executor no ring runs on"));
        }
        let slots = Pinned::new(&self.ctx, total)?;
        let kv = Device::new(&self.ctx, total)?;
        let Prepared { src_mem, dst_mem, src, offsets, pairs } =
            spec.prepare::<dyn ExecMemory>(total, &slots, &kv)?;
        let pairs_mem = Device::new(&self.ctx, pairs.len() * 8)?;
        pairs_mem.write_bytes(0, zerocopy::IntoBytes::as_bytes(pairs.as_slice()))?;
        let events = Events::new(self)?;
        let (grid, block) = (self.shape.max_blocks, self.shape.block_threads);
        let zero = |m: &dyn ExecMemory| -> Result<()> {
            match m.host_ptr() {
                Some(_) => m.write_bytes(0, &vec![0u8; total]),
                None => self.ctx.enter()?.zero(m.exec_addr(), total),
            }
        };
        // One cuMemcpyAsync from `s` to `d` (executor offsets of the source and destination
        // regions) of `len` bytes on the I/O stream, in the bench's direction.
        let (src_at, dst_at) = (place(src_mem), place(dst_mem));
        let memcpy = |s: u64, d: u64, len: usize| -> Result<()> {
            let _cur = self.ctx.enter()?;
            // SAFETY: both ranges lie inside the bench's regions (whole chunks, or the whole
            // region), alive until the copy was waited for; pinned host memory on the host
            // side, device memory on the other.
            let rc = unsafe {
                match (src_at.1, dst_at.1) {
                    (Some(h), None) => sys::cuMemcpyHtoDAsync_v2(
                        dst_at.0 + d,
                        h.add(s as usize).cast::<c_void>(),
                        len,
                        self.stream,
                    ),
                    (None, Some(h)) => sys::cuMemcpyDtoHAsync_v2(
                        h.add(d as usize).cast::<c_void>(),
                        src_at.0 + s,
                        len,
                        self.stream,
                    ),
                    _ => {
                        return Err(
                            self.err("copy bench: one side must be host memory, the other device memory")
                        )
                    }
                }
            };
            check("cuMemcpyAsync", rc)
        };
        let mut got = vec![0u8; total];
        let mut report =
            spec.report(grid, block, "cuMemcpyAsync (the copy engine)", "CUDA events on the I/O stream");
        for rep in 0..spec.reps {
            zero(dst_mem)?;
            let kernel = events.time(|| {
                let (mut p, mut n, mut b) = (pairs_mem.exec_addr(), spec.chunks, spec.chunk_bytes);
                let mut params: [*mut c_void; 3] =
                    [(&raw mut p).cast(), (&raw mut n).cast(), (&raw mut b).cast()];
                self.launch(self.kernels.copy, grid, block, self.stream, &mut params)
            })?;
            if rep == 0 {
                dst_mem.read_bytes(0, &mut got)?;
                report.verified_bytes += spec.verify("tt_gio_copy", &src, &got, Some(&offsets))?;
            }

            zero(dst_mem)?;
            let baseline_chunks = events
                .time(|| offsets.iter().try_for_each(|&(s, d)| memcpy(s, d, spec.chunk_bytes as usize)))?;
            if rep == 0 {
                dst_mem.read_bytes(0, &mut got)?;
                report.verified_bytes +=
                    spec.verify("cuMemcpyAsync per chunk", &src, &got, Some(&offsets))?;
            }

            zero(dst_mem)?;
            let baseline = events.time(|| memcpy(0, 0, total))?;
            if rep == 0 {
                dst_mem.read_bytes(0, &mut got)?;
                report.verified_bytes += spec.verify("cuMemcpyAsync", &src, &got, None)?;
            }
            report.runs.push(CopyTimes { kernel, baseline, baseline_chunks });
        }
        Ok(report)
    }
}
