//! CUDA KV memory made reachable for the drives through GDRCopy: each region's
//! GPU pages pinned (`gdr_pin_buffer`) and mapped into this process
//! (`gdr_map`, a BAR1 window: a PFN map, which vfio type1 can map for a
//! drive), so the drives' DMA goes peer to peer into GPU memory.
//!
//! `libgdrapi.so.2` is loaded at run time (like libcuda), from `TUTTI_GDRAPI`
//! when set. Pins are whole 64 KiB GPU pages: each region is rounded out to
//! pages, and regions whose pages overlap share one pin. Everything is
//! unmapped and unpinned when the provider drops, which the registration
//! holding it does before the engine may free the memory
//! (`tutti_kv_unregister`, a new registration, or the runtime's release).
//!
//! Verified on the stand-in gdrapi of `tutti-cuda-standin` (whose device
//! allocations are memfd-backed, so `gdr_map` is a second view of the same
//! bytes) with the emulated drives; no GPU with gdrdrv has run it yet.

use crate::error::{ObjError, Result};
use crate::p2p::DeviceAccess;
use std::ffi::{c_int, c_void, CString};
use std::sync::Arc;

/// GDRCopy's pinning unit.
pub const GPU_PAGE: u64 = 64 << 10;

/// The library name tried when `TUTTI_GDRAPI` is not set.
pub const DEFAULT_LIBRARY: &str = "libgdrapi.so.2";

#[repr(C)]
#[derive(Clone, Copy)]
struct Mh {
    /// `unsigned long`: 64 bits on LP64 Linux.
    h: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct InfoV2 {
    va: u64,
    mapped_size: u64,
    page_size: u32,
    tm_cycles: u64,
    cycles_per_ms: u32,
    flags: u32,
    mapping_type: c_int,
}

type Open = unsafe extern "C" fn() -> *mut c_void;
type Close = unsafe extern "C" fn(*mut c_void) -> c_int;
type Pin = unsafe extern "C" fn(*mut c_void, u64, usize, u64, u32, *mut Mh) -> c_int;
type Unpin = unsafe extern "C" fn(*mut c_void, Mh) -> c_int;
type Info = unsafe extern "C" fn(*mut c_void, Mh, *mut InfoV2) -> c_int;
type Map = unsafe extern "C" fn(*mut c_void, Mh, *mut *mut c_void, usize) -> c_int;
type Unmap = unsafe extern "C" fn(*mut c_void, Mh, *mut c_void, usize) -> c_int;

/// The loaded library's entry points (the handle stays open for the process).
struct Api {
    open: Open,
    close: Close,
    pin: Pin,
    unpin: Unpin,
    info: Info,
    map: Map,
    unmap: Unmap,
}

fn err(what: impl Into<String>) -> ObjError {
    ObjError::invalid("gdrcopy", what.into())
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string owned by libc.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        return "unknown error".into();
    }
    // SAFETY: non-null and NUL-terminated (above).
    unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

impl Api {
    fn load(path: &str) -> Result<Api> {
        let c = CString::new(path).map_err(|_| err(format!("library path {path:?} holds a NUL")))?;
        // SAFETY: a NUL-terminated path; the handle is never closed (symbols stay valid).
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            return Err(err(format!("cannot load {path}: {}", dlerror())));
        }
        let sym = |name: &str| -> Result<*mut c_void> {
            let n = CString::new(name).map_err(|_| err("symbol name with NUL"))?;
            // SAFETY: a live handle and a NUL-terminated name.
            let p = unsafe { libc::dlsym(h, n.as_ptr()) };
            if p.is_null() {
                return Err(err(format!("{path} has no {name} (GDRCopy 2.x exports it)")));
            }
            Ok(p)
        };
        // SAFETY: each symbol is GDRCopy 2.x's function of that name, whose C signature the
        // type spells (gdrapi.h: gdr_t is a pointer, gdr_mh_t a struct of one unsigned long).
        unsafe {
            Ok(Api {
                open: std::mem::transmute::<*mut c_void, Open>(sym("gdr_open")?),
                close: std::mem::transmute::<*mut c_void, Close>(sym("gdr_close")?),
                pin: std::mem::transmute::<*mut c_void, Pin>(sym("gdr_pin_buffer")?),
                unpin: std::mem::transmute::<*mut c_void, Unpin>(sym("gdr_unpin_buffer")?),
                info: std::mem::transmute::<*mut c_void, Info>(sym("gdr_get_info_v2")?),
                map: std::mem::transmute::<*mut c_void, Map>(sym("gdr_map")?),
                unmap: std::mem::transmute::<*mut c_void, Unmap>(sym("gdr_unmap")?),
            })
        }
    }
}

