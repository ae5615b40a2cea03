//! Store sessions: reserve files for new chunks, write them layer range by
//! layer range (jobs), then commit: flushed data first, index entry after,
//! so a crash leaves a chunk either missing or whole.

use crate::error::{guard, lock, CapiError};
use crate::handles::Registry;
use crate::jobs::{layer_range, tutti_job_t, Job, Submitted, JOBS};
use crate::kv::{hashes_in, tutti_hash_t};
use crate::ptr::{self, SizePrefixed, TUTTI_MAX_BLOCKS_PER_CALL};
use crate::runtime::{tutti_runtime_t, Runtime};
use crate::session::{State, StoreSession};
use crate::status::TUTTI_OK;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use tutti_objstore::{Direction, ObjError};

/// A store session (opaque).
pub struct tutti_store_t {
    _private: [u8; 0],
}

/// What a commit achieved. Set `struct_size = sizeof(tutti_store_report_t)`,
/// and `failed_bitmap`/`failed_bitmap_words` if the per-block failures are wanted.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tutti_store_report_t {
    pub struct_size: u32,
    /// New blocks made durable and visible to lookups.
    pub stored: u32,
    /// Blocks written by no one in this session: their chunk was already stored, or another
    /// session was storing it (that one's commit decides; if it gives up, a later lookup misses).
    pub present: u32,
    /// Blocks not stored (pool full, a layer failed or was never written, I/O error).
    pub failed: u32,
    /// IN, nullable: bit (i % 64) of word i / 64 = block i of the session failed.
    pub failed_bitmap: *mut u64,
    /// IN: capacity of `failed_bitmap` in 64-bit words.
    pub failed_bitmap_words: u32,
}

impl Default for tutti_store_report_t {
    fn default() -> Self {
        tutti_store_report_t {
            struct_size: std::mem::size_of::<tutti_store_report_t>() as u32,
            stored: 0,
            present: 0,
            failed: 0,
            failed_bitmap: std::ptr::null_mut(),
            failed_bitmap_words: 0,
        }
    }
}

// SAFETY: repr(C) with `struct_size: u32` first.
unsafe impl SizePrefixed for tutti_store_report_t {
    const NAME: &'static str = "tutti_store_report_t";
}

static STORES: Registry<StoreSession> = Registry::new("tutti_store_t", 3);

/// Starts storing chunk `hashes[i]` from engine block `block_ids[i]`:
/// reserves a pool file for each chunk not yet stored (evicting
/// least-recently-used unpinned ones if needed). Write the layers with
/// `tutti_store_submit`, then `tutti_store_commit`; destroy with
/// `tutti_store_destroy` (an uncommitted session is given up).
///
/// # Safety
/// `rt` is a runtime handle (checked); `hashes` and `block_ids` point to
/// `count` readable elements; `out_store` is writable.
#[no_mangle]
pub unsafe extern "C" fn tutti_store_begin(
    rt: *mut tutti_runtime_t,
    hashes: *const tutti_hash_t,
    block_ids: *const u32,
    count: usize,
    out_store: *mut *mut tutti_store_t,
) -> i32 {
    guard("tutti_store_begin", || {
        let rt = Runtime::get(rt)?;
        // SAFETY: forwarded from the caller.
        let out = unsafe { ptr::out(out_store, "out_store")? };
        *out = std::ptr::null_mut();
        // SAFETY: forwarded from the caller.
        let keys = unsafe { hashes_in(hashes, count)? };
        // SAFETY: forwarded from the caller.
        let blocks =
            unsafe { ptr::slice_in(block_ids, count, "block_ids", TUTTI_MAX_BLOCKS_PER_CALL as u64)? };
        if count == 0 {
            return Err(CapiError::invalid("count", "a store needs at least one block"));
        }
        let store = rt.store()?;
        let id = store.begin_store(&keys, blocks)?;
        rt.stores_open.fetch_add(1, Ordering::Relaxed);
        let s = StoreSession {
            rt,
            store,
            id,
            blocks: count as u32,
            state: Mutex::new(State { committed: false, jobs: Vec::new() }),
        };
        *out = STORES.insert(Arc::new(s));
        Ok(TUTTI_OK)
    })
}

