//! Exports: streams, events, modules and libraries, occupancy, launches.

use crate::current;
use crate::driver::{call, driver, out, State};
use crate::error::{fail, Result};
use crate::module::{self, Function, Image, LibKernel, Module};
use crate::residency::{Need, MAX_BLOCK_THREADS};
use crate::stream::{Dep, Event, Launch, Stream, StreamKind, Work};
use crate::sync::{implicit_deps, resolve, sync_context, sync_streams};
use cudarc::driver::sys::{CUevent, CUfunction, CUkernel, CUlibrary, CUmodule, CUresult, CUstream};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::Arc;
use tutti_kernels::cubin::KernelInfo;

const CU_STREAM_NON_BLOCKING: c_uint = 1;

#[no_mangle]
/// # Safety
/// `stream` is NULL or a valid out pointer.
pub unsafe extern "C" fn cuStreamCreate(stream: *mut CUstream, flags: c_uint) -> CUresult {
    call(&["cuStreamCreate"], || {
        let mut st = driver().state();
        st.need_init()?;
        let ctx = current::current_ctx(&st)?;
        let kind = match flags {
            0 => StreamKind::Blocking,
            CU_STREAM_NON_BLOCKING => StreamKind::NonBlocking,
            f => return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, format!("stream flags {f:#x}"))),
        };
        if stream.is_null() {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, "phStream is NULL"));
        }
        let h = st.handle();
        st.streams.insert(h, Stream::new(h, ctx.handle, kind));
        // SAFETY: non-null, valid per the contract.
        unsafe { stream.write(h as CUstream) };
        Ok(())
    })
}

/// Work already queued still runs (the driver releases the stream once it did).
#[no_mangle]
pub extern "C" fn cuStreamDestroy_v2(stream: CUstream) -> CUresult {
    call(&["cuStreamDestroy_v2"], || {
        let mut st = driver().state();
        st.need_init()?;
        let s = st
            .streams
            .remove(&(stream as usize))
            .ok_or_else(|| fail(CUresult::CUDA_ERROR_INVALID_HANDLE, format!("no stream {stream:p}")))?;
        s.destroy();
        st.retired.retain(|r| r.busy());
        if s.busy() {
            st.retired.push(s);
        }
        Ok(())
    })
}

fn stream_error(s: &Stream, e: String) -> crate::error::StandinError {
    fail(CUresult::CUDA_ERROR_LAUNCH_FAILED, format!("stream {:#x}: {e}", s.handle))
}

#[no_mangle]
pub extern "C" fn cuStreamQuery(stream: CUstream) -> CUresult {
    let mut busy = false;
    let rc = call(&["cuStreamQuery"], || {
        let st = driver().state();
        st.need_init()?;
        let (s, _) = resolve(&st, stream)?;
        busy = !s.idle().map_err(|e| stream_error(&s, e))?;
        Ok(())
    });
    if rc == CUresult::CUDA_SUCCESS && busy {
        CUresult::CUDA_ERROR_NOT_READY
    } else {
        rc
    }
}

#[no_mangle]
pub extern "C" fn cuStreamSynchronize(stream: CUstream) -> CUresult {
    call(&["cuStreamSynchronize"], || {
        let (s, deadline) = {
            let st = driver().state();
            st.need_init()?;
            (resolve(&st, stream)?.0, st.knobs.sync_deadline)
        };
        sync_streams("cuStreamSynchronize", std::slice::from_ref(&s), deadline)?;
        s.idle().map(|_| ()).map_err(|e| stream_error(&s, e))
    })
}

fn event(st: &State, e: CUevent) -> Result<Arc<Event>> {
    st.events
        .get(&(e as usize))
        .cloned()
        .ok_or_else(|| fail(CUresult::CUDA_ERROR_INVALID_HANDLE, format!("no event {e:p}")))
}

#[no_mangle]
pub extern "C" fn cuStreamWaitEvent(stream: CUstream, ev: CUevent, flags: c_uint) -> CUresult {
    call(&["cuStreamWaitEvent"], || {
        let st = driver().state();
        st.need_init()?;
        if flags != 0 {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, format!("flags {flags:#x} (must be 0)")));
        }
        let e = event(&st, ev)?;
        let (s, ctx) = resolve(&st, stream)?;
        let mut deps = implicit_deps(&st, &s, &ctx);
        let generation = e.recorded();
        deps.push(Dep::Event(e, generation));
        s.enqueue(deps, Work::Marker, "cuStreamWaitEvent".into());
        Ok(())
    })
}

