//! The slack table: (input-length bucket, prefix-length bucket, layer) → slack window, SM budget,
//! max IOCBs for prefill, and context-length bucket → the same for decode steps (paper §3.3).
//!
//! On disk it is JSON: `{"format": "tutti-slack-table", "version": 1, "checksum": crc32,
//! "table": {...}}`. Every number in the body is an integer, so the body re-serialises to the
//! same bytes and the CRC-32 over it catches a flipped digit that would otherwise load as a
//! silently wrong slack. A table is tied to the model, GPU and layer count it was profiled for.

use std::path::Path;

use crate::buckets::{Axis, Position};
use crate::{RequestShape, SchedError};

pub const FORMAT_NAME: &str = "tutti-slack-table";
pub const FORMAT_VERSION: u32 = 1;

/// What a table was made for. Loading it for anything else is an error.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Identity {
    pub model: String,
    pub gpu: String,
    pub layers: u32,
}

impl Identity {
    /// Human-readable list of the fields that differ, or `None` if they match.
    pub fn mismatch(&self, expected: &Identity) -> Option<String> {
        let mut diffs = Vec::new();
        if self.model != expected.model {
            diffs.push(format!("model '{}' (expected '{}')", self.model, expected.model));
        }
        if self.gpu != expected.gpu {
            diffs.push(format!("gpu '{}' (expected '{}')", self.gpu, expected.gpu));
        }
        if self.layers != expected.layers {
            diffs.push(format!("{} layers (expected {})", self.layers, expected.layers));
        }
        (!diffs.is_empty()).then(|| diffs.join(", "))
    }
}

/// Slack available while one layer (or one decode step) computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SlackEntry {
    /// Time I/O can run hidden behind compute, nanoseconds.
    pub window_ns: u64,
    /// SMs the I/O kernel may occupy without slowing compute.
    pub sm_budget: u32,
    /// IOCBs the I/O kernel can drive within the window on `sm_budget` SMs.
    pub max_iocbs: u32,
}

/// The bucket axes of a table.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TableGrid {
    pub input: Axis,
    pub prefix: Axis,
    pub decode_context: Axis,
}

