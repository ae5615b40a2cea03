//! Tensor stripes: where every object of every GPU file lives, by arithmetic.
//!
//! Each drive is laid out as
//!
//! ```text
//! [ superblock: 4 KiB ][ journal half A ][ journal half B ][ data slots ... ]
//! ```
//!
//! and, for a pool of `D` drives and `L` layers (objects per file `2L`,
//! object `j = 2·layer + kv`), object `j` of file `f` lives on
//!
//! ```text
//! drive = (f + j) mod D
//! S     = ceil(2L / D)                          slots per file per drive
//! LBA   = data_start_lba[drive] + (f·S + j / D) · object_lbas[drive]
//! ```
//!
//! One layer's K and V of consecutive files land on consecutive drives, so a
//! layer read of many blocks spreads over all drives. For fixed `f` and
//! drive `d` the objects on `d` are `j ≡ d − f (mod D)`, whose `j / D` are
//! distinct and below `S`: no two objects share a slot. Nothing is stored
//! per object; the executor does the same arithmetic.
//!
//! An object is `chunks` commands: the object split at the smallest maximum
//! transfer of the pool's drives (rounded down to 4 KiB so every chunk is a
//! whole number of LBAs on every drive).

use crate::error::{ObjError, Result};
use crate::geometry::Geometry;

/// Metadata unit: the superblock and every journal page are this many bytes.
pub const META_BYTES: u64 = 4096;

/// What the stripe arithmetic needs to know about one drive.
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize)]
pub struct DriveShape {
    /// Logical block size in bytes (512 or 4096).
    pub lba_size: u32,
    /// Namespace size in logical blocks.
    pub blocks: u64,
    /// Largest transfer of one command in bytes (MDTS, or the driver's cap).
    pub max_transfer: u64,
}

/// Where one drive's regions start, in its own LBAs.
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize)]
pub struct DriveRegions {
    pub lba_size: u32,
    /// LBAs of the superblock region (4 KiB).
    pub superblock_lbas: u64,
    /// First LBA of journal half A; half B follows it.
    pub journal_lba: u64,
    /// LBAs of one journal half.
    pub journal_half_lbas: u64,
    pub data_start_lba: u64,
    /// LBAs of one object.
    pub object_lbas: u64,
    /// LBAs of the namespace.
    pub blocks: u64,
}

/// One object's place: `lbas` blocks on `drive` from `lba`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ObjectAddr {
    pub drive: u32,
    pub lba: u64,
    pub lbas: u64,
}

/// The pool-wide stripe map.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StripeMap {
    drives: Vec<DriveRegions>,
    objects_per_file: u32,
    slots_per_file: u32,
    object_bytes: u64,
    chunk_bytes: u64,
    chunks: u32,
    files: u32,
}

