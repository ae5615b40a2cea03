//! Layer tables: what lets the executor expand `(file, block)` pairs into NVMe
//! commands by arithmetic, so the host does O(1) work per layer.
//!
//! # Placement (tensor stripes)
//! A pool of `D` drives holds files; a file is one engine KV block of a model
//! with `L` layers and holds `2L` objects, object `j = 2·layer + kv` (kv 0 = K,
//! 1 = V). For file `f`:
//! - drive of object j: `(f + j) mod D`;
//! - slots per file per drive: `S = ceil(2L / D)`;
//! - LBA of object j: `data_start_lba[drive] + (f·S + j / D) · object_lbas[drive]`,
//!   where `object_lbas[drive]` is the object size in that drive's LBAs (the
//!   drives of a pool may have different LBA sizes).
//!
//! An object is `chunks` commands: it is split at the drives' transfer limit
//! (MDTS) into `chunk_bytes` pieces (whole LBAs of every drive), the last
//! possibly shorter. The data
//! pointer of chunk `c` of object (layer, kv) of engine block `b` is entry
//! `((b·L + layer)·2 + kv)·chunks + c` — a 16-byte SGL descriptor (an SGL
//! table) or PRP1/PRP2 (a PRP table). A staged table's entry instead names the
//! chunk's KV memory as the executor addresses it, `{address, length}`: the
//! drives cannot reach that memory, so each command moves through a staging
//! slot (`GioUring::register_staged_table`).

use crate::error::{GioError, Result};
use tutti_driver::command::{prp, DataPtr};
use tutti_driver::spec::{SglDescriptor, SglKind};
use tutti_driver::transport::IovaSegment;
use tutti_kernels::abi::{self, LayerTableDesc, TABLE_MAX_DRIVES};

/// K or V.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kv {
    K = 0,
    V = 1,
}

/// One drive of the pool, in pool order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolDrive {
    /// Index of the drive in the `GioUring` (the order drives were given to `init`).
    pub drive: u32,
    /// First LBA of the object area on this drive, in this drive's LBAs.
    pub data_start_lba: u64,
    /// This drive's logical block size (drives of one pool may differ).
    pub lba_size: u32,
}

/// The shape of a pool: everything the placement formula needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerGeometry {
    pub layers: u32,
    /// Files the pool can hold (file ids are `0..files`).
    pub files: u32,
    /// Engine blocks with table entries (block ids are `0..blocks`).
    pub blocks: u32,
    /// Bytes of one object (one K or V slice of one block in one layer); a
    /// whole number of LBAs on every pool drive.
    pub object_bytes: u64,
    /// Largest transfer of one command, bytes (the smallest MDTS of the pool).
    pub max_transfer: u64,
    pub drives: Vec<PoolDrive>,
}

