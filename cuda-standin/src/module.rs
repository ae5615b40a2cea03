//! Cubin images (cuModuleLoadData, cuLibraryLoadData), their kernels, and the
//! table that maps each entry point to its host build.
//!
//! An image is validated as the driver would: an ELF64 cubin for EM_CUDA and
//! sm_90, every entry point known (it must have a host build to run), each
//! with a register count. Its parameter tables are checked against what the
//! host kernel takes when a kernel is launched.

use crate::error::{fail, Result};
use cudarc::driver::sys::CUresult;
use std::sync::Arc;
use tutti_kernels::cubin::{self, KernelInfo};
use tutti_kernels::host::{HostArgs, HostKernel};

/// The architecture the stand-in device reports (compute capability 9.0).
pub(crate) const DEVICE_SM: u32 = 90;
/// Largest image read from a bare pointer.
const MAX_IMAGE: usize = 256 << 20;

/// An entry point the stand-in can run, and how its parameters become the
/// host kernel's arguments (values in ordinal order, zero-extended).
pub(crate) struct HostEntry {
    pub kernel: HostKernel,
    /// Parameter sizes in bytes, in order.
    pub params: &'static [u16],
    pub args: fn(&[u64]) -> HostArgs,
}

fn exec_args(p: &[u64]) -> HostArgs {
    HostArgs::exec(p[0] as usize as *mut _)
}

fn wait_args(p: &[u64]) -> HostArgs {
    HostArgs {
        ctx: p[0] as usize as *mut _,
        ids: p[1] as usize as *const u32,
        seqs: p[2] as usize as *const u32,
        n: p[3] as u32,
        timeout_ns: p[4],
        result: p[5] as usize as *mut u32,
        ..HostArgs::exec(std::ptr::null_mut())
    }
}

fn copy_args(p: &[u64]) -> HostArgs {
    HostArgs::copy(p[0] as usize as *const u64, p[1] as u32, p[2])
}

/// One line per kernel of the host build.
pub(crate) const HOST_ENTRIES: &[HostEntry] = &[
    HostEntry { kernel: HostKernel::Issue, params: &[8], args: exec_args },
    HostEntry { kernel: HostKernel::Persistent, params: &[8], args: exec_args },
    HostEntry { kernel: HostKernel::Wait, params: &[8, 8, 8, 4, 8, 8], args: wait_args },
    HostEntry { kernel: HostKernel::Copy, params: &[8, 4, 8], args: copy_args },
];

pub(crate) fn host_entry(name: &str) -> Option<&'static HostEntry> {
    HOST_ENTRIES.iter().find(|e| e.kernel.name() == name)
}

/// A validated image.
pub(crate) struct Image {
    pub kernels: Vec<KernelInfo>,
}

impl Image {
    pub fn kernel(&self, name: &str) -> Result<usize> {
        self.kernels.iter().position(|k| k.name == name).ok_or_else(|| {
            let have: Vec<&str> = self.kernels.iter().map(|k| k.name.as_str()).collect();
            fail(
                CUresult::CUDA_ERROR_NOT_FOUND,
                format!("no entry point {name:?} in the image (it has {})", have.join(", ")),
            )
        })
    }
}

/// cuModuleLoadData: an image of `ctx`.
pub(crate) struct Module {
    pub ctx: usize,
    pub image: Arc<Image>,
}

/// cuModuleGetFunction / cuKernelGetFunction: a kernel bound to a context.
#[derive(Clone)]
pub(crate) struct Function {
    pub ctx: usize,
    pub image: Arc<Image>,
    pub index: usize,
    /// The module it came from (None: from a library).
    pub module: Option<usize>,
}

/// cuLibraryGetKernel: a context-free kernel.
#[derive(Clone)]
pub(crate) struct LibKernel {
    pub library: usize,
    pub image: Arc<Image>,
    pub index: usize,
}

fn invalid(reason: impl Into<String>) -> crate::error::StandinError {
    fail(CUresult::CUDA_ERROR_INVALID_IMAGE, reason)
}

fn field(b: &[u8], off: usize, n: usize) -> u64 {
    let mut v = [0u8; 8];
    v[..n].copy_from_slice(&b[off..off + n]);
    u64::from_le_bytes(v)
}

