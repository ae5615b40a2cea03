//! Scatter Gather List descriptors (§4.4).

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// SGL descriptor type (byte 15 bits 7:4).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum SglKind {
    DataBlock,
    BitBucket,
    Segment,
    LastSegment,
    /// Any other type, with its raw value.
    Other(u8),
}

impl SglKind {
    fn code(self) -> u8 {
        match self {
            SglKind::DataBlock => 0x0,
            SglKind::BitBucket => 0x1,
            SglKind::Segment => 0x2,
            SglKind::LastSegment => 0x3,
            SglKind::Other(v) => v & 0xf,
        }
    }
}

/// One 16-byte SGL descriptor: address \[7:0\], length \[11:8\], identifier \[15\].
#[repr(C)]
#[derive(Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct SglDescriptor {
    pub addr: u64,
    pub len: u32,
    pub rsvd: [u8; 3],
    /// Type \[7:4\] | sub type \[3:0\] (sub type 0 = address).
    pub id: u8,
}

const _: () = assert!(core::mem::size_of::<SglDescriptor>() == 16);

impl SglDescriptor {
    fn with_kind(kind: SglKind, addr: u64, len: u32) -> Self {
        SglDescriptor { addr, len, rsvd: [0; 3], id: kind.code() << 4 }
    }
    /// A Data Block: `len` bytes at `addr`.
    pub fn data_block(addr: u64, len: u32) -> Self {
        Self::with_kind(SglKind::DataBlock, addr, len)
    }
    /// A Bit Bucket: `len` bytes of a read are discarded.
    pub fn bit_bucket(len: u32) -> Self {
        Self::with_kind(SglKind::BitBucket, 0, len)
    }
    /// A Segment: the next segment of `len` bytes (16 per descriptor) at `addr`.
    pub fn segment(addr: u64, len: u32) -> Self {
        Self::with_kind(SglKind::Segment, addr, len)
    }
    /// A Last Segment: the final segment, `len` bytes at `addr`.
    pub fn last_segment(addr: u64, len: u32) -> Self {
        Self::with_kind(SglKind::LastSegment, addr, len)
    }
    pub fn kind(&self) -> SglKind {
        match self.id >> 4 {
            0x0 => SglKind::DataBlock,
            0x1 => SglKind::BitBucket,
            0x2 => SglKind::Segment,
            0x3 => SglKind::LastSegment,
            v => SglKind::Other(v),
        }
    }
    pub fn subtype(&self) -> u8 {
        self.id & 0xf
    }
    /// The descriptor as the two 64-bit words of a command's DPTR.
    pub fn to_words(self) -> [u64; 2] {
        [self.addr, self.len as u64 | (self.id as u64) << 56]
    }
    pub fn from_words(w: [u64; 2]) -> Self {
        SglDescriptor { addr: w[0], len: w[1] as u32, rsvd: [0; 3], id: (w[1] >> 56) as u8 }
    }
}

impl core::fmt::Debug for SglDescriptor {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Sgl({:?} {:#x}+{:#x})", self.kind(), self.addr, self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::IntoBytes;

    #[test]
    fn descriptor_bytes_match_the_spec() {
        let d = SglDescriptor::last_segment(0x1122_3344_5566_7788, 0x30);
        let b = d.as_bytes();
        assert_eq!(&b[0..8], &0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(&b[8..12], &0x30u32.to_le_bytes());
        assert_eq!(b[15], 0x30);
        assert_eq!(d.kind(), SglKind::LastSegment);
        assert_eq!(SglDescriptor::data_block(1, 2).as_bytes()[15], 0x00);
        assert_eq!(SglDescriptor::bit_bucket(2).as_bytes()[15], 0x10);
        assert_eq!(SglDescriptor::segment(1, 2).as_bytes()[15], 0x20);
    }

    #[test]
    fn words_round_trip_and_match_bytes() {
        for d in [
            SglDescriptor::data_block(0x0dea_dbee_f000, 4096),
            SglDescriptor::segment(0x1000, 32),
            SglDescriptor::bit_bucket(512),
        ] {
            let w = d.to_words();
            assert_eq!(SglDescriptor::from_words(w), d);
            assert_eq!(w.as_bytes(), d.as_bytes());
        }
        assert_eq!(SglDescriptor::from_words([0, 0x50 << 56]).kind(), SglKind::Other(5));
    }
}
