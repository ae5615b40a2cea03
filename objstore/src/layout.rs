//! Where the engine keeps its paged KV memory: per-layer base addresses and strides.
//!
//! Every layout we accept has the property that one object (K or V of one
//! block in one layer, `tokens_per_block × kv_heads × head_dim` elements) is
//! contiguous, so object `(block, layer, kv)` lives at
//!
//! ```text
//! addr = layers[layer].k_base  + block · block_stride      (kv = 0)
//!        layers[layer].v_base  + block · block_stride      (kv = 1)
//! ```
//!
//! - vLLM (flash-attn) keeps one tensor per layer shaped
//!   `[2, num_blocks, block_size, kv_heads, head_dim]`: `k_base` = the layer's
//!   tensor, `v_base = k_base + num_blocks · object`, `block_stride = object`.
//! - A fully contiguous `[num_blocks, layers, 2, block_size, kv_heads, head_dim]`
//!   region: `k_base = base + 2·layer·object`, `v_base = k_base + object`,
//!   `block_stride = 2 · layers · object`.
//! - Anything else with one block stride ([`KvLayout::strided`]), e.g. FlashInfer's
//!   `[num_blocks, 2, …]` per layer.

use crate::error::{ObjError, Result};
use crate::geometry::Geometry;

/// Which family a layout belongs to; part of the cache identity, because
/// the same bytes mean different things under different layouts.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayoutKind {
    /// vLLM flash-attn: per layer `[2, num_blocks, block_size, kv_heads, head_dim]`.
    VllmPerLayer,
    /// One region `[num_blocks, layers, 2, block_size, kv_heads, head_dim]`.
    Contiguous,
    /// Caller-described per-layer bases and one block stride.
    Strided,
}

impl LayoutKind {
    pub fn code(self) -> u8 {
        match self {
            LayoutKind::VllmPerLayer => 1,
            LayoutKind::Contiguous => 2,
            LayoutKind::Strided => 3,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            LayoutKind::VllmPerLayer => "vllm-per-layer",
            LayoutKind::Contiguous => "contiguous",
            LayoutKind::Strided => "strided",
        }
    }
}

/// Addresses of block 0's K and V objects in one layer.
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize)]
pub struct LayerBases {
    pub k: u64,
    pub v: u64,
}

/// A contiguous range of engine memory that must be mapped for the drives.
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize)]
pub struct MemRegion {
    pub addr: u64,
    pub len: u64,
}

/// The engine's KV memory, validated against a geometry.
#[derive(Clone, Debug, serde::Serialize)]
pub struct KvLayout {
    kind: LayoutKind,
    geometry: Geometry,
    num_blocks: u32,
    block_stride: u64,
    layers: Vec<LayerBases>,
    regions: Vec<MemRegion>,
}

impl KvLayout {
    /// vLLM's per-layer tensors; `layer_bases[l]` is the address of layer `l`'s tensor.
    pub fn vllm_per_layer(geometry: Geometry, num_blocks: u32, layer_bases: &[u64]) -> Result<Self> {
        geometry.validate()?;
        let obj = geometry.object_bytes();
        let v_off = obj.checked_mul(num_blocks as u64).ok_or_else(|| too_big("num_blocks"))?;
        let layers = layer_bases
            .iter()
            .map(|&k| Ok(LayerBases { k, v: k.checked_add(v_off).ok_or_else(|| too_big("layer_bases"))? }))
            .collect::<Result<Vec<_>>>()?;
        Self::build(LayoutKind::VllmPerLayer, geometry, num_blocks, obj, layers)
    }

    /// One contiguous region at `base` shaped `[num_blocks, layers, 2, …]`.
    pub fn contiguous(geometry: Geometry, num_blocks: u32, base: u64) -> Result<Self> {
        geometry.validate()?;
        let obj = geometry.object_bytes();
        let layers = (0..geometry.layers as u64)
            .map(|l| {
                let k = base.checked_add(2 * l * obj).ok_or_else(|| too_big("base"))?;
                Ok(LayerBases { k, v: k.checked_add(obj).ok_or_else(|| too_big("base"))? })
            })
            .collect::<Result<Vec<_>>>()?;
        Self::build(LayoutKind::Contiguous, geometry, num_blocks, geometry.file_bytes(), layers)
    }

    /// Caller-described bases with one block stride shared by every layer.
    pub fn strided(
        geometry: Geometry,
        num_blocks: u32,
        block_stride: u64,
        layers: Vec<LayerBases>,
    ) -> Result<Self> {
        geometry.validate()?;
        Self::build(LayoutKind::Strided, geometry, num_blocks, block_stride, layers)
    }