/// Reads an ELF image from a bare pointer: its length is where its furthest
/// header or section ends.
///
/// # Safety
/// `p` must point at a complete image (as cuModuleLoadData requires).
pub(crate) unsafe fn image_bytes<'a>(p: *const u8) -> Result<&'a [u8]> {
    if p.is_null() {
        return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, "image pointer is NULL"));
    }
    // SAFETY: every image starts with at least a 4-byte magic.
    let magic = unsafe { std::slice::from_raw_parts(p, 4) };
    if magic != b"\x7fELF" {
        let text = magic.iter().all(|c| c.is_ascii());
        return Err(invalid(if text {
            "not an ELF cubin (PTX or fatbin text: JIT compilation is not modelled, load a cubin)"
        } else {
            "not an ELF cubin (bad magic)"
        }));
    }
    // SAFETY: an ELF file has a 64-byte header (ELF64; class checked right after).
    let hdr = unsafe { std::slice::from_raw_parts(p, 64) };
    if hdr[4] != 2 {
        return Err(invalid("not an ELF64 image"));
    }
    let (phoff, shoff) = (field(hdr, 0x20, 8) as usize, field(hdr, 0x28, 8) as usize);
    let (phent, phnum) = (field(hdr, 0x36, 2) as usize, field(hdr, 0x38, 2) as usize);
    let (shent, shnum) = (field(hdr, 0x3a, 2) as usize, field(hdr, 0x3c, 2) as usize);
    let mut end = 64usize.max(phoff.saturating_add(phent * phnum)).max(shoff.saturating_add(shent * shnum));
    if end > MAX_IMAGE || shent < 64 {
        return Err(invalid(format!("headers end at byte {end} (section entries of {shent} bytes)")));
    }
    // SAFETY: the section header table lies within the image (its header says so).
    let shdrs = unsafe { std::slice::from_raw_parts(p.add(shoff), shent * shnum) };
    for i in 0..shnum {
        let h = i * shent;
        let (kind, off, size) =
            (field(shdrs, h + 4, 4), field(shdrs, h + 0x18, 8), field(shdrs, h + 0x20, 8));
        if kind != 8 {
            end = end.max((off as usize).saturating_add(size as usize));
        }
    }
    if end > MAX_IMAGE {
        return Err(invalid(format!("a section ends at byte {end}, beyond {MAX_IMAGE}")));
    }
    // SAFETY: the image spans `end` bytes per its own headers.
    Ok(unsafe { std::slice::from_raw_parts(p, end) })
}

/// Validates an image as the driver does when loading it.
pub(crate) fn load(bytes: &[u8]) -> Result<Arc<Image>> {
    let cubin = cubin::parse(bytes).map_err(|e| invalid(e.to_string()))?;
    if cubin.sm != DEVICE_SM {
        return Err(invalid(format!(
            "the cubin is for sm_{}; this device is sm_{DEVICE_SM} (a cubin runs only on its own architecture)",
            cubin.sm
        )));
    }
    if cubin.kernels.is_empty() {
        return Err(invalid("the cubin has no entry points"));
    }
    for k in &cubin.kernels {
        if host_entry(&k.name).is_none() {
            let known: Vec<&str> = HOST_ENTRIES.iter().map(|e| e.kernel.name()).collect();
            return Err(invalid(format!(
                "entry point {:?} has no host build in the stand-in (it runs {})",
                k.name,
                known.join(", ")
            )));
        }
        if k.registers.is_none() {
            return Err(invalid(format!("entry point {:?} has no register count (EIATTR_REGCOUNT)", k.name)));
        }
    }
    Ok(Arc::new(Image { kernels: cubin.kernels }))
}

/// Reads a launch's parameters through the cubin's table and turns them into
/// the host kernel's arguments; a table that does not match what the host
/// kernel takes is refused with the difference.
///
/// # Safety
/// `params` must be NULL or hold one valid pointer per parameter of the cubin's table,
/// each pointing at that parameter's bytes.
pub(crate) unsafe fn marshal(k: &KernelInfo, params: *mut *mut std::ffi::c_void) -> Result<HostArgs> {
    let bad = |why: String| fail(CUresult::CUDA_ERROR_INVALID_VALUE, format!("{}: {why}", k.name));
    let entry = host_entry(&k.name).ok_or_else(|| bad("no host build".into()))?;
    if k.params.len() != entry.params.len() {
        return Err(bad(format!(
            "the cubin's parameter table has {} parameters, the host kernel takes {}",
            k.params.len(),
            entry.params.len()
        )));
    }
    let mut offset = 0u16;
    for (i, (p, &size)) in k.params.iter().zip(entry.params).enumerate() {
        offset = offset.next_multiple_of(size);
        if p.size != size || p.offset != offset {
            return Err(bad(format!(
                "parameter {i} is {} bytes at offset {} in the cubin; the host kernel takes {size} bytes at \
                 offset {offset}",
                p.size, p.offset
            )));
        }
        offset += size;
    }
    if params.is_null() && !k.params.is_empty() {
        return Err(bad("kernelParams is NULL".into()));
    }
    let mut values = Vec::with_capacity(k.params.len());
    for (i, p) in k.params.iter().enumerate() {
        // SAFETY: one pointer per parameter (caller's contract).
        let ptr = unsafe { *params.add(i) }.cast::<u8>();
        if ptr.is_null() {
            return Err(bad(format!("kernelParams[{i}] is NULL")));
        }
        let mut v = [0u8; 8];
        let n = usize::from(p.size).min(8);
        // SAFETY: the parameter's bytes (caller's contract); unaligned reads are fine.
        unsafe { std::ptr::copy_nonoverlapping(ptr, v.as_mut_ptr(), n) };
        values.push(u64::from_le_bytes(v));
    }
    Ok((entry.args)(&values))
}
