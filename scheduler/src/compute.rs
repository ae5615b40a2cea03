//! A compute-time model of a decoder-only transformer on a GPU, used to profile without an
//! engine and to drive the simulator.
//!
//! Prefill of `n` new tokens after `p` cached tokens, per layer:
//! - linear part (QKV/O projections and the FFN): `2 · params_per_layer · n` FLOPs — constant in
//!   the prefix length ("FFN term" in the paper's bubble analysis);
//! - attention: `QKᵀ` and `AV` over a causal window, `4 · heads · head_dim · Σᵢ (p + i)` FLOPs,
//!   i.e. `4 · heads · head_dim · (n·p + n(n+1)/2)` — grows with both prefix and input length.
//!
//! Decode with batch 1 is memory-bound: each step streams the weights and the KV of the context.

use crate::table::Identity;
use crate::SchedError;

/// Model shape. KV bytes are derived from it, never configured separately.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelGeometry {
    pub name: String,
    pub layers: u32,
    pub hidden: u32,
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub ffn: u32,
    pub vocab: u32,
    pub dtype_bytes: u32,
    /// Tokens per KV block (the paged-attention block; one IOCB moves K or V of one block, one layer).
    pub block_tokens: u32,
}

impl ModelGeometry {
    /// Llama-3-8B: 32 layers, 32 query heads, 8 KV heads of 128, FFN 14336, BF16, 16-token blocks.
    pub fn llama3_8b() -> Self {
        ModelGeometry {
            name: "llama-3-8b".into(),
            layers: 32,
            hidden: 4096,
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            ffn: 14336,
            vocab: 128_256,
            dtype_bytes: 2,
            block_tokens: 16,
        }
    }

    pub fn validate(&self) -> Result<(), SchedError> {
        let fields = [
            ("layers", self.layers),
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("head_dim", self.head_dim),
            ("ffn", self.ffn),
            ("dtype_bytes", self.dtype_bytes),
            ("block_tokens", self.block_tokens),
        ];
        if let Some((name, _)) = fields.iter().find(|(_, v)| *v == 0) {
            return Err(SchedError::InvalidModel(format!("{}: {name} must be > 0", self.name)));
        }
        // `%` rather than `is_multiple_of`: the workspace MSRV (1.85) predates it.
        #[allow(clippy::manual_is_multiple_of)]
        let grouped = self.heads % self.kv_heads == 0;
        if !grouped {
            return Err(SchedError::InvalidModel(format!(
                "{}: {} query heads is not a multiple of {} KV heads",
                self.name, self.heads, self.kv_heads
            )));
        }
        Ok(())
    }

    /// K and V of one token in one layer.
    pub fn kv_bytes_per_token_layer(&self) -> u64 {
        2 * u64::from(self.kv_heads) * u64::from(self.head_dim) * u64::from(self.dtype_bytes)
    }

    /// K and V of one token over all layers (Llama-3-8B: 32 × 2 × 8 × 128 × 2 B = 128 KiB).
    pub fn kv_bytes_per_token(&self) -> u64 {
        u64::from(self.layers) * self.kv_bytes_per_token_layer()
    }

    /// One IOCB: the K (or V) tensor of one block in one layer.
    pub fn iocb_bytes(&self) -> u64 {
        u64::from(self.block_tokens) * self.kv_bytes_per_token_layer() / 2
    }

    /// Weights of one layer: Q and O (hidden²), K and V (hidden × kv_dim), gate/up/down (3 × hidden × ffn).
    pub fn params_per_layer(&self) -> f64 {
        let h = f64::from(self.hidden);
        let kv_dim = f64::from(self.kv_heads) * f64::from(self.head_dim);
        2.0 * h * h + 2.0 * h * kv_dim + 3.0 * h * f64::from(self.ffn)
    }