/// # Safety
/// `ev` is NULL or a valid out pointer.
#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(ev: *mut CUevent, _flags: c_uint) -> CUresult {
    call(&["cuEventCreate"], || {
        let mut st = driver().state();
        st.need_init()?;
        current::current_ctx(&st)?;
        let h = st.handle();
        // SAFETY: forwarded contract.
        unsafe { out(ev, h as CUevent, "phEvent") }?;
        st.events.insert(h, Event::new());
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuEventRecord(ev: CUevent, stream: CUstream) -> CUresult {
    call(&["cuEventRecord"], || {
        let st = driver().state();
        st.need_init()?;
        let e = event(&st, ev)?;
        let (s, ctx) = resolve(&st, stream)?;
        let deps = implicit_deps(&st, &s, &ctx);
        let generation = e.record();
        s.enqueue(deps, Work::Record(e, generation), "cuEventRecord".into());
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuEventQuery(ev: CUevent) -> CUresult {
    let mut reached = true;
    let rc = call(&["cuEventQuery"], || {
        let st = driver().state();
        st.need_init()?;
        let e = event(&st, ev)?;
        reached = e.reached(e.recorded());
        Ok(())
    });
    if rc == CUresult::CUDA_SUCCESS && !reached {
        CUresult::CUDA_ERROR_NOT_READY
    } else {
        rc
    }
}

#[no_mangle]
pub extern "C" fn cuEventSynchronize(ev: CUevent) -> CUresult {
    call(&["cuEventSynchronize"], || {
        let (e, deadline) = {
            let st = driver().state();
            st.need_init()?;
            (event(&st, ev)?, st.knobs.sync_deadline)
        };
        let generation = e.recorded();
        let start = std::time::Instant::now();
        if crate::device::progress().wait_until(start + deadline, || e.reached(generation)) {
            return Ok(());
        }
        let text =
            format!("cuEventSynchronize blocked {:.1} s on an event not reached", deadline.as_secs_f64());
        driver().state().violation(text.clone());
        Err(fail(CUresult::CUDA_ERROR_TIMEOUT, text))
    })
}

/// The host time between two events' latest records, as CUDA reports it: milliseconds.
///
/// # Safety
/// `ms` is NULL or a valid out pointer.
unsafe fn elapsed(name: &'static str, ms: *mut f32, start: CUevent, end: CUevent) -> CUresult {
    call(&[name], || {
        let st = driver().state();
        st.need_init()?;
        let (a, b) = (event(&st, start)?, event(&st, end)?);
        let never = || fail(CUresult::CUDA_ERROR_INVALID_HANDLE, "an event was never recorded");
        let (a, b) = (a.latest_reached_at().ok_or_else(never)?, b.latest_reached_at().ok_or_else(never)?);
        let (Some(a), Some(b)) = (a, b) else {
            return Err(fail(CUresult::CUDA_ERROR_NOT_READY, "an event's latest record is not reached yet"));
        };
        let v = if b >= a { (b - a).as_secs_f64() * 1e3 } else { -((a - b).as_secs_f64() * 1e3) };
        // SAFETY: forwarded contract.
        unsafe { out(ms, v as f32, "pMilliseconds") }
    })
}

/// # Safety
/// `ms` is NULL or a valid out pointer.
#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(ms: *mut f32, start: CUevent, end: CUevent) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { elapsed("cuEventElapsedTime", ms, start, end) }
}

/// # Safety
/// `ms` is NULL or a valid out pointer.
#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(ms: *mut f32, start: CUevent, end: CUevent) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { elapsed("cuEventElapsedTime_v2", ms, start, end) }
}

#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(ev: CUevent) -> CUresult {
    call(&["cuEventDestroy_v2"], || {
        let mut st = driver().state();
        st.need_init()?;
        st.events
            .remove(&(ev as usize))
            .map(|_| ())
            .ok_or_else(|| fail(CUresult::CUDA_ERROR_INVALID_HANDLE, format!("no event {ev:p}")))
    })
}

// ------------------------------------------------------------------ modules and libraries

fn name_of<'a>(name: *const c_char) -> Result<&'a str> {
    if name.is_null() {
        return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, "name is NULL"));
    }
    // SAFETY: a NUL-terminated string (the calls' contract).
    unsafe { CStr::from_ptr(name) }
        .to_str()
        .map_err(|_| fail(CUresult::CUDA_ERROR_INVALID_VALUE, "name is not UTF-8"))
}

