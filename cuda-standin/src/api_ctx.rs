//! Exports: initialisation, the device, contexts and green contexts.

use crate::current;
use crate::driver::{call, driver, init, out};
use crate::error::fail;
use crate::residency::{BLOCKS_PER_SM, MAX_BLOCK_THREADS, THREADS_PER_SM};
use crate::sync::sync_streams;
use cudarc::driver::sys::{
    CUcontext, CUdevResource, CUdevResourceDesc, CUdevice, CUdevice_attribute as A, CUgreenCtx, CUresult,
    CUstream,
};
use std::ffi::{c_char, c_int, c_uint, c_void};

/// The driver version reported: 12.9.
pub(crate) const DRIVER_VERSION: c_int = 12090;
const RESOURCE_MAGIC: [u8; 4] = *b"TTSM";
const CU_DEV_RESOURCE_TYPE_SM: c_uint = 1;
const CU_GREEN_CTX_DEFAULT_STREAM: c_uint = 1;
const CU_STREAM_NON_BLOCKING: c_uint = 1;

fn ptr(h: usize) -> *mut c_void {
    h as *mut c_void
}

fn need_device(dev: CUdevice) -> crate::error::Result<()> {
    if dev == 0 {
        Ok(())
    } else {
        Err(fail(CUresult::CUDA_ERROR_INVALID_DEVICE, format!("no device {dev} (the stand-in has device 0)")))
    }
}

#[no_mangle]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    call(&["cuInit"], || {
        if flags != 0 {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, format!("flags {flags:#x} (must be 0)")));
        }
        init(&mut driver().state());
        Ok(())
    })
}

/// # Safety
/// `version` is NULL or a valid out pointer.
#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    // SAFETY: forwarded contract.
    call(&["cuDriverGetVersion"], || unsafe { out(version, DRIVER_VERSION, "driverVersion") })
}

/// # Safety
/// `count` is NULL or a valid out pointer.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    call(&["cuDeviceGetCount"], || {
        driver().state().need_init()?;
        // SAFETY: forwarded contract.
        unsafe { out(count, 1, "count") }
    })
}

/// # Safety
/// `device` is NULL or a valid out pointer.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    call(&["cuDeviceGet"], || {
        driver().state().need_init()?;
        need_device(ordinal)?;
        // SAFETY: forwarded contract.
        unsafe { out(device, 0, "device") }
    })
}

/// The value of a device attribute (an H100-like sm_90 part); unlisted ones are 0.
fn attribute(attr: c_int, sms: u32, regs_per_sm: u32) -> c_int {
    let table: [(A, c_int); 22] = [
        (A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9),
        (A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0),
        (A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, sms as c_int),
        (A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, regs_per_sm as c_int),
        (A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, regs_per_sm as c_int),
        (A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, THREADS_PER_SM as c_int),
        (A::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, BLOCKS_PER_SM as c_int),
        (A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, MAX_BLOCK_THREADS as c_int),
        (A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, MAX_BLOCK_THREADS as c_int),
        (A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, i32::MAX),
        (A::CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32),
        (A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, 228 * 1024),
        (A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 48 * 1024),
        (A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 227 * 1024),
        (A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1),
        (A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1),
        (A::CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS, 1),
        (A::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, 2),
        (A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, 5120),
        (A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 1_755_000),
        (A::CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, 1),
        (A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, 0),
    ];
    table.iter().find(|(a, _)| *a as c_int == attr).map_or(0, |&(_, v)| v)
}

/// # Safety
/// `pi` is NULL or a valid out pointer.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(pi: *mut c_int, attrib: c_int, dev: CUdevice) -> CUresult {
    call(&["cuDeviceGetAttribute"], || {
        let st = driver().state();
        st.need_init()?;
        need_device(dev)?;
        if attrib < 1 || attrib >= A::CU_DEVICE_ATTRIBUTE_MAX as c_int {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!("unknown device attribute {attrib}"),
            ));
        }
        let v = attribute(attrib, st.knobs.sm_count, st.knobs.regs_per_sm);
        // SAFETY: forwarded contract.
        unsafe { out(pi, v, "pi") }
    })
}