    pub fn weight_bytes(&self) -> f64 {
        let embeddings = 2.0 * f64::from(self.vocab) * f64::from(self.hidden);
        (f64::from(self.layers) * self.params_per_layer() + embeddings) * f64::from(self.dtype_bytes)
    }

    pub fn linear_flops(&self, input: f64) -> f64 {
        2.0 * self.params_per_layer() * input
    }

    pub fn attention_flops(&self, input: f64, prefix: f64) -> f64 {
        4.0 * f64::from(self.heads)
            * f64::from(self.head_dim)
            * (input * prefix + input * (input + 1.0) / 2.0)
    }
}

/// GPU speed as effective (achieved, not peak) rates, plus the I/O SM partition.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GpuModel {
    pub name: String,
    /// Achieved TFLOP/s of the projection/FFN GEMMs (H100 SXM BF16 dense peak is ~989).
    pub linear_tflops: f64,
    /// Achieved TFLOP/s of the attention kernel.
    pub attention_tflops: f64,
    /// Achieved HBM bandwidth in GB/s (H100 SXM peak is 3350).
    pub hbm_gbps: f64,
    /// Fixed cost per layer (kernel launches, norms, small operators), nanoseconds.
    pub layer_overhead_ns: u64,
    /// SMs reserved for the I/O kernel (green-context partition); the SM budget handed out.
    pub io_sms: u32,
    /// IOCBs one I/O SM can issue and reap per microsecond; caps IOCBs per slack window.
    pub iocbs_per_sm_per_us: f64,
}

impl GpuModel {
    /// An H100-class GPU at ~40% of BF16 peak, 4 of 132 SMs for I/O (the paper's example budget).
    pub fn h100_class() -> Self {
        GpuModel {
            name: "h100-class".into(),
            linear_tflops: 400.0,
            attention_tflops: 400.0,
            hbm_gbps: 2700.0,
            layer_overhead_ns: 20_000,
            io_sms: 4,
            iocbs_per_sm_per_us: 1.0,
        }
    }

    pub fn validate(&self) -> Result<(), SchedError> {
        let rates = [
            ("linear_tflops", self.linear_tflops),
            ("attention_tflops", self.attention_tflops),
            ("hbm_gbps", self.hbm_gbps),
            ("iocbs_per_sm_per_us", self.iocbs_per_sm_per_us),
        ];
        if let Some((name, v)) = rates.iter().find(|(_, v)| !(v.is_finite() && *v > 0.0)) {
            return Err(SchedError::InvalidModel(format!("gpu {}: {name} must be > 0, got {v}", self.name)));
        }
        if self.io_sms == 0 {
            return Err(SchedError::InvalidModel(format!("gpu {}: io_sms must be > 0", self.name)));
        }
        Ok(())
    }

    pub fn io_partition(&self) -> IoPartition {
        IoPartition { io_sms: self.io_sms, iocbs_per_sm_per_us: self.iocbs_per_sm_per_us }
    }
}

/// The SMs reserved for the I/O kernel and how many IOCBs they drive: turns a slack window into
/// an SM budget and an IOCB cap.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct IoPartition {
    pub io_sms: u32,
    pub iocbs_per_sm_per_us: f64,
}

impl IoPartition {
    pub fn validate(&self) -> Result<(), SchedError> {
        if self.io_sms == 0 || !(self.iocbs_per_sm_per_us.is_finite() && self.iocbs_per_sm_per_us > 0.0) {
            return Err(SchedError::InvalidConfig(format!(
                "I/O partition needs > 0 SMs and a positive IOCB rate, got {} SMs at {} IOCB/SM/us",
                self.io_sms, self.iocbs_per_sm_per_us
            )));
        }
        Ok(())
    }

    /// IOCBs the I/O partition can drive within `window_ns`.
    pub fn max_iocbs(&self, window_ns: f64) -> u32 {
        let n = window_ns / 1000.0 * f64::from(self.io_sms) * self.iocbs_per_sm_per_us;
        n.clamp(0.0, f64::from(u32::MAX)) as u32
    }

