//! The per-drive superblock: which pool a drive belongs to and where.
//!
//! 4096 bytes at LBA 0 of every pool drive, written once when the pool is
//! formatted:
//!
//! ```text
//!    0  magic "TUTTIKV\0"          8
//!    8  format version u32        12  superblock bytes u32 (4096)
//!   16  pool id u128
//!   32  drive count u32           36  this drive's index u32
//!   40  layers u32  44 kv_heads u32  48 head_dim u32  52 tokens_per_block u32
//!   56  dtype code u8  57..60 zero
//!   60  object bytes u64 (redundant, checked)
//!   68  journal pages per half u32
//!   72  this drive's LBA size u32 76 zero
//!   80  files in the pool u32     84  slots per file u32
//!   88  this drive's data start LBA u64
//!   96  created, seconds since the Unix epoch u64
//!  104  serial numbers of every drive in pool order, 20 bytes each (≤ 64)
//! 4092  CRC-32 of bytes 0..4096 with this field zero
//! ```

use crate::codec::crc_with_hole;
use crate::geometry::{Dtype, Geometry};
use crate::stripe::{MAX_DRIVES, META_BYTES};
use zerocopy::little_endian::{U128, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

pub const MAGIC: [u8; 8] = *b"TUTTIKV\0";
pub const FORMAT_VERSION: u32 = 1;
const SERIAL_BYTES: usize = 20;

/// The superblock's bytes: the one definition of its layout (the table in
/// the module docs), little endian, no padding.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct RawSuperblock {
    magic: [u8; 8],
    version: U32,
    size: U32,
    pool_id: U128,
    drive_count: U32,
    drive_index: U32,
    layers: U32,
    kv_heads: U32,
    head_dim: U32,
    tokens_per_block: U32,
    dtype: u8,
    _zero0: [u8; 3],
    object_bytes: U64,
    journal_pages: U32,
    lba_size: U32,
    _zero1: [u8; 4],
    files: U32,
    slots_per_file: U32,
    data_start_lba: U64,
    created_unix: U64,
    serials: [[u8; SERIAL_BYTES]; MAX_DRIVES],
    _reserved: [u8; RESERVED],
    crc: U32,
}

const SERIALS_AT: usize = 104;
const RESERVED: usize = META_BYTES as usize - 4 - SERIALS_AT - MAX_DRIVES * SERIAL_BYTES;
const CRC_AT: usize = std::mem::offset_of!(RawSuperblock, crc);
const _: () = assert!(std::mem::size_of::<RawSuperblock>() == META_BYTES as usize);
const _: () = assert!(std::mem::offset_of!(RawSuperblock, object_bytes) == 60);
const _: () = assert!(std::mem::offset_of!(RawSuperblock, serials) == SERIALS_AT);
const _: () = assert!(CRC_AT == META_BYTES as usize - 4);

/// One drive's superblock.
#[derive(Clone, PartialEq, Eq, Debug, serde::Serialize)]
pub struct Superblock {
    pub pool_id: u128,
    pub drive_count: u32,
    pub drive_index: u32,
    pub geometry: Geometry,
    pub journal_pages: u32,
    pub lba_size: u32,
    pub files: u32,
    pub slots_per_file: u32,
    pub data_start_lba: u64,
    pub created_unix: u64,
    /// Serial number of every pool drive, in pool order (for error messages).
    pub serials: Vec<String>,
}

/// What LBA 0 of a drive holds.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Found {
    /// No tutti magic: a blank or foreign drive.
    Blank,
    /// The magic is there but the rest is not a superblock we can trust.
    Corrupt(String),
    Valid(Superblock),
}

impl Superblock {
    pub fn encode(&self) -> Vec<u8> {
        let g = &self.geometry;
        let mut serials = [[0; SERIAL_BYTES]; MAX_DRIVES];
        for (field, s) in serials.iter_mut().zip(&self.serials) {
            *field = [b' '; SERIAL_BYTES];
            let src = s.as_bytes();
            let n = src.len().min(SERIAL_BYTES);
            field[..n].copy_from_slice(&src[..n]);
        }
        let mut raw = RawSuperblock {
            magic: MAGIC,
            version: FORMAT_VERSION.into(),
            size: (META_BYTES as u32).into(),
            pool_id: self.pool_id.into(),
            drive_count: self.drive_count.into(),
            drive_index: self.drive_index.into(),
            layers: g.layers.into(),
            kv_heads: g.kv_heads.into(),
            head_dim: g.head_dim.into(),
            tokens_per_block: g.tokens_per_block.into(),
            dtype: g.dtype.code(),
            _zero0: [0; 3],
            object_bytes: g.object_bytes().into(),
            journal_pages: self.journal_pages.into(),
            lba_size: self.lba_size.into(),
            _zero1: [0; 4],
            files: self.files.into(),
            slots_per_file: self.slots_per_file.into(),
            data_start_lba: self.data_start_lba.into(),
            created_unix: self.created_unix.into(),
            serials,
            _reserved: [0; RESERVED],
            crc: 0.into(),
        };
        raw.crc = crc_with_hole(raw.as_bytes(), CRC_AT).into();
        raw.as_bytes().to_vec()
    }

