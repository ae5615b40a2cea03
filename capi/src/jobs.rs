//! Jobs: a load or store of many blocks over a range of layers, polled,
//! waited for (whole or one layer), cancelled, and destroyed from C.

use crate::error::{guard, CapiError, Result};
use crate::handles::Registry;
use crate::ptr::{self, SizePrefixed};
use crate::runtime::Runtime;
use crate::session::StoreSession;
use crate::status::{TUTTI_IN_PROGRESS, TUTTI_OK};
use std::ffi::c_char;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tutti_objstore::{Direction, JobId, JobStatus, KvStore};

/// A load: drive → engine memory.
pub const TUTTI_DIR_LOAD: u32 = 1;
/// A store: engine memory → drive.
pub const TUTTI_DIR_STORE: u32 = 2;

/// How long destroying an unfinished job waits for the layers already handed
/// to the drives (each NVMe command has its own, shorter, deadline).
const DRAIN: Duration = Duration::from_secs(30);

/// A load or store job (opaque).
pub struct tutti_job_t {
    _private: [u8; 0],
}

/// A job's progress. Set `struct_size = sizeof(tutti_job_status_t)` (64 for
/// a caller built against ABI 1.0, which gets the fields up to `bytes`; 120
/// for ABI 1.1, up to `layer_submit_ns`; 136 since ABI 1.2), and
/// `failed_bitmap`/`failed_bitmap_words` if the per-block failures are
/// wanted (`unknown_bitmap`/`unknown_bitmap_words` for those of unknown
/// outcome, `layer_submit_ns`/`layer_submit_ns_len` for the per-layer
/// submission CPU).
///
/// The caller's buffers are filled after the fields; a buffer given with
/// too small a capacity is left alone and the call returns
/// `TUTTI_E_BUFFER_TOO_SMALL` once the fields and the other buffers are filled.
///
/// Unknown outcome (ABI 1.2, `unknown`, `unknown_bitmap`): a failed block
/// whose NVMe command timed out or whose queue or drive died, so the drive
/// may still execute it later:
/// - load: the drive may still write that engine block's KV memory until
///   the drive is reset (the runtime closed; opening the pool again, e.g. in
///   a new process, resets the controllers). Until then the engine must not
///   hand that block's memory to another request, nor recompute into it:
///   treat the block as poisoned (keep it out of the free list) and
///   recompute the request's KV into other blocks, or the late read can
///   overwrite the new KV.
/// - store: the block was not stored, and its pool file is quarantined
///   (`tutti_stats_t::quarantined_files`), never reused nor served by a
///   lookup in this runtime; the engine's block is only read, so it is free.
///
/// The gio_uring executors recover the drive first (its queue pairs deleted
/// and created again, which completes or aborts every earlier command): such
/// a block then fails with a known outcome, is not in `unknown`, and its file
/// is reused. A block is reported unknown only when that recovery failed, or
/// with `TUTTI_EXECUTOR_DIRECT`, which does not recover drives.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tutti_job_status_t {
    pub struct_size: u32,
    /// `TUTTI_DIR_*`.
    pub direction: u32,
    /// 1 when every layer has finished (successfully or not).
    pub done: u32,
    pub cancelled: u32,
    pub first_layer: u32,
    pub num_layers: u32,
    pub layers_done: u32,
    /// Blocks of the submission.
    pub blocks: u32,
    /// Blocks with a failure so far (their KV must be recomputed / was not stored).
    pub failed: u32,
    /// IN: capacity of `failed_bitmap` in 64-bit words (at least ceil(blocks / 64) if given).
    pub failed_bitmap_words: u32,
    /// IN, nullable: receives the failures, bit (i % 64) of word i / 64 = block i of the submission.
    pub failed_bitmap: *mut u64,
    /// NVMe commands issued so far.
    pub commands: u64,
    /// KV bytes of the blocks that did not fail, over the finished layers.
    pub bytes: u64,
    /// ABI 1.1: calls the host made into the I/O path for this job.
    pub host_calls: u64,
    /// ABI 1.1: commands whose fields the host wrote itself (0 when the executor expands them).
    pub host_built: u64,
    /// ABI 1.1: (file, block) pairs the host read or copied in the job's
    /// per-layer submissions; 0 when `pairs_registered` (the executor reads
    /// the registered list).
    pub host_pairs: u64,
    /// ABI 1.1: host CPU (the submitting thread's CPU time) of the job's
    /// setup: validation, I/O references, pair registration; ns, once per job.
    pub setup_ns: u64,
    /// ABI 1.1: host CPU of the job's per-layer submissions so far (the sum
    /// of `layer_submit_ns`), ns.
    pub submit_ns: u64,
    /// ABI 1.1: 1 when the job's (file, block) pairs were registered with
    /// the I/O path once, at its start, so layers refer to them.
    pub pairs_registered: u32,
    /// ABI 1.1, IN: capacity of `layer_submit_ns` in entries (at least `num_layers` if given).
    pub layer_submit_ns_len: u32,
    /// ABI 1.1, IN, nullable: receives the host CPU inside the I/O path's
    /// submit per layer, ns; entry i = layer `first_layer + i` (0 while not submitted).
    pub layer_submit_ns: *mut u64,
    /// ABI 1.2: of the `failed` blocks, those with an unknown outcome (see above).
    pub unknown: u32,
    /// ABI 1.2, IN: capacity of `unknown_bitmap` in 64-bit words (at least ceil(blocks / 64) if given).
    pub unknown_bitmap_words: u32,
    /// ABI 1.2, IN, nullable: receives the blocks of unknown outcome, a subset
    /// of `failed_bitmap`, in its bit order.
    pub unknown_bitmap: *mut u64,
}