/// With the `module_load_waits` knob, a load waits for all device work, in
/// every context (see `Knobs::module_load_waits`): behind a persistent kernel
/// it fails after the sync deadline with a violation, where the driver hangs.
fn load_waits(call: &str) -> Result<()> {
    let (streams, deadline) = {
        let st = driver().state();
        st.need_init()?;
        if !st.knobs.module_load_waits {
            return Ok(());
        }
        let mut all: Vec<_> = st.streams.values().cloned().collect();
        all.extend(st.contexts.values().map(|c| c.legacy.clone()));
        (all, st.knobs.sync_deadline)
    };
    crate::sync::sync_streams(call, &streams, deadline)
}

/// # Safety
/// `module` is NULL or a valid out pointer; `image` points at a complete cubin.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(m: *mut CUmodule, image: *const c_void) -> CUresult {
    call(&["cuModuleLoadData"], || {
        load_waits("cuModuleLoadData")?;
        let mut st = driver().state();
        st.need_init()?;
        let ctx = current::current_ctx(&st)?;
        // SAFETY: forwarded contract.
        let img = module::load(unsafe { module::image_bytes(image.cast()) }?)?;
        if m.is_null() {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, "module is NULL"));
        }
        let h = st.handle();
        st.modules.insert(h, Module { ctx: ctx.handle, image: img });
        // SAFETY: non-null, valid per the contract.
        unsafe { m.write(h as CUmodule) };
        Ok(())
    })
}

/// # Safety
/// `f` is NULL or a valid out pointer; `name` a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    f: *mut CUfunction,
    m: CUmodule,
    name: *const c_char,
) -> CUresult {
    call(&["cuModuleGetFunction"], || {
        let mut st = driver().state();
        st.need_init()?;
        let module = st
            .modules
            .get(&(m as usize))
            .ok_or_else(|| fail(CUresult::CUDA_ERROR_INVALID_HANDLE, format!("no module {m:p}")))?;
        let name = name_of(name)?;
        let index = module.image.kernel(name)?;
        let func = Function { ctx: module.ctx, image: module.image.clone(), index, module: Some(m as usize) };
        let h = st.handle();
        // SAFETY: forwarded contract.
        unsafe { out(f, h as CUfunction, "hfunc") }?;
        st.functions.insert(h, func);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuModuleUnload(m: CUmodule) -> CUresult {
    call(&["cuModuleUnload"], || {
        let ctx = {
            let st = driver().state();
            st.need_init()?;
            st.modules
                .get(&(m as usize))
                .ok_or_else(|| fail(CUresult::CUDA_ERROR_INVALID_HANDLE, format!("no module {m:p}")))?
                .ctx
        };
        sync_context("cuModuleUnload", ctx)?;
        let mut st = driver().state();
        st.modules.remove(&(m as usize));
        st.functions.retain(|_, f| f.module != Some(m as usize));
        Ok(())
    })
}

/// # Safety
/// `lib` is NULL or a valid out pointer; `code` points at a complete cubin. JIT and
/// library options are ignored.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryLoadData(
    lib: *mut CUlibrary,
    code: *const c_void,
    _jit_options: *mut c_void,
    _jit_values: *mut *mut c_void,
    _n_jit: c_uint,
    _lib_options: *mut c_void,
    _lib_values: *mut *mut c_void,
    _n_lib: c_uint,
) -> CUresult {
    call(&["cuLibraryLoadData"], || {
        load_waits("cuLibraryLoadData")?;
        let mut st = driver().state();
        st.need_init()?;
        // SAFETY: forwarded contract.
        let img = module::load(unsafe { module::image_bytes(code.cast()) }?)?;
        if lib.is_null() {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, "library is NULL"));
        }
        let h = st.handle();
        st.libraries.insert(h, img);
        // SAFETY: non-null, valid per the contract.
        unsafe { lib.write(h as CUlibrary) };
        Ok(())
    })
}