/// # Safety
/// `pctx` is NULL or a valid out pointer.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    call(&["cuDevicePrimaryCtxRetain"], || {
        let mut st = driver().state();
        st.need_init()?;
        need_device(dev)?;
        let handle = match st.primary.as_mut() {
            Some((c, refs)) => {
                *refs += 1;
                c.handle
            }
            None => {
                let c = st.new_context(None, None);
                let h = c.handle;
                st.primary = Some((c, 1));
                h
            }
        };
        // SAFETY: forwarded contract.
        unsafe { out(pctx, handle as CUcontext, "pctx") }
    })
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    call(&["cuDevicePrimaryCtxRelease_v2"], || {
        let mut st = driver().state();
        st.need_init()?;
        need_device(dev)?;
        match st.primary.as_mut() {
            // The context and its resources stay (the stand-in never destroys a primary context).
            Some((_, refs)) if *refs > 0 => {
                *refs -= 1;
                Ok(())
            }
            _ => Err(fail(CUresult::CUDA_ERROR_INVALID_CONTEXT, "the primary context is not retained")),
        }
    })
}

#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    call(&["cuCtxSetCurrent"], || {
        let mut st = driver().state();
        st.need_init()?;
        current::set_current(&mut st, ctx as usize)
    })
}

/// # Safety
/// `pctx` is NULL or a valid out pointer.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    call(&["cuCtxGetCurrent"], || {
        driver().state().need_init()?;
        // SAFETY: forwarded contract.
        unsafe { out(pctx, current::current().unwrap_or(0) as CUcontext, "pctx") }
    })
}

#[no_mangle]
pub extern "C" fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult {
    call(&["cuCtxPushCurrent_v2"], || {
        let mut st = driver().state();
        st.need_init()?;
        if ctx.is_null() {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_CONTEXT, "pushing a NULL context"));
        }
        current::push(&mut st, ctx as usize)
    })
}

/// # Safety
/// `pctx` is NULL or a valid out pointer.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) -> CUresult {
    call(&["cuCtxPopCurrent_v2"], || {
        let mut st = driver().state();
        st.need_init()?;
        let popped = current::pop(&mut st)?;
        if !pctx.is_null() {
            // SAFETY: non-null, valid per the contract.
            unsafe { pctx.write(popped as CUcontext) };
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    call(&["cuCtxSynchronize"], || {
        let (streams, deadline) = {
            let st = driver().state();
            st.need_init()?;
            let ctx = current::current_ctx(&st)?;
            (st.streams_of(&ctx), st.knobs.sync_deadline)
        };
        sync_streams("cuCtxSynchronize", &streams, deadline)
    })
}

// ------------------------------------------------------------------ green contexts

fn sm_range(r: &CUdevResource) -> crate::error::Result<(u32, u32)> {
    // SAFETY: reading the SM arm of the union; a zeroed or foreign resource reads as garbage
    // that the magic check below refuses.
    let count = unsafe { r.__bindgen_anon_1.sm.smCount };
    if r.type_ as c_uint != CU_DEV_RESOURCE_TYPE_SM || r._internal_padding[..4] != RESOURCE_MAGIC {
        return Err(fail(CUresult::CUDA_ERROR_INVALID_RESOURCE_TYPE, "not an SM resource from this driver"));
    }
    let first = u32::from_le_bytes([
        r._internal_padding[4],
        r._internal_padding[5],
        r._internal_padding[6],
        r._internal_padding[7],
    ]);
    Ok((first, count))
}

fn make_resource(first: u32, count: u32) -> CUdevResource {
    // SAFETY: a plain C struct for which all-zero is valid.
    let mut r: CUdevResource = unsafe { std::mem::zeroed() };
    r.type_ = cudarc::driver::sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM;
    r._internal_padding[..4].copy_from_slice(&RESOURCE_MAGIC);
    r._internal_padding[4..8].copy_from_slice(&first.to_le_bytes());
    r.__bindgen_anon_1.sm.smCount = count;
    r
}

/// # Safety
/// `resource` is NULL or a valid out pointer.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDevResource(
    dev: CUdevice,
    resource: *mut CUdevResource,
    type_: c_uint,
) -> CUresult {
    call(&["cuDeviceGetDevResource"], || {
        let st = driver().state();
        st.need_init()?;
        need_device(dev)?;
        if type_ != CU_DEV_RESOURCE_TYPE_SM {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_RESOURCE_TYPE, format!("resource type {type_}")));
        }
        // SAFETY: forwarded contract.
        unsafe { out(resource, make_resource(0, st.knobs.sm_count), "resource") }
    })
}

