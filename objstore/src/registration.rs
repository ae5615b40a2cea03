//! Registering the engine's KV memory: DMA mappings and the P2P SGL table.
//!
//! The registered memory is mapped once into every drive's DMA space, and
//! for every distinct device view of it one table is built, once, with one
//! 16-byte SGL Data Block per (engine block, layer, K|V, chunk):
//!
//! ```text
//! table[((b·L + layer)·2 + kv)·chunks + c] = DataBlock(iova of chunk c of object (b, layer, kv), its length)
//! ```
//!
//! Drives behind one IOMMU domain see the memory at the same IOVAs and share
//! a table; drives with their own IOMMU (or emulated controllers, each with its
//! own) get their own. Either way a command's data pointer is a table read,
//! never a page walk on the I/O path.
//!
//! For comparison the same chunks described by PRP (§4.3) would need, per
//! command spanning `n` 4-KiB pages with `n > 2`, a list of `n − 1` entries
//! (8 bytes each) in list pages of 512 entries (the last one of a full page
//! chaining to the next). Both sizes are reported.

use crate::error::{ObjError, Result};
use crate::hash::{CacheIdentity, IdentityId};
use crate::layout::KvLayout;
use crate::memory::HostKvMemory;
use crate::stripe::StripeMap;
use std::sync::Arc;
use tutti_driver::spec::SglDescriptor;
use tutti_driver::transport::{DmaMapping, DmaSpace, IovaSegment};

/// What the registered KV memory is, which decides whether the drives can
/// DMA into it (direct) or the executor must stage every chunk.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvMemoryKind {
    /// Host memory the drives may map: direct (P2P-style) DMA.
    #[default]
    Host,
    /// Host memory the drives must not touch (testing the staged path on a
    /// machine without a GPU): never mapped into a drive's DMA space.
    HostUnmapped,
    /// CUDA device memory: the executor's address space.
    Cuda,
    /// Memory of another device that a provider maps for the drives (a
    /// vfio-pci BAR, a GDRCopy mapping): peer-to-peer DMA when the probe at
    /// registration passes ([`crate::p2p`]), staged otherwise.
    DeviceP2p,
}

