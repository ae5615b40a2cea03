//! The kernels' image and its loading: compiled with NVRTC for the device
//! (once per process and architecture) or a prebuilt cubin checked against
//! the device and the launches, then loaded as a module and as a library.

use super::context::check;
use crate::error::{GioError, Result};
use cudarc::driver::sys;
use std::collections::HashMap;
use std::ffi::CString;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use tutti_kernels::{nvrtc, KERNEL_COPY, KERNEL_ISSUE, KERNEL_PERSISTENT, KERNEL_WAIT};

pub(super) struct Kernels {
    pub module: sys::CUmodule,
    pub issue: sys::CUfunction,
    pub persistent: sys::CUfunction,
    pub wait: sys::CUfunction,
    /// `tt_gio_copy` (the copy benchmark, `bench.rs`).
    pub copy: sys::CUfunction,
    /// The same image as a library: its kernel handles belong to no context,
    /// so `enqueue_wait` may launch on another context's stream.
    pub library: sys::CUlibrary,
    pub wait_any: sys::CUkernel,
}

/// The kernels compiled for `arch`, once per process.
pub(super) fn cubin(arch: &str) -> Result<Arc<Vec<u8>>> {
    static CUBINS: OnceLock<Mutex<HashMap<String, Arc<Vec<u8>>>>> = OnceLock::new();
    let mut cache = CUBINS
        .get_or_init(Mutex::default)
        .lock()
        .map_err(|_| GioError::invalid("cubin cache lock poisoned"))?;
    if let Some(c) = cache.get(arch) {
        return Ok(c.clone());
    }
    let compiled = nvrtc::compile_gio(arch)?;
    for w in compiled.warnings() {
        tracing::warn!(arch, warning = w, "NVRTC warning in the I/O kernels");
    }
    let c = Arc::new(compiled.cubin);
    cache.insert(arch.to_string(), c.clone());
    Ok(c)
}

/// A cubin built elsewhere, checked against this device and the launchers
/// before the driver sees it.
pub(super) fn prebuilt_cubin(path: &Path, sm: u32) -> Result<Arc<Vec<u8>>> {
    let bad = |what: String| GioError::invalid(format!("cubin {}: {what}", path.display()));
    let image = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let parsed = tutti_kernels::cubin::parse(&image).map_err(|e| bad(e.to_string()))?;
    if parsed.sm != sm {
        return Err(bad(format!("built for sm_{}, the device is sm_{sm}", parsed.sm)));
    }
    for (name, sizes) in tutti_kernels::KERNEL_PARAMS {
        let k = parsed.kernel(name).ok_or_else(|| bad(format!("no entry point {name}")))?;
        if k.param_sizes() != sizes {
            return Err(bad(format!(
                "{name} takes parameters of {:?} bytes, the launches pass {sizes:?}",
                k.param_sizes()
            )));
        }
    }
    Ok(Arc::new(image))
}

/// Loads the image twice: as a module (functions of this context, for its own
/// streams) and as a library (context-free kernel handles, for engine streams).
/// The executor's context is current (the caller holds `CudaCtx::enter`).
pub(super) fn load(cubin: &[u8]) -> Result<Kernels> {
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: `cubin` is an ELF image from NVRTC, alive for the call.
    check("cuModuleLoadData", unsafe { sys::cuModuleLoadData(&mut module, cubin.as_ptr().cast()) })?;
    tracing::debug!("CUDA executor: module loaded");
    let name = |n: &str| CString::new(n).map_err(|_| GioError::invalid("kernel name with NUL"));
    let get = |n: &str| -> Result<sys::CUfunction> {
        let c = name(n)?;
        let mut f: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: a loaded module and a NUL-terminated name.
        check("cuModuleGetFunction", unsafe { sys::cuModuleGetFunction(&mut f, module, c.as_ptr()) })?;
        Ok(f)
    };
    let funcs = (|| {
        Ok::<_, GioError>((get(KERNEL_ISSUE)?, get(KERNEL_PERSISTENT)?, get(KERNEL_WAIT)?, get(KERNEL_COPY)?))
    })();
    let (issue, persistent, wait, copy) = match funcs {
        Ok(f) => f,
        Err(e) => {
            // SAFETY: loaded above; no kernel of it was launched.
            let _ = unsafe { sys::cuModuleUnload(module) };
            return Err(e);
        }
    };
    let mut library: sys::CUlibrary = std::ptr::null_mut();
    // SAFETY: the same image; no JIT or library options.
    let rc = unsafe {
        sys::cuLibraryLoadData(
            &mut library,
            cubin.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    let mut wait_any: sys::CUkernel = std::ptr::null_mut();
    let got = check("cuLibraryLoadData", rc).and_then(|()| {
        let c = name(KERNEL_WAIT)?;
        // SAFETY: a loaded library and a NUL-terminated name.
        check("cuLibraryGetKernel", unsafe { sys::cuLibraryGetKernel(&mut wait_any, library, c.as_ptr()) })
    });
    if let Err(e) = got {
        // SAFETY: loaded above (the library only if its load succeeded); nothing launched.
        unsafe {
            if !library.is_null() {
                let _ = sys::cuLibraryUnload(library);
            }
            let _ = sys::cuModuleUnload(module);
        }
        return Err(e);
    }
    Ok(Kernels { module, issue, persistent, wait, copy, library, wait_any })
}