impl Default for tutti_job_status_t {
    fn default() -> Self {
        tutti_job_status_t {
            struct_size: 0,
            direction: 0,
            done: 0,
            cancelled: 0,
            first_layer: 0,
            num_layers: 0,
            layers_done: 0,
            blocks: 0,
            failed: 0,
            failed_bitmap_words: 0,
            failed_bitmap: std::ptr::null_mut(),
            commands: 0,
            bytes: 0,
            host_calls: 0,
            host_built: 0,
            host_pairs: 0,
            setup_ns: 0,
            submit_ns: 0,
            pairs_registered: 0,
            layer_submit_ns_len: 0,
            layer_submit_ns: std::ptr::null_mut(),
            unknown: 0,
            unknown_bitmap_words: 0,
            unknown_bitmap: std::ptr::null_mut(),
        }
    }
}

// SAFETY: repr(C) with `struct_size: u32` first; integers and pointers, no padding
// (ten u32, then 8-byte fields from offset 40; two u32 before each later pointer).
unsafe impl SizePrefixed for tutti_job_status_t {
    const NAME: &'static str = "tutti_job_status_t";
    const SIZES: &'static [u32] = &[
        std::mem::offset_of!(tutti_job_status_t, host_calls) as u32,
        std::mem::offset_of!(tutti_job_status_t, unknown) as u32,
        std::mem::size_of::<tutti_job_status_t>() as u32,
    ];
}

pub(crate) struct Job {
    rt: Arc<Runtime>,
    /// The store the job was submitted on (a reconnected client's jobs of before the
    /// reconnect stay on the old one, and fail with it).
    store: Arc<KvStore>,
    key: u64,
    /// The object store's job; `None` when no block could be submitted.
    id: Option<JobId>,
    dir: Direction,
    blocks: u32,
    /// Loads: blocks `0..submitted` went to the store; the rest were not stored.
    submitted: u32,
    layers: Range<u32>,
    /// Loads: the pin of the job's own lookup, released with the job.
    pin: u64,
    /// Stores: the session written for (kept open while the job lives).
    _session: Option<Arc<StoreSession>>,
    /// The failures already added to the runtime's `failed_blocks` (bitmap).
    counted: Mutex<Vec<u64>>,
}

pub(crate) static JOBS: Registry<Job> = Registry::new("tutti_job_t", 2);

/// A layer range of the pool's geometry.
pub(crate) fn layer_range(rt: &Runtime, first: u32, count: u32) -> Result<Range<u32>> {
    let layers = rt.geometry.layers;
    match first.checked_add(count) {
        Some(end) if count > 0 && end <= layers => Ok(first..end),
        _ => Err(CapiError::invalid(
            "layers",
            format!("first_layer {first} + num_layers {count} is not a non-empty range within 0..{layers}"),
        )),
    }
}