impl KvMemoryKind {
    /// Why the drives cannot DMA straight into memory of this kind, when they
    /// cannot: the data path is then staged. Probed at registration.
    pub fn p2p_obstacle(self) -> Option<String> {
        match self {
            KvMemoryKind::Host | KvMemoryKind::DeviceP2p => None,
            KvMemoryKind::HostUnmapped => {
                Some("host KV memory registered as not DMA-mappable (host-staged test kind)".into())
            }
            KvMemoryKind::Cuda => {
                let why = if std::path::Path::new("/dev/iommu").exists() {
                    "tutti binds drives through vfio type1 containers and has no iommufd dma-buf import path"
                } else {
                    "/dev/iommu is absent (kernel without iommufd)"
                };
                Some(format!(
                    "CUDA memory: vfio type1 cannot map it; dma-buf import through iommufd not available: {why}"
                ))
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvMemoryKind::Host => "host",
            KvMemoryKind::HostUnmapped => "host (unmapped)",
            KvMemoryKind::Cuda => "cuda",
            KvMemoryKind::DeviceP2p => "device (p2p)",
        }
    }
}

/// The data path in force for a registration.
#[derive(Clone, PartialEq, Eq, Debug, serde::Serialize)]
pub struct DataPath {
    /// `direct` (drives DMA into host KV memory), `p2p` (drives DMA into
    /// another device's memory, probed) or `staged` (through pinned host staging).
    pub mode: &'static str,
    pub memory: KvMemoryKind,
    /// When staged: what is missing for direct (P2P) DMA.
    pub p2p_missing: Option<String>,
    /// Who maps device KV memory for the drives (`p2p`, or `staged` after a
    /// failed probe): `vfio-pci 0000:00:09.0 BAR2`, ...
    pub provider: Option<String>,
    /// When staged: the staging slots and their counters (gio_uring path).
    pub staging: Option<tutti_gio_uring::StagingStats>,
}

/// One view's table; `descs[index(b, layer, kv, c)]`.
pub struct SglTable {
    pub descs: Vec<SglDescriptor>,
}

/// Metadata sizes of a registration.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, serde::Serialize)]
pub struct TableSizes {
    /// Descriptors per table: blocks × layers × 2 × chunks.
    pub descriptors: u64,
    /// Distinct device views (tables) of the registered memory.
    pub tables: u32,
    /// Bytes of all SGL tables.
    pub sgl_bytes: u64,
    /// Bytes of PRP list entries the same commands would need (per view, summed).
    pub prp_entry_bytes: u64,
    /// The same PRP lists allocated as 4-KiB list pages, one list per command.
    pub prp_page_bytes: u64,
    /// Commands needing a PRP list (more than two pages), per view.
    pub prp_lists: u64,
}

/// The engine's KV memory, mapped for every drive, with its tables.
pub(crate) struct Registration {
    pub layout: KvLayout,
    pub identity: CacheIdentity,
    pub identity_id: IdentityId,
    /// `tables[table_of_drive[d]]` holds drive `d`'s descriptors.
    pub tables: Vec<Arc<SglTable>>,
    pub table_of_drive: Vec<usize>,
    pub sizes: TableSizes,
    pub chunks: u32,
    /// What the KV memory is; when it is not `Host` the registration is
    /// staged: nothing is mapped for the drives and there are no SGL tables.
    pub memory_kind: KvMemoryKind,
    /// Staged: the drives never see the KV memory (its kind cannot be
    /// mapped, P2P was refused, or its probe failed).
    staged: bool,
    /// Why not direct or P2P, when staged.
    pub p2p_missing: Option<String>,
    /// Per drive, per layout region. Dropped before `device` and `_memory`.
    _mappings: Vec<Vec<DmaMapping>>,
    /// Device KV memory and its provider ([`KvMemoryKind::DeviceP2p`], or
    /// [`KvMemoryKind::Cuda`] that GDRCopy mapped). Dropped after the drives'
    /// mappings of it.
    pub device: Option<crate::p2p::DeviceKvMemory>,
    _memory: Option<Arc<HostKvMemory>>,
}

/// Most SGL descriptors one table may hold (16 bytes each: 2 GiB). A table
/// has `num_blocks × layers × 2 × chunks` of them, built at registration; a
/// larger registration is refused (naming `num_blocks`) before anything is
/// mapped. gio_uring's layer table has as many entries, so this bounds it too.
pub const MAX_TABLE_DESCRIPTORS: u64 = 1 << 27;

/// Descriptors of one table for `layout` split into `chunks` chunks per object,
/// or an error naming `num_blocks` when that is more than [`MAX_TABLE_DESCRIPTORS`].
pub fn table_descriptors(layout: &KvLayout, chunks: u32) -> Result<u64> {
    let n = layout.num_blocks() as u128 * layout.geometry().layers as u128 * 2 * chunks as u128;
    if n > MAX_TABLE_DESCRIPTORS as u128 {
        return Err(ObjError::invalid(
            "num_blocks",
            format!(
                "{} blocks × {} layers × 2 × {chunks} chunks is {n} SGL descriptors per table, over the \
                 {MAX_TABLE_DESCRIPTORS} a registration may build; register fewer blocks",
                layout.num_blocks(),
                layout.geometry().layers
            ),
        ));
    }
    Ok(n as u64)
}

/// Most bytes of SGL tables one registration may build, all its device views together
/// (`views × num_blocks × layers × 2 × chunks × 16`): the tables are built on the CPU at
/// registration, about 10 s per GiB, so a larger registration is refused up front (naming this
/// bound) before anything is mapped. `views` is counted before mapping as the distinct DMA
/// spaces of the drives (one per VFIO container or emulated controller), at least 1.
pub const MAX_TABLE_BYTES: u64 = 1 << 30;

/// Refuses a registration whose tables would pass [`MAX_TABLE_DESCRIPTORS`] per table or
/// [`MAX_TABLE_BYTES`] in all, for `views` device views; returns the descriptors per table.
pub fn check_table_bounds(layout: &KvLayout, chunks: u32, views: usize) -> Result<u64> {
    let descriptors = table_descriptors(layout, chunks)?;
    let bytes = descriptors as u128 * views.max(1) as u128 * size_of::<SglDescriptor>() as u128;
    if bytes > MAX_TABLE_BYTES as u128 {
        return Err(ObjError::invalid(
            "num_blocks",
            format!(
                "{} blocks × {} layers × 2 × {chunks} chunks is {descriptors} SGL descriptors per table; \
                 {} device views make {bytes} bytes of tables, over the {MAX_TABLE_BYTES}-byte bound \
                 (TUTTI_MAX_TABLE_BYTES) a registration may build; register fewer blocks",
                layout.num_blocks(),
                layout.geometry().layers,
                views.max(1)
            ),
        ));
    }
    Ok(descriptors)
}

/// Distinct DMA spaces among `spaces` (drives sharing an IOMMU domain share one).
pub(crate) fn distinct_spaces(spaces: &[Arc<dyn DmaSpace>]) -> usize {
    let mut seen: Vec<*const ()> = spaces.iter().map(|s| Arc::as_ptr(s) as *const ()).collect();
    seen.sort_unstable();
    seen.dedup();
    seen.len()
}

const PAGE: u64 = 4096;
/// PRP entries per list page (§4.3: the last entry of a full page chains).
const PRP_PER_PAGE: u64 = PAGE / 8;

impl Registration {
    /// Maps the layout's regions into every drive's DMA space and builds the tables.
    ///
    /// # Safety
    /// Every region of `layout` must be memory of this process that stays
    /// allocated, and is not used for anything the drives must not see, until
    /// the registration is dropped (`memory`, if given, is kept alive by it).
    pub unsafe fn new(
        layout: KvLayout,
        identity: CacheIdentity,
        spaces: &[Arc<dyn DmaSpace>],
        map: &StripeMap,
        memory: Option<Arc<HostKvMemory>>,
        memory_kind: KvMemoryKind,
        device: Option<crate::p2p::DeviceKvMemory>,
    ) -> Result<Self> {
        let provided = match memory_kind {
            KvMemoryKind::DeviceP2p => device.is_some(),
            // CUDA memory with a provider (GDRCopy) or without (staged).
            KvMemoryKind::Cuda => true,
            _ => device.is_none(),
        };
        if !provided {
            return Err(ObjError::invalid(
                "memory",
                "device KV memory is registered with its provider, and only device or CUDA KV memory",
            ));
        }
        if identity.geometry != *layout.geometry() || identity.layout != layout.kind() {
            return Err(ObjError::invalid(
                "identity",
                "its geometry or layout kind differs from the registered layout",
            ));
        }
        if map.object_bytes() != layout.geometry().object_bytes() {
            return Err(ObjError::invalid("layout", "its geometry differs from the pool's"));
        }
        // Bounded before anything is mapped or allocated.
        let refused = match &device {
            Some(d) if d.policy == crate::p2p::P2pPolicy::Off => {
                Some(format!("{}: P2P is off (the p2p setting); moved through staging", d.provider))
            }
            // A provider maps it for the drives: the probe decides.
            Some(_) => None,
            None => memory_kind.p2p_obstacle(),
        };
        let views = if refused.is_some() { 1 } else { distinct_spaces(spaces) };
        let descriptors = check_table_bounds(&layout, map.chunks(), views)?;
        if let Some(why) = refused {
            return Ok(Self::staged_with(
                layout,
                identity,
                descriptors,
                map.chunks(),
                memory_kind,
                why,
                device,
                memory,
            ));
        }
        // One mapping per distinct DMA space: drives sharing an IOMMU domain
        // (one VFIO container) share one `DmaSpace` and see one set of IOVAs.
        let mut mappings: Vec<Vec<DmaMapping>> = Vec::new();
        let mut space_of_drive = Vec::with_capacity(spaces.len());
        let mut seen: Vec<*const ()> = Vec::new();
        // Device memory a drive's DMA space refused to map, under `P2pPolicy::Auto`: staged.
        let mut map_refused: Option<String> = None;
        'spaces: for space in spaces {
            let key = Arc::as_ptr(space) as *const ();
            if let Some(i) = seen.iter().position(|&k| k == key) {
                space_of_drive.push(i);
                continue;
            }
            let mut per = Vec::new();
            for r in layout.regions() {
                match &device {
                    None => {
                        // SAFETY: the caller keeps every region allocated until this registration drops.
                        per.push(unsafe { space.map(r.addr as *mut u8, r.len as usize)? })
                    }
                    Some(d) => {
                        let mapped = d.access.drive_view(r.addr, r.len).and_then(|at| {
                            // SAFETY: the caller keeps the device memory mapped until this registration
                            // drops (KvStore::register_device's contract).
                            let m = unsafe { space.map_device(at, r.len as usize, &d.provider)? };
                            if d.unreachable {
                                space.revoke(&m)?;
                            }
                            Ok(m)
                        });
                        match mapped {
                            Ok(m) => per.push(m),
                            Err(e) if d.policy == crate::p2p::P2pPolicy::Require => return Err(e),
                            Err(e) => {
                                map_refused =
                                    Some(format!("mapping {} for the drives failed: {e}", d.provider));
                                break 'spaces;
                            }
                        }
                    }
                }
            }
            space_of_drive.push(mappings.len());
            mappings.push(per);
            seen.push(key);
        }
        if let Some(why) = map_refused {
            drop(mappings);
            let chunks = map.chunks();
            return Ok(Self::staged_with(
                layout,
                identity,
                descriptors,
                chunks,
                memory_kind,
                why,
                device,
                memory,
            ));
        }
        // One table per distinct device view of the memory.
        let mut tables: Vec<Arc<SglTable>> = Vec::new();
        let mut table_of_space = Vec::new();
        let mut views: Vec<Vec<Vec<IovaSegment>>> = Vec::new();
        for per in &mappings {
            let view: Vec<Vec<IovaSegment>> = per.iter().map(|m| m.segments().to_vec()).collect();
            if let Some(i) = views.iter().position(|v| *v == view) {
                table_of_space.push(i);
                continue;
            }
            tables.push(Arc::new(build_table(&layout, per, map)?));
            table_of_space.push(views.len());
            views.push(view);
        }
        let table_of_drive: Vec<usize> = space_of_drive.iter().map(|&s| table_of_space[s]).collect();
        let sizes = sizes(&tables);
        let identity_id = identity.id();
        tracing::info!(
            tables = sizes.tables,
            sgl_bytes = sizes.sgl_bytes,
            prp_page_bytes = sizes.prp_page_bytes,
            "KV memory registered"
        );
        Ok(Registration {
            layout,
            identity,
            identity_id,
            tables,
            table_of_drive,
            sizes,
            chunks: map.chunks(),
            memory_kind,
            staged: false,
            p2p_missing: None,
            device,
            _mappings: mappings,
            _memory: memory,
        })
    }

