//! The bytes every method moves.
//!
//! A request of `blocks` chunks has `blocks × layers × 2` objects (K and V of
//! each layer). They live three times over:
//! - in a reference buffer, object `(chunk, layer, kv)` at
//!   `((chunk × layers + layer) × 2 + kv) × object_bytes` — the memory-copy
//!   source and what every delivery is checked against;
//! - in a file with the same layout, written once so its pages sit in the page
//!   cache — what io_uring and pread read;
//! - on the emulated drives, stored through the object store.
//!
//! They land in the engine's KV memory (vLLM per-layer layout), chunk `i` in
//! block slot `dst[i]`: a seeded shuffle, so consecutive objects of the
//! request go to scattered places, as in a paged KV cache.

use crate::pattern::kv_object;
use anyhow::{bail, Context};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::fs::File;
use std::io::Write;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tutti_objstore::{Geometry, HostKvMemory, KvLayout};

pub struct Dataset {
    pub g: Geometry,
    /// Chunks of the request, and block slots of the KV memory.
    pub blocks: u32,
    /// Engine block slot of chunk `i` on retrieval.
    pub dst: Vec<u32>,
    pub seed: u64,
    reference: Vec<u8>,
    pub file: File,
    path: PathBuf,
    pub kv: Arc<HostKvMemory>,
    pub layout: KvLayout,
}

impl Dataset {
    /// Generates the request's bytes, writes them to a file under `dir`, and
    /// allocates KV memory for `blocks` slots.
    pub fn create(g: Geometry, blocks: u32, seed: u64, dir: &Path) -> anyhow::Result<Dataset> {
        if blocks == 0 {
            bail!("a request of zero blocks");
        }
        let obj = g.object_bytes() as usize;
        let total = (blocks as usize)
            .checked_mul(g.file_bytes() as usize)
            .with_context(|| format!("{blocks} blocks of {} bytes overflow", g.file_bytes()))?;
        let mut reference = vec![0u8; total];
        let per_chunk = g.file_bytes() as usize;
        std::thread::scope(|s| {
            let half = (blocks as usize).div_ceil(2) * per_chunk;
            let (a, b) = reference.split_at_mut(half.min(total));
            let chunk0 = (half / per_chunk) as u32;
            for (part, first) in [(a, 0u32), (b, chunk0)] {
                s.spawn(move || {
                    for (k, o) in part.chunks_mut(obj).enumerate() {
                        let k = k as u32;
                        let (chunk, layer, kv) = (first + k / (2 * g.layers), k / 2 % g.layers, k % 2);
                        kv_object(seed, chunk, layer, kv, o);
                    }
                });
            }
        });

        let path = dir.join(format!("tutti-bench-retrieve-{}-{blocks}x{}.kv", std::process::id(), g.layers));
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .with_context(|| format!("creating the baseline file {}", path.display()))?;
        let written = file.write_all(&reference).and_then(|()| file.sync_data());
        if let Err(e) = written {
            let _ = std::fs::remove_file(&path);
            return Err(e).with_context(|| format!("writing {} bytes to {}", total, path.display()));
        }

        let per_layer = KvLayout::bytes_needed(tutti_objstore::LayoutKind::VllmPerLayer, &g, blocks);
        let kv = Arc::new(HostKvMemory::new((per_layer * g.layers as u64) as usize)?);
        let bases: Vec<u64> = (0..g.layers as u64).map(|l| kv.addr() + l * per_layer).collect();
        let layout = KvLayout::vllm_per_layer(g, blocks, &bases)?;
        let mut dst: Vec<u32> = (0..blocks).collect();
        dst.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed ^ 0x5eed));
        Ok(Dataset { g, blocks, dst, seed, reference, file, path, kv, layout })
    }

    /// Offset of object `(chunk, layer, kv)` in the reference buffer and the file.
    pub fn source_offset(&self, chunk: u32, layer: u32, kv: u32) -> u64 {
        ((chunk as u64 * self.g.layers as u64 + layer as u64) * 2 + kv as u64) * self.g.object_bytes()
    }

    /// The stored bytes of object `(chunk, layer, kv)`.
    pub fn source(&self, chunk: u32, layer: u32, kv: u32) -> &[u8] {
        let at = self.source_offset(chunk, layer, kv) as usize;
        &self.reference[at..at + self.g.object_bytes() as usize]
    }

    /// Offset in the KV memory of object `(layer, kv)` of block slot `block`.
    pub fn slot_offset(&self, block: u32, layer: u32, kv: u32) -> usize {
        (self.layout.object_addr(block, layer, kv) - self.kv.addr()) as usize
    }

    /// Offset in the KV memory where chunk `chunk`'s object `(layer, kv)` is retrieved to.
    pub fn dst_offset(&self, chunk: u32, layer: u32, kv: u32) -> usize {
        self.slot_offset(self.dst[chunk as usize], layer, kv)
    }

    /// Puts every chunk's stored bytes into block slot `chunk` (the engine
    /// state before the request is stored).
    pub fn fill_slots_in_order(&self) -> anyhow::Result<()> {
        for c in 0..self.blocks {
            for l in 0..self.g.layers {
                for kv in 0..2 {
                    self.kv.copy_in(self.slot_offset(c, l, kv), self.source(c, l, kv))?;
                }
            }
        }
        Ok(())
    }

    /// Overwrites the destination objects of chunks `0..n` for `layers`, so a
    /// method that delivers nothing cannot pass on an earlier method's bytes.
    pub fn clear(&self, n: u32, layers: Range<u32>) -> anyhow::Result<()> {
        let obj = self.g.object_bytes() as usize;
        for l in layers {
            for c in 0..n {
                for kv in 0..2 {
                    self.kv.fill(self.dst_offset(c, l, kv), obj, 0xA5)?;
                }
            }
        }
        Ok(())
    }

    /// Checks that every destination object of chunks `0..n` for `layers`
    /// holds exactly the stored bytes; returns the bytes checked.
    pub fn verify(&self, n: u32, layers: Range<u32>) -> anyhow::Result<u64> {
        let obj = self.g.object_bytes() as usize;
        let mut checked = 0u64;
        for l in layers {
            for c in 0..n {
                for kv in 0..2 {
                    let at = self.dst_offset(c, l, kv);
                    if at + obj > self.kv.len() {
                        bail!("slot offset {at:#x} is outside the KV memory");
                    }
                    // SAFETY: in bounds (checked above) and no transfer is in flight: every
                    // method returns only after all of its data has landed.
                    let got = unsafe { std::slice::from_raw_parts(self.kv.as_ptr().add(at), obj) };
                    let want = self.source(c, l, kv);
                    if got != want {
                        let i = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
                        bail!(
                            "chunk {c}, layer {l} {} in block slot {}: byte {i} is {:#04x}, stored {:#04x}",
                            ["K", "V"][kv as usize],
                            self.dst[c as usize],
                            got[i],
                            want[i]
                        );
                    }
                    checked += obj as u64;
                }
            }
        }
        Ok(checked)
    }
}

