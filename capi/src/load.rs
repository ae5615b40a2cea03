//! Starting a load: chunks looked up and pinned, then read into the engine's blocks layer by
//! layer, as a job (`jobs`). Stores start from a store session (`store`).

use crate::error::{guard, lock, CapiError, Result};
use crate::jobs::{layer_range, tutti_job_t, Job, Submitted, JOBS};
use crate::kv::{hashes_in, tutti_hash_t};
use crate::ptr::{self, TUTTI_MAX_BLOCKS_PER_CALL};
use crate::runtime::{tutti_runtime_t, Runtime};
use crate::status::TUTTI_OK;
use std::sync::Arc;
use tutti_objstore::Direction;

/// Loads chunk `hashes[i]` into engine block `block_ids[i]` for layers
/// `first_layer .. first_layer + num_layers`. The hashes are looked up (and
/// pinned for the job's life); from the first one not stored on, blocks are
/// not loaded and are reported failed in the job's bitmap, so the engine
/// recomputes exactly those. Block ids must be distinct and registered.
///
/// # Safety
/// `rt` is a runtime handle (checked); `hashes` and `block_ids` point to
/// `count` readable elements; `out_job` is writable.
#[no_mangle]
pub unsafe extern "C" fn tutti_load_submit(
    rt: *mut tutti_runtime_t,
    hashes: *const tutti_hash_t,
    block_ids: *const u32,
    count: usize,
    first_layer: u32,
    num_layers: u32,
    out_job: *mut *mut tutti_job_t,
) -> i32 {
    guard("tutti_load_submit", || {
        let rt = Runtime::get(rt)?;
        // SAFETY: forwarded from the caller.
        let out = unsafe { ptr::out(out_job, "out_job")? };
        *out = std::ptr::null_mut();
        // SAFETY: forwarded from the caller.
        let keys = unsafe { hashes_in(hashes, count)? };
        // SAFETY: forwarded from the caller.
        let blocks =
            unsafe { ptr::slice_in(block_ids, count, "block_ids", TUTTI_MAX_BLOCKS_PER_CALL as u64)? };
        if count == 0 {
            return Err(CapiError::invalid("count", "a load needs at least one block"));
        }
        let layers = layer_range(&rt, first_layer, num_layers)?;
        check_blocks(&rt, blocks)?;
        let store = rt.store()?;
        let found = store.lookup(&keys)?;
        let hits = found.hits();
        let id = if hits > 0 {
            match store.submit_load(&found.files, &blocks[..hits], layers.clone()) {
                Ok(id) => Some(id),
                Err(e) => {
                    let _ = store.unpin(found.pin);
                    return Err(e.into());
                }
            }
        } else {
            None
        };
        let job = Job::new(
            rt,
            Submitted {
                store,
                id,
                dir: Direction::Load,
                blocks: count as u32,
                submitted: hits as u32,
                layers,
                pin: found.pin,
                session: None,
            },
        );
        *out = JOBS.insert(Arc::new(job));
        Ok(TUTTI_OK)
    })
}

/// Every block id is registered and appears once.
fn check_blocks(rt: &Runtime, blocks: &[u32]) -> Result<()> {
    let num_blocks = lock(&rt.registered, "registration")?
        .as_ref()
        .map(|r| r.num_blocks)
        .ok_or(CapiError::Obj(tutti_objstore::ObjError::NotRegistered))?;
    let mut seen = std::collections::HashSet::with_capacity(blocks.len());
    for (i, &b) in blocks.iter().enumerate() {
        if b >= num_blocks {
            return Err(CapiError::invalid(
                "block_ids",
                format!("block_ids[{i}] = {b} is outside the {num_blocks} registered blocks"),
            ));
        }
        if !seen.insert(b) {
            return Err(CapiError::invalid("block_ids", format!("block_ids[{i}] = {b} appears twice")));
        }
    }
    Ok(())
}