    pub fn decode(b: &[u8]) -> Found {
        let Ok((raw, _)) = RawSuperblock::ref_from_prefix(b) else {
            return Found::Blank;
        };
        if raw.magic != MAGIC {
            return Found::Blank;
        }
        if crc_with_hole(raw.as_bytes(), CRC_AT) != raw.crc.get() {
            return Found::Corrupt("superblock checksum mismatch".into());
        }
        match Self::fields(raw) {
            Ok(sb) => Found::Valid(sb),
            Err(what) => Found::Corrupt(what),
        }
    }

    fn fields(raw: &RawSuperblock) -> Result<Superblock, String> {
        let version = raw.version.get();
        if version != FORMAT_VERSION {
            return Err(format!("format version {version}; this build reads version {FORMAT_VERSION}"));
        }
        let dtype = Dtype::from_code(raw.dtype).ok_or_else(|| format!("unknown dtype code {}", raw.dtype))?;
        let geometry = Geometry {
            layers: raw.layers.get(),
            kv_heads: raw.kv_heads.get(),
            head_dim: raw.head_dim.get(),
            tokens_per_block: raw.tokens_per_block.get(),
            dtype,
        };
        geometry.validate().map_err(|e| format!("recorded geometry is invalid: {e}"))?;
        if raw.object_bytes.get() != geometry.object_bytes() {
            return Err("recorded object size disagrees with the recorded geometry".into());
        }
        let drive_count = raw.drive_count.get();
        let drive_index = raw.drive_index.get();
        if drive_count == 0 || drive_count as usize > MAX_DRIVES || drive_index >= drive_count {
            return Err(format!("drive {drive_index} of {drive_count} is impossible"));
        }
        let serials = raw.serials[..drive_count as usize]
            .iter()
            .map(|f| String::from_utf8_lossy(f).trim_end().to_string())
            .collect();
        Ok(Superblock {
            pool_id: raw.pool_id.get(),
            drive_count,
            drive_index,
            geometry,
            journal_pages: raw.journal_pages.get(),
            lba_size: raw.lba_size.get(),
            files: raw.files.get(),
            slots_per_file: raw.slots_per_file.get(),
            data_start_lba: raw.data_start_lba.get(),
            created_unix: raw.created_unix.get(),
            serials,
        })
    }

    /// The pool id as users see it.
    pub fn pool_name(&self) -> String {
        pool_name(self.pool_id)
    }
}

/// Short printable form of a pool id.
pub fn pool_name(id: u128) -> String {
    format!("{:016x}", (id >> 64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Superblock {
        Superblock {
            pool_id: 0x1234_5678_9abc_def0_0fed_cba9_8765_4321,
            drive_count: 3,
            drive_index: 1,
            geometry: Geometry::llama3_8b(),
            journal_pages: 100,
            lba_size: 512,
            files: 4000,
            slots_per_file: 22,
            data_start_lba: 1608,
            created_unix: 1_700_000_000,
            serials: vec!["A".into(), "SERIAL-B".into(), "a-serial-that-is-longer-than-20".into()],
        }
    }

    #[test]
    fn round_trip() {
        let sb = sample();
        let b = sb.encode();
        let Found::Valid(back) = Superblock::decode(&b) else { panic!("not valid") };
        assert_eq!(back.serials[2], "a-serial-that-is-lon");
        assert_eq!(Superblock { serials: sb.serials.clone(), ..back }, sb);
    }

    /// The byte layout is the on-disk format: every field where the module docs put it.
    #[test]
    fn fields_sit_at_their_documented_offsets() {
        let b = sample().encode();
        let le32 = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        let le64 = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        assert_eq!(&b[0..8], b"TUTTIKV\0");
        assert_eq!((le32(8), le32(12)), (FORMAT_VERSION, 4096));
        assert_eq!(u128::from_le_bytes(b[16..32].try_into().unwrap()), sample().pool_id);
        assert_eq!((le32(32), le32(36)), (3, 1));
        let g = Geometry::llama3_8b();
        assert_eq!(
            (le32(40), le32(44), le32(48), le32(52)),
            (g.layers, g.kv_heads, g.head_dim, g.tokens_per_block)
        );
        assert_eq!(b[56], g.dtype.code());
        assert_eq!(le64(60), g.object_bytes());
        assert_eq!((le32(68), le32(72), le32(80), le32(84)), (100, 512, 4000, 22));
        assert_eq!((le64(88), le64(96)), (1608, 1_700_000_000));
        assert_eq!(&b[104 + 20..104 + 28], b"SERIAL-B");
        assert_eq!(le32(4092), crc_with_hole(&b, 4092));
    }

    #[test]
    fn damage_is_detected() {
        let b = sample().encode();
        assert_eq!(Superblock::decode(&vec![0u8; 4096]), Found::Blank);
        for at in [9, 17, 41, 90, 200, 4095] {
            let mut d = b.clone();
            d[at] ^= 0x10;
            assert!(matches!(Superblock::decode(&d), Found::Corrupt(_)), "flip at {at} went unnoticed");
        }
        let mut newer = sample().encode();
        newer[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
        let crc = crc_with_hole(&newer, CRC_AT);
        newer[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        let Found::Corrupt(why) = Superblock::decode(&newer) else { panic!() };
        assert!(why.contains("version"), "{why}");
    }
}