impl StripeMap {
    /// Lays a pool of `geometry` out on `drives` with journal halves of
    /// `journal_pages` pages each.
    pub fn new(geometry: &Geometry, drives: &[DriveShape], journal_pages: u32) -> Result<Self> {
        geometry.validate()?;
        if drives.is_empty() {
            return Err(ObjError::invalid("drives", "a pool needs at least one drive"));
        }
        if drives.len() > MAX_DRIVES {
            return Err(ObjError::invalid(
                "drives",
                format!("{} drives; at most {MAX_DRIVES}", drives.len()),
            ));
        }
        if journal_pages == 0 {
            return Err(ObjError::invalid("journal_pages", "must be at least 1"));
        }
        let obj = geometry.object_bytes();
        let d = drives.len() as u32;
        let objects_per_file = geometry.objects_per_file();
        let slots_per_file = objects_per_file.div_ceil(d);
        let mut regions = Vec::with_capacity(drives.len());
        let mut files = u64::MAX;
        let mut chunk_bytes = u64::MAX;
        for (i, s) in drives.iter().enumerate() {
            if !s.lba_size.is_power_of_two() || !(512..=META_BYTES as u32).contains(&s.lba_size) {
                return Err(ObjError::invalid(
                    "drives",
                    format!("drive {i}: LBA size {} is not a power of two in 512..=4096", s.lba_size),
                ));
            }
            let lba = s.lba_size as u64;
            if !obj.is_multiple_of(lba) {
                return Err(ObjError::invalid(
                    "geometry",
                    format!(
                        "one object is {obj} bytes (tokens_per_block × kv_heads × head_dim × dtype), \
                         not a multiple of drive {i}'s {lba}-byte LBA; objects must be LBA-aligned"
                    ),
                ));
            }
            chunk_bytes = chunk_bytes.min(s.max_transfer);
            let superblock_lbas = META_BYTES / lba;
            let journal_half_lbas = journal_pages as u64 * (META_BYTES / lba);
            let data_start_lba = superblock_lbas + 2 * journal_half_lbas;
            let object_lbas = obj / lba;
            let data_lbas = s.blocks.saturating_sub(data_start_lba);
            files = files.min(data_lbas / (slots_per_file as u64 * object_lbas));
            regions.push(DriveRegions {
                lba_size: s.lba_size,
                superblock_lbas,
                journal_lba: superblock_lbas,
                journal_half_lbas,
                data_start_lba,
                object_lbas,
                blocks: s.blocks,
            });
        }
        // Chunks are whole 4 KiB units, hence whole LBAs on every drive.
        let chunk_bytes =
            (chunk_bytes / META_BYTES * META_BYTES).max(META_BYTES).min(obj.next_multiple_of(META_BYTES));
        let chunks = obj.div_ceil(chunk_bytes) as u32;
        if files == 0 {
            return Err(ObjError::invalid(
                "drives",
                format!(
                    "no room for a single GPU file of {} bytes after the {}-page journals",
                    geometry.file_bytes(),
                    journal_pages
                ),
            ));
        }
        let files = files.min(MAX_FILES as u64) as u32;
        Ok(StripeMap {
            drives: regions,
            objects_per_file,
            slots_per_file,
            object_bytes: obj,
            chunk_bytes,
            chunks,
            files,
        })
    }

    /// The same map holding at most `files` files (a pool keeps the capacity
    /// it was formatted with, even on larger replacement drives).
    pub fn with_files(mut self, files: u32) -> Result<Self> {
        if files > self.files {
            return Err(ObjError::invalid(
                "files",
                format!("the pool was formatted for {files} files; these drives hold only {}", self.files),
            ));
        }
        self.files = files;
        Ok(self)
    }

    /// Pages of one journal half (the same on every drive).
    pub fn journal_pages(&self) -> u32 {
        self.drives.first().map_or(0, |r| (r.journal_half_lbas * r.lba_size as u64 / META_BYTES) as u32)
    }

    pub fn drive_count(&self) -> u32 {
        self.drives.len() as u32
    }
    pub fn drive(&self, d: u32) -> &DriveRegions {
        &self.drives[d as usize]
    }
    pub fn drives(&self) -> &[DriveRegions] {
        &self.drives
    }
    /// GPU files the pool holds.
    pub fn files(&self) -> u32 {
        self.files
    }
    pub fn objects_per_file(&self) -> u32 {
        self.objects_per_file
    }
    pub fn slots_per_file(&self) -> u32 {
        self.slots_per_file
    }
    pub fn object_bytes(&self) -> u64 {
        self.object_bytes
    }
    /// Bytes of every chunk but possibly the last.
    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }
    /// Commands per object.
    pub fn chunks(&self) -> u32 {
        self.chunks
    }
    /// Bytes of chunk `c` of an object.
    pub fn chunk_len(&self, c: u32) -> u64 {
        (self.object_bytes - c as u64 * self.chunk_bytes).min(self.chunk_bytes)
    }

    /// Drive of object `j` of file `f`.
    pub fn drive_of(&self, file: u32, j: u32) -> u32 {
        ((file as u64 + j as u64) % self.drives.len() as u64) as u32
    }

    /// Where object `j` (= 2·layer + kv) of `file` lives. Callers keep
    /// `file < files()` and `j < objects_per_file()`.
    pub fn locate(&self, file: u32, j: u32) -> ObjectAddr {
        let drive = self.drive_of(file, j);
        let r = &self.drives[drive as usize];
        let slot = file as u64 * self.slots_per_file as u64 + (j / self.drive_count()) as u64;
        ObjectAddr { drive, lba: r.data_start_lba + slot * r.object_lbas, lbas: r.object_lbas }
    }

    /// Starting LBA and bytes of chunk `c` of object `j` of `file`.
    pub fn locate_chunk(&self, file: u32, j: u32, c: u32) -> (ObjectAddr, u64) {
        let o = self.locate(file, j);
        let lba_size = self.drives[o.drive as usize].lba_size as u64;
        let len = self.chunk_len(c);
        let at = ObjectAddr {
            drive: o.drive,
            lba: o.lba + c as u64 * self.chunk_bytes / lba_size,
            lbas: len / lba_size,
        };
        (at, len)
    }

    /// First LBA of journal half `half` (0 or 1) on `drive`.
    pub fn journal_half_lba(&self, drive: u32, half: u32) -> u64 {
        let r = &self.drives[drive as usize];
        r.journal_lba + half as u64 * r.journal_half_lbas
    }
}

