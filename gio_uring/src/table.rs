//! Layer tables: what lets the executor expand `(file, block)` pairs into NVMe
//! commands by arithmetic, so the host does O(1) work per layer.
//!
//! # Placement (tensor stripes)
//! A pool of `D` drives holds files; a file is one engine KV block of a model
//! with `L` layers and holds `2L` objects, object `j = 2·layer + kv` (kv 0 = K,
//! 1 = V). For file `f`:
//! - drive of object j: `(f + j) mod D`;
//! - slots per file per drive: `S = ceil(2L / D)`;
//! - LBA of object j: `data_start_lba[drive] + (f·S + j / D) · object_lbas`.
//!
//! An object is `chunks` commands: it is split at the drives' transfer limit
//! (MDTS) into `chunk_lbas`-block pieces, the last possibly shorter. The data
//! pointer of chunk `c` of object (layer, kv) of engine block `b` is entry
//! `((b·L + layer)·2 + kv)·chunks + c` — a 16-byte SGL descriptor (an SGL
//! table) or PRP1/PRP2 (a PRP table).

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
    /// First LBA of the object area on this drive.
    pub data_start_lba: u64,
}

/// The shape of a pool: everything the placement formula needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerGeometry {
    pub layers: u32,
    /// Files the pool can hold (file ids are `0..files`).
    pub files: u32,
    /// Engine blocks with table entries (block ids are `0..blocks`).
    pub blocks: u32,
    /// Bytes of one object (one K or V slice of one block in one layer).
    pub object_bytes: u64,
    /// Logical block size of every pool drive.
    pub lba_size: u32,
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
        if !self.lba_size.is_power_of_two() || self.lba_size < 512 {
            return bad(format!("LBA size {} is not a power of two >= 512", self.lba_size));
        }
        if self.object_bytes == 0 || !self.object_bytes.is_multiple_of(self.lba_size as u64) {
            return bad(format!(
                "object size {} is not a whole number of {}-byte LBAs",
                self.object_bytes, self.lba_size
            ));
        }
        if self.object_lbas() > u32::MAX as u64 {
            return bad(format!("object of {} bytes is too large", self.object_bytes));
        }
        if self.max_transfer < self.lba_size as u64 {
            return bad(format!("transfer limit {} is below one LBA ({})", self.max_transfer, self.lba_size));
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
    pub fn object_lbas(&self) -> u64 {
        self.object_bytes / self.lba_size as u64
    }
    /// Blocks per command: the object, or the transfer limit if that is smaller.
    pub fn chunk_lbas(&self) -> u32 {
        let per_cmd = (self.max_transfer / self.lba_size as u64).min(tutti_driver::command::MAX_NLB as u64);
        self.object_lbas().min(per_cmd) as u32
    }
    /// Commands per object.
    pub fn chunks(&self) -> u32 {
        self.object_lbas().div_ceil(self.chunk_lbas().max(1) as u64) as u32
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
    /// First LBA of object (layer, kv) of `file` on its drive.
    pub fn lba_of(&self, file: u32, layer: u32, kv: Kv) -> u64 {
        let j = 2 * layer as u64 + kv as u64;
        let d = self.drive_of(file, layer, kv) as usize;
        let d_count = self.pool_drives() as u64;
        self.drives[d].data_start_lba
            + (file as u64 * self.slots_per_file() as u64 + j / d_count) * self.object_lbas()
    }
    /// LBAs each drive needs past its `data_start_lba` for `files` files.
    pub fn lbas_per_drive(&self) -> u64 {
        self.files as u64 * self.slots_per_file() as u64 * self.object_lbas()
    }
    /// (offset from the object's first LBA, blocks) of chunk `c`.
    pub fn chunk(&self, c: u32) -> (u64, u32) {
        let off = c as u64 * self.chunk_lbas() as u64;
        (off, (self.object_lbas() - off).min(self.chunk_lbas() as u64) as u32)
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
        let bytes = self.geometry.chunk(c).1 as u64 * self.geometry.lba_size as u64;
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
            (kind, other) => {
                return Err(GioError::table(format!(
                    "a {kind:?} table cannot hold the data pointer {other:?}"
                )))
            }
        };
        self.entries[i] = words;
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
            let (off, nlb) = g.chunk(c);
            let (off, len) = (off * g.lba_size as u64, nlb as u64 * g.lba_size as u64);
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
            },
            layers: g.layers,
            ndrives: g.pool_drives(),
            chunks: g.chunks(),
            files: g.files,
            blocks: g.blocks,
            object_lbas: g.object_lbas() as u32,
            chunk_lbas: g.chunk_lbas(),
            slots_per_file: g.slots_per_file(),
            lba_shift: g.lba_size.trailing_zeros(),
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
            lba_size: 512,
            max_transfer: 16 << 10,
            drives: (0..drives).map(|d| PoolDrive { drive: d, data_start_lba: 1000 * d as u64 }).collect(),
        }
    }

    #[test]
    fn placement_follows_the_formula_and_never_collides() {
        for (d, l) in [(1, 1), (2, 3), (3, 4), (4, 2), (5, 7)] {
            let g = geometry(d, l);
            assert_eq!(g.slots_per_file(), (2 * l).div_ceil(d));
            assert_eq!((g.chunk_lbas(), g.chunks()), (32, 4));
            let mut used = std::collections::HashSet::new();
            for f in 0..g.files {
                for layer in 0..l {
                    for kv in [Kv::K, Kv::V] {
                        let j = 2 * layer + kv as u32;
                        let drive = g.drive_of(f, layer, kv);
                        assert_eq!(drive, (f + j) % d);
                        let lba = g.lba_of(f, layer, kv);
                        let s = (f * g.slots_per_file() + j / d) as u64;
                        assert_eq!(lba, 1000 * drive as u64 + s * g.object_lbas());
                        assert!(lba + g.object_lbas() <= 1000 * drive as u64 + g.lbas_per_drive());
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
        assert_eq!(g.chunk(3), (96, 32));
    }

    #[test]
    fn uneven_last_chunk() {
        let mut g = geometry(2, 1);
        g.object_bytes = 40 * 512;
        assert_eq!((g.chunk_lbas(), g.chunks()), (32, 2));
        assert_eq!(g.chunk(1), (32, 8));
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
