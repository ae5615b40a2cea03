//! Compiling the kernels with NVRTC, and finding libnvrtc first.
//!
//! cudarc's loader panics when libnvrtc cannot be found, so every entry point
//! here calls [`load`] first: it looks for `libnvrtc.so.12` itself and loads it
//! by absolute path when the dynamic loader would not find it. Once loaded,
//! cudarc's own `dlopen("libnvrtc.so.12")` resolves to it by soname.
//!
//! Register counts come from ptxas itself: NVRTC builds an sm_XX cubin by
//! running ptxas, and with `-Xptxas -v` its report lands in the program log.

use crate::error::KernelError;
use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const SONAME: &str = "libnvrtc.so.12";

/// Loads libnvrtc once per process; returns where it came from.
///
/// Order: `$TUTTI_NVRTC_LIB` (a path), the loader's search path
/// (`LD_LIBRARY_PATH`, ld.so.cache), `$CUDA_HOME/lib64`, `/usr/local/cuda/lib64`,
/// then the `nvidia-cuda-nvrtc-cu12` pip wheel located through `python3`.
pub fn load() -> Result<&'static str, KernelError> {
    static LOADED: OnceLock<Result<String, String>> = OnceLock::new();
    LOADED
        .get_or_init(find_and_load)
        .as_ref()
        .map(String::as_str)
        .map_err(|why| KernelError::NvrtcUnavailable(why.clone()))
}

fn find_and_load() -> Result<String, String> {
    let mut tried = Vec::new();
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("TUTTI_NVRTC_LIB") {
        candidates.push(PathBuf::from(p));
    }
    if dlopen(SONAME).is_ok() {
        return Ok(format!("{SONAME} from the loader search path"));
    }
    tried.push(format!("{SONAME} on the loader search path"));
    if let Some(home) = std::env::var_os("CUDA_HOME") {
        candidates.push(Path::new(&home).join("lib64").join(SONAME));
    }
    candidates.push(PathBuf::from("/usr/local/cuda/lib64").join(SONAME));
    if let Some(dir) = crate::wheel::package_dir("nvidia.cuda_nvrtc") {
        candidates.push(dir.join("lib").join(SONAME));
    }
    for path in candidates {
        match dlopen(&path.to_string_lossy()) {
            Ok(()) => return Ok(path.display().to_string()),
            Err(e) => tried.push(format!("{} ({e})", path.display())),
        }
    }
    Err(format!(
        "libnvrtc not found (tried: {}); install it with `python3 -m pip install nvidia-cuda-nvrtc-cu12` \
         or point TUTTI_NVRTC_LIB at libnvrtc.so.12",
        tried.join(", ")
    ))
}

/// Loads a library for the rest of the process (never closed: cudarc keeps using it).
fn dlopen(name: &str) -> Result<(), String> {
    let c = CString::new(name).map_err(|_| "path contains a NUL byte".to_string())?;
    // SAFETY: a valid C string; dlopen has no other preconditions.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns a thread-local message or NULL.
        let msg = unsafe { libc::dlerror() };
        return Err(if msg.is_null() {
            "dlopen failed".into()
        } else {
            // SAFETY: non-null dlerror results are NUL-terminated strings.
            unsafe { CStr::from_ptr(msg) }.to_string_lossy().into_owned()
        });
    }
    Ok(())
}

/// The NVRTC version, e.g. (12, 9).
pub fn version() -> Result<(i32, i32), KernelError> {
    load()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: libnvrtc is loaded (above); both pointers are valid.
    let rc = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if rc != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(KernelError::NvrtcUnavailable(format!("nvrtcVersion failed: {rc:?}")));
    }
    Ok((major, minor))
}

/// What ptxas reported for one kernel.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelResources {
    pub name: String,
    pub registers: u32,
    pub barriers: u32,
    pub shared_bytes: u32,
    pub stack_frame: u32,
    /// Spill stores and loads of the kernel and the functions it calls.
    pub spill_stores: u32,
    pub spill_loads: u32,
}

/// A compiled program.
#[derive(Clone, Debug)]
pub struct Compiled {
    pub arch: String,
    pub cubin: Vec<u8>,
    /// NVRTC's log, including ptxas' resource report.
    pub log: String,
    /// Per entry point, in the order ptxas reported them.
    pub kernels: Vec<KernelResources>,
}

impl Compiled {
    /// Log lines that are warnings (from NVRTC's front end or from ptxas).
    pub fn warnings(&self) -> Vec<&str> {
        self.log.lines().filter(|l| l.to_ascii_lowercase().contains("warning")).collect()
    }
}

/// Compiles the I/O kernels into a cubin for `arch` (e.g. `sm_90`).
pub fn compile_gio(arch: &str) -> Result<Compiled, KernelError> {
    compile(crate::GIO_SOURCE, crate::GIO_PROGRAM, arch)
}