/// Writes layers `first_layer .. first_layer + num_layers` of the session's
/// new blocks from engine memory (an engine's `save_kv_layer`, for a range).
/// The job's bitmap is indexed like the session's blocks.
///
/// # Safety
/// `store` is a store handle (checked); `out_job` is writable.
#[no_mangle]
pub unsafe extern "C" fn tutti_store_submit(
    store: *mut tutti_store_t,
    first_layer: u32,
    num_layers: u32,
    out_job: *mut *mut tutti_job_t,
) -> i32 {
    guard("tutti_store_submit", || {
        let s = STORES.get(store)?;
        // SAFETY: forwarded from the caller.
        let out = unsafe { ptr::out(out_job, "out_job")? };
        *out = std::ptr::null_mut();
        let layers = layer_range(&s.rt, first_layer, num_layers)?;
        let mut state = lock(&s.state, "store")?;
        if state.committed {
            return Err(CapiError::invalid("store", "the store was already committed"));
        }
        let id = s.store.submit_store(s.id, layers.clone())?;
        state.jobs.push(id);
        drop(state);
        let job = Job::new(
            s.rt.clone(),
            Submitted {
                store: s.store.clone(),
                id: Some(id),
                dir: Direction::Store,
                blocks: s.blocks,
                submitted: s.blocks,
                layers,
                pin: 0,
                session: Some(s.clone()),
            },
        );
        *out = JOBS.insert(Arc::new(job));
        Ok(TUTTI_OK)
    })
}

/// Makes every block whose layers were all written durable, then visible to
/// lookups; the rest are given up. `TUTTI_E_BUSY` while a job of the session
/// is still running (wait for it first); a session commits once.
///
/// # Safety
/// `store` is a store handle (checked); `report` is NULL or points to a
/// `tutti_store_report_t` with `struct_size` set and a valid bitmap buffer.
#[no_mangle]
pub unsafe extern "C" fn tutti_store_commit(
    store: *mut tutti_store_t,
    report: *mut tutti_store_report_t,
) -> i32 {
    guard("tutti_store_commit", || {
        let s = STORES.get(store)?;
        // SAFETY: forwarded from the caller.
        let report = unsafe {
            if report.is_null() {
                None
            } else {
                Some(ptr::sized_out(report)?)
            }
        };
        // Every argument is checked before anything is committed: a rejected
        // call leaves the session as it was, to be committed again.
        let words = (s.blocks as usize).div_ceil(64);
        let bitmap = match &report {
            Some(r) if !r.failed_bitmap.is_null() => {
                if (r.failed_bitmap_words as usize) < words {
                    return Err(CapiError::BufferTooSmall {
                        what: "failed_bitmap (words)",
                        needed: words,
                        capacity: r.failed_bitmap_words as usize,
                    });
                }
                // SAFETY: the caller promises `failed_bitmap_words` (>= `words`) writable words
                // (struct docs); the pointer's alignment is checked here.
                Some(unsafe { ptr::slice_out(r.failed_bitmap, words, "failed_bitmap")? })
            }
            _ => None,
        };
        let mut state = lock(&s.state, "store")?;
        if state.committed {
            return Err(CapiError::invalid("store", "the store was already committed"));
        }
        // A job's end reaches the session when the job is next advanced.
        for &j in &state.jobs {
            match s.store.poll(j) {
                Ok(_) | Err(ObjError::Unknown { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let r = s.store.commit_store(s.id)?;
        state.committed = true;
        s.rt.stores_open.fetch_sub(1, Ordering::Relaxed);
        if let Some(out) = report {
            out.stored = r.stored;
            out.present = r.present;
            out.failed = r.failed.len() as u32;
            if let Some(dst) = bitmap {
                dst.fill(0);
                for (i, _) in &r.failed {
                    dst[*i as usize / 64] |= 1 << (i % 64);
                }
            }
        }
        Ok(TUTTI_OK)
    })
}

/// Destroys a store handle. An uncommitted session is given up (its files
/// are freed) once its jobs are destroyed too. NULL is a no-op.
///
/// # Safety
/// `store` is NULL or a store handle (a stale one is detected).
#[no_mangle]
pub unsafe extern "C" fn tutti_store_destroy(store: *mut tutti_store_t) -> i32 {
    guard("tutti_store_destroy", || {
        drop(STORES.remove(store)?);
        Ok(TUTTI_OK)
    })
}