/// What was handed to the object store for a new job.
pub(crate) struct Submitted {
    pub store: Arc<KvStore>,
    pub id: Option<JobId>,
    pub dir: Direction,
    pub blocks: u32,
    pub submitted: u32,
    pub layers: Range<u32>,
    pub pin: u64,
    pub session: Option<Arc<StoreSession>>,
}

/// One view of a job, whatever happened to the part not submitted.
struct View {
    st: Option<JobStatus>,
    failed: Vec<u64>,
    /// The failed blocks of unknown outcome (a subset of `failed`, as long).
    unknown: Vec<u64>,
    first_error: Option<String>,
}

impl Job {
    pub(crate) fn new(rt: Arc<Runtime>, s: Submitted) -> Job {
        let key = rt.next_key();
        rt.set_in_flight(key, if s.id.is_some() { s.layers.len() as u32 } else { 0 });
        let Submitted { store, id, dir, blocks, submitted, layers, pin, session } = s;
        let job = Job {
            rt,
            store,
            key,
            id,
            dir,
            blocks,
            submitted,
            layers,
            pin,
            _session: session,
            counted: Mutex::new(vec![0; (blocks as usize).div_ceil(64)]),
        };
        // The blocks not submitted have failed already, whether or not the job is ever polled.
        job.count_failures(&job.failed_bitmap(None));
        job
    }

    /// The job's failure bitmap: the object store's, plus the blocks not submitted.
    fn failed_bitmap(&self, st: Option<&JobStatus>) -> Vec<u64> {
        let mut failed = st.map(|s| s.failed_blocks.clone()).unwrap_or_default();
        failed.resize((self.blocks as usize).div_ceil(64), 0);
        for i in self.submitted..self.blocks {
            failed[i as usize / 64] |= 1 << (i % 64);
        }
        failed
    }

    /// Adds the failures not counted before to the runtime's `failed_blocks`:
    /// every block a job reports failed counts once, however often it is seen.
    fn count_failures(&self, failed: &[u64]) {
        let Ok(mut counted) = self.counted.lock() else {
            return;
        };
        let mut new = 0u64;
        for (c, &f) in counted.iter_mut().zip(failed) {
            new += (f & !*c).count_ones() as u64;
            *c |= f;
        }
        self.rt.failed_blocks.fetch_add(new, Ordering::Relaxed);
    }

    fn view(&self, st: Option<JobStatus>) -> View {
        let failed = self.failed_bitmap(st.as_ref());
        self.count_failures(&failed);
        // Only the object store's blocks can be unknown: the blocks not
        // submitted never reached a drive.
        let mut unknown = st.as_ref().map(|s| s.unknown_blocks.clone()).unwrap_or_default();
        unknown.resize(failed.len(), 0);
        for (u, f) in unknown.iter_mut().zip(&failed) {
            *u &= f;
        }
        let mut first_error = st.as_ref().and_then(|s| s.first_error.clone());
        if self.submitted < self.blocks && first_error.is_none() {
            first_error = Some(format!(
                "block {} (and every later one) is not stored under this cache identity",
                self.submitted
            ));
        }
        if let Some(s) = &st {
            self.rt.set_in_flight(self.key, if s.done { 0 } else { s.layers - s.layers_done });
        }
        View { st, failed, unknown, first_error }
    }

    fn poll(&self) -> Result<View> {
        Ok(self.view(self.id.map(|id| self.store.poll(id)).transpose()?))
    }

    /// As `poll`, also after tuttid is gone (the reasons of the job's failures).
    fn status(&self) -> Result<View> {
        Ok(self.view(self.id.map(|id| self.store.status(id)).transpose()?))
    }

    fn wait(&self, timeout: Duration) -> Result<View> {
        Ok(self.view(self.id.map(|id| self.store.wait(id, timeout)).transpose()?))
    }

    fn wait_layer(&self, layer: u32, timeout: Duration) -> Result<View> {
        self.check_layer(layer)?;
        Ok(self.view(self.id.map(|id| self.store.wait_layer(id, layer, timeout)).transpose()?))
    }

    fn check_layer(&self, layer: u32) -> Result<()> {
        if !self.layers.contains(&layer) {
            return Err(CapiError::invalid(
                "layer",
                format!("layer {layer} is not in the job's {}..{}", self.layers.start, self.layers.end),
            ));
        }
        Ok(())
    }