/// Compiles `source` into a cubin for `arch` with ptxas' resource report.
pub fn compile(source: &str, program: &str, arch: &str) -> Result<Compiled, KernelError> {
    use cudarc::nvrtc::{result, sys};
    load()?;
    let fail = |call: &'static str, code: String, log: String| KernelError::Compile {
        program: program.to_string(),
        arch: arch.to_string(),
        call,
        code,
        log,
    };
    let src = CString::new(source).map_err(|_| fail("source", "NUL byte in source".into(), String::new()))?;
    let name = CString::new(program).map_err(|_| fail("name", "NUL byte in name".into(), String::new()))?;
    let prog = result::create_program(&src, Some(&name))
        .map_err(|e| fail("nvrtcCreateProgram", format!("{e:?}"), String::new()))?;
    let options = [format!("--gpu-architecture={arch}"), "--std=c++17".into(), "-Xptxas".into(), "-v".into()];
    // SAFETY: `prog` is a live program created above and destroyed below.
    let compiled = unsafe { result::compile_program(prog, &options) };
    // SAFETY: as above.
    let log = unsafe { result::get_program_log(prog) }.map(|raw| c_chars_to_string(&raw)).unwrap_or_default();
    let out =
        compiled.map_err(|e| fail("nvrtcCompileProgram", format!("{e:?}"), log.clone())).and_then(|()| {
            let mut size = 0usize;
            // SAFETY: `prog` compiled successfully; `size` is a valid out pointer.
            let rc = unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) };
            if rc != sys::nvrtcResult::NVRTC_SUCCESS {
                return Err(fail("nvrtcGetCUBINSize", format!("{rc:?}"), log.clone()));
            }
            let mut cubin = vec![0u8; size];
            // SAFETY: `cubin` has the `size` bytes NVRTC asked for.
            let rc = unsafe { sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast::<c_char>()) };
            if rc != sys::nvrtcResult::NVRTC_SUCCESS {
                return Err(fail("nvrtcGetCUBIN", format!("{rc:?}"), log.clone()));
            }
            Ok(cubin)
        });
    // SAFETY: `prog` is destroyed exactly once, after its last use.
    if let Err(e) = unsafe { result::destroy_program(prog) } {
        tracing::warn!(program, error = ?e, "nvrtcDestroyProgram failed");
    }
    let cubin = out?;
    let kernels = parse_ptxas_report(&log);
    Ok(Compiled { arch: arch.to_string(), cubin, log, kernels })
}

fn c_chars_to_string(raw: &[c_char]) -> String {
    let bytes: Vec<u8> = raw.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Reads ptxas' `-v` report:
/// ```text
/// ptxas info    : Compiling entry function 'k' for 'sm_90'
/// ptxas info    : Function properties for k
/// ptxas         .     48 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
/// ptxas info    : Used 64 registers, used 1 barriers, 12 bytes smem
/// ```
/// Properties of a non-entry function are added to the entry being compiled.
pub fn parse_ptxas_report(log: &str) -> Vec<KernelResources> {
    let mut out: Vec<KernelResources> = Vec::new();
    let mut props_for: Option<String> = None;
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default();
            out.push(KernelResources { name: name.to_string(), ..Default::default() });
        } else if let Some(rest) = line.split("Function properties for ").nth(1) {
            props_for = Some(rest.trim().to_string());
        } else if line.contains("bytes stack frame") {
            let Some(k) = out.last_mut() else { continue };
            let n = numbers_before(line);
            let own = props_for.as_deref() == Some(k.name.as_str());
            if own {
                k.stack_frame = n.get("stack").copied().unwrap_or(0);
            }
            k.spill_stores += n.get("spill stores").copied().unwrap_or(0);
            k.spill_loads += n.get("spill loads").copied().unwrap_or(0);
        } else if let Some(rest) = line.split("Used ").nth(1) {
            let Some(k) = out.last_mut() else { continue };
            let n = numbers_before(rest);
            k.registers = n.get("registers").copied().unwrap_or(0);
            k.barriers = n.get("barriers").copied().unwrap_or(0);
            k.shared_bytes = n.get("smem").copied().unwrap_or(0);
        }
    }
    out
}

/// For "N bytes stack frame, M registers, used K barriers" gives
/// {"stack": N, "registers": M, "barriers": K}, keyed by the words after the
/// number ("bytes" skipped; "spill stores"/"spill loads" keep two words).
fn numbers_before(text: &str) -> std::collections::HashMap<&str, u32> {
    let mut map = std::collections::HashMap::new();
    for part in text.split(',') {
        let words: Vec<&str> = part.split_whitespace().filter(|w| *w != "used" && *w != ".").collect();
        let Some(pos) = words.iter().position(|w| w.parse::<u32>().is_ok()) else { continue };
        let Ok(value) = words[pos].parse::<u32>() else { continue };
        let rest: Vec<&str> = words[pos + 1..].iter().copied().filter(|w| *w != "bytes").collect();
        let key = match rest.as_slice() {
            ["spill", "stores", ..] => "spill stores",
            ["spill", "loads", ..] => "spill loads",
            [first, ..] => first,
            [] => continue,
        };
        map.insert(key, value);
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptxas_report_is_parsed_per_entry() {
        let log = "ptxas info    : 2 bytes gmem\n\
            ptxas info    : Compiling entry function 'tt_gio_wait' for 'sm_90'\n\
            ptxas info    : Function properties for tt_gio_wait\n\
            ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
            ptxas info    : Used 17 registers, used 0 barriers\n\
            ptxas info    : Compiling entry function 'tt_gio_issue' for 'sm_90'\n\
            ptxas info    : Function properties for tt_gio_issue\n\
            ptxas         .     48 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
            ptxas info    : Used 64 registers, used 1 barriers, 48 bytes cumulative stack size, 12 bytes smem\n\
            ptxas info    : Function properties for _Z15tt_process_partPK11tt_exec_ctxjjj\n\
            ptxas         .     0 bytes stack frame, 80 bytes spill stores, 56 bytes spill loads\n";
        let k = parse_ptxas_report(log);
        assert_eq!(k.len(), 2);
        assert_eq!(k[0], KernelResources { name: "tt_gio_wait".into(), registers: 17, ..Default::default() });
        assert_eq!(k[1].name, "tt_gio_issue");
        assert_eq!((k[1].registers, k[1].barriers, k[1].shared_bytes), (64, 1, 12));
        assert_eq!((k[1].stack_frame, k[1].spill_stores, k[1].spill_loads), (48, 80, 56));
    }
}
