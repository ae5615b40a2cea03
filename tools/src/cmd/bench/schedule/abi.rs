//! The few C ABI calls `tutti bench schedule` makes, behind safe wrappers: the bench measures
//! what an engine gets through libtutti, the scheduler in its job path included.

use anyhow::{bail, Context};
use capi::*;
use std::ffi::{CStr, CString};
use std::ptr::{null, null_mut};
use std::time::Duration;

fn check(what: &str, rc: i32) -> anyhow::Result<i32> {
    if rc < 0 {
        // SAFETY: the library returns a NUL-terminated string valid until its next call here.
        let msg = unsafe { CStr::from_ptr(tutti_last_error()) }.to_string_lossy().into_owned();
        bail!("{what}: {msg}");
    }
    Ok(rc)
}

/// An open runtime, closed on drop.
pub struct Rt(*mut tutti_runtime_t);

/// Page-aligned host memory standing in for the engine's KV cache.
pub struct KvMem {
    buf: Vec<u8>,
    off: usize,
}

impl KvMem {
    pub fn new(len: usize) -> KvMem {
        let buf = vec![0u8; len + 4096];
        let off = buf.as_ptr().align_offset(4096);
        KvMem { buf, off }
    }
    pub fn addr(&self) -> u64 {
        self.buf[self.off..].as_ptr() as u64
    }
}

pub struct Job(*mut tutti_job_t);
pub struct Store(*mut tutti_store_t);

impl Rt {
    pub fn open(cfg: &tutti_runtime_config_t) -> anyhow::Result<Rt> {
        let mut rt = null_mut();
        // SAFETY: a valid config (its pointers NULL) and out pointer.
        check("tutti_runtime_open", unsafe { tutti_runtime_open(cfg, &mut rt) })?;
        Ok(Rt(rt))
    }

    /// Registers `mem` as vLLM per-layer KV of `blocks` blocks of `object` bytes.
    pub fn register(&self, mem: &KvMem, layers: u32, blocks: u32, object: u64) -> anyhow::Result<()> {
        let per_layer = 2 * u64::from(blocks) * object;
        let bases: Vec<u64> = (0..u64::from(layers)).map(|l| mem.addr() + l * per_layer).collect();
        let model = CString::new("bench-schedule")?;
        let l = tutti_kv_layout_t {
            struct_size: std::mem::size_of::<tutti_kv_layout_t>() as u32,
            kind: TUTTI_LAYOUT_VLLM_PER_LAYER,
            num_blocks: blocks,
            num_layers: layers,
            k_bases: bases.as_ptr(),
            v_bases: null(),
            base: 0,
            block_stride: 0,
            memory: TUTTI_MEMORY_HOST,
            model: model.as_ptr(),
            tenant_salt: null(),
            tenant_salt_len: 0,
        };
        // SAFETY: `mem` holds every object of the layout; the caller keeps it past this runtime.
        check("tutti_register_kv", unsafe { tutti_register_kv(self.0, &l, null_mut()) })?;
        Ok(())
    }

    pub fn configure(&self, c: &tutti_sched_config_t) -> anyhow::Result<()> {
        // SAFETY: a live handle and a valid config.
        check("tutti_sched_configure", unsafe { tutti_sched_configure(self.0, c) })?;
        Ok(())
    }

    pub fn layer_start(&self, input: u32, prefix: u32, layer: u32) -> anyhow::Result<()> {
        // SAFETY: a live handle.
        check("tutti_sched_layer_start", unsafe { tutti_sched_layer_start(self.0, input, prefix, layer) })?;
        Ok(())
    }

    pub fn layer_end(&self, layer: u32) -> anyhow::Result<()> {
        // SAFETY: a live handle.
        check("tutti_sched_layer_end", unsafe { tutti_sched_layer_end(self.0, layer) })?;
        Ok(())
    }

    pub fn decode_start(&self, context: u32) -> anyhow::Result<()> {
        // SAFETY: a live handle.
        check("tutti_sched_decode_start", unsafe { tutti_sched_decode_start(self.0, context) })?;
        Ok(())
    }

    pub fn decode_end(&self) -> anyhow::Result<()> {
        // SAFETY: a live handle.
        check("tutti_sched_decode_end", unsafe { tutti_sched_decode_end(self.0) })?;
        Ok(())
    }