impl LayerGeometry {
    /// Checks the geometry and derives the numbers the executor uses.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(GioError::table(what));
        if self.layers == 0 || self.files == 0 || self.blocks == 0 {
            return bad(format!(
                "layers {}, files {}, blocks {}: none may be 0",
                self.layers, self.files, self.blocks
            ));
        }
        if self.drives.is_empty() || self.drives.len() > TABLE_MAX_DRIVES {
            return bad(format!("{} drives; a pool has 1..={TABLE_MAX_DRIVES}", self.drives.len()));
        }
        for (i, d) in self.drives.iter().enumerate() {
            if !d.lba_size.is_power_of_two() || d.lba_size < 512 {
                return bad(format!("pool drive {i}: LBA size {} is not a power of two >= 512", d.lba_size));
            }
            if self.object_bytes == 0 || !self.object_bytes.is_multiple_of(d.lba_size as u64) {
                return bad(format!(
                    "object size {} is not a whole number of pool drive {i}'s {}-byte LBAs",
                    self.object_bytes, d.lba_size
                ));
            }
        }
        if self.object_units() > u32::MAX as u64 {
            return bad(format!("object of {} bytes is too large", self.object_bytes));
        }
        if self.max_transfer < self.max_lba() as u64 {
            return bad(format!(
                "transfer limit {} is below one LBA ({}) of a pool drive",
                self.max_transfer,
                self.max_lba()
            ));
        }
        if 2 * self.chunks() as usize > abi::IOCB_MAX_IOCTX {
            return bad(format!(
                "an object is {} commands; one pair (K and V) must fit an IOCB of {} IOCTXs",
                self.chunks(),
                abi::IOCB_MAX_IOCTX
            ));
        }
        let entries = self.entry_count();
        if entries > u32::MAX as u64 {
            return bad(format!("{entries} table entries do not fit 32-bit indices"));
        }
        Ok(())
    }

    pub fn pool_drives(&self) -> u32 {
        self.drives.len() as u32
    }

    /// The table's unit: the smallest LBA size of the pool. The executor keeps
    /// object and chunk sizes in these units and divides by the ratio to each
    /// drive's own LBA size (a power of two).
    pub fn unit(&self) -> u32 {
        self.drives.iter().map(|d| d.lba_size).min().unwrap_or(512).max(1)
    }

    /// The largest LBA size of the pool: chunks are whole multiples of it.
    pub fn max_lba(&self) -> u32 {
        self.drives.iter().map(|d| d.lba_size).max().unwrap_or(512).max(1)
    }

    /// Object size in table units.
    pub fn object_units(&self) -> u64 {
        self.object_bytes / self.unit() as u64
    }

    /// Bytes per command: the object, or the transfer limit (at most MAX_NLB of
    /// the smallest LBAs, whole LBAs of every drive) if that is smaller.
    pub fn chunk_bytes(&self) -> u64 {
        let unit = self.unit() as u64;
        let per_cmd = self.max_transfer.min(unit * tutti_driver::command::MAX_NLB as u64);
        let per_cmd = per_cmd / self.max_lba() as u64 * self.max_lba() as u64;
        self.object_bytes.min(per_cmd).max(unit)
    }

    /// Commands per object.
    pub fn chunks(&self) -> u32 {
        self.object_bytes.div_ceil(self.chunk_bytes().max(1)) as u32
    }

    /// `S = ceil(2L / D)`.
    pub fn slots_per_file(&self) -> u32 {
        (2 * self.layers).div_ceil(self.pool_drives())
    }

    /// Pool index of the drive holding object (layer, kv) of `file`.
    pub fn drive_of(&self, file: u32, layer: u32, kv: Kv) -> u32 {
        let j = 2 * layer as u64 + kv as u64;
        ((file as u64 + j) % self.pool_drives() as u64) as u32
    }

    /// LBAs of one object on pool drive `d`.
    pub fn object_lbas(&self, d: u32) -> u64 {
        self.object_bytes / self.drives.get(d as usize).map_or(1, |p| p.lba_size.max(1) as u64)
    }

    /// First LBA of object (layer, kv) of `file` on its drive, in that drive's LBAs.
    pub fn lba_of(&self, file: u32, layer: u32, kv: Kv) -> u64 {
        let j = 2 * layer as u64 + kv as u64;
        let d = self.drive_of(file, layer, kv);
        let d_count = self.pool_drives() as u64;
        let start = self.drives.get(d as usize).map_or(0, |p| p.data_start_lba);
        start + (file as u64 * self.slots_per_file() as u64 + j / d_count) * self.object_lbas(d)
    }

    /// LBAs pool drive `d` needs past its `data_start_lba` for `files` files.
    pub fn lbas_per_drive(&self, d: u32) -> u64 {
        self.files as u64 * self.slots_per_file() as u64 * self.object_lbas(d)
    }

    /// (byte offset into the object, bytes) of chunk `c`.
    pub fn chunk(&self, c: u32) -> (u64, u64) {
        let off = c as u64 * self.chunk_bytes();
        (off, self.object_bytes.saturating_sub(off).min(self.chunk_bytes()))
    }

    /// Table entry of chunk `c` of object (layer, kv) of engine block `block`.
    pub fn entry_index(&self, block: u32, layer: u32, kv: Kv, c: u32) -> u64 {
        ((block as u64 * self.layers as u64 + layer as u64) * 2 + kv as u64) * self.chunks() as u64 + c as u64
    }

    pub fn entry_count(&self) -> u64 {
        self.blocks as u64 * self.layers as u64 * 2 * self.chunks() as u64
    }

    /// IOCTXs one (file, block) pair expands to in a layer IOCB.
    pub fn ioctx_per_pair(&self) -> u32 {
        2 * self.chunks()
    }
}