/// One pin: GPU pages `va .. va + len`, mapped at `map`.
struct Pinned {
    handle: Mh,
    va: u64,
    len: u64,
    map: *mut u8,
}

/// CUDA memory pinned and mapped through GDRCopy, for the drives and for the
/// probe's byte checks (through the mapping, as the CPU sees BAR1).
pub struct GdrMapped {
    api: Arc<Api>,
    g: *mut c_void,
    pins: Vec<Pinned>,
    library: String,
}

// SAFETY: the gdr_t handle and the mappings are process-wide; GDRCopy's calls may be made
// from any thread, and this type's accesses to the mappings are volatile byte copies in
// bounds of a mapping it owns until drop.
unsafe impl Send for GdrMapped {}
// SAFETY: as above: `&self` only reads and writes the mapped device memory.
unsafe impl Sync for GdrMapped {}

impl std::fmt::Debug for GdrMapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GdrMapped({}, {} pins)", self.library, self.pins.len())
    }
}

impl GdrMapped {
    /// The library named by `TUTTI_GDRAPI`, else [`DEFAULT_LIBRARY`].
    pub fn library_from_env() -> String {
        std::env::var("TUTTI_GDRAPI").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| DEFAULT_LIBRARY.into())
    }

    /// Pins and maps the GPU pages of every `(addr, len)` region of CUDA memory.
    /// Fails, with nothing left pinned, naming the call, the range and the errno.
    pub fn pin(library: &str, regions: &[(u64, u64)]) -> Result<GdrMapped> {
        let api = Arc::new(Api::load(library)?);
        // SAFETY: GDRCopy's gdr_open takes nothing; NULL means gdrdrv is not there.
        let g = unsafe { (api.open)() };
        if g.is_null() {
            return Err(err(format!(
                "gdr_open failed ({library}): is the gdrdrv module loaded (/dev/gdrdrv)?"
            )));
        }
        let mut m = GdrMapped { api, g, pins: Vec::new(), library: library.to_string() };
        // Page ranges, merged where regions share pages.
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for &(addr, len) in regions {
            if len == 0 {
                continue;
            }
            let end = addr.checked_add(len).ok_or_else(|| err(format!("{addr:#x}+{len:#x} wraps")))?;
            let start = addr & !(GPU_PAGE - 1);
            let end = end.div_ceil(GPU_PAGE) * GPU_PAGE;
            ranges.push((start, end));
        }
        ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (s, e) in ranges {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        for (s, e) in merged {
            m.pin_one(s, e - s)?;
        }
        tracing::info!(library, pins = m.pins.len(), "CUDA KV memory pinned and mapped through GDRCopy");
        Ok(m)
    }

    fn pin_one(&mut self, va: u64, len: u64) -> Result<()> {
        let mut h = Mh { h: 0 };
        // SAFETY: a live gdr_t and a valid out pointer.
        let rc = unsafe { (self.api.pin)(self.g, va, len as usize, 0, 0, &mut h) };
        if rc != 0 {
            return Err(err(format!(
                "gdr_pin_buffer of GPU pages {va:#x}+{len:#x}: errno {rc} ({})",
                std::io::Error::from_raw_os_error(rc)
            )));
        }
        let mut info = InfoV2::default();
        // SAFETY: a live gdr_t, a pinned handle and a valid out pointer.
        let rc = unsafe { (self.api.info)(self.g, h, &mut info) };
        let bad = if rc != 0 {
            Some(format!("gdr_get_info_v2: errno {rc}"))
        } else if info.page_size as u64 != GPU_PAGE {
            Some(format!("GPU page size {} bytes, tutti pins 64 KiB pages", info.page_size))
        } else if info.va != va || info.mapped_size != len {
            Some(format!(
                "the pin covers {:#x}+{:#x}, not the 64 KiB-aligned pages {va:#x}+{len:#x} asked for",
                info.va, info.mapped_size
            ))
        } else {
            None
        };
        if let Some(why) = bad {
            // SAFETY: the handle pinned above, not mapped.
            unsafe { (self.api.unpin)(self.g, h) };
            return Err(err(why));
        }
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: a live gdr_t, a pinned handle, a valid out pointer and the pin's size.
        let rc = unsafe { (self.api.map)(self.g, h, &mut p, len as usize) };
        if rc != 0 || p.is_null() {
            // SAFETY: the handle pinned above, not mapped.
            unsafe { (self.api.unpin)(self.g, h) };
            return Err(err(format!("gdr_map of GPU pages {va:#x}+{len:#x}: errno {rc}")));
        }
        self.pins.push(Pinned { handle: h, va, len, map: p.cast() });
        Ok(())
    }

    /// The mapping of `addr .. addr + len` in this process.
    fn at(&self, addr: u64, len: u64) -> Result<*mut u8> {
        let end = addr.checked_add(len).ok_or_else(|| err(format!("{addr:#x}+{len:#x} wraps")))?;
        let p = self.pins.iter().find(|p| addr >= p.va && end <= p.va + p.len).ok_or_else(|| {
            err(format!("{addr:#x}+{len:#x} is not inside the GPU pages pinned through GDRCopy"))
        })?;
        // SAFETY: in bounds of the pin's mapping (checked above).
        Ok(unsafe { p.map.add((addr - p.va) as usize) })
    }

    /// The GPU pages pinned, as (first address, bytes).
    pub fn pinned(&self) -> Vec<(u64, u64)> {
        self.pins.iter().map(|p| (p.va, p.len)).collect()
    }
}

