//! The timing-trace file `tutti profile --trace` reads: JSON lines, one record per line.
//!
//! ```text
//! {"kind":"request","request":7,"input_tokens":2048,"prefix_tokens":30720}
//! {"kind":"layer","request":7,"layer":0,"start_ns":1000,"end_ns":51000}
//! {"kind":"decode","request":7,"context_tokens":32769,"start_ns":1700000,"end_ns":1707000}
//! ```
//! A `request` record gives the shape of a prefill; `layer` records give the compute interval of
//! each layer of that prefill; `decode` records give one decode step with its context length.
//! Timestamps are nanoseconds on any monotonic clock. Blank lines and lines starting with `#`
//! are skipped.

use std::io::BufRead;

use crate::{ComputeModel, RequestShape, SchedError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum TraceRecord {
    Request { request: u64, input_tokens: u32, prefix_tokens: u32 },
    Layer { request: u64, layer: u32, start_ns: u64, end_ns: u64 },
    Decode { request: u64, context_tokens: u32, start_ns: u64, end_ns: u64 },
}

/// Parse a JSON-lines trace, calling `sink` per record; errors name the line.
pub(crate) fn read_jsonl(
    reader: impl BufRead,
    mut sink: impl FnMut(TraceRecord) -> Result<(), SchedError>,
) -> Result<usize, SchedError> {
    let mut records = 0;
    for (i, line) in reader.lines().enumerate() {
        let line_no = i + 1;
        let line = line.map_err(|e| SchedError::Trace { line: line_no, detail: e.to_string() })?;
        let text = line.trim();
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        let record: TraceRecord = serde_json::from_str(text)
            .map_err(|e| SchedError::Trace { line: line_no, detail: e.to_string() })?;
        sink(record).map_err(|e| match e {
            SchedError::Profile(detail) => SchedError::Trace { line: line_no, detail },
            other => other,
        })?;
        records += 1;
    }
    Ok(records)
}

/// What an engine would record running `model` on these request shapes, each followed by
/// `decode_steps` decode steps. Useful as a worked example of the format and for tests.
pub fn synthetic_trace(model: &ComputeModel, shapes: &[RequestShape], decode_steps: u32) -> Vec<TraceRecord> {
    let mut out = Vec::new();
    let mut t = 0u64;
    for (id, shape) in shapes.iter().enumerate() {
        let request = id as u64;
        out.push(TraceRecord::Request {
            request,
            input_tokens: shape.input_tokens,
            prefix_tokens: shape.prefix_tokens,
        });
        let layer_ns = model.prefill_layer_ns(shape.input_tokens, shape.prefix_tokens).round() as u64;
        for layer in 0..model.geometry.layers {
            out.push(TraceRecord::Layer { request, layer, start_ns: t, end_ns: t + layer_ns });
            t += layer_ns;
        }
        let first = shape.input_tokens + shape.prefix_tokens;
        for context in (first..).take(decode_steps as usize) {
            let step = model.decode_step_ns(context).round() as u64;
            out.push(TraceRecord::Decode { request, context_tokens: context, start_ns: t, end_ns: t + step });
            t += step;
        }
    }
    out
}