/// How a table's entries describe memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableKind {
    /// Each entry is one SGL descriptor (PSDT 01b).
    Sgl,
    /// Each entry is PRP1/PRP2 (PSDT 00b).
    Prp,
    /// Each entry is the executor address and length of the chunk's KV
    /// memory; data moves through staging slots the drives can reach.
    Staged,
}

/// A layer table being built on the host; `GioUring::register_table` uploads
/// it to where the executor reads it.
#[derive(Clone, Debug)]
pub struct LayerTable {
    geometry: LayerGeometry,
    kind: TableKind,
    entries: Vec<[u64; 2]>,
}

impl LayerTable {
    /// An empty table (every entry unfilled: an IOCTX that reaches one fails
    /// with a translation error instead of moving data).
    pub fn new(geometry: LayerGeometry, kind: TableKind) -> Result<Self> {
        geometry.validate()?;
        let n = geometry.entry_count() as usize;
        Ok(LayerTable { geometry, kind, entries: vec![[0, 0]; n] })
    }

    pub fn geometry(&self) -> &LayerGeometry {
        &self.geometry
    }
    pub fn kind(&self) -> TableKind {
        self.kind
    }
    pub fn entries(&self) -> &[[u64; 2]] {
        &self.entries
    }

    fn check(&self, block: u32, layer: u32, c: u32) -> Result<()> {
        let g = &self.geometry;
        if block >= g.blocks || layer >= g.layers || c >= g.chunks() {
            return Err(GioError::table(format!(
                "entry (block {block}, layer {layer}, chunk {c}) is outside {} blocks x {} layers x {} chunks",
                g.blocks,
                g.layers,
                g.chunks()
            )));
        }
        Ok(())
    }

    /// Sets the data pointer of one chunk. SGL Data Blocks must cover exactly
    /// the chunk; a PRP pointer is taken as given (PRP2 may be a list the caller
    /// built, e.g. with `tutti_driver::command::prp::build`).
    pub fn set_entry(&mut self, block: u32, layer: u32, kv: Kv, c: u32, ptr: DataPtr) -> Result<()> {
        self.check(block, layer, c)?;
        let i = self.geometry.entry_index(block, layer, kv, c) as usize;
        let bytes = self.geometry.chunk(c).1;
        let words = match (self.kind, ptr) {
            (TableKind::Sgl, DataPtr::Sgl(d)) => {
                if d.kind() == SglKind::DataBlock && d.len as u64 != bytes {
                    return Err(GioError::table(format!(
                        "chunk {c} of (block {block}, layer {layer}, {kv:?}) is {bytes} bytes; the Data Block has {}",
                        d.len
                    )));
                }
                if d.len == 0 {
                    return Err(GioError::table("an SGL entry of length 0 reads as unfilled"));
                }
                d.to_words()
            }
            (TableKind::Prp, DataPtr::Prp { prp1, prp2 }) => {
                if prp1 == 0 {
                    return Err(GioError::table("PRP1 of 0 reads as unfilled"));
                }
                [prp1, prp2]
            }
            (TableKind::Staged, other) => {
                return Err(GioError::table(format!(
                    "a staged table holds KV addresses (set_kv), not the data pointer {other:?}"
                )))
            }
            (kind, other) => {
                return Err(GioError::table(format!(
                    "a {kind:?} table cannot hold the data pointer {other:?}"
                )))
            }
        };
        self.entries[i] = words;
        Ok(())
    }

    /// Staged tables: object (layer, kv) of `block` is at executor address
    /// `addr` (KV memory the drives cannot reach; 8-byte aligned, as the
    /// executor copies it in 8-byte words). Every chunk's entry is set.
    pub fn set_kv(&mut self, block: u32, layer: u32, kv: Kv, addr: u64) -> Result<()> {
        if self.kind != TableKind::Staged {
            return Err(GioError::table(format!(
                "a {:?} table holds data pointers, not KV addresses",
                self.kind
            )));
        }
        self.check(block, layer, 0)?;
        if addr == 0 || !addr.is_multiple_of(8) {
            return Err(GioError::table(format!(
                "object (block {block}, layer {layer}, {kv:?}) at {addr:#x}: staged objects must be non-null \
                 and 8-byte aligned"
            )));
        }
        let g = self.geometry.clone();
        if addr.checked_add(g.object_bytes).is_none() {
            return Err(GioError::table(format!("object at {addr:#x} wraps the address space")));
        }
        for c in 0..g.chunks() {
            let (off, len) = g.chunk(c);
            let i = g.entry_index(block, layer, kv, c) as usize;
            self.entries[i] = [addr + off, len];
        }
        Ok(())
    }

