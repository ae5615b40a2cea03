//! The profiler's C calls: engines report each prefill's shape and the
//! compute interval of every layer; the runtime's profiler (its state in
//! `profile_state`) fits them into a slack table (tutti-scheduler
//! `Profiler`), which can be saved for `tutti`.

use crate::clock::now_ns;
use crate::error::{guard, lock, CapiError, Result};
use crate::profile_state::ProfileState;
use crate::ptr;
use crate::runtime::{tutti_runtime_t, Runtime};
use crate::status::TUTTI_OK;
use std::ffi::c_char;
use std::path::Path;
use tutti_scheduler::{Identity, IoPartition, RequestShape, TableGrid};

/// Layer starts waiting for their end; bounded so a forgotten end cannot grow it forever.
const MAX_OPEN_LAYERS: usize = 1 << 16;
/// The profiler keeps every sample until the table is built; a profiling
/// run needs far fewer, so an engine that leaves profiling on is stopped
/// with an error instead of growing without bound.
pub const TUTTI_MAX_PROFILED_REQUESTS: u64 = 1 << 16;
/// Decode steps the profiler keeps (see `TUTTI_MAX_PROFILED_REQUESTS`).
pub const TUTTI_MAX_PROFILED_DECODE_STEPS: u64 = 1 << 20;

fn full(what: &str, max: u64) -> CapiError {
    CapiError::Sched(tutti_scheduler::SchedError::Profile(format!(
        "the profiler holds {max} {what} already; save the slack table (it has enough samples)"
    )))
}

/// Nanoseconds on the monotonic clock the `tutti_profile_layer_start/end`
/// hooks use (its zero is the first use in the process).
///
/// # Safety
/// None: callable at any time from any thread.
#[no_mangle]
pub extern "C" fn tutti_clock_ns() -> u64 {
    crate::error::guard_value(0, now_ns)
}

fn with_hooks(rt: *const tutti_runtime_t, f: impl FnOnce(&mut ProfileState) -> Result<()>) -> Result<i32> {
    let rt = Runtime::get(rt)?;
    let mut h = lock(&rt.profile, "profiler")?;
    f(&mut h)?;
    Ok(TUTTI_OK)
}

/// A prefill starts: `input_tokens` computed, `prefix_tokens` loaded from the
/// cache. Its layers follow as `tutti_profile_layer_start/end` or `tutti_profile_layer`.
///
/// # Safety
/// `rt` is a runtime handle (checked).
#[no_mangle]
pub unsafe extern "C" fn tutti_profile_request_begin(
    rt: *mut tutti_runtime_t,
    request_id: u64,
    input_tokens: u32,
    prefix_tokens: u32,
) -> i32 {
    guard("tutti_profile_request_begin", || {
        with_hooks(rt, |h| {
            if h.requests >= TUTTI_MAX_PROFILED_REQUESTS {
                return Err(full("requests", TUTTI_MAX_PROFILED_REQUESTS));
            }
            h.profiler.begin_request(request_id, RequestShape::new(input_tokens, prefix_tokens))?;
            h.requests += 1;
            Ok(())
        })
    })
}

/// Layer `layer` of request `request_id` starts computing now.
///
/// # Safety
/// `rt` is a runtime handle (checked).
#[no_mangle]
pub unsafe extern "C" fn tutti_profile_layer_start(
    rt: *mut tutti_runtime_t,
    request_id: u64,
    layer: u32,
) -> i32 {
    guard("tutti_profile_layer_start", || {
        with_hooks(rt, |h| {
            if layer >= h.layers {
                return Err(CapiError::invalid(
                    "layer",
                    format!("{layer} but the model has {} layers", h.layers),
                ));
            }
            if h.open.len() >= MAX_OPEN_LAYERS {
                return Err(CapiError::invalid(
                    "layer",
                    format!("{MAX_OPEN_LAYERS} layers were started and never ended"),
                ));
            }
            if h.open.insert((request_id, layer), now_ns()).is_some() {
                return Err(CapiError::invalid(
                    "layer",
                    format!("request {request_id} layer {layer} started twice without ending"),
                ));
            }
            Ok(())
        })
    })
}

