//! Checksums for the on-drive formats. The formats themselves (superblock,
//! journal pages) are zerocopy little-endian `#[repr(C)]` structs, one
//! definition each, so no field is written at a literal offset and no write
//! can fall outside its buffer.

/// CRC-32 of `buf` with the 4 bytes at `crc_at` taken as zero.
pub fn crc_with_hole(buf: &[u8], crc_at: usize) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(buf.get(..crc_at).unwrap_or(buf));
    h.update(&[0; 4]);
    h.update(buf.get(crc_at + 4..).unwrap_or(&[]));
    h.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hole_is_ignored_and_the_rest_is_covered() {
        let mut b = [0u8; 32];
        b[3] = 9;
        let c = crc_with_hole(&b, 10);
        b[10] ^= 0xff; // inside the hole: no change
        assert_eq!(crc_with_hole(&b, 10), c);
        b[20] ^= 1; // outside the hole
        assert_ne!(crc_with_hole(&b, 10), c);
        // The CRC-32 (IEEE) of the bytes with the hole zeroed, pinned.
        assert_eq!(crc_with_hole(&[0u8; 8], 4), crc32fast::hash(&[0u8; 8]));
    }
}