    /// A staged registration: the drives never see this memory; the executor
    /// copies each chunk through staging slots (io::gio builds that table).
    #[allow(clippy::too_many_arguments, reason = "the fields of a registration")]
    fn staged_with(
        layout: KvLayout,
        identity: CacheIdentity,
        descriptors: u64,
        chunks: u32,
        memory_kind: KvMemoryKind,
        why: String,
        device: Option<crate::p2p::DeviceKvMemory>,
        memory: Option<Arc<HostKvMemory>>,
    ) -> Registration {
        tracing::info!(memory = memory_kind.name(), %why, "KV memory registered for the staged data path");
        Registration {
            identity_id: identity.id(),
            layout,
            identity,
            tables: Vec::new(),
            table_of_drive: Vec::new(),
            sizes: TableSizes { descriptors, ..Default::default() },
            chunks,
            memory_kind,
            staged: true,
            p2p_missing: Some(why),
            device,
            _mappings: Vec::new(),
            _memory: memory,
        }
    }

    /// This registration moved to the staged path (a failed P2P probe said
    /// `why`): the drives' mappings and tables are dropped.
    pub(crate) fn into_staged(self, why: String) -> Registration {
        let descriptors = self.sizes.descriptors;
        let Registration { layout, identity, chunks, memory_kind, device, _mappings, _memory, .. } = self;
        drop(_mappings);
        Self::staged_with(layout, identity, descriptors, chunks, memory_kind, why, device, _memory)
    }