/// # Safety
/// `result` is NULL or has `*nb_groups` slots; `nb_groups` is valid; `input` is a valid
/// resource; `remaining` is NULL or a valid out pointer.
#[no_mangle]
pub unsafe extern "C" fn cuDevSmResourceSplitByCount(
    result: *mut CUdevResource,
    nb_groups: *mut c_uint,
    input: *const CUdevResource,
    remaining: *mut CUdevResource,
    use_flags: c_uint,
    min_count: c_uint,
) -> CUresult {
    call(&["cuDevSmResourceSplitByCount"], || {
        driver().state().need_init()?;
        if nb_groups.is_null() || input.is_null() || min_count == 0 || use_flags != 0 {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                "nbGroups and input must be given, minCount > 0, useFlags 0",
            ));
        }
        // SAFETY: non-null, valid per the contract.
        let (first, count) = sm_range(unsafe { &*input })?;
        let possible = count / min_count;
        // SAFETY: non-null, valid per the contract.
        let asked = unsafe { *nb_groups };
        let groups = if result.is_null() { possible } else { asked.min(possible) };
        if groups == 0 {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,
                format!("cannot split groups of {min_count} SMs off {count}"),
            ));
        }
        if !result.is_null() {
            for g in 0..groups {
                // SAFETY: `result` has `asked` >= `groups` slots.
                unsafe { result.add(g as usize).write(make_resource(first + g * min_count, min_count)) };
            }
        }
        let used = if result.is_null() { 0 } else { groups * min_count };
        if !remaining.is_null() {
            // SAFETY: non-null, valid per the contract.
            unsafe { remaining.write(make_resource(first + used, count - used)) };
        }
        // SAFETY: non-null, valid per the contract.
        unsafe { nb_groups.write(groups) };
        Ok(())
    })
}

/// # Safety
/// `desc` is a valid out pointer; `resources` holds `nb` valid resources.
#[no_mangle]
pub unsafe extern "C" fn cuDevResourceGenerateDesc(
    desc: *mut CUdevResourceDesc,
    resources: *mut CUdevResource,
    nb: c_uint,
) -> CUresult {
    call(&["cuDevResourceGenerateDesc"], || {
        let mut st = driver().state();
        st.need_init()?;
        if resources.is_null() || nb == 0 {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, "no resources"));
        }
        let mut sms = Vec::new();
        for i in 0..nb as usize {
            // SAFETY: `nb` valid resources.
            let (first, count) = sm_range(unsafe { &*resources.add(i) })?;
            sms.extend(first..first + count);
        }
        sms.sort_unstable();
        sms.dedup();
        let h = st.handle();
        // SAFETY: forwarded contract.
        unsafe { out(desc, h as CUdevResourceDesc, "phDesc") }?;
        st.descs.insert(h, sms);
        Ok(())
    })
}

