//! Building slack tables: from engine timings or from a compute model.
//!
//! With an engine attached, it reports each prefill's shape ([`Profiler::begin_request`]) and the
//! compute interval of every layer ([`Profiler::record_layer`], the call the C ABI exposes), plus
//! decode steps. Per layer, the profiler fits `t = a + b·n + c·(n·p + n(n+1)/2)` — fixed cost,
//! linear (FFN/projection) work, attention work; the structure of [`ComputeModel`] — with
//! non-negative coefficients, then evaluates the fit at every table bucket. Fitting rather than
//! bucket-averaging fills buckets no request hit and smooths measurement noise. Decode steps are
//! fitted as `t = a + b·context`.

mod fit;
mod trace;

use std::collections::BTreeMap;
use std::io::BufRead;

use fit::{nnls_relative, predict, Sample};
pub use trace::{synthetic_trace, TraceRecord};

use crate::compute::IoPartition;
use crate::table::{Identity, SlackTable, TableGrid};
use crate::{ComputeModel, RequestShape, SchedError};

#[derive(Debug, Clone)]
struct RequestTimings {
    shape: RequestShape,
    layer_ns: Vec<Option<u64>>,
}

/// Collects engine timings and turns them into a [`SlackTable`].
#[derive(Debug, Clone)]
pub struct Profiler {
    layers: u32,
    requests: BTreeMap<u64, RequestTimings>,
    decode: Vec<(u32, u64)>,
}

/// Fit of one layer's compute time.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LayerFit {
    pub layer: u32,
    pub samples: usize,
    pub fixed_ns: f64,
    pub ns_per_token: f64,
    pub ns_per_attention_unit: f64,
    /// Largest |predicted − measured| / measured over the layer's samples.
    pub max_rel_error: f64,
}

/// How well the fitted model explains the trace.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FitReport {
    pub requests: usize,
    pub layer_samples: usize,
    pub decode_samples: usize,
    pub layers: Vec<LayerFit>,
    pub decode_fixed_ns: f64,
    pub decode_ns_per_token: f64,
    pub decode_max_rel_error: f64,
    /// Worst relative error over all layers and decode steps.
    pub max_rel_error: f64,
}

fn features(shape: RequestShape) -> [f64; 3] {
    let (n, p) = (f64::from(shape.input_tokens), f64::from(shape.prefix_tokens));
    [1.0, n, n * p + n * (n + 1.0) / 2.0]
}

fn max_rel_error<const K: usize>(coef: &[f64; K], samples: &[Sample<K>]) -> f64 {
    samples.iter().filter(|s| s.y > 0.0).map(|s| (predict(coef, &s.x) - s.y).abs() / s.y).fold(0.0, f64::max)
}

impl Profiler {
    pub fn new(layers: u32) -> Result<Self, SchedError> {
        if layers == 0 {
            return Err(SchedError::Profile("a model has at least one layer".into()));
        }
        Ok(Profiler { layers, requests: BTreeMap::new(), decode: Vec::new() })
    }

    /// A prefill with this shape starts; its layers follow as [`Profiler::record_layer`].
    pub fn begin_request(&mut self, request_id: u64, shape: RequestShape) -> Result<(), SchedError> {
        if shape.input_tokens == 0 {
            return Err(SchedError::Profile(format!(
                "request {request_id}: a prefill computes at least one token"
            )));
        }
        if self.requests.contains_key(&request_id) {
            return Err(SchedError::Profile(format!("request {request_id} began twice")));
        }
        let layer_ns = vec![None; self.layers as usize];
        self.requests.insert(request_id, RequestTimings { shape, layer_ns });
        Ok(())
    }

    /// Layer `layer` of request `request_id` computed from `start_ns` to `end_ns`.
    pub fn record_layer(
        &mut self,
        request_id: u64,
        layer: u32,
        start_ns: u64,
        end_ns: u64,
    ) -> Result<(), SchedError> {
        let layers = self.layers;
        let req = self.requests.get_mut(&request_id).ok_or_else(|| {
            SchedError::Profile(format!("layer timing for request {request_id}, which never began"))
        })?;
        if layer >= layers {
            return Err(SchedError::Profile(format!(
                "request {request_id}: layer {layer} but the model has {layers}"
            )));
        }
        if end_ns < start_ns {
            return Err(SchedError::Profile(format!(
                "request {request_id} layer {layer}: ends at {end_ns} ns before it starts at {start_ns} ns"
            )));
        }
        let slot = &mut req.layer_ns[layer as usize];
        if slot.is_some() {
            return Err(SchedError::Profile(format!("request {request_id} layer {layer} recorded twice")));
        }
        *slot = Some(end_ns - start_ns);
        Ok(())
    }