    fn done(v: &View) -> bool {
        v.st.as_ref().is_none_or(|s| s.done)
    }

    fn layer_done(&self, v: &View, layer: u32) -> bool {
        v.st.as_ref().is_none_or(|s| s.layer_is_done(layer))
    }

    /// Sets the fields of `out` from `v` (the caller's buffers are filled by `fill_buffers`).
    fn fill(&self, v: &View, out: &mut tutti_job_status_t) {
        let failed: u32 = v.failed.iter().map(|w| w.count_ones()).sum();
        let layers_done = v.st.as_ref().map_or(self.layers.len() as u32, |s| s.layers_done);
        let obj = self.store.stripe_map().object_bytes();
        out.direction = match self.dir {
            Direction::Load => TUTTI_DIR_LOAD,
            Direction::Store => TUTTI_DIR_STORE,
        };
        out.done = Job::done(v) as u32;
        out.cancelled = v.st.as_ref().is_some_and(|s| s.cancelled) as u32;
        out.first_layer = self.layers.start;
        out.num_layers = self.layers.len() as u32;
        out.layers_done = layers_done;
        out.blocks = self.blocks;
        out.failed = failed;
        out.unknown = v.unknown.iter().map(|w| w.count_ones()).sum();
        out.commands = v.st.as_ref().map_or(0, |s| s.commands);
        out.bytes = self.blocks.saturating_sub(failed) as u64 * layers_done as u64 * 2 * obj;
        if let Some(s) = &v.st {
            out.host_calls = s.host_calls;
            out.host_built = s.host_built;
            out.host_pairs = s.host_pairs;
            out.setup_ns = s.setup_ns;
            out.submit_ns = s.submit_ns;
            out.pairs_registered = s.pairs_registered as u32;
        }
    }

    /// Copies the failure bitmaps and the per-layer submission CPU into the
    /// caller's buffers named in `out` (each nullable). A buffer too small is
    /// skipped and reported after the others are filled.
    fn fill_buffers(&self, v: &View, out: &tutti_job_status_t) -> Result<()> {
        // Entry i = layer first_layer + i; 0 for a layer not submitted yet.
        let mut layer_ns = vec![0u64; self.layers.len()];
        if let Some(s) = &v.st {
            for (d, &ns) in layer_ns.iter_mut().zip(&s.layer_submit_ns) {
                *d = ns;
            }
        }
        // SAFETY: the caller promises `failed_bitmap_words` writable words (struct docs).
        let failed = unsafe {
            words_out(&v.failed, out.failed_bitmap, out.failed_bitmap_words, "failed_bitmap (words)")
        };
        // SAFETY: as above, `unknown_bitmap_words` words (only read from a 1.2 caller's struct).
        let unknown = unsafe {
            words_out(&v.unknown, out.unknown_bitmap, out.unknown_bitmap_words, "unknown_bitmap (words)")
        };
        // SAFETY: as above, `layer_submit_ns_len` entries (only read from a 1.1+ caller's struct).
        let layers = unsafe {
            words_out(&layer_ns, out.layer_submit_ns, out.layer_submit_ns_len, "layer_submit_ns (entries)")
        };
        failed.and(unknown).and(layers)
    }
}

/// Copies `words` into an optional caller buffer of `capacity` `u64`s.
///
/// # Safety
/// `dst` is NULL or points to `capacity` writable `u64`s.
unsafe fn words_out(words: &[u64], dst: *mut u64, capacity: u32, what: &'static str) -> Result<()> {
    if dst.is_null() {
        return Ok(());
    }
    if (capacity as usize) < words.len() {
        return Err(CapiError::BufferTooSmall { what, needed: words.len(), capacity: capacity as usize });
    }
    // SAFETY: forwarded; `words.len() <= capacity`.
    let dst = unsafe { ptr::slice_out(dst, words.len(), what)? };
    dst.copy_from_slice(words);
    Ok(())
}