/// # Safety
/// `k` is NULL or a valid out pointer; `name` a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetKernel(
    k: *mut CUkernel,
    lib: CUlibrary,
    name: *const c_char,
) -> CUresult {
    call(&["cuLibraryGetKernel"], || {
        let mut st = driver().state();
        st.need_init()?;
        let image = st
            .libraries
            .get(&(lib as usize))
            .cloned()
            .ok_or_else(|| fail(CUresult::CUDA_ERROR_INVALID_HANDLE, format!("no library {lib:p}")))?;
        let index = image.kernel(name_of(name)?)?;
        let h = st.handle();
        // SAFETY: forwarded contract.
        unsafe { out(k, h as CUkernel, "pKernel") }?;
        st.lib_kernels.insert(h, LibKernel { library: lib as usize, image, index });
        Ok(())
    })
}

/// # Safety
/// `f` is NULL or a valid out pointer.
#[no_mangle]
pub unsafe extern "C" fn cuKernelGetFunction(f: *mut CUfunction, k: CUkernel) -> CUresult {
    call(&["cuKernelGetFunction"], || {
        let mut st = driver().state();
        st.need_init()?;
        let ctx = current::current_ctx(&st)?;
        let lk = st
            .lib_kernels
            .get(&(k as usize))
            .cloned()
            .ok_or_else(|| fail(CUresult::CUDA_ERROR_INVALID_HANDLE, format!("no kernel {k:p}")))?;
        let h = st.handle();
        // SAFETY: forwarded contract.
        unsafe { out(f, h as CUfunction, "pFunc") }?;
        st.functions.insert(h, Function { ctx: ctx.handle, image: lk.image, index: lk.index, module: None });
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuLibraryUnload(lib: CUlibrary) -> CUresult {
    call(&["cuLibraryUnload"], || {
        let contexts: Vec<usize> = {
            let st = driver().state();
            st.need_init()?;
            if !st.libraries.contains_key(&(lib as usize)) {
                return Err(fail(CUresult::CUDA_ERROR_INVALID_HANDLE, format!("no library {lib:p}")));
            }
            st.contexts.keys().copied().collect()
        };
        for c in contexts {
            sync_context("cuLibraryUnload", c)?;
        }
        let mut st = driver().state();
        st.libraries.remove(&(lib as usize));
        st.lib_kernels.retain(|_, k| k.library != lib as usize);
        Ok(())
    })
}

/// A launchable handle: a CUfunction (bound to its context) or a CUkernel
/// cast to CUfunction (runs in the stream's context).
fn launchable(st: &State, f: CUfunction) -> Result<(Option<usize>, Arc<Image>, usize)> {
    if let Some(func) = st.functions.get(&(f as usize)) {
        return Ok((Some(func.ctx), func.image.clone(), func.index));
    }
    if let Some(k) = st.lib_kernels.get(&(f as usize)) {
        return Ok((None, k.image.clone(), k.index));
    }
    Err(fail(CUresult::CUDA_ERROR_INVALID_HANDLE, format!("no function or kernel {f:p}")))
}

fn registers(k: &KernelInfo) -> u32 {
    k.registers.unwrap_or(255)
}

fn max_threads(k: &KernelInfo) -> u32 {
    k.max_threads.unwrap_or(MAX_BLOCK_THREADS).min(MAX_BLOCK_THREADS)
}

/// # Safety
/// `pi` is NULL or a valid out pointer.
#[no_mangle]
pub unsafe extern "C" fn cuFuncGetAttribute(pi: *mut c_int, attrib: c_int, f: CUfunction) -> CUresult {
    use cudarc::driver::sys::CUfunction_attribute as F;
    call(&["cuFuncGetAttribute"], || {
        let st = driver().state();
        st.need_init()?;
        let (_, image, index) = launchable(&st, f)?;
        let k = &image.kernels[index];
        let v = match attrib {
            a if a == F::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK as c_int => max_threads(k) as c_int,
            a if a == F::CU_FUNC_ATTRIBUTE_NUM_REGS as c_int => registers(k) as c_int,
            a if a == F::CU_FUNC_ATTRIBUTE_PTX_VERSION as c_int => module::DEVICE_SM as c_int,
            a if a == F::CU_FUNC_ATTRIBUTE_BINARY_VERSION as c_int => module::DEVICE_SM as c_int,
            a if (0..F::CU_FUNC_ATTRIBUTE_MAX as c_int).contains(&a) => 0,
            a => return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, format!("function attribute {a}"))),
        };
        // SAFETY: forwarded contract.
        unsafe { out(pi, v, "pi") }
    })
}

/// # Safety
/// `n` is NULL or a valid out pointer.
#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    n: *mut c_int,
    f: CUfunction,
    block: c_int,
    dynamic_smem: usize,
) -> CUresult {
    call(&["cuOccupancyMaxActiveBlocksPerMultiprocessor"], || {
        let st = driver().state();
        st.need_init()?;
        let (_, image, index) = launchable(&st, f)?;
        let k = &image.kernels[index];
        if block <= 0 || dynamic_smem > 48 * 1024 {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!("block size {block}, {dynamic_smem} B smem"),
            ));
        }
        let per_sm = if block as u32 > max_threads(k) {
            0
        } else {
            Need::of(registers(k), block as u32).per_sm(st.knobs.regs_per_sm)
        };
        // SAFETY: forwarded contract.
        unsafe { out(n, per_sm as c_int, "numBlocks") }
    })
}