    /// A staged registration's reason, replaced by a more precise one (CUDA
    /// memory whose provider could not be set up says why).
    pub(crate) fn set_p2p_missing(&mut self, why: String) {
        if self.staged {
            self.p2p_missing = Some(why);
        }
    }

    /// Whether the data path is staged (the drives cannot reach the KV memory).
    pub fn staged(&self) -> bool {
        self.staged
    }

    /// `direct`, `p2p` or `staged`.
    pub fn mode(&self) -> &'static str {
        match (self.staged, self.memory_kind) {
            (true, _) => "staged",
            (false, _) if self.device.is_some() => "p2p",
            _ => "direct",
        }
    }

    /// The descriptor for chunk `c` of object `(block, layer, kv)` as drive `d` sees it.
    /// Only for direct registrations (a staged one has no tables).
    pub fn descriptor(&self, d: u32, block: u32, layer: u32, kv: u32, c: u32) -> SglDescriptor {
        let t = &self.tables[self.table_of_drive[d as usize]];
        t.descs[table_index(self.layout.geometry().layers, self.chunks, block, layer, kv, c)]
    }
}

/// The table index of the contract: `((b·L + layer)·2 + kv)·chunks + c`.
pub fn table_index(layers: u32, chunks: u32, block: u32, layer: u32, kv: u32, c: u32) -> usize {
    (((block as usize * layers as usize + layer as usize) * 2 + kv as usize) * chunks as usize) + c as usize
}

