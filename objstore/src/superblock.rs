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

use crate::codec::{crc_with_hole, Get, Put};
use crate::geometry::{Dtype, Geometry};
use crate::stripe::{MAX_DRIVES, META_BYTES};

pub const MAGIC: [u8; 8] = *b"TUTTIKV\0";
pub const FORMAT_VERSION: u32 = 1;
const SERIALS_AT: usize = 104;
const SERIAL_BYTES: usize = 20;
const CRC_AT: usize = META_BYTES as usize - 4;
const _: () = assert!(SERIALS_AT + MAX_DRIVES * SERIAL_BYTES <= CRC_AT);

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
        let mut b = vec![0u8; META_BYTES as usize];
        let mut p = Put::new(&mut b);
        p.bytes(0, &MAGIC);
        p.u32(8, FORMAT_VERSION);
        p.u32(12, META_BYTES as u32);
        p.u128(16, self.pool_id);
        p.u32(32, self.drive_count);
        p.u32(36, self.drive_index);
        let g = &self.geometry;
        p.u32(40, g.layers);
        p.u32(44, g.kv_heads);
        p.u32(48, g.head_dim);
        p.u32(52, g.tokens_per_block);
        p.u8(56, g.dtype.code());
        p.u64(60, g.object_bytes());
        p.u32(68, self.journal_pages);
        p.u32(72, self.lba_size);
        p.u32(80, self.files);
        p.u32(84, self.slots_per_file);
        p.u64(88, self.data_start_lba);
        p.u64(96, self.created_unix);
        for (i, s) in self.serials.iter().take(MAX_DRIVES).enumerate() {
            let mut field = [b' '; SERIAL_BYTES];
            let src = s.as_bytes();
            let n = src.len().min(SERIAL_BYTES);
            field[..n].copy_from_slice(&src[..n]);
            p.bytes(SERIALS_AT + i * SERIAL_BYTES, &field);
        }
        let crc = crc_with_hole(&b, CRC_AT);
        Put::new(&mut b).u32(CRC_AT, crc);
        b
    }

    pub fn decode(b: &[u8]) -> Found {
        let g = Get::new(b);
        if b.len() < META_BYTES as usize || g.bytes::<8>(0) != Some(MAGIC) {
            return Found::Blank;
        }
        let b = &b[..META_BYTES as usize];
        let stored = g.u32(CRC_AT).unwrap_or(0);
        if crc_with_hole(b, CRC_AT) != stored {
            return Found::Corrupt("superblock checksum mismatch".into());
        }
        match Self::fields(&g) {
            Ok(sb) => Found::Valid(sb),
            Err(what) => Found::Corrupt(what),
        }
    }

    fn fields(g: &Get) -> Result<Superblock, String> {
        let short = || "superblock is truncated".to_string();
        let version = g.u32(8).ok_or_else(short)?;
        if version != FORMAT_VERSION {
            return Err(format!("format version {version}; this build reads version {FORMAT_VERSION}"));
        }
        let dtype_code = g.u8(56).ok_or_else(short)?;
        let dtype = Dtype::from_code(dtype_code).ok_or_else(|| format!("unknown dtype code {dtype_code}"))?;
        let geometry = Geometry {
            layers: g.u32(40).ok_or_else(short)?,
            kv_heads: g.u32(44).ok_or_else(short)?,
            head_dim: g.u32(48).ok_or_else(short)?,
            tokens_per_block: g.u32(52).ok_or_else(short)?,
            dtype,
        };
        geometry.validate().map_err(|e| format!("recorded geometry is invalid: {e}"))?;
        if g.u64(60) != Some(geometry.object_bytes()) {
            return Err("recorded object size disagrees with the recorded geometry".into());
        }
        let drive_count = g.u32(32).ok_or_else(short)?;
        let drive_index = g.u32(36).ok_or_else(short)?;
        if drive_count == 0 || drive_count as usize > MAX_DRIVES || drive_index >= drive_count {
            return Err(format!("drive {drive_index} of {drive_count} is impossible"));
        }
        let serials = (0..drive_count as usize)
            .map(|i| {
                let raw =
                    g.bytes::<SERIAL_BYTES>(SERIALS_AT + i * SERIAL_BYTES).unwrap_or([b' '; SERIAL_BYTES]);
                String::from_utf8_lossy(&raw).trim_end().to_string()
            })
            .collect();
        Ok(Superblock {
            pool_id: g.u128(16).ok_or_else(short)?,
            drive_count,
            drive_index,
            geometry,
            journal_pages: g.u32(68).ok_or_else(short)?,
            lba_size: g.u32(72).ok_or_else(short)?,
            files: g.u32(80).ok_or_else(short)?,
            slots_per_file: g.u32(84).ok_or_else(short)?,
            data_start_lba: g.u64(88).ok_or_else(short)?,
            created_unix: g.u64(96).ok_or_else(short)?,
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
        Put::new(&mut newer).u32(8, FORMAT_VERSION + 1);
        let crc = crc_with_hole(&newer, CRC_AT);
        Put::new(&mut newer).u32(CRC_AT, crc);
        let Found::Corrupt(why) = Superblock::decode(&newer) else { panic!() };
        assert!(why.contains("version"), "{why}");
    }
}