/// # Safety
/// `params` holds one pointer per kernel parameter, each at that parameter's value.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    smem: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    call(&["cuLaunchKernel"], || {
        let mut st = driver().state();
        st.need_init()?;
        let (fctx, image, index) = launchable(&st, f)?;
        let k = &image.kernels[index];
        let (s, ctx) = resolve(&st, stream)?;
        if let Some(fc) = fctx {
            if fc != ctx.handle {
                let text = format!(
                    "cuLaunchKernel: {} was loaded in context {fc:#x} but launched on stream {:#x} of context {:#x} \
                     (a CUfunction belongs to the context current when its module was loaded)",
                    k.name, s.handle, ctx.handle
                );
                st.violation(text.clone());
                return Err(fail(CUresult::CUDA_ERROR_INVALID_HANDLE, text));
            }
        }
        let bad = |why: String| fail(CUresult::CUDA_ERROR_INVALID_VALUE, format!("{}: {why}", k.name));
        if gy != 1 || gz != 1 || by != 1 || bz != 1 {
            return Err(bad(format!(
                "grid {gx}x{gy}x{gz}, block {bx}x{by}x{bz}: only 1-D launches are modelled"
            )));
        }
        if gx == 0 || bx == 0 || bx > max_threads(k) {
            return Err(bad(format!("grid {gx}, block {bx} (at most {} threads per block)", max_threads(k))));
        }
        if !bx.is_multiple_of(32) {
            return Err(bad(format!(
                "block of {bx} threads: the stand-in runs whole warps (a multiple of 32)"
            )));
        }
        if smem as usize > 48 * 1024 {
            return Err(bad(format!("{smem} bytes of dynamic shared memory")));
        }
        if !extra.is_null() {
            return Err(bad("parameters through `extra` are not modelled".into()));
        }
        let need = Need::of(registers(k), bx);
        let regs_per_sm = st.knobs.regs_per_sm;
        if need.per_sm(regs_per_sm) == 0 {
            return Err(fail(
                CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
                format!(
                    "{}: a block of {bx} threads x {} registers does not fit an SM",
                    k.name,
                    registers(k)
                ),
            ));
        }
        // SAFETY: forwarded contract.
        let args = unsafe { module::marshal(k, params) }?;
        let entry = module::host_entry(&k.name).ok_or_else(|| bad("no host build".into()))?;
        let sms: Vec<u32> = match &ctx.sms {
            Some(v) => v.to_vec(),
            None => (0..st.knobs.sm_count).collect(),
        };
        let ticket = st.ticket();
        let deps = implicit_deps(&st, &s, &ctx);
        crate::device::ledger().stats.launches += 1;
        let launch = Launch {
            ticket,
            kernel: entry.kernel,
            ctx: ctx.handle,
            sms,
            grid: gx,
            block: bx,
            need,
            regs_per_sm,
            args,
        };
        s.enqueue(deps, Work::Launch(launch), format!("kernel {} ({gx} x {bx})", k.name));
        Ok(())
    })
}