    /// Bytes a layout of `kind` needs for `num_blocks` blocks (per layer for
    /// [`LayoutKind::VllmPerLayer`], in total otherwise).
    pub fn bytes_needed(kind: LayoutKind, geometry: &Geometry, num_blocks: u32) -> u64 {
        match kind {
            LayoutKind::VllmPerLayer => 2 * num_blocks as u64 * geometry.object_bytes(),
            _ => num_blocks as u64 * geometry.file_bytes(),
        }
    }

    fn build(
        kind: LayoutKind,
        geometry: Geometry,
        num_blocks: u32,
        block_stride: u64,
        layers: Vec<LayerBases>,
    ) -> Result<Self> {
        if num_blocks == 0 {
            return Err(ObjError::invalid("num_blocks", "must be at least 1"));
        }
        if layers.len() != geometry.layers as usize {
            return Err(ObjError::invalid(
                "layer_bases",
                format!("{} layers described, the geometry has {}", layers.len(), geometry.layers),
            ));
        }
        let obj = geometry.object_bytes();
        if num_blocks > 1 && block_stride < obj {
            return Err(ObjError::invalid(
                "block_stride",
                format!("{block_stride} bytes is less than one object ({obj} bytes): blocks would overlap"),
            ));
        }
        // SGL Data Blocks under SGLS = 10b and PRP entries need dword-aligned addresses (§4.3, §4.4).
        if !block_stride.is_multiple_of(4) {
            return Err(ObjError::invalid(
                "block_stride",
                format!("{block_stride} is not a multiple of 4 bytes"),
            ));
        }
        let span = block_stride
            .checked_mul(num_blocks as u64 - 1)
            .and_then(|s| s.checked_add(obj))
            .ok_or_else(|| too_big("block_stride"))?;
        for (l, b) in layers.iter().enumerate() {
            for (addr, kv) in [(b.k, "K"), (b.v, "V")] {
                if addr == 0 {
                    return Err(ObjError::invalid("layer_bases", format!("layer {l} {kv}: null address")));
                }
                if addr % 4 != 0 {
                    return Err(ObjError::invalid(
                        "layer_bases",
                        format!("layer {l} {kv}: address {addr:#x} is not 4-byte aligned"),
                    ));
                }
                if addr.checked_add(span).is_none() {
                    return Err(ObjError::invalid(
                        "layer_bases",
                        format!("layer {l} {kv}: {addr:#x} + {span} wraps"),
                    ));
                }
            }
        }
        let layout = KvLayout { kind, geometry, num_blocks, block_stride, layers, regions: Vec::new() };
        layout.check_disjoint()?;
        let regions = layout.merge_regions();
        Ok(KvLayout { regions, ..layout })
    }

    /// Every object of the layout occupies its own bytes. The 2L arithmetic
    /// progressions (one per layer and K|V) share one stride, so two of them
    /// collide iff some multiple of the stride brings their bases closer than
    /// one object.
    fn check_disjoint(&self) -> Result<()> {
        let obj = self.geometry.object_bytes() as i128;
        let s = self.block_stride as i128;
        let n = self.num_blocks as i128;
        let runs: Vec<(u64, usize, &str)> =
            self.layers.iter().enumerate().flat_map(|(l, b)| [(b.k, l, "K"), (b.v, l, "V")]).collect();
        let span = (n - 1) * s + obj;
        for (i, &(a, la, ka)) in runs.iter().enumerate() {
            for &(b, lb, kb) in &runs[i + 1..] {
                let d = a as i128 - b as i128;
                if d.abs() >= span {
                    continue;
                }
                // Closest approach of a + i·s and b + j·s over i, j in 0..n: d + k·s, |k| < n.
                let collide = if s == 0 {
                    d.abs() < obj
                } else {
                    let k0 = (-d).div_euclid(s);
                    [k0, k0 + 1].iter().any(|&k| k.abs() < n && (d + k * s).abs() < obj)
                };
                if collide {
                    return Err(ObjError::invalid(
                        "layer_bases",
                        format!("layer {la} {ka} (at {a:#x}) and layer {lb} {kb} (at {b:#x}) overlap with block stride {}", self.block_stride),
                    ));
                }
            }
        }
        Ok(())
    }

    fn merge_regions(&self) -> Vec<MemRegion> {
        let span = self.block_stride * (self.num_blocks as u64 - 1) + self.geometry.object_bytes();
        let mut spans: Vec<(u64, u64)> =
            self.layers.iter().flat_map(|b| [(b.k, b.k + span), (b.v, b.v + span)]).collect();
        spans.sort_unstable();
        let mut out: Vec<MemRegion> = Vec::new();
        for (lo, hi) in spans {
            match out.last_mut() {
                Some(r) if lo <= r.addr + r.len => r.len = r.len.max(hi - r.addr),
                _ => out.push(MemRegion { addr: lo, len: hi - lo }),
            }
        }
        out
    }