impl TableGrid {
    /// Two buckets per octave from 128 to 256K tokens (prefix and decode axes start at 0).
    pub fn standard() -> Result<Self, SchedError> {
        Ok(TableGrid {
            input: Axis::geometric(128, 262_144, 2, false)?,
            prefix: Axis::geometric(128, 262_144, 2, true)?,
            decode_context: Axis::geometric(128, 262_144, 2, true)?,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Columns {
    window_ns: Vec<u64>,
    sm_budget: Vec<u32>,
    max_iocbs: Vec<u32>,
}

impl Columns {
    fn from_entries(entries: &[SlackEntry]) -> Self {
        Columns {
            window_ns: entries.iter().map(|e| e.window_ns).collect(),
            sm_budget: entries.iter().map(|e| e.sm_budget).collect(),
            max_iocbs: entries.iter().map(|e| e.max_iocbs).collect(),
        }
    }

    fn into_entries(self, what: &str, expected: usize) -> Result<Vec<SlackEntry>, String> {
        let lens = [self.window_ns.len(), self.sm_budget.len(), self.max_iocbs.len()];
        if lens.iter().any(|&l| l != expected) {
            return Err(format!("{what} has columns of lengths {lens:?}, the grid needs {expected}"));
        }
        Ok((0..expected)
            .map(|i| SlackEntry {
                window_ns: self.window_ns[i],
                sm_budget: self.sm_budget[i],
                max_iocbs: self.max_iocbs[i],
            })
            .collect())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Body {
    identity: Identity,
    source: String,
    grid: TableGrid,
    prefill: Columns,
    decode: Columns,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct FileHeader {
    format: String,
    version: u64,
    checksum: u32,
    table: serde_json::Value,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SlackTable {
    identity: Identity,
    source: String,
    grid: TableGrid,
    /// Indexed `[input][prefix][layer]`.
    prefill: Vec<SlackEntry>,
    /// Indexed by decode-context bucket.
    decode: Vec<SlackEntry>,
}

impl SlackTable {
    /// Fill a table from functions of (input tokens, prefix tokens, layer) and decode context.
    pub fn from_fn(
        identity: Identity,
        source: impl Into<String>,
        grid: TableGrid,
        mut prefill: impl FnMut(u32, u32, u32) -> SlackEntry,
        mut decode: impl FnMut(u32) -> SlackEntry,
    ) -> Result<Self, SchedError> {
        if identity.layers == 0 {
            return Err(SchedError::InvalidTable("identity has 0 layers".into()));
        }
        let mut entries = Vec::with_capacity(grid.input.len() * grid.prefix.len() * identity.layers as usize);
        for &n in grid.input.points() {
            for &p in grid.prefix.points() {
                for l in 0..identity.layers {
                    entries.push(prefill(n, p, l));
                }
            }
        }
        let decode = grid.decode_context.points().iter().map(|&c| decode(c)).collect();
        Ok(SlackTable { identity, source: source.into(), grid, prefill: entries, decode })
    }

    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// Where the numbers came from ("model:...", "trace:...").
    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn grid(&self) -> &TableGrid {
        &self.grid
    }

    pub fn layers(&self) -> u32 {
        self.identity.layers
    }

    fn index(&self, i: usize, p: usize, layer: u32) -> usize {
        (i * self.grid.prefix.len() + p) * self.identity.layers as usize + layer as usize
    }

    /// The stored entry at bucket indices (no interpolation).
    pub fn entry(&self, input_bucket: usize, prefix_bucket: usize, layer: u32) -> Option<SlackEntry> {
        if input_bucket >= self.grid.input.len() || prefix_bucket >= self.grid.prefix.len() {
            return None;
        }
        if layer >= self.identity.layers {
            return None;
        }
        self.prefill.get(self.index(input_bucket, prefix_bucket, layer)).copied()
    }

    /// Nearest (input, prefix) bucket of a shape — the cell the online estimator keys on.
    pub fn cell_of(&self, shape: RequestShape) -> (usize, usize) {
        let i = self.grid.input.locate(f64::from(shape.input_tokens)).nearest();
        let p = self.grid.prefix.locate(f64::from(shape.prefix_tokens)).nearest();
        (i, p)
    }

    /// Slack for `layer` of a prefill with this shape, bilinearly interpolated between buckets
    /// (window and IOCBs rounded down; SM budget the smallest of the neighbours). Shapes
    /// outside the grid clamp to its edge.
    pub fn lookup(&self, shape: RequestShape, layer: u32) -> Result<SlackEntry, SchedError> {
        if layer >= self.identity.layers {
            return Err(SchedError::LayerOutOfRange { layer, layers: self.identity.layers });
        }
        let pi = self.grid.input.locate(f64::from(shape.input_tokens));
        let pp = self.grid.prefix.locate(f64::from(shape.prefix_tokens));
        let corners = [
            (pi.lo, pp.lo, (1.0 - pi.weight_hi) * (1.0 - pp.weight_hi)),
            (pi.lo, pp.hi, (1.0 - pi.weight_hi) * pp.weight_hi),
            (pi.hi, pp.lo, pi.weight_hi * (1.0 - pp.weight_hi)),
            (pi.hi, pp.hi, pi.weight_hi * pp.weight_hi),
        ];
        Ok(blend(corners.iter().map(|&(i, p, w)| (self.prefill[self.index(i, p, layer)], w))))
    }

    /// Slack of one decode step with `context_tokens` of KV, linearly interpolated.
    pub fn decode_lookup(&self, context_tokens: u32) -> SlackEntry {
        let Position { lo, hi, weight_hi } = self.grid.decode_context.locate(f64::from(context_tokens));
        blend([(self.decode[lo], 1.0 - weight_hi), (self.decode[hi], weight_hi)].into_iter())
    }

    /// A copy whose windows and IOCB caps are scaled by `factor` — e.g. 1.3 for a profile made
    /// 30% too optimistic (what-if studies in the simulator).
    pub fn with_window_scale(&self, factor: f64) -> Result<SlackTable, SchedError> {
        if !(factor.is_finite() && factor > 0.0) {
            return Err(SchedError::InvalidTable(format!("window scale must be > 0, got {factor}")));
        }
        let scale = |e: &SlackEntry| SlackEntry {
            window_ns: (e.window_ns as f64 * factor).round() as u64,
            sm_budget: e.sm_budget,
            max_iocbs: (f64::from(e.max_iocbs) * factor).min(f64::from(u32::MAX)) as u32,
        };
        Ok(SlackTable {
            identity: self.identity.clone(),
            source: format!("{} (windows x{factor})", self.source),
            grid: self.grid.clone(),
            prefill: self.prefill.iter().map(scale).collect(),
            decode: self.decode.iter().map(scale).collect(),
        })
    }

    fn body(&self) -> Body {
        Body {
            identity: self.identity.clone(),
            source: self.source.clone(),
            grid: self.grid.clone(),
            prefill: Columns::from_entries(&self.prefill),
            decode: Columns::from_entries(&self.decode),
        }
    }

    pub fn to_json(&self) -> Result<String, SchedError> {
        let body = self.body();
        let bytes = serde_json::to_vec(&body).map_err(|e| SchedError::InvalidTable(e.to_string()))?;
        let table = serde_json::to_value(&body).map_err(|e| SchedError::InvalidTable(e.to_string()))?;
        let header = FileHeader {
            format: FORMAT_NAME.into(),
            version: u64::from(FORMAT_VERSION),
            checksum: crc32fast::hash(&bytes),
            table,
        };
        serde_json::to_string(&header).map_err(|e| SchedError::InvalidTable(e.to_string()))
    }

    /// Parse a table file's text; `origin` names it in errors. No identity check.
    pub fn from_json(text: &str, origin: &str) -> Result<SlackTable, SchedError> {
        let corrupt = |detail: String| SchedError::Corrupt { path: origin.into(), detail };
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| corrupt(e.to_string()))?;
        match value.get("format").and_then(|f| f.as_str()) {
            Some(FORMAT_NAME) => {}
            Some(other) => return Err(corrupt(format!("format is '{other}', expected '{FORMAT_NAME}'"))),
            None => return Err(corrupt("no \"format\" field".into())),
        }
        // Check the version before the body so a newer file says "version", not "missing field".
        let version =
            value.get("version").and_then(|v| v.as_u64()).ok_or_else(|| corrupt("no version".into()))?;
        if version != u64::from(FORMAT_VERSION) {
            return Err(SchedError::Version {
                path: origin.into(),
                found: version,
                expected: FORMAT_VERSION,
            });
        }
        let header: FileHeader = serde_json::from_value(value).map_err(|e| corrupt(e.to_string()))?;
        let body: Body = serde_json::from_value(header.table).map_err(|e| corrupt(e.to_string()))?;
        let bytes = serde_json::to_vec(&body).map_err(|e| corrupt(e.to_string()))?;
        let computed = crc32fast::hash(&bytes);
        if computed != header.checksum {
            return Err(SchedError::Checksum { path: origin.into(), stored: header.checksum, computed });
        }
        let layers = body.identity.layers as usize;
        if layers == 0 {
            return Err(corrupt("identity has 0 layers".into()));
        }
        for (name, axis) in [
            ("input", &body.grid.input),
            ("prefix", &body.grid.prefix),
            ("decode_context", &body.grid.decode_context),
        ] {
            Axis::new(axis.points().to_vec()).map_err(|e| corrupt(format!("{name} axis: {e}")))?;
        }
        let cells = body.grid.input.len() * body.grid.prefix.len() * layers;
        let prefill = body.prefill.into_entries("prefill", cells).map_err(corrupt)?;
        let decode = body.decode.into_entries("decode", body.grid.decode_context.len()).map_err(corrupt)?;
        Ok(SlackTable { identity: body.identity, source: body.source, grid: body.grid, prefill, decode })
    }

    /// Load a table and check it was made for `expected`.
    pub fn load(path: &Path, expected: &Identity) -> Result<SlackTable, SchedError> {
        let table = Self::load_unchecked(path)?;
        if let Some(mismatch) = table.identity.mismatch(expected) {
            return Err(SchedError::IdentityMismatch { path: path.display().to_string(), mismatch });
        }
        Ok(table)
    }

    /// Load a table without an identity check (for inspection tools).
    pub fn load_unchecked(path: &Path) -> Result<SlackTable, SchedError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|source| SchedError::Io { path: origin.clone(), source })?;
        Self::from_json(&text, &origin)
    }

    /// Write the table (to a temporary file renamed into place, so a crash leaves no half file).
    pub fn save(&self, path: &Path) -> Result<(), SchedError> {
        let origin = path.display().to_string();
        let json = self.to_json()?;
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = std::path::PathBuf::from(tmp);
        let io = |source| SchedError::Io { path: origin.clone(), source };
        std::fs::write(&tmp, json).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)?;
        tracing::debug!(path = %origin, model = %self.identity.model, gpu = %self.identity.gpu, "slack table saved");
        Ok(())
    }
}

fn blend(parts: impl Iterator<Item = (SlackEntry, f64)>) -> SlackEntry {
    let (mut window, mut iocbs, mut sms) = (0.0, 0.0, u32::MAX);
    for (e, w) in parts {
        if w <= 0.0 {
            continue;
        }
        window += w * e.window_ns as f64;
        iocbs += w * f64::from(e.max_iocbs);
        sms = sms.min(e.sm_budget);
    }
    // A weight of exactly 0 everywhere cannot happen (weights sum to 1), but keep the type total.
    let sms = if sms == u32::MAX { 0 } else { sms };
    // Tolerate float error at exact bucket hits before rounding down.
    SlackEntry {
        window_ns: (window + 1e-6).floor() as u64,
        sm_budget: sms,
        max_iocbs: (iocbs + 1e-6).floor() as u32,
    }
}

#[cfg(test)]
#[path = "table_tests.rs"]
mod tests;
