//! Host memory registered with the driver for the kernels (`cuMemHostRegister`):
//! the engine's KV memory and the drives' queue memory and doorbell pages.

use super::context::{check, CudaCtx, Deferred};
use crate::error::{GioError, Result};
use crate::mem::{HostMapping, HostRange};
use cudarc::driver::sys;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

struct Registered {
    len: usize,
    dev: u64,
    refs: usize,
}

/// Host ranges registered with the driver, by page-aligned start. Several
/// mappings share one registration (both doorbells of a queue sit in one BAR
/// page, and registering a page twice is an error).
pub(super) struct Registry {
    ctx: Arc<CudaCtx>,
    map: Mutex<HashMap<usize, Registered>>,
    unregister_now: bool,
}

/// Why [`Registry::map`] failed.
pub(super) enum MapError {
    /// The driver refused to register a BAR page (IOMEMORY): the caller may
    /// fall back to the doorbell relay.
    IoRefused(GioError),
    Other(GioError),
}

impl From<MapError> for GioError {
    fn from(e: MapError) -> Self {
        match e {
            MapError::IoRefused(e) | MapError::Other(e) => e,
        }
    }
}

impl Registry {
    /// `unregister_now`: a deferred unregistration may be run when the same memory is
    /// registered again (launch mode: the driver's wait for the device ends).
    pub fn new(ctx: &Arc<CudaCtx>, unregister_now: bool) -> Arc<Self> {
        Arc::new(Registry { ctx: ctx.clone(), map: Mutex::default(), unregister_now })
    }

    /// # Safety
    /// `ptr..ptr+len` must stay mapped until the returned mapping is dropped.
    pub unsafe fn map(
        self: &Arc<Self>,
        ptr: *mut u8,
        len: usize,
        range: HostRange,
    ) -> Result<Box<dyn HostMapping>, MapError> {
        const PAGE: usize = 4096;
        let start = ptr as usize & !(PAGE - 1);
        let end = (ptr as usize + len.max(1)).next_multiple_of(PAGE);
        let mut map =
            self.map.lock().map_err(|_| MapError::Other(GioError::invalid("registry lock poisoned")))?;
        let hit = map.iter_mut().find(|(&base, r)| base <= start && end <= base + r.len);
        let (base, dev) = match hit {
            Some((&base, r)) => {
                r.refs += 1;
                (base, r.dev)
            }
            None => {
                let mut cur = self.ctx.enter().map_err(MapError::Other)?;
                // A registration of this memory whose mapping was dropped may still wait in the
                // deferred list (frees wait while kernels may run): the driver would refuse the
                // range as already registered. In launch mode its unregistration can run now
                // (the mapping's users are gone and the driver's wait for running launches
                // ends); under a persistent kernel it would block until the kernel stops.
                // An old registration that starts below `start` is not looked for: the driver
                // refuses the range then, and that error is returned.
                if cur.deferred_unregisters_in(start, end) > 0 {
                    if !self.unregister_now {
                        return Err(MapError::Other(GioError::Executor {
                            executor: "cuda".into(),
                            what: format!(
                                "host memory {start:#x}..{end:#x} was registered before and its release \
                                 waits for the persistent I/O kernel to stop; it cannot be registered again \
                                 until then (stop the executor, or use launch mode)"
                            ),
                        }));
                    }
                    cur.release_unregisters_in(start, end);
                }
                // IOMEMORY tells the driver the range is device registers (a BAR), which it
                // maps uncached for the GPU's stores (DESIGN.md: doorbells written by the GPU).
                let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP
                    | if range == HostRange::Io { sys::CU_MEMHOSTREGISTER_IOMEMORY } else { 0 };
                // SAFETY: the caller keeps the range mapped; page-aligned as the driver requires.
                let rc = unsafe { sys::cuMemHostRegister_v2(start as *mut _, end - start, flags) };
                if let Err(e) = check("cuMemHostRegister", rc) {
                    return Err(match range {
                        // Some drivers refuse remap_pfn_range mappings (open-gpu-kernel-modules #732).
                        HostRange::Io => MapError::IoRefused(GioError::Executor {
                            executor: "cuda".into(),
                            what: format!(
                                "cannot map the drive's doorbell page for the GPU ({e}); this driver may not \
                                 support registering PCI BARs (IOMEMORY)"
                            ),
                        }),
                        HostRange::Memory => MapError::Other(e),
                    });
                }
                let mut dev: sys::CUdeviceptr = 0;
                // SAFETY: `start` was just registered with DEVICEMAP.
                let rc = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, start as *mut _, 0) };
                if let Err(e) = check("cuMemHostGetDevicePointer", rc) {
                    // SAFETY: registered just above, nothing uses it yet.
                    let _ = unsafe { sys::cuMemHostUnregister(start as *mut _) };
                    return Err(MapError::Other(e));
                }
                drop(cur);
                map.insert(start, Registered { len: end - start, dev, refs: 1 });
                (start, dev)
            }
        };
        Ok(Box::new(Mapping { registry: self.clone(), base, exec: dev + (ptr as usize - base) as u64 }))
    }

    fn unmap(&self, base: usize) {
        let Ok(mut map) = self.map.lock() else { return };
        let Some(r) = map.get_mut(&base) else { return };
        r.refs -= 1;
        if r.refs == 0 {
            map.remove(&base);
            drop(map);
            self.ctx.release(Deferred::Unregister(base as *mut _));
        }
    }
}

struct Mapping {
    registry: Arc<Registry>,
    base: usize,
    exec: u64,
}

impl HostMapping for Mapping {
    fn exec_addr(&self) -> u64 {
        self.exec
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        self.registry.unmap(self.base);
    }
}
