//! Waiting for device work from the host, always against a deadline, and the
//! implicit ordering of the legacy default stream.

use crate::context::Context;
use crate::current;
use crate::driver::{driver, State};
use crate::error::{fail, Result};
use crate::stream::{Dep, Stream, StreamKind};
use cudarc::driver::sys::{CUresult, CUstream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// CU_STREAM_LEGACY and CU_STREAM_PER_THREAD.
const STREAM_LEGACY: usize = 1;
const STREAM_PER_THREAD: usize = 2;

/// Waits until every operation enqueued on `streams` so far has run. After
/// `deadline` it fails with CUDA_ERROR_TIMEOUT and records a violation: the
/// real driver would block for as long as the work runs (forever, behind a
/// persistent kernel).
pub(crate) fn sync_streams(call: &str, streams: &[Arc<Stream>], deadline: Duration) -> Result<()> {
    let targets: Vec<(Arc<Stream>, u64)> = streams.iter().map(|s| (s.clone(), s.enqueued())).collect();
    let start = Instant::now();
    let done = crate::device::progress()
        .wait_until(start + deadline, || targets.iter().all(|(s, t)| s.completed() >= *t));
    if done {
        return Ok(());
    }
    let busy: Vec<String> = targets
        .iter()
        .filter(|(s, t)| s.completed() < *t)
        .map(|(s, _)| {
            format!("{} on stream {:#x}", s.running().unwrap_or_else(|| "waiting".into()), s.handle)
        })
        .collect();
    let text = format!(
        "{call} blocked {:.1} s behind a running kernel ({}); the driver would block until it returns",
        start.elapsed().as_secs_f64(),
        busy.join(", ")
    );
    driver().state().violation(text.clone());
    Err(fail(CUresult::CUDA_ERROR_TIMEOUT, text))
}

/// Like [`sync_streams`] for every stream of context `ctx` (what freeing memory does).
pub(crate) fn sync_context(call: &str, ctx: usize) -> Result<()> {
    let (streams, deadline) = {
        let st = driver().state();
        match st.contexts.get(&ctx) {
            Some(c) => (st.streams_of(c), st.knobs.sync_deadline),
            None => return Ok(()),
        }
    };
    sync_streams(call, &streams, deadline)
}

/// The stream a handle names: NULL and CU_STREAM_LEGACY are the current
/// context's legacy stream.
pub(crate) fn resolve(st: &State, h: CUstream) -> Result<(Arc<Stream>, Arc<Context>)> {
    let raw = h as usize;
    if raw == 0 || raw == STREAM_LEGACY {
        let ctx = current::current_ctx(st)?;
        return Ok((ctx.legacy.clone(), ctx));
    }
    if raw == STREAM_PER_THREAD {
        return Err(fail(CUresult::CUDA_ERROR_INVALID_HANDLE, "per-thread default streams are not modelled"));
    }
    let s = st.streams.get(&raw).cloned().ok_or_else(|| {
        fail(CUresult::CUDA_ERROR_INVALID_HANDLE, format!("no stream {raw:#x} (destroyed?)"))
    })?;
    let ctx = st.context(s.ctx)?;
    Ok((s, ctx))
}

/// What an operation enqueued now on `s` must wait for besides its own stream.
pub(crate) fn implicit_deps(st: &State, s: &Stream, ctx: &Context) -> Vec<Dep> {
    match s.kind {
        StreamKind::Legacy => st
            .streams
            .values()
            .filter(|o| o.ctx == ctx.handle && o.kind == StreamKind::Blocking)
            .map(|o| Dep::Stream(o.clone(), o.enqueued()))
            .collect(),
        StreamKind::Blocking => vec![Dep::Stream(ctx.legacy.clone(), ctx.legacy.enqueued())],
        StreamKind::NonBlocking => Vec::new(),
    }
}