impl Drop for Job {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            let store = &self.store;
            // Cancels what was not submitted and waits (bounded) for the layers on the drives,
            // also when tuttid is gone: a command in flight may still move the job's bytes.
            match store.drain(id, DRAIN) {
                // Failures no poll saw yet (a job destroyed unwaited) still count once.
                Ok(s) => self.count_failures(&self.failed_bitmap(Some(&s))),
                Err(e) => tracing::warn!(job = id, error = %e, "a destroyed job could not be drained"),
            }
            if let Err(e) = store.release(id) {
                tracing::warn!(job = id, error = %e, "a destroyed job could not be released");
            }
        }
        if let Err(e) = self.store.unpin(self.pin) {
            tracing::warn!(pin = self.pin, error = %e, "a destroyed load's pin could not be released");
        }
        self.rt.set_in_flight(self.key, 0);
    }
}

/// Checks a caller's status struct (its size and the alignment of the
/// buffers it names) before the call does anything, so a bad one is refused
/// without waiting or advancing the job. Capacities are checked when the
/// buffers are filled (see `tutti_job_status_t`).
///
/// # Safety
/// As `answer`.
unsafe fn check_status(status: *mut tutti_job_status_t) -> Result<()> {
    if status.is_null() {
        return Ok(());
    }
    // SAFETY: forwarded from the caller; reading only (`commit` is never called).
    let s = unsafe { ptr::sized_out_prefix(status)? };
    let buffers = [
        (s.val.failed_bitmap, "failed_bitmap"),
        (s.val.unknown_bitmap, "unknown_bitmap"),
        (s.val.layer_submit_ns, "layer_submit_ns"),
    ];
    for (p, what) in buffers {
        if !p.is_null() && !p.is_aligned() {
            return Err(CapiError::Misaligned(what, "uint64_t"));
        }
    }
    Ok(())
}

/// Answers a job call: fills `status` (nullable; as many fields as its
/// `struct_size` covers) even when the call then reports a timeout, so the
/// caller sees how far the job got; then the caller's buffers.
///
/// # Safety
/// `status` is NULL or points to a `tutti_job_status_t` of any ABI-1 minor
/// version with `struct_size` set.
unsafe fn answer(job: &Job, v: &View, status: *mut tutti_job_status_t) -> Result<()> {
    if !status.is_null() {
        // SAFETY: forwarded from the caller.
        let mut out = unsafe { ptr::sized_out_prefix(status)? };
        job.fill(v, &mut out.val);
        let buffers = out.val;
        out.commit();
        job.fill_buffers(v, &buffers)?;
    }
    Ok(())
}

fn job_of(handle: *const tutti_job_t) -> Result<Arc<Job>> {
    JOBS.get(handle)
}

/// Progress without blocking: `TUTTI_OK` when every layer has finished,
/// `TUTTI_IN_PROGRESS` otherwise. Failed blocks are not an error of the call:
/// `status->failed` and the bitmap report them (`tutti_job_error` says why).
///
/// # Safety
/// `job` is a job handle (checked); `status` is NULL or points to a
/// `tutti_job_status_t` with `struct_size` set and a valid bitmap buffer.
#[no_mangle]
pub unsafe extern "C" fn tutti_job_poll(job: *mut tutti_job_t, status: *mut tutti_job_status_t) -> i32 {
    guard("tutti_job_poll", || {
        let j = job_of(job)?;
        // SAFETY: forwarded from the caller.
        unsafe { check_status(status)? };
        let v = j.poll()?;
        // SAFETY: forwarded from the caller.
        unsafe { answer(&j, &v, status)? };
        Ok(if Job::done(&v) { TUTTI_OK } else { TUTTI_IN_PROGRESS })
    })
}

/// Waits until every layer has finished (`TUTTI_OK`) or `timeout_ms` passes
/// (`TUTTI_E_TIMEOUT`; `status` is filled either way).
///
/// # Safety
/// As `tutti_job_poll`.
#[no_mangle]
pub unsafe extern "C" fn tutti_job_wait(
    job: *mut tutti_job_t,
    timeout_ms: u64,
    status: *mut tutti_job_status_t,
) -> i32 {
    guard("tutti_job_wait", || {
        let j = job_of(job)?;
        // SAFETY: forwarded from the caller.
        unsafe { check_status(status)? };
        let v = j.wait(ptr::timeout(timeout_ms)?)?;
        // SAFETY: forwarded from the caller.
        unsafe { answer(&j, &v, status)? };
        if !Job::done(&v) {
            let s = v.st.as_ref().map_or(0, |s| s.layers_done);
            return Err(CapiError::Timeout(format!(
                "the job did not finish within {timeout_ms} ms ({s} of {} layers done)",
                j.layers.len()
            )));
        }
        Ok(TUTTI_OK)
    })
}