/// Drives in one pool (the superblock lists them all).
pub const MAX_DRIVES: usize = 64;
/// Files in one pool (file ids are u32 in the executor's tables; one id is kept free).
pub const MAX_FILES: u32 = u32::MAX - 1;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::Dtype;

    fn geo(layers: u32) -> Geometry {
        Geometry { layers, kv_heads: 2, head_dim: 64, tokens_per_block: 8, dtype: Dtype::Bf16 }
    }

    #[test]
    fn contract_formula() {
        let g = geo(3); // 6 objects of 2 KiB
        let shapes = [
            DriveShape { lba_size: 512, blocks: 1 << 16, max_transfer: 128 << 10 },
            DriveShape { lba_size: 4096, blocks: 1 << 13, max_transfer: 4096 },
            DriveShape { lba_size: 512, blocks: 1 << 16, max_transfer: 128 << 10 },
            DriveShape { lba_size: 512, blocks: 1 << 16, max_transfer: 128 << 10 },
        ];
        // 2 KiB objects are not 4096-aligned on drive 1.
        assert!(StripeMap::new(&g, &shapes, 4).unwrap_err().to_string().contains("LBA"));
        let g = Geometry { head_dim: 128, ..g }; // 4 KiB objects
        let m = StripeMap::new(&g, &shapes, 4).unwrap();
        assert_eq!(m.slots_per_file(), 2);
        assert_eq!(m.chunk_bytes(), 4096);
        assert_eq!(m.chunks(), 1);
        let r0 = m.drive(0);
        assert_eq!(
            (r0.superblock_lbas, r0.journal_half_lbas, r0.data_start_lba, r0.object_lbas),
            (8, 32, 72, 8)
        );
        let r1 = m.drive(1);
        assert_eq!((r1.superblock_lbas, r1.data_start_lba, r1.object_lbas), (1, 9, 1));
        // File 5, object 3: drive (5+3)%4 = 0, slot 5·2 + 3/4 = 10.
        assert_eq!(m.locate(5, 3), ObjectAddr { drive: 0, lba: 72 + 10 * 8, lbas: 8 });
        // File 5, object 4: drive 1, slot 11.
        assert_eq!(m.locate(5, 4), ObjectAddr { drive: 1, lba: 9 + 11, lbas: 1 });
        // Capacity: drive 1 has 8192 - 9 LBAs / (2 slots × 1) = 4091 files.
        assert_eq!(m.files(), 4091);
    }

    #[test]
    fn objects_split_at_the_smallest_transfer() {
        let g = Geometry { head_dim: 1280, ..geo(2) }; // 40 KiB objects
        let shapes = [
            DriveShape { lba_size: 512, blocks: 1 << 20, max_transfer: 16 << 10 },
            DriveShape { lba_size: 4096, blocks: 1 << 18, max_transfer: 128 << 10 },
        ];
        let m = StripeMap::new(&g, &shapes, 1).unwrap();
        assert_eq!((m.chunk_bytes(), m.chunks()), (16 << 10, 3));
        assert_eq!(m.chunk_len(2), 8 << 10);
        let (a, len) = m.locate_chunk(0, 1, 2);
        assert_eq!(a.drive, 1);
        assert_eq!((a.lba - m.locate(0, 1).lba, a.lbas, len), (8, 2, 8 << 10));
    }

    #[test]
    fn too_small_drives_are_an_error() {
        let shapes = [DriveShape { lba_size: 512, blocks: 30, max_transfer: 4096 }];
        assert!(StripeMap::new(&geo(2), &shapes, 1).unwrap_err().to_string().contains("no room"));
        assert!(StripeMap::new(&geo(2), &[], 1).is_err());
        let odd = [DriveShape { lba_size: 520, blocks: 1 << 20, max_transfer: 4096 }];
        assert!(StripeMap::new(&geo(2), &odd, 1).is_err());
    }
}
