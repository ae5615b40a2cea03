//! Chained prefix hashes and cache identities.
//!
//! A request's tokens are cut into chunks of `tokens_per_block` tokens (one
//! chunk = one KV block = one GPU file). Chunk `i`'s key folds in chunk
//! `i−1`'s key:
//!
//! ```text
//! h(−1) = ROOT
//! h(i)  = H128( h(i−1) ‖ n_tokens as u32 ‖ tokens(i) as u32 LE )
//! ```
//!
//! so a hit on chunk `i` means the whole prefix `0..=i` matched, and a
//! lookup walks left to right and stops at the first miss.
//!
//! `H128` is two 64-bit hashes of different construction, each ending in
//! the MurmurHash3 `fmix64` finalizer: lane A is FNV-1a over bytes with a
//! seeded offset basis, lane B a multiply-rotate hash over 64-bit words. The
//! lanes share no structure, so treating the pair as a 128-bit random function
//! gives a collision chance of about `n² / 2¹²⁹` among `n` stored chunks —
//! about 1.5·10⁻²¹ for a billion. This holds for ordinary inputs only: neither
//! lane is cryptographic, and someone who chooses tokens can construct
//! collisions. A pool shared by mutually distrusting tenants should be fed
//! the engine's own cryptographic block hashes (e.g. vLLM's SHA-256 prefix
//! hashing, truncated to 128 bits) through [`BlockHash`] directly.
//!
//! A [`CacheIdentity`] (model, geometry, dtype, layout, tenant salt) is kept
//! next to every key, so KV stored under one identity never answers a lookup
//! made under another, whatever the hashes.

use crate::geometry::Geometry;
use crate::layout::LayoutKind;

/// The chained hash of one chunk of tokens (or an engine-supplied block hash).
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Default, serde::Serialize, serde::Deserialize,
)]
pub struct BlockHash(pub u128);

impl BlockHash {
    /// The hash of chunk `i` given chunk `i−1`'s (or [`ROOT`] for the first).
    pub fn chain(prev: BlockHash, tokens: &[u32]) -> BlockHash {
        let mut h = Hasher128::new();
        h.write(&prev.0.to_le_bytes());
        h.write(&(tokens.len() as u32).to_le_bytes());
        for t in tokens {
            h.write(&t.to_le_bytes());
        }
        BlockHash(h.finish())
    }
    pub fn to_bytes(self) -> [u8; 16] {
        self.0.to_le_bytes()
    }
    pub fn from_bytes(b: [u8; 16]) -> Self {
        BlockHash(u128::from_le_bytes(b))
    }
}

impl std::fmt::Display for BlockHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// The parent of a request's first chunk.
pub const ROOT: BlockHash = BlockHash(0x7475_7474_692d_6b76_2d72_6f6f_742d_7631); // "tutti-kv-root-v1"

