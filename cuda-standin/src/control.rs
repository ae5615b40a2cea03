//! The test side: finds the built stand-in, loads it so that cudarc uses it,
//! and drives its control functions.
//!
//! Everything goes through `dlsym` on the loaded library: a test binary that
//! links this crate's rlib has its own copy of the stand-in's state, which is
//! not the one cudarc talks to.

use crate::error::StandinError;
use cudarc::driver::sys::CUresult;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::PathBuf;

/// The file cargo builds (`crate-type = ["cdylib", ...]`).
pub const LIBRARY_FILE: &str = "libtutti_cuda_standin.so";

/// Where the stand-in is: `$TUTTI_CUDA_DRIVER`, else next to the running test
/// executable (`target/<profile>/deps/`, where cargo builds the cdylib of a
/// dependency, or the profile directory it is uplifted to).
pub fn library_path() -> Result<PathBuf, StandinError> {
    if let Some(p) = std::env::var_os("TUTTI_CUDA_DRIVER") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(StandinError::Library(format!("TUTTI_CUDA_DRIVER={} is not a file", p.display())))
        };
    }
    let exe = std::env::current_exe().map_err(|e| StandinError::Library(format!("current_exe: {e}")))?;
    let dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    let candidates = [dir.join(LIBRARY_FILE), dir.parent().map(|d| d.join(LIBRARY_FILE)).unwrap_or_default()];
    candidates.iter().find(|p| p.is_file()).cloned().ok_or_else(|| {
        StandinError::Library(format!(
            "{LIBRARY_FILE} not found (looked in {} and {}); build it with `cargo build -p tutti-cuda-standin` \
             or set TUTTI_CUDA_DRIVER",
            candidates[0].display(),
            candidates[1].display()
        ))
    })
}

fn dlerror() -> String {
    // SAFETY: dlerror returns a thread-local message or NULL.
    let msg = unsafe { libc::dlerror() };
    if msg.is_null() {
        "unknown dl error".into()
    } else {
        // SAFETY: non-null dlerror results are NUL-terminated.
        unsafe { CStr::from_ptr(msg) }.to_string_lossy().into_owned()
    }
}

type SetKnob = unsafe extern "C" fn(*const c_char, u64) -> c_int;
type GetKnob = unsafe extern "C" fn(*const c_char, *mut u64) -> c_int;
type Fail = unsafe extern "C" fn(*const c_char, u64, u64, u32) -> c_int;
type Violation = unsafe extern "C" fn(u64, *mut c_char, usize) -> i64;
type Stat = unsafe extern "C" fn(*const c_char, u64, *mut u64) -> c_int;
type Text = unsafe extern "C" fn(*mut c_char, usize) -> u64;

/// The loaded stand-in's control functions.
pub struct Standin {
    pub path: PathBuf,
    reset: extern "C" fn(),
    set_knob: SetKnob,
    get_knob: GetKnob,
    fail: Fail,
    violation_count: extern "C" fn() -> u64,
    violation: Violation,
    stat: Stat,
    last_error: Text,
}

fn sym(handle: *mut c_void, name: &str) -> Result<*mut c_void, StandinError> {
    let c = CString::new(name).map_err(|_| StandinError::Library("symbol name with NUL".into()))?;
    // SAFETY: a live handle and a NUL-terminated name.
    let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
    if p.is_null() {
        return Err(StandinError::Library(format!("{name} not exported: {}", dlerror())));
    }
    Ok(p)
}

