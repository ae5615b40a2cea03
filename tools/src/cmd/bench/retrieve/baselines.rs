//! The host-driven ways to move the same objects, each a call per layer that
//! returns when the layer has landed:
//! - [`UringFixed`]: io_uring READ_FIXED from the page-cached file into
//!   registered buffers (the KV memory), the file registered too, submissions
//!   batched up to the ring depth — what a file-based KV tier does;
//! - [`Pread`]: one `pread` per object — the per-block CPU path (one cuFile
//!   call per block);
//! - [`Memcpy`]: a plain copy of each object from memory — the limit here.

use super::data::Dataset;
use super::measure::{Calls, Method};
// The object store's own clock for its setup and submission CPU, so the figures compare.
use anyhow::{bail, Context};
use io_uring::{opcode, types, IoUring};
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use tutti_objstore::thread_cpu_ns;

/// Largest registered buffer: the kernel refuses more than 1 GiB per buffer.
const MAX_FIXED_BUFFER: u64 = 256 << 20;

pub struct UringFixed {
    ring: IoUring,
    depth: u32,
    /// Bytes per registered buffer: buffer `k` starts at `k × piece` of the KV memory.
    piece: u64,
}

impl UringFixed {
    /// A ring of `depth` entries with the data set's file and KV memory registered.
    pub fn new(ds: &Dataset, depth: u32) -> anyhow::Result<UringFixed> {
        let ring = IoUring::new(depth).with_context(|| format!("creating an io_uring of {depth} entries"))?;
        let obj = ds.g.object_bytes();
        // Whole objects per buffer: every object offset is a multiple of the object size.
        let piece = (MAX_FIXED_BUFFER / obj).max(1) * obj;
        let len = ds.kv.len() as u64;
        let iovecs: Vec<libc::iovec> = (0..len.div_ceil(piece))
            .map(|k| libc::iovec {
                // SAFETY: `k × piece < len`: the pointer stays inside the KV memory.
                iov_base: unsafe { ds.kv.as_ptr().add((k * piece) as usize) }.cast(),
                iov_len: piece.min(len - k * piece) as usize,
            })
            .collect();
        if iovecs.len() > u16::MAX as usize {
            bail!("{} bytes of KV memory need more than {} registered buffers", len, u16::MAX);
        }
        // SAFETY: the buffers are the data set's KV memory, which outlives the
        // ring (the ring is dropped first in `run`); the kernel pins the pages.
        unsafe { ring.submitter().register_buffers(&iovecs) }.with_context(|| {
            format!(
                "registering {} of KV memory as io_uring fixed buffers (RLIMIT_MEMLOCK too low? \
                 try `ulimit -l unlimited`)",
                crate::report::bytes(len)
            )
        })?;
        ring.submitter().register_files(&[ds.file.as_raw_fd()]).context("registering the baseline file")?;
        Ok(UringFixed { ring, depth, piece })
    }

    fn layer(&mut self, ds: &Dataset, n: u32, layer: u32) -> anyhow::Result<()> {
        let obj = ds.g.object_bytes();
        let total = 2 * n;
        let (mut next, mut done, mut inflight) = (0u32, 0u32, 0u32);
        while done < total {
            {
                let mut sq = self.ring.submission();
                while next < total && inflight < self.depth && !sq.is_full() {
                    let (chunk, kv) = (next / 2, next % 2);
                    let at = ds.dst_offset(chunk, layer, kv) as u64;
                    let buf = (at / self.piece) as u16;
                    if at % self.piece + obj > self.piece {
                        bail!("object at {at:#x} straddles registered buffers");
                    }
                    // SAFETY: in bounds of the KV memory (offset from its layout).
                    let ptr = unsafe { ds.kv.as_ptr().add(at as usize) };
                    let read = opcode::ReadFixed::new(types::Fixed(0), ptr, obj as u32, buf)
                        .offset(ds.source_offset(chunk, layer, kv))
                        .build()
                        .user_data(next as u64);
                    // SAFETY: the destination lies in registered buffer `buf`, which stays
                    // registered and allocated until this layer's completions are reaped.
                    unsafe { sq.push(&read) }
                        .map_err(|_| anyhow::anyhow!("io_uring submission queue full"))?;
                    next += 1;
                    inflight += 1;
                }
            }
            self.ring.submit_and_wait(1).context("io_uring_enter")?;
            for cqe in self.ring.completion() {
                let k = cqe.user_data() as u32;
                if cqe.result() != obj as i32 {
                    let why = if cqe.result() < 0 {
                        std::io::Error::from_raw_os_error(-cqe.result()).to_string()
                    } else {
                        format!("short read of {} bytes", cqe.result())
                    };
                    bail!(
                        "io_uring read of chunk {} layer {layer} {}: {why}",
                        k / 2,
                        ["K", "V"][k as usize % 2]
                    );
                }
                done += 1;
                inflight -= 1;
            }
        }
        Ok(())
    }
}

impl Method for UringFixed {
    fn name(&self) -> &'static str {
        "io_uring"
    }
    fn describe(&self) -> String {
        format!(
            "io_uring READ_FIXED from a page-cached file into registered buffers, batches of up to {}",
            self.depth
        )
    }
    fn retrieve(&mut self, ds: &Dataset, n: u32, layers: Range<u32>) -> anyhow::Result<Calls> {
        timed_layers(layers, |l| self.layer(ds, n, l))
    }
}

pub struct Pread;