    /// One decode step of request `request_id` with `context_tokens` of KV.
    pub fn record_decode_step(
        &mut self,
        request_id: u64,
        context_tokens: u32,
        start_ns: u64,
        end_ns: u64,
    ) -> Result<(), SchedError> {
        if end_ns < start_ns {
            return Err(SchedError::Profile(format!(
                "request {request_id} decode step: ends at {end_ns} ns before it starts at {start_ns} ns"
            )));
        }
        self.decode.push((context_tokens, end_ns - start_ns));
        Ok(())
    }

    pub fn ingest(&mut self, record: TraceRecord) -> Result<(), SchedError> {
        match record {
            TraceRecord::Request { request, input_tokens, prefix_tokens } => {
                self.begin_request(request, RequestShape::new(input_tokens, prefix_tokens))
            }
            TraceRecord::Layer { request, layer, start_ns, end_ns } => {
                self.record_layer(request, layer, start_ns, end_ns)
            }
            TraceRecord::Decode { request, context_tokens, start_ns, end_ns } => {
                self.record_decode_step(request, context_tokens, start_ns, end_ns)
            }
        }
    }

    /// Read a JSON-lines trace (format in [`TraceRecord`]'s module docs); returns records read.
    pub fn ingest_jsonl(&mut self, reader: impl BufRead) -> Result<usize, SchedError> {
        trace::read_jsonl(reader, |r| self.ingest(r))
    }

    /// Fit the timings and evaluate the fit on `grid`.
    pub fn build(
        &self,
        identity: Identity,
        grid: TableGrid,
        io: IoPartition,
        source: &str,
    ) -> Result<(SlackTable, FitReport), SchedError> {
        io.validate()?;
        if identity.layers != self.layers {
            return Err(SchedError::Profile(format!(
                "identity says {} layers, the trace was recorded for {}",
                identity.layers, self.layers
            )));
        }
        let mut layer_coef = Vec::with_capacity(self.layers as usize);
        let mut fits = Vec::with_capacity(self.layers as usize);
        let mut layer_samples = 0;
        for layer in 0..self.layers {
            let samples: Vec<Sample<3>> = self
                .requests
                .values()
                .filter_map(|r| {
                    r.layer_ns[layer as usize].map(|ns| Sample { x: features(r.shape), y: ns as f64 })
                })
                .collect();
            if samples.is_empty() {
                return Err(SchedError::Profile(format!("no timing recorded for layer {layer}")));
            }
            let coef = nnls_relative(&samples).ok_or_else(|| {
                SchedError::Profile(format!(
                    "layer {layer}: cannot fit {} samples; record requests of several different shapes",
                    samples.len()
                ))
            })?;
            layer_samples += samples.len();
            fits.push(LayerFit {
                layer,
                samples: samples.len(),
                fixed_ns: coef[0],
                ns_per_token: coef[1],
                ns_per_attention_unit: coef[2],
                max_rel_error: max_rel_error(&coef, &samples),
            });
            layer_coef.push(coef);
        }
        let decode_samples: Vec<Sample<2>> =
            self.decode.iter().map(|&(c, ns)| Sample { x: [1.0, f64::from(c)], y: ns as f64 }).collect();
        if decode_samples.is_empty() {
            return Err(SchedError::Profile(
                "no decode steps recorded; decode slack cannot be profiled".into(),
            ));
        }
        let decode_coef = nnls_relative(&decode_samples)
            .ok_or_else(|| SchedError::Profile("cannot fit the decode steps".into()))?;
        let decode_err = max_rel_error(&decode_coef, &decode_samples);
        let table = SlackTable::from_fn(
            identity,
            source,
            grid,
            |n, p, l| io.entry(predict(&layer_coef[l as usize], &features(RequestShape::new(n, p)))),
            |c| io.entry(predict(&decode_coef, &[1.0, f64::from(c)])),
        )?;
        let max_layer_err = fits.iter().map(|f| f.max_rel_error).fold(0.0, f64::max);
        let report = FitReport {
            requests: self.requests.len(),
            layer_samples,
            decode_samples: decode_samples.len(),
            layers: fits,
            decode_fixed_ns: decode_coef[0],
            decode_ns_per_token: decode_coef[1],
            decode_max_rel_error: decode_err,
            max_rel_error: max_layer_err.max(decode_err),
        };
        tracing::info!(
            requests = report.requests,
            max_rel_error = report.max_rel_error,
            "slack table fitted"
        );
        Ok((table, report))
    }

    /// A table straight from a compute model (no engine attached).
    pub fn from_model(model: &ComputeModel, grid: TableGrid) -> Result<SlackTable, SchedError> {
        model.geometry.validate()?;
        model.gpu.validate()?;
        let io = model.gpu.io_partition();
        SlackTable::from_fn(
            model.identity(),
            format!("model:{}@{}", model.geometry.name, model.gpu.name),
            grid,
            |n, p, _| io.entry(model.prefill_layer_ns(n, p)),
            |c| io.entry(model.decode_step_ns(c)),
        )
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