/// Layer `layer` of request `request_id` finished computing now; records the
/// interval since its `tutti_profile_layer_start`.
///
/// # Safety
/// `rt` is a runtime handle (checked).
#[no_mangle]
pub unsafe extern "C" fn tutti_profile_layer_end(
    rt: *mut tutti_runtime_t,
    request_id: u64,
    layer: u32,
) -> i32 {
    guard("tutti_profile_layer_end", || {
        with_hooks(rt, |h| {
            let start = h.open.remove(&(request_id, layer)).ok_or_else(|| {
                CapiError::invalid(
                    "layer",
                    format!("request {request_id} layer {layer} ended without a start"),
                )
            })?;
            Ok(h.profiler.record_layer(request_id, layer, start, now_ns())?)
        })
    })
}

/// Records layer `layer` of request `request_id` as computed from `start_ns`
/// to `end_ns` (any one monotonic clock, e.g. CUDA event times).
///
/// # Safety
/// `rt` is a runtime handle (checked).
#[no_mangle]
pub unsafe extern "C" fn tutti_profile_layer(
    rt: *mut tutti_runtime_t,
    request_id: u64,
    layer: u32,
    start_ns: u64,
    end_ns: u64,
) -> i32 {
    guard("tutti_profile_layer", || {
        with_hooks(rt, |h| Ok(h.profiler.record_layer(request_id, layer, start_ns, end_ns)?))
    })
}

/// Records one decode step of request `request_id` over `context_tokens` of KV.
///
/// # Safety
/// `rt` is a runtime handle (checked).
#[no_mangle]
pub unsafe extern "C" fn tutti_profile_decode_step(
    rt: *mut tutti_runtime_t,
    request_id: u64,
    context_tokens: u32,
    start_ns: u64,
    end_ns: u64,
) -> i32 {
    guard("tutti_profile_decode_step", || {
        with_hooks(rt, |h| {
            if h.decode_steps >= TUTTI_MAX_PROFILED_DECODE_STEPS {
                return Err(full("decode steps", TUTTI_MAX_PROFILED_DECODE_STEPS));
            }
            h.profiler.record_decode_step(request_id, context_tokens, start_ns, end_ns)?;
            h.decode_steps += 1;
            Ok(())
        })
    })
}

/// Fits the recorded timings and saves the slack table at `path` (the
/// format `tutti simulate`/`tutti profile` read), identified by `model`
/// (NULL = the registered model), `gpu` and the layer count. `io_sms` SMs at
/// `iocbs_per_sm_per_us` IOCBs per SM per µs turn slack into IOCB budgets.
/// Needs layer timings of several request shapes and some decode steps
/// (`TUTTI_E_PROFILE` says what is missing).
///
/// # Safety
/// `rt` is a runtime handle (checked); `path`, `gpu` and (unless NULL)
/// `model` are NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn tutti_profile_save_slack_table(
    rt: *mut tutti_runtime_t,
    path: *const c_char,
    model: *const c_char,
    gpu: *const c_char,
    io_sms: u32,
    iocbs_per_sm_per_us: f64,
) -> i32 {
    guard("tutti_profile_save_slack_table", || {
        let rt = Runtime::get(rt)?;
        // SAFETY: forwarded from the caller.
        let path = unsafe { ptr::str_in(path, "path", 4096)? };
        // SAFETY: forwarded from the caller.
        let gpu = unsafe { ptr::str_in(gpu, "gpu", 256)? };
        let model = if model.is_null() {
            lock(&rt.registered, "registration")?.as_ref().map(|r| r.model.clone()).ok_or_else(|| {
                CapiError::invalid(
                    "model",
                    "NULL, and no KV memory is registered to take the model name from",
                )
            })?
        } else {
            // SAFETY: forwarded from the caller.
            unsafe { ptr::str_in(model, "model", 1024)? }.to_string()
        };
        let io = IoPartition { io_sms, iocbs_per_sm_per_us };
        let identity = Identity { model, gpu: gpu.to_string(), layers: rt.geometry.layers };
        let (table, report) = lock(&rt.profile, "profiler")?.profiler.build(
            identity,
            TableGrid::standard()?,
            io,
            "tutti C ABI profile hooks",
        )?;
        table.save(Path::new(path))?;
        tracing::info!(path, max_rel_error = report.max_rel_error, "slack table saved");
        Ok(TUTTI_OK)
    })
}