/// # Safety
/// `green` is a valid out pointer.
#[no_mangle]
pub unsafe extern "C" fn cuGreenCtxCreate(
    green: *mut CUgreenCtx,
    desc: CUdevResourceDesc,
    dev: CUdevice,
    flags: c_uint,
) -> CUresult {
    call(&["cuGreenCtxCreate"], || {
        let mut st = driver().state();
        st.need_init()?;
        need_device(dev)?;
        if flags != CU_GREEN_CTX_DEFAULT_STREAM {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!("flags {flags:#x} (must be CU_GREEN_CTX_DEFAULT_STREAM)"),
            ));
        }
        let sms = st.descs.get(&(desc as usize)).cloned().ok_or_else(|| {
            fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                "not a resource descriptor from cuDevResourceGenerateDesc",
            )
        })?;
        if green.is_null() {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, "phCtx is NULL"));
        }
        let gh = st.handle();
        let ctx = st.new_context(Some(gh), Some(sms));
        st.greens.insert(gh, ctx.handle);
        // SAFETY: non-null, valid per the contract.
        unsafe { green.write(gh as CUgreenCtx) };
        Ok(())
    })
}

/// # Safety
/// `pctx` is a valid out pointer.
#[no_mangle]
pub unsafe extern "C" fn cuCtxFromGreenCtx(pctx: *mut CUcontext, green: CUgreenCtx) -> CUresult {
    call(&["cuCtxFromGreenCtx"], || {
        let st = driver().state();
        st.need_init()?;
        let ctx = *st.greens.get(&(green as usize)).ok_or_else(|| {
            fail(CUresult::CUDA_ERROR_INVALID_HANDLE, format!("no green context {green:p}"))
        })?;
        // SAFETY: forwarded contract.
        unsafe { out(pctx, ptr(ctx).cast(), "pContext") }
    })
}

#[no_mangle]
pub extern "C" fn cuGreenCtxDestroy(green: CUgreenCtx) -> CUresult {
    call(&["cuGreenCtxDestroy"], || {
        let (ctx, streams, deadline) = {
            let st = driver().state();
            st.need_init()?;
            let h = *st.greens.get(&(green as usize)).ok_or_else(|| {
                fail(CUresult::CUDA_ERROR_INVALID_HANDLE, format!("no green context {green:p}"))
            })?;
            let ctx = st.context(h)?;
            (ctx.clone(), st.streams_of(&ctx), st.knobs.sync_deadline)
        };
        sync_streams("cuGreenCtxDestroy", &streams, deadline)?;
        let mut st = driver().state();
        st.greens.remove(&(green as usize));
        st.contexts.remove(&ctx.handle);
        st.green_owner.remove(&ctx.handle);
        let gone: Vec<usize> =
            st.streams.values().filter(|s| s.ctx == ctx.handle).map(|s| s.handle).collect();
        for h in gone {
            if let Some(s) = st.streams.remove(&h) {
                s.destroy();
            }
        }
        ctx.legacy.destroy();
        Ok(())
    })
}

/// # Safety
/// `stream` is a valid out pointer.
#[no_mangle]
pub unsafe extern "C" fn cuGreenCtxStreamCreate(
    stream: *mut CUstream,
    green: CUgreenCtx,
    flags: c_uint,
    _priority: c_int,
) -> CUresult {
    call(&["cuGreenCtxStreamCreate"], || {
        let mut st = driver().state();
        st.need_init()?;
        if flags != CU_STREAM_NON_BLOCKING {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!("flags {flags:#x} (green context streams must be CU_STREAM_NON_BLOCKING)"),
            ));
        }
        let h = *st.greens.get(&(green as usize)).ok_or_else(|| {
            fail(CUresult::CUDA_ERROR_INVALID_HANDLE, format!("no green context {green:p}"))
        })?;
        let ctx = st.context(h)?;
        if stream.is_null() {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, "phStream is NULL"));
        }
        let sh = st.handle();
        let s = crate::stream::Stream::new(sh, ctx.handle, crate::stream::StreamKind::NonBlocking);
        st.streams.insert(sh, s);
        // SAFETY: non-null, valid per the contract.
        unsafe { stream.write(sh as CUstream) };
        Ok(())
    })
}

/// Error names and descriptions (cuGetErrorName, cuGetErrorString).
fn describe(code: c_uint) -> Option<(&'static std::ffi::CStr, &'static std::ffi::CStr)> {
    error_entry(code).map(|(_, n, d)| (n, d))
}

/// The `CUresult` with value `code`, if the stand-in knows it.
pub(crate) fn known_code(code: c_uint) -> Option<CUresult> {
    error_entry(code).map(|(r, _, _)| r)
}