    pub fn sched_stats(&self) -> anyhow::Result<tutti_sched_stats_t> {
        let mut s = tutti_sched_stats_t {
            struct_size: std::mem::size_of::<tutti_sched_stats_t>() as u32,
            ..Default::default()
        };
        // SAFETY: a live handle and a sized struct.
        check("tutti_sched_stats", unsafe { tutti_sched_stats(self.0, &mut s) })?;
        Ok(s)
    }

    pub fn load(&self, keys: &[tutti_hash_t], blocks: &[u32], layers: u32) -> anyhow::Result<Job> {
        let mut job = null_mut();
        // SAFETY: valid buffers of `keys.len()` elements and an out pointer.
        let rc = unsafe {
            tutti_submit_load(self.0, keys.as_ptr(), blocks.as_ptr(), keys.len(), 0, layers, &mut job)
        };
        check("tutti_submit_load", rc)?;
        Ok(Job(job))
    }

    pub fn store_begin(&self, keys: &[tutti_hash_t], blocks: &[u32]) -> anyhow::Result<Store> {
        let mut st = null_mut();
        // SAFETY: valid buffers of `keys.len()` elements and an out pointer.
        let rc = unsafe { tutti_store_begin(self.0, keys.as_ptr(), blocks.as_ptr(), keys.len(), &mut st) };
        check("tutti_store_begin", rc)?;
        Ok(Store(st))
    }
}

impl Drop for Rt {
    fn drop(&mut self) {
        // SAFETY: a live handle; the registration goes with the runtime.
        unsafe {
            tutti_unregister_kv(self.0);
            tutti_runtime_close(self.0);
        }
    }
}

fn status() -> tutti_job_status_t {
    tutti_job_status_t { struct_size: std::mem::size_of::<tutti_job_status_t>() as u32, ..Default::default() }
}

fn ms(d: Duration) -> u64 {
    d.as_millis().max(1) as u64
}

impl Job {
    /// Waits for layer `layer`; returns the blocks failed so far.
    pub fn wait_layer(&self, layer: u32, timeout: Duration) -> anyhow::Result<u32> {
        let mut s = status();
        // SAFETY: a live job and a sized status.
        check("tutti_job_wait_layer", unsafe { tutti_job_wait_layer(self.0, layer, ms(timeout), &mut s) })?;
        Ok(s.failed)
    }

    /// Whether every layer of the job has finished (without blocking).
    pub fn done(&self) -> anyhow::Result<bool> {
        // SAFETY: a live job; no status wanted.
        Ok(check("tutti_job_poll", unsafe { tutti_job_poll(self.0, null_mut()) })? == TUTTI_OK)
    }

    /// Waits for the whole job; returns the blocks failed.
    pub fn wait(&self, timeout: Duration) -> anyhow::Result<u32> {
        let mut s = status();
        // SAFETY: a live job and a sized status.
        check("tutti_job_wait", unsafe { tutti_job_wait(self.0, ms(timeout), &mut s) })?;
        Ok(s.failed)
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        // SAFETY: a live job handle.
        unsafe { tutti_job_destroy(self.0) };
    }
}

impl Store {
    /// Submits layer `layer` of the session's blocks (an engine's `save_kv_layer`).
    pub fn submit_layer(&self, layer: u32) -> anyhow::Result<Job> {
        let mut job = null_mut();
        // SAFETY: a live store handle and an out pointer.
        check("tutti_store_submit", unsafe { tutti_store_submit(self.0, layer, 1, &mut job) })?;
        Ok(Job(job))
    }

    /// Commits; returns the blocks stored.
    pub fn commit(&self) -> anyhow::Result<u32> {
        let mut r = tutti_store_report_t::default();
        // SAFETY: a live store handle and a sized report.
        check("tutti_store_commit", unsafe { tutti_store_commit(self.0, &mut r) }).context("commit")?;
        Ok(r.stored)
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // SAFETY: a live store handle.
        unsafe { tutti_store_destroy(self.0) };
    }
}

/// A distinct chunk key per (request, block): the bench's own, not token hashes.
pub fn key(request: u32, block: u32, salt: u32) -> tutti_hash_t {
    let mut bytes = [0u8; 16];
    bytes[..4].copy_from_slice(&request.to_le_bytes());
    bytes[4..8].copy_from_slice(&block.to_le_bytes());
    bytes[8..12].copy_from_slice(&salt.to_le_bytes());
    bytes[12..].copy_from_slice(b"bsch");
    tutti_hash_t { bytes }
}