    /// Fills every chunk of object (layer, kv) of `block` from the object's
    /// memory, given as IOVA segments. Each chunk must be expressible in one
    /// 16-byte entry: one segment for an SGL table (a Data Block), at most two
    /// memory pages for a PRP table. Anything else needs list memory: build it
    /// with `tutti_driver::command::{sgl, prp}::build` and use [`Self::set_entry`].
    pub fn set_object(
        &mut self,
        block: u32,
        layer: u32,
        kv: Kv,
        segments: &[IovaSegment],
        page: u64,
    ) -> Result<()> {
        let g = self.geometry.clone();
        let total: u64 = segments.iter().map(|s| s.len).sum();
        if total != g.object_bytes {
            return Err(GioError::table(format!(
                "object memory is {total} bytes; objects are {}",
                g.object_bytes
            )));
        }
        for c in 0..g.chunks() {
            let (off, len) = g.chunk(c);
            let part = tutti_driver::queue::slice_segments(segments, off, len);
            let ptr = match self.kind {
                TableKind::Sgl => match part.as_slice() {
                    [one] => DataPtr::Sgl(SglDescriptor::data_block(one.iova, one.len as u32)),
                    _ => {
                        return Err(GioError::table(format!(
                        "chunk {c} ({len} bytes) spans {} IOVA segments: an SGL entry inline holds one Data \
                             Block; build a Last Segment list in DMA memory and use set_entry",
                        part.len()
                    )))
                    }
                },
                TableKind::Prp => prp_inline(&part, page, c, len)?,
                TableKind::Staged => {
                    return Err(GioError::table(
                        "a staged table holds KV addresses: use set_kv, not IOVA segments",
                    ))
                }
            };
            self.set_entry(block, layer, kv, c, ptr)?;
        }
        Ok(())
    }

    /// The header the executor reads, pointing at `entries_addr`.
    pub(crate) fn descriptor(&self, entries_addr: u64, drive_map: &[u32]) -> LayerTableDesc {
        let g = &self.geometry;
        let mut d = LayerTableDesc {
            kind: match self.kind {
                TableKind::Sgl => abi::TABLE_SGL,
                TableKind::Prp => abi::TABLE_PRP,
                TableKind::Staged => abi::TABLE_STAGED,
            },
            layers: g.layers,
            ndrives: g.pool_drives(),
            chunks: g.chunks(),
            files: g.files,
            blocks: g.blocks,
            object_units: g.object_units() as u32,
            chunk_units: (g.chunk_bytes() / g.unit() as u64) as u32,
            slots_per_file: g.slots_per_file(),
            unit_shift: g.unit().trailing_zeros(),
            entries: entries_addr,
            entry_count: self.entries.len() as u64,
            ..Default::default()
        };
        for (i, pd) in g.drives.iter().enumerate() {
            d.drive[i] = drive_map.get(pd.drive as usize).copied().unwrap_or(u32::MAX);
            d.data_start_lba[i] = pd.data_start_lba;
        }
        d
    }
}