/// Chained hashes of every *full* chunk of `tokens`; a partial last chunk
/// is not cacheable and gets no hash.
pub fn chain_hashes(tokens: &[u32], tokens_per_block: u32) -> Vec<BlockHash> {
    let n = tokens_per_block.max(1) as usize;
    let mut prev = ROOT;
    tokens
        .chunks_exact(n)
        .map(|c| {
            prev = BlockHash::chain(prev, c);
            prev
        })
        .collect()
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
const SEED_A: u64 = 0x243f_6a88_85a3_08d3; // π
const SEED_B: u64 = 0x1319_8a2e_0370_7344;
const MUL_1: u64 = 0x9e37_79b9_7f4a_7c15; // golden ratio
const MUL_2: u64 = 0xc2b2_ae3d_27d4_eb4f;

/// MurmurHash3's 64-bit finalizer: every input bit affects every output bit.
fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

/// The two-lane 128-bit hash described in the module docs.
#[derive(Clone)]
pub struct Hasher128 {
    a: u64,
    b: u64,
    /// Bytes not yet folded into lane B (it consumes 8-byte words).
    pending: [u8; 8],
    npending: usize,
    len: u64,
}

impl Default for Hasher128 {
    fn default() -> Self {
        Self::new()
    }
}

impl Hasher128 {
    pub fn new() -> Self {
        Hasher128 { a: FNV_OFFSET ^ SEED_A, b: SEED_B, pending: [0; 8], npending: 0, len: 0 }
    }

    fn word(&mut self, w: u64) {
        self.b = (self.b ^ w.wrapping_mul(MUL_1)).rotate_left(29).wrapping_mul(MUL_2).wrapping_add(MUL_1);
    }

    pub fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.a = (self.a ^ byte as u64).wrapping_mul(FNV_PRIME);
            self.pending[self.npending] = byte;
            self.npending += 1;
            if self.npending == 8 {
                self.word(u64::from_le_bytes(self.pending));
                self.npending = 0;
            }
        }
        self.len += bytes.len() as u64;
    }

    pub fn finish(&self) -> u128 {
        let mut b = self.clone();
        if b.npending > 0 {
            b.pending[b.npending..].fill(0);
            b.word(u64::from_le_bytes(b.pending));
        }
        // The length separates inputs that differ only in trailing zero bytes of lane B.
        b.word(self.len);
        let a = fmix64(self.a ^ self.len.rotate_left(32));
        let lo = fmix64(b.b);
        (a as u128) << 64 | lo as u128
    }
}

/// What KV bytes mean: stored under one identity, never served under another.
#[derive(Clone, PartialEq, Eq, Debug, serde::Serialize)]
pub struct CacheIdentity {
    /// Model name and revision as the engine reports it.
    pub model: String,
    pub geometry: Geometry,
    pub layout: LayoutKind,
    /// Per-tenant salt; tenants with different salts never share KV.
    pub tenant_salt: Vec<u8>,
}

/// The 128-bit digest of a [`CacheIdentity`], kept with every index entry.
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Default, serde::Serialize, serde::Deserialize,
)]
pub struct IdentityId(pub u128);

impl CacheIdentity {
    pub fn new(model: impl Into<String>, geometry: Geometry, layout: LayoutKind, tenant_salt: &[u8]) -> Self {
        CacheIdentity { model: model.into(), geometry, layout, tenant_salt: tenant_salt.to_vec() }
    }

