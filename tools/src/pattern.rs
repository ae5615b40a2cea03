//! The deterministic test patterns the demo and the benchmarks write and verify: one home, so a
//! run of one command and a run of another agree on what "the stored bytes" are.

/// Contents of KV object `(chunk, layer, kv)` of a request seeded with `seed` (the demo and
/// `bench retrieve`): xorshift64* from a start that mixes every coordinate, so no two objects
/// are alike, fast enough to write gigabytes.
pub fn kv_object(seed: u64, chunk: u32, layer: u32, kv: u32, out: &mut [u8]) {
    let mut x =
        seed ^ (chunk as u64) << 20 ^ (layer as u64) << 44 ^ (kv as u64) << 62 ^ 0x9e37_79b9_7f4a_7c15;
    for w in out.chunks_mut(8) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let v = x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
        w.copy_from_slice(&v[..w.len()]);
    }
}

/// The bytes of `len` from byte `offset` of drive `drive`'s area (`offset` and `len` multiples
/// of 8; `bench sgl-vs-prp`): splitmix64 of (seed, drive, word), so any piece can be produced
/// on its own and no two words of a run are alike in practice.
pub fn drive_words(seed: u64, drive: usize, offset: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    for w in 0..(len / 8) as u64 {
        let mut x = seed ^ (drive as u64) << 56 ^ (offset / 8 + w).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(x ^ (x >> 31)).to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_objects_differ_by_every_coordinate_and_repeat_for_the_same_one() {
        let obj = |seed, chunk, layer, kv| {
            let mut b = vec![0u8; 64];
            kv_object(seed, chunk, layer, kv, &mut b);
            b
        };
        let base = obj(7, 1, 2, 0);
        assert_eq!(base, obj(7, 1, 2, 0));
        for other in [obj(8, 1, 2, 0), obj(7, 2, 2, 0), obj(7, 1, 3, 0), obj(7, 1, 2, 1)] {
            assert_ne!(base, other);
        }
        // A tail shorter than a word is filled too.
        let mut odd = vec![0u8; 13];
        kv_object(7, 1, 2, 0, &mut odd);
        assert_eq!(odd[..8], base[..8]);
        assert_ne!(odd[8..], [0u8; 5]);
    }

    #[test]
    fn drive_words_of_a_piece_equal_that_part_of_the_whole() {
        let whole = drive_words(3, 1, 0, 256);
        assert_eq!(drive_words(3, 1, 64, 64), whole[64..128]);
        assert_ne!(drive_words(3, 2, 0, 256), whole);
    }
}
