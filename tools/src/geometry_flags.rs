//! The KV geometry flags of every subcommand that opens a pool, and the
//! geometry they describe.

use tutti_objstore::{Dtype, Geometry};

#[derive(clap::Args, Debug, Clone)]
pub struct GeometryArgs {
    /// Model layers (the defaults are Llama-3-8B's geometry).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub layers: u32,
    /// KV heads per layer (per tensor-parallel rank).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub kv_heads: u32,
    /// Dimension of each head.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..))]
    pub head_dim: u32,
    /// Tokens per KV block (one GPU file per block).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub block_tokens: u32,
    /// f32, f16, bf16, fp8_e4m3, fp8_e5m2, i8.
    #[arg(long, default_value = "bf16", value_parser = parse_dtype)]
    pub dtype: String,
}

/// Accepts what [`Dtype`] parses, keeping the spelling given.
fn parse_dtype(s: &str) -> Result<String, String> {
    s.parse::<Dtype>().map(|_| s.to_string()).map_err(|e| e.to_string())
}

impl GeometryArgs {
    /// The geometry of the flags, checked.
    pub fn geometry(&self) -> anyhow::Result<Geometry> {
        self.with_layers(self.layers)
    }

    /// The same geometry with `layers` layers, checked.
    pub fn with_layers(&self, layers: u32) -> anyhow::Result<Geometry> {
        let g = Geometry {
            layers,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            tokens_per_block: self.block_tokens,
            dtype: self.dtype.parse::<Dtype>()?,
        };
        g.validate()?;
        Ok(g)
    }
}