fn build_table(layout: &KvLayout, mappings: &[DmaMapping], map: &StripeMap) -> Result<SglTable> {
    let g = layout.geometry();
    let obj = g.object_bytes();
    let chunks = map.chunks();
    let n = table_descriptors(layout, chunks)? as usize;
    let mut descs = Vec::new();
    descs.try_reserve_exact(n).map_err(|e| {
        ObjError::invalid(
            "num_blocks",
            format!(
                "cannot allocate the SGL table of {n} descriptors for {} blocks: {e}",
                layout.num_blocks()
            ),
        )
    })?;
    for b in 0..layout.num_blocks() {
        for layer in 0..g.layers {
            for kv in 0..2 {
                let addr = layout.object_addr(b, layer, kv);
                let (region, off) = layout.region_of(addr, obj).ok_or_else(|| {
                    ObjError::invalid("layout", format!("object at {addr:#x} outside every region"))
                })?;
                for c in 0..chunks {
                    let at = c as u64 * map.chunk_bytes();
                    let len = map.chunk_len(c);
                    let segs = mappings[region].translate((off + at) as usize, len as usize)?;
                    let [seg] = segs.as_slice() else {
                        return Err(ObjError::invalid(
                            "memory",
                            format!(
                                "block {b} layer {layer} {} chunk {c} spans {} IOVA segments; one SGL Data Block \
                                 per chunk needs IOVA-contiguous objects (map the memory through an IOMMU or hugepages)",
                                if kv == 0 { "K" } else { "V" },
                                segs.len()
                            ),
                        ));
                    };
                    descs.push(SglDescriptor::data_block(seg.iova, seg.len as u32));
                }
            }
        }
    }
    debug_assert_eq!(descs.len(), n);
    Ok(SglTable { descs })
}