impl Drop for Dataset {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "could not remove the baseline file");
        }
    }
}

/// The file system holding `dir`, by name where it matters here.
///
/// On tmpfs, io_uring cannot read the page cache inline (shmem files do not
/// take non-blocking reads on many kernels) and hands every read to a kernel
/// worker thread, which is not what a file tier on ext4 or xfs sees.
pub fn file_system(dir: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return "unknown".into();
    };
    // SAFETY: `c` is a NUL-terminated path and `st` a writable statfs the call fills.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return "unknown".into();
    }
    match st.f_type as u64 {
        0xEF53 => "ext4".into(),
        0x5846_5342 => "xfs".into(),
        0x9123_683E => "btrfs".into(),
        0x0102_1994 => "tmpfs".into(),
        0x794C_7630 => "overlayfs".into(),
        other => format!("file system type {other:#x}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tutti_objstore::Dtype;

    fn small() -> Geometry {
        Geometry { layers: 3, kv_heads: 1, head_dim: 64, tokens_per_block: 8, dtype: Dtype::Bf16 }
    }

    #[test]
    fn slots_are_scattered_and_each_used_once() {
        let ds = Dataset::create(small(), 64, 1, &std::env::temp_dir()).unwrap();
        let mut seen = ds.dst.clone();
        seen.sort_unstable();
        assert_eq!(seen, (0..64).collect::<Vec<_>>());
        assert!(ds.dst.iter().enumerate().filter(|(i, &b)| *i as u32 != b).count() > 32);
    }

    #[test]
    fn verify_catches_a_cleared_or_misplaced_object() {
        let ds = Dataset::create(small(), 8, 2, &std::env::temp_dir()).unwrap();
        ds.clear(8, 0..3).unwrap();
        assert!(ds.verify(8, 0..3).is_err(), "cleared slots pass verification");
        for c in 0..8 {
            for l in 0..3 {
                for kv in 0..2 {
                    ds.kv.copy_in(ds.dst_offset(c, l, kv), ds.source(c, l, kv)).unwrap();
                }
            }
        }
        assert_eq!(ds.verify(8, 0..3).unwrap(), 8 * 3 * 2 * small().object_bytes());
        // Chunk 0's layer-1 V where chunk 1's belongs.
        ds.kv.copy_in(ds.dst_offset(1, 1, 1), ds.source(0, 1, 1)).unwrap();
        let e = ds.verify(8, 0..3).unwrap_err().to_string();
        assert!(e.contains("chunk 1, layer 1 V"), "{e}");
    }

    #[test]
    fn the_file_holds_the_reference_bytes() {
        use std::os::unix::fs::FileExt;
        let ds = Dataset::create(small(), 5, 3, &std::env::temp_dir()).unwrap();
        let mut buf = vec![0u8; small().object_bytes() as usize];
        ds.file.read_exact_at(&mut buf, ds.source_offset(4, 2, 1)).unwrap();
        assert_eq!(buf, ds.source(4, 2, 1));
        assert_ne!(ds.source(4, 2, 1), ds.source(4, 2, 0));
        let path = ds.path.clone();
        drop(ds);
        assert!(!path.exists(), "the file is removed with the data set");
    }
}
