//! The shape of a model's KV cache and the size of one object.
//!
//! An *object* is one K or one V slice of one KV block in one layer:
//! `tokens_per_block × kv_heads × head_dim` elements, contiguous in the
//! engine's memory in every layout we accept. A *GPU file* is one KV block:
//! `2 × layers` objects (object `j = 2·layer + kv`, kv 0 = K, 1 = V).

use crate::error::{ObjError, Result};

/// Element type of the KV cache.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    F32,
    F16,
    Bf16,
    /// 8-bit float, E4M3 (FP8 KV caches).
    Fp8E4m3,
    /// 8-bit float, E5M2.
    Fp8E5m2,
    /// 8-bit integer (quantized KV caches).
    I8,
}

impl Dtype {
    pub fn bytes(self) -> u32 {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::Fp8E4m3 | Dtype::Fp8E5m2 | Dtype::I8 => 1,
        }
    }
    /// The code stored in superblocks and identities; never reuse a value.
    pub fn code(self) -> u8 {
        match self {
            Dtype::F32 => 1,
            Dtype::F16 => 2,
            Dtype::Bf16 => 3,
            Dtype::Fp8E4m3 => 4,
            Dtype::Fp8E5m2 => 5,
            Dtype::I8 => 6,
        }
    }
    pub fn from_code(code: u8) -> Option<Dtype> {
        Some(match code {
            1 => Dtype::F32,
            2 => Dtype::F16,
            3 => Dtype::Bf16,
            4 => Dtype::Fp8E4m3,
            5 => Dtype::Fp8E5m2,
            6 => Dtype::I8,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::Fp8E4m3 => "fp8_e4m3",
            Dtype::Fp8E5m2 => "fp8_e5m2",
            Dtype::I8 => "i8",
        }
    }
}

impl std::str::FromStr for Dtype {
    type Err = ObjError;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" | "fp32" => Dtype::F32,
            "f16" | "float16" | "fp16" | "half" => Dtype::F16,
            "bf16" | "bfloat16" => Dtype::Bf16,
            "fp8" | "fp8_e4m3" | "e4m3" => Dtype::Fp8E4m3,
            "fp8_e5m2" | "e5m2" => Dtype::Fp8E5m2,
            "i8" | "int8" => Dtype::I8,
            _ => {
                return Err(ObjError::invalid(
                    "dtype",
                    format!("{s:?} is not one of f32, f16, bf16, fp8_e4m3, fp8_e5m2, i8"),
                ))
            }
        })
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Largest accepted layer count; objects per file (2L) must fit the u16
/// object index the stripe arithmetic and the executor use.
pub const MAX_LAYERS: u32 = 4096;
/// Largest accepted object: one command chain per object keeps the table
/// small, and 1 GiB objects would mean a misconfigured geometry.
pub const MAX_OBJECT_BYTES: u64 = 1 << 30;

/// The KV-cache shape of one model (per tensor-parallel rank).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, serde::Serialize, serde::Deserialize)]
pub struct Geometry {
    pub layers: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub tokens_per_block: u32,
    pub dtype: Dtype,
}

impl Geometry {
    /// Llama-3-8B: 32 layers, 8 KV heads of dimension 128, 16-token blocks, bf16.
    pub fn llama3_8b() -> Self {
        Geometry { layers: 32, kv_heads: 8, head_dim: 128, tokens_per_block: 16, dtype: Dtype::Bf16 }
    }

    /// Checks every field; the error names the first one that is wrong.
    pub fn validate(&self) -> Result<()> {
        let fields = [
            ("layers", self.layers),
            ("kv_heads", self.kv_heads),
            ("head_dim", self.head_dim),
            ("tokens_per_block", self.tokens_per_block),
        ];
        for (field, v) in fields {
            if v == 0 {
                return Err(ObjError::invalid(field, "must be at least 1"));
            }
        }
        if self.layers > MAX_LAYERS {
            return Err(ObjError::invalid(
                "layers",
                format!("{} exceeds the maximum of {MAX_LAYERS}", self.layers),
            ));
        }
        let bytes = self.object_bytes_u128();
        if bytes > MAX_OBJECT_BYTES as u128 {
            return Err(ObjError::invalid(
                "geometry",
                format!(
                    "one object (tokens_per_block {} × kv_heads {} × head_dim {} × {} bytes) is {bytes} bytes, over {MAX_OBJECT_BYTES}",
                    self.tokens_per_block,
                    self.kv_heads,
                    self.head_dim,
                    self.dtype.bytes()
                ),
            ));
        }
        Ok(())
    }

    fn object_bytes_u128(&self) -> u128 {
        self.tokens_per_block as u128
            * self.kv_heads as u128
            * self.head_dim as u128
            * self.dtype.bytes() as u128
    }

    /// Bytes of one object: one K (or V) slice of one block in one layer.
    pub fn object_bytes(&self) -> u64 {
        self.object_bytes_u128().min(u64::MAX as u128) as u64
    }
    /// Objects per GPU file: K and V of every layer.
    pub fn objects_per_file(&self) -> u32 {
        2 * self.layers
    }
    /// Bytes of one KV block across all layers (one GPU file's payload).
    pub fn file_bytes(&self) -> u64 {
        self.object_bytes() * self.objects_per_file() as u64
    }
    /// KV bytes per token across all layers.
    pub fn bytes_per_token(&self) -> u64 {
        self.file_bytes() / self.tokens_per_block as u64
    }
}

impl Geometry {
    /// The `tutti serve` (and `tutti demo`) flags that describe this geometry, for messages
    /// that tell an operator how to start a daemon that matches.
    pub fn serve_flags(&self) -> String {
        format!(
            "--layers {} --kv-heads {} --head-dim {} --block-tokens {} --dtype {}",
            self.layers, self.kv_heads, self.head_dim, self.tokens_per_block, self.dtype
        )
    }
}

impl std::fmt::Display for Geometry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} layers × {} KV heads × head dim {} × {} tokens/block, {}",
            self.layers, self.kv_heads, self.head_dim, self.tokens_per_block, self.dtype
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_8b_object_is_32_kib() {
        let g = Geometry::llama3_8b();
        g.validate().unwrap();
        assert_eq!(g.object_bytes(), 32 << 10);
        assert_eq!(g.file_bytes(), 2 << 20);
        assert_eq!(g.bytes_per_token(), 128 << 10);
    }

    #[test]
    fn zero_fields_are_named() {
        let mut g = Geometry::llama3_8b();
        g.head_dim = 0;
        let e = g.validate().unwrap_err().to_string();
        assert!(e.contains("head_dim"), "{e}");
        let mut g = Geometry::llama3_8b();
        g.layers = MAX_LAYERS + 1;
        assert!(g.validate().unwrap_err().to_string().contains("layers"));
        let mut g = Geometry::llama3_8b();
        g.kv_heads = 1 << 20;
        g.head_dim = 1 << 10;
        assert!(g.validate().unwrap_err().to_string().contains("geometry"));
    }

    #[test]
    fn dtype_codes_round_trip() {
        for d in [Dtype::F32, Dtype::F16, Dtype::Bf16, Dtype::Fp8E4m3, Dtype::Fp8E5m2, Dtype::I8] {
            assert_eq!(Dtype::from_code(d.code()), Some(d));
            assert_eq!(d.name().parse::<Dtype>().unwrap(), d);
        }
        assert!(Dtype::from_code(0).is_none());
        assert!("f64".parse::<Dtype>().unwrap_err().to_string().contains("dtype"));
    }
}