impl DeviceAccess for GdrMapped {
    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<()> {
        let p = self.at(addr, dst.len() as u64)?;
        // SAFETY: `dst.len()` bytes at `p` lie inside a live mapping (checked by `at`).
        unsafe { crate::p2p::volatile_read(p, dst) };
        Ok(())
    }
    fn write(&self, addr: u64, src: &[u8]) -> Result<()> {
        let p = self.at(addr, src.len() as u64)?;
        // SAFETY: as in `read`.
        unsafe { crate::p2p::volatile_write(p, src) };
        Ok(())
    }
    fn drive_view(&self, addr: u64, len: u64) -> Result<*mut u8> {
        self.at(addr, len)
    }
}

impl Drop for GdrMapped {
    fn drop(&mut self) {
        for p in self.pins.drain(..) {
            // SAFETY: a mapping and pin this value made, used by nothing after drop (the
            // registration holding it dropped its drive mappings first).
            let (u, v) = unsafe {
                (
                    (self.api.unmap)(self.g, p.handle, p.map.cast(), p.len as usize),
                    (self.api.unpin)(self.g, p.handle),
                )
            };
            if u != 0 || v != 0 {
                tracing::error!(
                    va = p.va,
                    len = p.len,
                    unmap = u,
                    unpin = v,
                    "releasing a GDRCopy pin failed"
                );
            }
        }
        // SAFETY: the gdr_t opened in `pin`, with nothing pinned any more.
        unsafe { (self.api.close)(self.g) };
    }
}