    pub fn kind(&self) -> LayoutKind {
        self.kind
    }
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }
    pub fn num_blocks(&self) -> u32 {
        self.num_blocks
    }
    pub fn block_stride(&self) -> u64 {
        self.block_stride
    }
    pub fn layers(&self) -> &[LayerBases] {
        &self.layers
    }
    /// Disjoint, sorted memory ranges covering every object.
    pub fn regions(&self) -> &[MemRegion] {
        &self.regions
    }

    /// Address of object `(block, layer, kv)`; callers keep indices in range.
    pub fn object_addr(&self, block: u32, layer: u32, kv: u32) -> u64 {
        let b = &self.layers[layer as usize];
        let base = if kv == 0 { b.k } else { b.v };
        base + block as u64 * self.block_stride
    }

    /// Index of the region holding `addr..addr+len` and the offset in it.
    pub fn region_of(&self, addr: u64, len: u64) -> Option<(usize, u64)> {
        let i = self.regions.partition_point(|r| r.addr <= addr).checked_sub(1)?;
        let r = self.regions[i];
        (addr + len <= r.addr + r.len).then_some((i, addr - r.addr))
    }
}

fn too_big(field: &'static str) -> ObjError {
    ObjError::invalid(field, "addresses overflow 64 bits")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::Dtype;

    fn geo() -> Geometry {
        Geometry { layers: 3, kv_heads: 2, head_dim: 16, tokens_per_block: 4, dtype: Dtype::F16 }
    }

    #[test]
    fn vllm_layout_addresses() {
        let g = geo();
        let obj = g.object_bytes();
        let bases = [0x10_0000, 0x20_0000, 0x30_0000];
        let l = KvLayout::vllm_per_layer(g, 10, &bases).unwrap();
        assert_eq!(l.object_addr(0, 1, 0), 0x20_0000);
        assert_eq!(l.object_addr(3, 1, 1), 0x20_0000 + 10 * obj + 3 * obj);
        assert_eq!(l.regions().len(), 3);
        assert_eq!(l.regions()[0], MemRegion { addr: 0x10_0000, len: 20 * obj });
        assert_eq!(l.region_of(0x20_0000 + obj, obj), Some((1, obj)));
        assert_eq!(l.region_of(0x20_0000 + 20 * obj, 1), None);
    }

    #[test]
    fn contiguous_layout_is_one_region() {
        let g = geo();
        let obj = g.object_bytes();
        let l = KvLayout::contiguous(g, 5, 0x1000).unwrap();
        assert_eq!(l.regions(), &[MemRegion { addr: 0x1000, len: 5 * g.file_bytes() }]);
        assert_eq!(l.object_addr(2, 1, 1), 0x1000 + 2 * g.file_bytes() + 3 * obj);
    }

    #[test]
    fn overlapping_layers_are_rejected() {
        let g = geo();
        let obj = g.object_bytes();
        // Layer 1 starts inside layer 0's V half.
        let e = KvLayout::vllm_per_layer(g, 10, &[0x10_0000, 0x10_0000 + 15 * obj, 0x90_0000]).unwrap_err();
        assert!(e.to_string().contains("overlap"), "{e}");
        // Interleaved runs with the same stride are fine when offset by one object...
        let bases =
            (0..3).map(|l| LayerBases { k: 0x1000 + 2 * l * obj, v: 0x1000 + (2 * l + 1) * obj }).collect();
        assert!(KvLayout::strided(g, 4, 6 * obj, bases).is_ok());
        // ...and rejected when shifted by half an object.
        let bases = (0..3)
            .map(|l| LayerBases { k: 0x1000 + 2 * l * obj, v: 0x1000 + 2 * l * obj + obj / 2 })
            .collect();
        assert!(KvLayout::strided(g, 4, 6 * obj, bases).is_err());
    }

    #[test]
    fn bad_fields_are_named() {
        let g = geo();
        let obj = g.object_bytes();
        assert!(KvLayout::vllm_per_layer(g, 0, &[1 << 20; 3])
            .unwrap_err()
            .to_string()
            .contains("num_blocks"));
        assert!(KvLayout::vllm_per_layer(g, 4, &[1 << 20; 2])
            .unwrap_err()
            .to_string()
            .contains("layer_bases"));
        let e = KvLayout::vllm_per_layer(g, 4, &[0x1002, 1 << 20, 2 << 20]).unwrap_err().to_string();
        assert!(e.contains("aligned"), "{e}");
        let bases = (0..3).map(|l| LayerBases { k: (l + 1) << 20, v: ((l + 1) << 20) + (1 << 19) }).collect();
        let e = KvLayout::strided(g, 4, obj / 2, bases).unwrap_err().to_string();
        assert!(e.contains("block_stride"), "{e}");
        assert!(KvLayout::contiguous(g, 4, u64::MAX - 100).is_err());
    }
}