    /// Every field, length-prefixed so no two identities encode alike.
    pub fn id(&self) -> IdentityId {
        let mut h = Hasher128::new();
        h.write(b"tutti-identity-v1");
        for field in [self.model.as_bytes(), &self.tenant_salt] {
            h.write(&(field.len() as u64).to_le_bytes());
            h.write(field);
        }
        let g = &self.geometry;
        for v in [g.layers, g.kv_heads, g.head_dim, g.tokens_per_block] {
            h.write(&v.to_le_bytes());
        }
        h.write(&[g.dtype.code(), self.layout.code()]);
        IdentityId(h.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::Dtype;
    use std::collections::HashSet;

    /// The hash keys the on-disk index and journal, and the C ABI documents
    /// it: a change would make every existing pool miss silently. These
    /// values were computed from the documented scheme (`tutti_chain_hashes`
    /// in capi/src/kv.rs) by an independent implementation, not by this code.
    #[test]
    fn the_hash_is_pinned_by_fixed_vectors() {
        let h = |m: &[u8]| {
            let mut x = Hasher128::new();
            x.write(m);
            x.finish()
        };
        assert_eq!(h(b""), 0x47e70d3c1821a5a04382fe3fd3ce3b0b);
        assert_eq!(h(b"tutti"), 0xd863b13108b4a15a17d96cfa4288fe9a);
        let bytes: Vec<u8> = (0..20).collect();
        assert_eq!(h(&bytes), 0x844e9e5804494c162f2ba36a39104f91);
        let tokens: Vec<u32> = (0..32).collect();
        let chain = chain_hashes(&tokens, 16);
        assert_eq!(chain[0].0, 0xe65fe94396461ba1e03a152679759615);
        assert_eq!(chain[1].0, 0x230e2315f8f728890e65b747f0f31efa);
        assert_eq!(BlockHash::chain(ROOT, &[]).0, 0x113e35db4d6c922634f1092e3cef9335);
        let g = Geometry::llama3_8b();
        let id = CacheIdentity::new("llama-3-8b", g, LayoutKind::VllmPerLayer, b"").id();
        assert_eq!(id.0, 0x55d0977dcca47a1d6f9ba328e213743c);
        let id = CacheIdentity::new("llama-3-8b", g, LayoutKind::Contiguous, b"tenant-a").id();
        assert_eq!(id.0, 0x9bef8079009adee446b9fc82d1252a6c);
    }

    #[test]
    fn chain_depends_on_every_earlier_chunk() {
        let a: Vec<u32> = (0..64).collect();
        let mut b = a.clone();
        b[3] = 1000; // differs in chunk 0 only
        let ha = chain_hashes(&a, 16);
        let hb = chain_hashes(&b, 16);
        assert_eq!(ha.len(), 4);
        assert!(ha.iter().zip(&hb).all(|(x, y)| x != y), "a changed first chunk changes every later hash");
        let mut c = a.clone();
        c[40] = 7; // chunk 2
        let hc = chain_hashes(&c, 16);
        assert_eq!(&ha[..2], &hc[..2]);
        assert_ne!(ha[2], hc[2]);
        assert_ne!(ha[3], hc[3]);
        assert_eq!(chain_hashes(&a[..63], 16).len(), 3, "a partial chunk is not hashed");
    }

    #[test]
    fn no_collisions_among_many_small_inputs() {
        let mut seen = HashSet::new();
        for x in 0..20_000u32 {
            assert!(seen.insert(BlockHash::chain(ROOT, &[x])));
            assert!(seen.insert(BlockHash::chain(ROOT, &[x, 0])));
        }
        // Lanes are independent: neither half alone collides here either.
        let lo: HashSet<u64> = seen.iter().map(|h| h.0 as u64).collect();
        let hi: HashSet<u64> = seen.iter().map(|h| (h.0 >> 64) as u64).collect();
        assert_eq!((lo.len(), hi.len()), (seen.len(), seen.len()));
    }

    #[test]
    fn trailing_zeros_change_the_hash() {
        let mut a = Hasher128::new();
        a.write(&[1, 2, 3]);
        let mut b = Hasher128::new();
        b.write(&[1, 2, 3, 0]);
        assert_ne!(a.finish(), b.finish());
        let mut c = Hasher128::new();
        c.write(&[1]);
        c.write(&[2, 3]);
        assert_eq!(a.finish(), c.finish(), "split writes hash like one");
    }

    #[test]
    fn identity_covers_every_field() {
        let g = Geometry::llama3_8b();
        let base = CacheIdentity::new("llama-3-8b", g, LayoutKind::VllmPerLayer, b"");
        let variants = [
            CacheIdentity::new("llama-3-8b-instruct", g, LayoutKind::VllmPerLayer, b""),
            CacheIdentity::new(
                "llama-3-8b",
                Geometry { dtype: Dtype::F16, ..g },
                LayoutKind::VllmPerLayer,
                b"",
            ),
            CacheIdentity::new("llama-3-8b", Geometry { head_dim: 64, ..g }, LayoutKind::VllmPerLayer, b""),
            CacheIdentity::new("llama-3-8b", g, LayoutKind::Contiguous, b""),
            CacheIdentity::new("llama-3-8b", g, LayoutKind::VllmPerLayer, b"tenant-a"),
            // Moving a byte between fields must not collide.
            CacheIdentity::new("llama-3-8", g, LayoutKind::VllmPerLayer, b"b"),
        ];
        let mut ids: HashSet<IdentityId> = variants.iter().map(|v| v.id()).collect();
        assert_eq!(ids.len(), variants.len());
        assert!(ids.insert(base.id()));
        assert_eq!(base.id(), base.clone().id());
    }
}