type ErrorEntry = (CUresult, &'static std::ffi::CStr, &'static std::ffi::CStr);

fn error_entry(code: c_uint) -> Option<ErrorEntry> {
    use CUresult as R;
    let table: &[ErrorEntry] = &[
        (R::CUDA_SUCCESS, c"CUDA_SUCCESS", c"no error"),
        (R::CUDA_ERROR_INVALID_VALUE, c"CUDA_ERROR_INVALID_VALUE", c"invalid argument"),
        (R::CUDA_ERROR_OUT_OF_MEMORY, c"CUDA_ERROR_OUT_OF_MEMORY", c"out of memory"),
        (R::CUDA_ERROR_NOT_INITIALIZED, c"CUDA_ERROR_NOT_INITIALIZED", c"initialization error"),
        (R::CUDA_ERROR_INVALID_DEVICE, c"CUDA_ERROR_INVALID_DEVICE", c"invalid device ordinal"),
        (R::CUDA_ERROR_INVALID_IMAGE, c"CUDA_ERROR_INVALID_IMAGE", c"device kernel image is invalid"),
        (R::CUDA_ERROR_INVALID_CONTEXT, c"CUDA_ERROR_INVALID_CONTEXT", c"invalid device context"),
        (R::CUDA_ERROR_INVALID_HANDLE, c"CUDA_ERROR_INVALID_HANDLE", c"invalid resource handle"),
        (R::CUDA_ERROR_NOT_FOUND, c"CUDA_ERROR_NOT_FOUND", c"named symbol not found"),
        (R::CUDA_ERROR_NOT_READY, c"CUDA_ERROR_NOT_READY", c"device not ready"),
        (R::CUDA_ERROR_LAUNCH_FAILED, c"CUDA_ERROR_LAUNCH_FAILED", c"unspecified launch failure"),
        (
            R::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
            c"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
            c"too many resources requested for launch",
        ),
        (
            R::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
            c"CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
            c"part or all of the requested memory range is already mapped",
        ),
        (
            R::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
            c"CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
            c"pointer does not correspond to a registered memory region",
        ),
        (R::CUDA_ERROR_NOT_SUPPORTED, c"CUDA_ERROR_NOT_SUPPORTED", c"operation not supported"),
        (R::CUDA_ERROR_NOT_PERMITTED, c"CUDA_ERROR_NOT_PERMITTED", c"operation not permitted"),
        (R::CUDA_ERROR_INVALID_RESOURCE_TYPE, c"CUDA_ERROR_INVALID_RESOURCE_TYPE", c"invalid resource type"),
        (
            R::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,
            c"CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION",
            c"invalid resource configuration",
        ),
        (R::CUDA_ERROR_TIMEOUT, c"CUDA_ERROR_TIMEOUT", c"wait operation timed out"),
        (R::CUDA_ERROR_UNKNOWN, c"CUDA_ERROR_UNKNOWN", c"unknown error"),
    ];
    table.iter().find(|(r, _, _)| *r as c_uint == code).copied()
}

/// # Safety
/// `p` is NULL or a valid out pointer.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(code: c_uint, p: *mut *const c_char) -> CUresult {
    call(&["cuGetErrorName"], || {
        let (name, _) = describe(code)
            .ok_or_else(|| fail(CUresult::CUDA_ERROR_INVALID_VALUE, format!("unknown error code {code}")))?;
        // SAFETY: forwarded contract; the string is static.
        unsafe { out(p, name.as_ptr(), "pStr") }
    })
}

/// # Safety
/// `p` is NULL or a valid out pointer.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(code: c_uint, p: *mut *const c_char) -> CUresult {
    call(&["cuGetErrorString"], || {
        let (_, text) = describe(code)
            .ok_or_else(|| fail(CUresult::CUDA_ERROR_INVALID_VALUE, format!("unknown error code {code}")))?;
        // SAFETY: forwarded contract; the string is static.
        unsafe { out(p, text.as_ptr(), "pStr") }
    })
}