    pub fn entry(&self, window_ns: f64) -> crate::SlackEntry {
        let window_ns = window_ns.max(0.0);
        crate::SlackEntry {
            window_ns: window_ns.round() as u64,
            sm_budget: self.io_sms,
            max_iocbs: self.max_iocbs(window_ns),
        }
    }
}

/// Per-layer prefill and per-step decode time of a model on a GPU.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ComputeModel {
    pub geometry: ModelGeometry,
    pub gpu: GpuModel,
}

impl ComputeModel {
    pub fn new(geometry: ModelGeometry, gpu: GpuModel) -> Result<Self, SchedError> {
        geometry.validate()?;
        gpu.validate()?;
        Ok(ComputeModel { geometry, gpu })
    }

    pub fn llama3_8b_h100() -> Self {
        ComputeModel { geometry: ModelGeometry::llama3_8b(), gpu: GpuModel::h100_class() }
    }

    pub fn identity(&self) -> Identity {
        Identity {
            model: self.geometry.name.clone(),
            gpu: self.gpu.name.clone(),
            layers: self.geometry.layers,
        }
    }

    /// Compute time of one prefill layer, nanoseconds. Every layer of the model is alike.
    pub fn prefill_layer_ns(&self, input_tokens: u32, prefix_tokens: u32) -> f64 {
        if input_tokens == 0 {
            return 0.0;
        }
        let (n, p) = (f64::from(input_tokens), f64::from(prefix_tokens));
        let linear = self.geometry.linear_flops(n) / (self.gpu.linear_tflops * 1e3);
        let attention = self.geometry.attention_flops(n, p) / (self.gpu.attention_tflops * 1e3);
        self.gpu.layer_overhead_ns as f64 + linear + attention
    }

    /// Compute time of one decode step (batch 1) with `context_tokens` of KV, nanoseconds.
    pub fn decode_step_ns(&self, context_tokens: u32) -> f64 {
        let bytes = self.geometry.weight_bytes()
            + f64::from(context_tokens) * self.geometry.kv_bytes_per_token() as f64;
        let overhead = f64::from(self.geometry.layers) * self.gpu.layer_overhead_ns as f64;
        overhead + bytes / self.gpu.hbm_gbps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_8b_kv_geometry_is_128_kib_per_token() {
        let g = ModelGeometry::llama3_8b();
        assert_eq!(g.kv_bytes_per_token(), 128 * 1024);
        assert_eq!(g.kv_bytes_per_token_layer(), 4096);
        assert_eq!(g.iocb_bytes(), 16 * 2048);
        // ~7.5e9 parameters including embeddings and LM head.
        let params = g.weight_bytes() / 2.0;
        assert!((7.0e9..8.5e9).contains(&params), "{params}");
    }

    #[test]
    fn attention_grows_with_prefix_and_linear_part_does_not() {
        let m = ComputeModel::llama3_8b_h100();
        let a = m.prefill_layer_ns(1024, 0);
        let b = m.prefill_layer_ns(1024, 16_384);
        let c = m.prefill_layer_ns(1024, 32_768);
        assert!(a < b && b < c);
        // Attention is linear in the prefix, so equal prefix steps add equal time.
        assert!(((c - b) - (b - a)).abs() / (c - b) < 1e-9);
        assert_eq!(m.prefill_layer_ns(0, 1000), 0.0);
    }

    #[test]
    fn rejects_nonsense_geometry() {
        let mut g = ModelGeometry::llama3_8b();
        g.kv_heads = 5;
        assert!(g.validate().unwrap_err().to_string().contains("multiple"));
        g.kv_heads = 0;
        assert!(g.validate().unwrap_err().to_string().contains("kv_heads"));
        let mut gpu = GpuModel::h100_class();
        gpu.linear_tflops = f64::NAN;
        assert!(gpu.validate().unwrap_err().to_string().contains("linear_tflops"));
    }
}