/// PRP1/PRP2 for memory of at most two pages (§4.3), or an error saying a list is needed.
fn prp_inline(segments: &[IovaSegment], page: u64, c: u32, len: u64) -> Result<DataPtr> {
    let n = prp::count_entries(segments, page).map_err(|e| GioError::table(format!("chunk {c}: {e}")))?;
    if n > 2 {
        return Err(GioError::table(format!(
            "chunk {c} ({len} bytes) needs {n} PRP entries: a PRP table entry holds PRP1 and PRP2 (two pages) \
             without a list; build the PRP list with tutti_driver::command::prp::build and use set_entry, \
             or use an SGL table"
        )));
    }
    let first = segments.first().map(|s| s.iova).unwrap_or(0);
    let second = if n < 2 {
        0
    } else if segments.len() == 1 {
        (first & !(page - 1)) + page
    } else {
        segments[1].iova
    };
    Ok(DataPtr::Prp { prp1: first, prp2: second })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry(drives: u32, layers: u32) -> LayerGeometry {
        LayerGeometry {
            layers,
            files: 10,
            blocks: 8,
            object_bytes: 64 << 10,
            max_transfer: 16 << 10,
            drives: (0..drives)
                .map(|d| PoolDrive { drive: d, data_start_lba: 1000 * d as u64, lba_size: 512 })
                .collect(),
        }
    }

    #[test]
    fn placement_follows_the_formula_and_never_collides() {
        for (d, l) in [(1, 1), (2, 3), (3, 4), (4, 2), (5, 7)] {
            let g = geometry(d, l);
            assert_eq!(g.slots_per_file(), (2 * l).div_ceil(d));
            assert_eq!((g.chunk_bytes(), g.chunks()), (16 << 10, 4));
            let mut used = std::collections::HashSet::new();
            for f in 0..g.files {
                for layer in 0..l {
                    for kv in [Kv::K, Kv::V] {
                        let j = 2 * layer + kv as u32;
                        let drive = g.drive_of(f, layer, kv);
                        assert_eq!(drive, (f + j) % d);
                        let lba = g.lba_of(f, layer, kv);
                        let s = (f * g.slots_per_file() + j / d) as u64;
                        assert_eq!(lba, 1000 * drive as u64 + s * g.object_lbas(drive));
                        assert!(lba + g.object_lbas(drive) <= 1000 * drive as u64 + g.lbas_per_drive(drive));
                        assert!(used.insert((drive, lba)), "two objects at drive {drive} LBA {lba}");
                    }
                }
            }
        }
    }

    #[test]
    fn entries_are_indexed_per_block_layer_kv_chunk() {
        let g = geometry(2, 3);
        assert_eq!(g.entry_index(0, 0, Kv::K, 0), 0);
        assert_eq!(g.entry_index(0, 0, Kv::V, 0), 4);
        assert_eq!(g.entry_index(0, 1, Kv::K, 3), 11);
        assert_eq!(g.entry_index(1, 0, Kv::K, 0), 3 * 2 * 4);
        assert_eq!(g.entry_count(), 8 * 3 * 2 * 4);
        assert_eq!(g.chunk(3), (48 << 10, 16 << 10));
    }

    #[test]
    fn uneven_last_chunk() {
        let mut g = geometry(2, 1);
        g.object_bytes = 40 * 512;
        assert_eq!((g.chunk_bytes(), g.chunks()), (16 << 10, 2));
        assert_eq!(g.chunk(1), (16 << 10, 4 << 10));
    }

    #[test]
    fn mixed_lba_sizes_place_objects_in_each_drive_units() {
        let mut g = geometry(2, 2);
        g.drives[1].lba_size = 4096;
        g.validate().unwrap();
        assert_eq!((g.unit(), g.max_lba()), (512, 4096));
        assert_eq!((g.object_lbas(0), g.object_lbas(1)), (128, 16));
        // Chunks are whole 4 KiB LBAs of drive 1 as well as 512-byte LBAs of drive 0.
        assert_eq!((g.chunk_bytes(), g.chunks()), (16 << 10, 4));
        // File 0: object j on drive j mod 2, slot j / 2.
        assert_eq!(g.lba_of(0, 0, Kv::K), 0);
        assert_eq!(g.lba_of(0, 0, Kv::V), 1000);
        assert_eq!(g.lba_of(0, 1, Kv::V), 1000 + 16);
        assert_eq!(g.lba_of(1, 0, Kv::K), 1000 + 2 * 16);
        // A transfer limit that is not whole 4 KiB LBAs is rounded down to them.
        g.max_transfer = 6 << 10;
        assert_eq!(g.chunk_bytes(), 4 << 10);
        // An object that is not whole LBAs of every drive is refused, naming the drive.
        g.object_bytes = 6 << 10;
        assert!(g.validate().unwrap_err().to_string().contains("pool drive 1"));
    }

    #[test]
    fn sgl_entries_must_match_their_chunk() {
        let mut t = LayerTable::new(geometry(2, 2), TableKind::Sgl).unwrap();
        t.set_entry(1, 1, Kv::V, 2, DataPtr::Sgl(SglDescriptor::data_block(0x1000, 16 << 10))).unwrap();
        let i = t.geometry().entry_index(1, 1, Kv::V, 2) as usize;
        assert_eq!(t.entries()[i], SglDescriptor::data_block(0x1000, 16 << 10).to_words());
        let short = t.set_entry(0, 0, Kv::K, 0, DataPtr::Sgl(SglDescriptor::data_block(0x1000, 4096)));
        assert!(short.unwrap_err().to_string().contains("16384 bytes"));
        assert!(t.set_entry(8, 0, Kv::K, 0, DataPtr::Sgl(SglDescriptor::data_block(1, 16384))).is_err());
        assert!(t.set_entry(0, 0, Kv::K, 0, DataPtr::Prp { prp1: 0x1000, prp2: 0 }).is_err());
    }

    #[test]
    fn set_object_splits_at_the_transfer_limit() {
        let mut t = LayerTable::new(geometry(2, 2), TableKind::Sgl).unwrap();
        let seg = [IovaSegment { iova: 0x10_0000, len: 64 << 10 }];
        t.set_object(3, 1, Kv::K, &seg, 4096).unwrap();
        for c in 0..4 {
            let i = t.geometry().entry_index(3, 1, Kv::K, c) as usize;
            let d = SglDescriptor::from_words(t.entries()[i]);
            assert_eq!((d.addr, d.len), (0x10_0000 + c as u64 * (16 << 10), 16 << 10));
        }
        let split =
            [IovaSegment { iova: 0x10_0000, len: 8 << 10 }, IovaSegment { iova: 0x20_0000, len: 56 << 10 }];
        assert!(t.set_object(3, 1, Kv::K, &split, 4096).unwrap_err().to_string().contains("Last Segment"));
    }

    #[test]
    fn prp_tables_take_two_pages_inline_and_explain_lists() {
        let mut g = geometry(2, 2);
        g.max_transfer = 8 << 10;
        g.object_bytes = 16 << 10;
        let mut t = LayerTable::new(g, TableKind::Prp).unwrap();
        let seg = [IovaSegment { iova: 0x40_0000, len: 16 << 10 }];
        t.set_object(0, 0, Kv::V, &seg, 4096).unwrap();
        let i = t.geometry().entry_index(0, 0, Kv::V, 1) as usize;
        assert_eq!(t.entries()[i], [0x40_2000, 0x40_3000]);

        let mut big = geometry(2, 2);
        big.object_bytes = 16 << 10;
        let mut t = LayerTable::new(big, TableKind::Prp).unwrap();
        let err = t.set_object(0, 0, Kv::K, &seg, 4096).unwrap_err().to_string();
        assert!(err.contains("needs 4 PRP entries") && err.contains("prp::build"), "{err}");
    }

    #[test]
    fn staged_entries_name_kv_memory_per_chunk() {
        let mut t = LayerTable::new(geometry(2, 2), TableKind::Staged).unwrap();
        t.set_kv(2, 1, Kv::V, 0x7f00_0000_0000).unwrap();
        for c in 0..4 {
            let i = t.geometry().entry_index(2, 1, Kv::V, c) as usize;
            assert_eq!(t.entries()[i], [0x7f00_0000_0000 + c as u64 * (16 << 10), 16 << 10]);
        }
        assert!(t.set_kv(0, 0, Kv::K, 0x1004).unwrap_err().to_string().contains("8-byte aligned"));
        let sgl = DataPtr::Sgl(SglDescriptor::data_block(0x1000, 16 << 10));
        assert!(t.set_entry(0, 0, Kv::K, 0, sgl).unwrap_err().to_string().contains("set_kv"));
        let mut direct = LayerTable::new(geometry(2, 2), TableKind::Sgl).unwrap();
        assert!(direct.set_kv(0, 0, Kv::K, 0x1000).is_err());
    }

    #[test]
    fn bad_geometry_is_refused_with_a_reason() {
        let mut g = geometry(2, 2);
        g.object_bytes = 1000;
        assert!(LayerTable::new(g, TableKind::Sgl).unwrap_err().to_string().contains("whole number"));
        let mut g = geometry(2, 2);
        g.max_transfer = 512;
        g.object_bytes = 2048 * 512;
        assert!(LayerTable::new(g, TableKind::Sgl).unwrap_err().to_string().contains("must fit an IOCB"));
    }
}