/// Whether layer `layer` (absolute index) of the job has finished, without
/// blocking: `TUTTI_OK` or `TUTTI_IN_PROGRESS`; `TUTTI_E_INVALID_ARG` if the
/// job does not cover that layer.
///
/// # Safety
/// `job` is a job handle (checked).
#[no_mangle]
pub unsafe extern "C" fn tutti_job_layer_done(job: *mut tutti_job_t, layer: u32) -> i32 {
    guard("tutti_job_layer_done", || {
        let j = job_of(job)?;
        j.check_layer(layer)?;
        let v = j.poll()?;
        Ok(if j.layer_done(&v, layer) { TUTTI_OK } else { TUTTI_IN_PROGRESS })
    })
}

/// Waits until layer `layer` (absolute index) of the job has finished
/// (`TUTTI_OK`) or `timeout_ms` passes (`TUTTI_E_TIMEOUT`): an engine's
/// `wait_for_layer_load`. `status` (nullable) is filled either way.
///
/// # Safety
/// As `tutti_job_poll`.
#[no_mangle]
pub unsafe extern "C" fn tutti_job_wait_layer(
    job: *mut tutti_job_t,
    layer: u32,
    timeout_ms: u64,
    status: *mut tutti_job_status_t,
) -> i32 {
    guard("tutti_job_wait_layer", || {
        let j = job_of(job)?;
        // SAFETY: forwarded from the caller.
        unsafe { check_status(status)? };
        let v = j.wait_layer(layer, ptr::timeout(timeout_ms)?)?;
        // SAFETY: forwarded from the caller.
        unsafe { answer(&j, &v, status)? };
        if !j.layer_done(&v, layer) {
            return Err(CapiError::Timeout(format!("layer {layer} did not finish within {timeout_ms} ms")));
        }
        Ok(TUTTI_OK)
    })
}

/// Stops submitting the job's remaining layers; their blocks are reported
/// failed ("cancelled"). Layers already on the drives finish. Poll or wait
/// to see the job done.
///
/// # Safety
/// `job` is a job handle (checked).
#[no_mangle]
pub unsafe extern "C" fn tutti_job_cancel(job: *mut tutti_job_t) -> i32 {
    guard("tutti_job_cancel", || {
        let j = job_of(job)?;
        if let Some(id) = j.id {
            j.store.cancel(id)?;
        }
        Ok(TUTTI_OK)
    })
}

/// Copies the reason of the job's first block failure ("" if none so far)
/// into `buf` (NUL-terminated). It answers also after the runtime's tuttid is gone, when every
/// other call on the job fails. `*needed` (nullable) gets the bytes needed
/// including the NUL; `TUTTI_E_BUFFER_TOO_SMALL` if `capacity` is less.
///
/// # Safety
/// `job` is a job handle (checked); `buf` points to `capacity` writable
/// bytes (NULL if 0); `needed` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tutti_job_error(
    job: *mut tutti_job_t,
    buf: *mut c_char,
    capacity: usize,
    needed: *mut usize,
) -> i32 {
    guard("tutti_job_error", || {
        let j = job_of(job)?;
        let v = j.status()?;
        let msg = v.first_error.unwrap_or_default();
        // SAFETY: forwarded from the caller.
        unsafe { ptr::copy_str(msg.as_bytes(), buf, capacity, needed)? };
        Ok(TUTTI_OK)
    })
}

/// Destroys a job: an unfinished one is cancelled and its in-flight layers
/// are waited for (bounded), then it is released (a load's pins with it).
/// NULL is a no-op; a destroyed handle gets `TUTTI_E_BAD_HANDLE`.
///
/// # Safety
/// `job` is NULL or a job handle (a stale one is detected).
#[no_mangle]
pub unsafe extern "C" fn tutti_job_destroy(job: *mut tutti_job_t) -> i32 {
    guard("tutti_job_destroy", || {
        drop(JOBS.remove(job)?);
        Ok(TUTTI_OK)
    })
}