impl Method for Pread {
    fn name(&self) -> &'static str {
        "pread"
    }
    fn describe(&self) -> String {
        "one pread per object from the page-cached file".into()
    }
    fn retrieve(&mut self, ds: &Dataset, n: u32, layers: Range<u32>) -> anyhow::Result<Calls> {
        let obj = ds.g.object_bytes() as usize;
        timed_layers(layers, |layer| {
            for chunk in 0..n {
                for kv in 0..2 {
                    let at = ds.dst_offset(chunk, layer, kv);
                    // SAFETY: in bounds of the KV memory; nothing else touches it during the call.
                    let dst = unsafe { std::slice::from_raw_parts_mut(ds.kv.as_ptr().add(at), obj) };
                    let got = ds.file.read_at(dst, ds.source_offset(chunk, layer, kv))?;
                    if got != obj {
                        bail!("pread of chunk {chunk} layer {layer}: {got} of {obj} bytes");
                    }
                }
            }
            Ok(())
        })
    }
}

pub struct Memcpy;

impl Method for Memcpy {
    fn name(&self) -> &'static str {
        "memcpy"
    }
    fn describe(&self) -> String {
        "a memory copy of each object from the reference buffer (one thread)".into()
    }
    fn retrieve(&mut self, ds: &Dataset, n: u32, layers: Range<u32>) -> anyhow::Result<Calls> {
        let obj = ds.g.object_bytes() as usize;
        timed_layers(layers, |layer| {
            for chunk in 0..n {
                for kv in 0..2 {
                    let src = ds.source(chunk, layer, kv);
                    let at = ds.dst_offset(chunk, layer, kv);
                    if at + obj > ds.kv.len() {
                        bail!("slot offset {at:#x} is outside the KV memory");
                    }
                    // SAFETY: `src` is `obj` bytes of the reference buffer; the destination is
                    // `obj` bytes inside the KV memory (checked), a distinct allocation.
                    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), ds.kv.as_ptr().add(at), obj) };
                }
            }
            Ok(())
        })
    }
}

/// Runs `f` per layer, taking the calling thread's CPU time of each call.
fn timed_layers(layers: Range<u32>, mut f: impl FnMut(u32) -> anyhow::Result<()>) -> anyhow::Result<Calls> {
    let mut calls = Calls::default();
    for l in layers {
        let t0 = thread_cpu_ns();
        f(l)?;
        calls.cpu_ns.push(thread_cpu_ns().saturating_sub(t0));
    }
    Ok(calls)
}

#[cfg(test)]
mod tests {
    use super::super::data::Dataset;
    use super::super::measure::{run, Calls, Method};
    use std::ops::Range;
    use tutti_objstore::thread_cpu_ns;

    /// Copies like the memcpy baseline, but on another thread, and burns some more CPU there:
    /// the calling thread only waits.
    struct OffThread {
        worker_cpu_ns: u64,
    }

    impl Method for OffThread {
        fn name(&self) -> &'static str {
            "off-thread"
        }
        fn describe(&self) -> String {
            "memcpy on a worker thread".into()
        }
        fn retrieve(&mut self, ds: &Dataset, n: u32, layers: Range<u32>) -> anyhow::Result<Calls> {
            let t0 = thread_cpu_ns();
            let worker = std::thread::scope(|s| {
                s.spawn(|| -> anyhow::Result<u64> {
                    let w0 = thread_cpu_ns();
                    super::Memcpy.retrieve(ds, n, layers.clone())?;
                    let mut x = 1u64;
                    while thread_cpu_ns() - w0 < 20_000_000 {
                        for i in 0..10_000u64 {
                            x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
                        }
                    }
                    std::hint::black_box(x);
                    Ok(thread_cpu_ns() - w0)
                })
                .join()
                .map_err(|_| anyhow::anyhow!("worker panicked"))
            })??;
            self.worker_cpu_ns += worker;
            let per_layer = thread_cpu_ns().saturating_sub(t0) / layers.len() as u64;
            Ok(Calls { cpu_ns: vec![per_layer; layers.len()], ..Default::default() })
        }
    }

    #[test]
    fn process_cpu_counts_work_done_on_other_threads() {
        let g = tutti_objstore::Geometry {
            layers: 2,
            kv_heads: 2,
            head_dim: 64,
            tokens_per_block: 16,
            dtype: tutti_objstore::Dtype::Bf16,
        };
        let dir = std::env::temp_dir();
        let ds = Dataset::create(g, 8, 1, &dir).unwrap();
        let mut m = OffThread { worker_cpu_ns: 0 };
        let r = run(&mut m, &ds, 8, 0..2).unwrap();
        assert!(r.verified, "the worker's copy was not verified");
        let process_ns = r.process_cpu_us_per_layer * 2.0 * 1e3;
        // getrusage reports microseconds: allow one per thread for rounding.
        assert!(
            process_ns + 10_000.0 >= m.worker_cpu_ns as f64,
            "process CPU {process_ns} ns misses the worker's {} ns",
            m.worker_cpu_ns
        );
        assert!(
            r.process_cpu_us_per_layer > r.host_cpu_us_per_layer_call,
            "process CPU per layer {} µs should exceed the waiting thread's {} µs",
            r.process_cpu_us_per_layer,
            r.host_cpu_us_per_layer_call
        );
        assert!((r.process_cpu_ns_per_block - r.process_cpu_us_per_layer * 1e3 / 8.0).abs() < 1e-6);
    }
}
