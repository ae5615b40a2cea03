//! Little-endian field encoding for the on-drive formats (superblock, journal).
//!
//! Fields are written at explicit offsets so the byte layout is visible in
//! the code that defines it, and reads past the end of a buffer are errors
//! rather than panics.

/// Writes little-endian fields into a fixed-size buffer.
pub struct Put<'a> {
    buf: &'a mut [u8],
}

impl<'a> Put<'a> {
    pub fn new(buf: &'a mut [u8]) -> Self {
        Put { buf }
    }
    /// Copies `bytes` to `at`; out-of-range writes are dropped, which the
    /// format's own size asserts rule out.
    pub fn bytes(&mut self, at: usize, bytes: &[u8]) {
        if let Some(dst) = self.buf.get_mut(at..at + bytes.len()) {
            dst.copy_from_slice(bytes);
        }
    }
    pub fn u8(&mut self, at: usize, v: u8) {
        self.bytes(at, &[v]);
    }
    pub fn u16(&mut self, at: usize, v: u16) {
        self.bytes(at, &v.to_le_bytes());
    }
    pub fn u32(&mut self, at: usize, v: u32) {
        self.bytes(at, &v.to_le_bytes());
    }
    pub fn u64(&mut self, at: usize, v: u64) {
        self.bytes(at, &v.to_le_bytes());
    }
    pub fn u128(&mut self, at: usize, v: u128) {
        self.bytes(at, &v.to_le_bytes());
    }
}

/// Reads little-endian fields; `None` past the end.
pub struct Get<'a> {
    buf: &'a [u8],
}

impl<'a> Get<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Get { buf }
    }
    pub fn bytes<const N: usize>(&self, at: usize) -> Option<[u8; N]> {
        self.buf.get(at..at + N)?.try_into().ok()
    }
    pub fn u8(&self, at: usize) -> Option<u8> {
        self.buf.get(at).copied()
    }
    pub fn u16(&self, at: usize) -> Option<u16> {
        self.bytes(at).map(u16::from_le_bytes)
    }
    pub fn u32(&self, at: usize) -> Option<u32> {
        self.bytes(at).map(u32::from_le_bytes)
    }
    pub fn u64(&self, at: usize) -> Option<u64> {
        self.bytes(at).map(u64::from_le_bytes)
    }
    pub fn u128(&self, at: usize) -> Option<u128> {
        self.bytes(at).map(u128::from_le_bytes)
    }
}

/// CRC-32 of `buf` with the 4 bytes at `crc_at` taken as zero.
pub fn crc_with_hole(buf: &[u8], crc_at: usize) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&buf[..crc_at]);
    h.update(&[0; 4]);
    h.update(&buf[crc_at + 4..]);
    h.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_and_bounds_hold() {
        let mut b = [0u8; 32];
        let mut p = Put::new(&mut b);
        p.u16(0, 0xbeef);
        p.u64(2, 0x0102_0304_0506_0708);
        p.u128(16, u128::MAX - 5);
        p.u32(30, 7); // does not fit: dropped
        let g = Get::new(&b);
        assert_eq!(g.u16(0), Some(0xbeef));
        assert_eq!(g.u64(2), Some(0x0102_0304_0506_0708));
        assert_eq!(g.u128(16), Some(u128::MAX - 5));
        assert_eq!(g.u32(30), None);
        let c = crc_with_hole(&b, 10);
        b[10] ^= 0xff; // inside the hole: no change
        assert_eq!(crc_with_hole(&b, 10), c);
        b[20] ^= 1; // outside the hole
        assert_ne!(crc_with_hole(&b, 10), c);
    }
}
