//! What a method is to the harness, and how its cost is taken: wall time for
//! bandwidth, the calling thread's CPU time for the control path, and the
//! whole process's CPU time for the work done anywhere (executor threads and
//! emulated controllers included).

use super::data::Dataset;
use crate::cmd::bench::common::{cpu_s_per_gb, process_cpu_ns};
use anyhow::bail;
use std::ops::Range;
use std::time::Instant;

/// Host-thread CPU spent on one method's layer calls.
#[derive(Clone, Debug, Default)]
pub struct Calls {
    /// CPU nanoseconds of each layer call, on the calling thread.
    pub cpu_ns: Vec<u64>,
    /// CPU nanoseconds the calling thread spent waiting for layers to finish
    /// (only methods whose call returns before the data has moved).
    pub wait_cpu_ns: u64,
    /// CPU nanoseconds spent once per request before any layer (tutti: one
    /// submit_load's validation and pair registration); 0 for methods without.
    pub setup_cpu_ns: u64,
}

/// A way of moving layers of the request into their engine slots.
pub trait Method {
    /// Short name used in tables and JSON.
    fn name(&self) -> &'static str;
    /// What the method does, in a sentence.
    fn describe(&self) -> String;
    /// Moves `layers` of chunks `0..n` into their slots, one call (or, for
    /// tutti, one submission) per layer, and returns once every byte has arrived.
    fn retrieve(&mut self, ds: &Dataset, n: u32, layers: Range<u32>) -> anyhow::Result<Calls>;
}

/// One method's run over one scenario, verified.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Run {
    pub method: String,
    /// Bytes moved (and verified) by the run.
    pub bytes: u64,
    pub verified_bytes: u64,
    pub verified: bool,
    pub layer_calls: u32,
    /// Runs made; this is the one of median time.
    pub reps: u32,
    pub seconds: f64,
    /// Decimal gigabytes per second over the whole run.
    pub gb_per_s: f64,
    /// Mean host-thread CPU per layer call (the control path), µs.
    pub host_cpu_us_per_layer_call: f64,
    /// The same, per block of the call, ns.
    pub host_cpu_ns_per_block: f64,
    /// Host-thread CPU spent once per request before any layer (tutti's
    /// submit_load: validation and pair registration), µs; 0 for the baselines.
    pub setup_cpu_us_per_request: f64,
    /// `host_cpu_us_per_layer_call` plus the setup spread over the request's layers, µs.
    pub host_cpu_us_per_layer_with_setup: f64,
    /// Host-thread CPU spent waiting per layer (0 for calls that return when done), µs.
    pub wait_cpu_us_per_layer: f64,
    /// CPU of every thread of the process during the run (executor lanes and
    /// emulated controllers included), seconds.
    pub process_cpu_s: f64,
    /// `process_cpu_s` per layer call, µs: beside the host-thread column, the CPU the whole
    /// method cost (for tutti the lanes' polling and the emulated drives' copies; for the
    /// baselines about their host CPU, which already does the copy).
    pub process_cpu_us_per_layer: f64,
    /// The same, per block of the call, ns.
    pub process_cpu_ns_per_block: f64,
    /// `process_cpu_s` per decimal gigabyte moved: the whole cost of the bytes.
    pub process_cpu_s_per_gb: f64,
}

/// Clears the slots, runs `m` over `layers` of chunks `0..n`, and checks every byte.
pub fn run(m: &mut dyn Method, ds: &Dataset, n: u32, layers: Range<u32>) -> anyhow::Result<Run> {
    if n == 0 || n > ds.blocks || layers.is_empty() || layers.end > ds.g.layers {
        bail!(
            "{}: {n} blocks of layers {}..{} is outside the data set ({} blocks, {} layers)",
            m.name(),
            layers.start,
            layers.end,
            ds.blocks,
            ds.g.layers
        );
    }
    ds.clear(n, layers.clone())?;
    let proc0 = process_cpu_ns()?;
    let t = Instant::now();
    let calls = m.retrieve(ds, n, layers.clone())?;
    let seconds = t.elapsed().as_secs_f64();
    let process_ns = process_cpu_ns()?.saturating_sub(proc0) as f64;
    let verified_bytes = ds.verify(n, layers.clone()).map_err(|e| anyhow::anyhow!("{}: {e}", m.name()))?;
    let bytes = n as u64 * layers.len() as u64 * 2 * ds.g.object_bytes();
    let count = calls.cpu_ns.len().max(1) as f64;
    let mean_ns = calls.cpu_ns.iter().sum::<u64>() as f64 / count;
    Ok(Run {
        method: m.name().to_string(),
        bytes,
        verified_bytes,
        verified: verified_bytes == bytes,
        layer_calls: calls.cpu_ns.len() as u32,
        reps: 1,
        seconds,
        gb_per_s: bytes as f64 / seconds.max(1e-9) / 1e9,
        host_cpu_us_per_layer_call: mean_ns / 1e3,
        host_cpu_ns_per_block: mean_ns / n as f64,
        setup_cpu_us_per_request: calls.setup_cpu_ns as f64 / 1e3,
        host_cpu_us_per_layer_with_setup: (mean_ns + calls.setup_cpu_ns as f64 / count) / 1e3,
        wait_cpu_us_per_layer: calls.wait_cpu_ns as f64 / layers.len() as f64 / 1e3,
        process_cpu_s: process_ns / 1e9,
        process_cpu_us_per_layer: process_ns / layers.len() as f64 / 1e3,
        process_cpu_ns_per_block: process_ns / layers.len() as f64 / n as f64,
        process_cpu_s_per_gb: cpu_s_per_gb(process_ns / 1e9, bytes),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tutti_objstore::thread_cpu_ns;

    #[test]
    fn thread_cpu_time_grows_with_work_on_this_thread() {
        let a = thread_cpu_ns();
        let mut x = 1u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
        }
        std::hint::black_box(x);
        let b = thread_cpu_ns();
        assert!(a > 0 && b > a, "thread CPU clock did not advance: {a} -> {b}");
        assert!(process_cpu_ns().unwrap() >= b - a);
    }
}