fn sizes(tables: &[Arc<SglTable>]) -> TableSizes {
    let mut s = TableSizes {
        descriptors: tables.first().map_or(0, |t| t.descs.len() as u64),
        tables: tables.len() as u32,
        ..Default::default()
    };
    for t in tables {
        s.sgl_bytes += (t.descs.len() * size_of::<SglDescriptor>()) as u64;
        for d in &t.descs {
            let pages = ((d.addr % PAGE) + d.len as u64).div_ceil(PAGE);
            if pages > 2 {
                let entries = pages - 1;
                s.prp_lists += 1;
                s.prp_entry_bytes += entries * 8;
                // k pages hold 511·k + 1 entries.
                s.prp_page_bytes += (entries - 1).div_ceil(PRP_PER_PAGE - 1).max(1) * PAGE;
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::{Dtype, Geometry};
    use crate::layout::LayoutKind;
    use crate::stripe::DriveShape;
    use tutti_emulator::EmuIommu;

    #[test]
    fn tables_follow_the_contract_and_views_are_shared() {
        let g = Geometry { layers: 2, kv_heads: 2, head_dim: 256, tokens_per_block: 8, dtype: Dtype::Bf16 }; // 8 KiB
        let shape = DriveShape { lba_size: 512, blocks: 1 << 16, max_transfer: 4096 };
        let map = StripeMap::new(&g, &[shape, shape], 1).unwrap();
        assert_eq!(map.chunks(), 2);
        let mem = Arc::new(HostKvMemory::new(4 * g.file_bytes() as usize).unwrap());
        let layout = KvLayout::contiguous(g, 4, mem.addr()).unwrap();
        let id = CacheIdentity::new("m", g, LayoutKind::Contiguous, b"");
        let shared: Arc<dyn DmaSpace> = Arc::new(EmuIommu::new("a"));
        let other: Arc<dyn DmaSpace> = Arc::new(EmuIommu::new("b"));
        other.alloc(8192).map(std::mem::forget).unwrap(); // shift b's IOVAs
                                                          // SAFETY: `mem` is kept alive by the registration.
        let r = unsafe {
            Registration::new(
                layout,
                id,
                &[shared.clone(), other, shared],
                &map,
                Some(mem.clone()),
                KvMemoryKind::Host,
                None,
            )
        }
        .unwrap();
        assert_eq!(r.table_of_drive, vec![0, 1, 0]);
        assert_eq!(r.sizes.tables, 2);
        assert_eq!(r.sizes.descriptors, 4 * 2 * 2 * 2);
        assert_eq!(r.sizes.sgl_bytes, 2 * 32 * 16);
        // 4-KiB chunks of page-aligned memory need no PRP list.
        assert_eq!(r.sizes.prp_lists, 0);
        // Block 3, layer 1, V, chunk 1 is at 3·file + (2·1+1)·obj + 4096 from the base.
        let d0 = r.descriptor(0, 3, 1, 1, 1);
        let d1 = r.descriptor(1, 3, 1, 1, 1);
        assert_eq!(d0.len, 4096);
        assert_ne!(d0.addr, d1.addr, "separate IOMMUs, separate IOVAs");
        let base0 = r.descriptor(0, 0, 0, 0, 0).addr;
        assert_eq!(d0.addr - base0, 3 * g.file_bytes() + 3 * g.object_bytes() + 4096);
    }

    #[test]
    fn prp_sizes_count_list_pages() {
        let mk = |addr: u64, len: u32| SglDescriptor::data_block(addr, len);
        let t = Arc::new(SglTable {
            descs: vec![
                mk(0x1000, 8192),             // 2 pages: no list
                mk(0x1800, 8192),             // 3 pages: 2 entries, 1 list page
                mk(0x0, 32 << 10),            // 8 pages: 7 entries
                mk(0x0, (513 * 4096) as u32), // 512 entries: exactly one full page
                mk(0x0, (514 * 4096) as u32), // 513 entries: two pages
            ],
        });
        let s = sizes(&[t]);
        assert_eq!(s.prp_lists, 4);
        assert_eq!(s.prp_entry_bytes, (2 + 7 + 512 + 513) * 8);
        assert_eq!(s.prp_page_bytes, (1 + 1 + 1 + 2) * 4096);
        assert_eq!(s.sgl_bytes, 5 * 16);
    }
}