impl Standin {
    /// Loads the stand-in found by [`library_path`] for the rest of the
    /// process (RTLD_NOW | RTLD_GLOBAL, never closed). Call it before the
    /// first cudarc driver call: cudarc then resolves `libcuda.so` to it.
    pub fn load() -> Result<Standin, StandinError> {
        let path = library_path()?;
        let c = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| StandinError::Library("library path with NUL".into()))?;
        // SAFETY: a NUL-terminated path; loading runs no initialisers beyond Rust's defaults.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if handle.is_null() {
            return Err(StandinError::Library(format!("dlopen {}: {}", path.display(), dlerror())));
        }
        let present = sym(handle, "tt_standin_present")?;
        // SAFETY: the symbol is `extern "C" fn() -> u32` in the stand-in (api_control.rs).
        let present: extern "C" fn() -> u32 = unsafe { std::mem::transmute(present) };
        if present() != 1 {
            return Err(StandinError::Library(format!("{} is not the tutti CUDA stand-in", path.display())));
        }
        // SAFETY: each symbol has the signature it is transmuted to (api_control.rs).
        unsafe {
            Ok(Standin {
                reset: std::mem::transmute::<*mut c_void, extern "C" fn()>(sym(handle, "tt_standin_reset")?),
                set_knob: std::mem::transmute::<*mut c_void, SetKnob>(sym(handle, "tt_standin_set_knob")?),
                get_knob: std::mem::transmute::<*mut c_void, GetKnob>(sym(handle, "tt_standin_get_knob")?),
                fail: std::mem::transmute::<*mut c_void, Fail>(sym(handle, "tt_standin_fail")?),
                violation_count: std::mem::transmute::<*mut c_void, extern "C" fn() -> u64>(sym(
                    handle,
                    "tt_standin_violation_count",
                )?),
                violation: std::mem::transmute::<*mut c_void, Violation>(sym(
                    handle,
                    "tt_standin_violation",
                )?),
                stat: std::mem::transmute::<*mut c_void, Stat>(sym(handle, "tt_standin_stat")?),
                last_error: std::mem::transmute::<*mut c_void, Text>(sym(handle, "tt_standin_last_error")?),
                path,
            })
        }
    }

    /// Knobs to defaults, failures disarmed, violations and statistics cleared.
    pub fn reset(&self) {
        (self.reset)()
    }

    /// Sets a knob: `sm_count`, `landing_delay_ms`, `sync_deadline_ms`, `regs_per_sm`, `module_load_waits`.
    pub fn set_knob(&self, name: &str, value: u64) -> Result<(), StandinError> {
        let c = CString::new(name).map_err(|_| StandinError::Library("knob name with NUL".into()))?;
        // SAFETY: a NUL-terminated name.
        if unsafe { (self.set_knob)(c.as_ptr(), value) } == 0 {
            Ok(())
        } else {
            Err(StandinError::Library(self.last_error()))
        }
    }

    pub fn knob(&self, name: &str) -> Option<u64> {
        let c = CString::new(name).ok()?;
        let mut v = 0;
        // SAFETY: a NUL-terminated name and a valid out pointer.
        (unsafe { (self.get_knob)(c.as_ptr(), &mut v) } == 0).then_some(v)
    }

    /// After `skip` calls of `name`, the next `count` return `code`.
    pub fn fail(&self, name: &str, skip: u64, count: u64, code: CUresult) -> Result<(), StandinError> {
        let c = CString::new(name).map_err(|_| StandinError::Library("function name with NUL".into()))?;
        // SAFETY: a NUL-terminated name.
        if unsafe { (self.fail)(c.as_ptr(), skip, count, code as u32) } == 0 {
            Ok(())
        } else {
            Err(StandinError::Library(format!("the stand-in cannot inject {code:?}")))
        }
    }

    /// Every violation recorded since the last reset.
    pub fn violations(&self) -> Vec<String> {
        let n = (self.violation_count)();
        (0..n)
            .filter_map(|i| {
                let mut buf = vec![0u8; 1024];
                // SAFETY: `buf` has the length passed.
                let len = unsafe { (self.violation)(i, buf.as_mut_ptr().cast(), buf.len()) };
                (len >= 0).then(|| {
                    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
                    String::from_utf8_lossy(&buf[..end]).into_owned()
                })
            })
            .collect()
    }

    /// A statistic (see `tt_standin_stat`); `ctx` 0 for all contexts.
    pub fn stat(&self, name: &str, ctx: usize) -> Result<u64, StandinError> {
        let c = CString::new(name).map_err(|_| StandinError::Library("stat name with NUL".into()))?;
        let mut v = 0;
        // SAFETY: a NUL-terminated name and a valid out pointer.
        if unsafe { (self.stat)(c.as_ptr(), ctx as u64, &mut v) } == 0 {
            Ok(v)
        } else {
            Err(StandinError::Library(format!("no statistic {name:?}")))
        }
    }

    /// Why the calling thread's last refused driver call was refused.
    pub fn last_error(&self) -> String {
        let mut buf = vec![0u8; 2048];
        // SAFETY: `buf` has the length passed.
        unsafe { (self.last_error)(buf.as_mut_ptr().cast(), buf.len()) };
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    }
}
