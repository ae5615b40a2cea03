//! One timed phase of the demo: a request stored layer by layer, or looked up, loaded into
//! other engine slots layer by layer and verified; and what each phase measured.

use super::args::Args;
use super::kv::{for_blocks, Kv};
use crate::progress::byte_bar;
use anyhow::bail;
use std::time::Instant;
use tutti_emulator::monotonic_ns;
use tutti_objstore::KvStore;

/// A rate for the text report: GiB/s, or MiB/s below 1 GiB/s (slow media such as QEMU's).
pub(crate) fn rate(gib_per_sec: f64) -> String {
    if gib_per_sec >= 1.0 {
        format!("{gib_per_sec:.2} GiB/s")
    } else {
        format!("{:.1} MiB/s", gib_per_sec * 1024.0)
    }
}

#[derive(serde::Serialize, serde::Deserialize, Default, Clone, Debug)]
pub(crate) struct Phase {
    pub bytes: u64,
    pub seconds: f64,
    pub gib_per_sec: f64,
    pub blocks: u32,
    pub failed_blocks: u32,
    pub nvme_commands: u64,
    pub commands_per_layer: f64,
    /// Calls the host made into the I/O path per layer.
    pub host_calls_per_layer: f64,
    /// Commands per layer whose fields the host wrote (0: the executor built them).
    pub host_built_per_layer: f64,
    /// Host CPU (the submitting thread's) inside the per-layer submissions, µs per layer.
    pub host_submit_us_per_layer: f64,
    /// Host CPU of the jobs' setup (validation, registering the pairs once), µs per layer.
    pub host_setup_us_per_layer: f64,
    pub verified_bytes: u64,
    /// CLOCK_MONOTONIC (ns, the same clock in every process) at the start and end of the
    /// timed part, so the phases of several processes can be laid on one time line.
    pub start_mono_ns: u64,
    pub end_mono_ns: u64,
}

/// Engine slot of chunk `i` on retrieval: rotated by half, so every chunk
/// lands in a different slot from the one it was stored from.
fn slot(i: u32, n: u32) -> u32 {
    (i + n / 2 + (n % 2)) % n.max(1)
}

/// Stores engine blocks 0.. under `hashes`, layer by layer, and commits them.
pub(crate) fn store_request(
    store: &KvStore,
    kv: &Kv,
    hashes: &[tutti_objstore::BlockHash],
    args: &Args,
) -> anyhow::Result<Phase> {
    let g = kv.g;
    let blocks = hashes.len() as u32;
    let src: Vec<u32> = (0..blocks).collect();
    let bar = byte_bar(blocks as u64 * g.file_bytes(), "store", args.json);
    let layer_bytes = blocks as u64 * 2 * g.object_bytes();
    let mut store_phase = Phase { blocks, start_mono_ns: monotonic_ns(), ..Default::default() };
    let t = Instant::now();
    let session = store.begin_store(hashes, &src)?;
    let jobs = (0..g.layers).map(|l| store.submit_store(session, l..l + 1)).collect::<Result<Vec<_>, _>>()?;
    for job in jobs {
        let st = store.wait(job, args.wait())?;
        if !st.done {
            bail!("storing a layer did not finish within {} s (--timeout)", args.timeout);
        }
        store.release(job)?;
        store_phase.nvme_commands += st.commands;
        store_phase.host_calls_per_layer += st.host_calls as f64;
        store_phase.host_built_per_layer += st.host_built as f64;
        store_phase.host_submit_us_per_layer += st.submit_ns as f64 / 1e3;
        store_phase.host_setup_us_per_layer += st.setup_ns as f64 / 1e3;
        bar.inc(layer_bytes);
    }
    let rep = store.commit_store(session)?;
    store_phase.seconds = t.elapsed().as_secs_f64();
    store_phase.end_mono_ns = monotonic_ns();
    bar.finish_and_clear();
    if let Some((i, why)) = rep.failed.first() {
        bail!("{} of {blocks} blocks were not stored; block {i}: {why}", rep.failed.len());
    }
    store_phase.bytes = (rep.stored as u64) * g.file_bytes();
    finish_phase(&mut store_phase, g.layers);
    Ok(store_phase)
}

pub(crate) struct Retrieved {
    pub hits: usize,
    pub phase: Phase,
}

/// Looks the request up, loads the hit prefix into rotated slots layer by
/// layer, and verifies every byte against the KV of `args.seed`.
pub(crate) fn retrieve(
    store: &KvStore,
    kv: &Kv,
    hashes: &[tutti_objstore::BlockHash],
    args: &Args,
    what: &str,
) -> anyhow::Result<Retrieved> {
    retrieve_seed(store, kv, hashes, args, what, args.seed)
}

/// [`retrieve`], verifying against the KV of `seed`.
pub(crate) fn retrieve_seed(
    store: &KvStore,
    kv: &Kv,
    hashes: &[tutti_objstore::BlockHash],
    args: &Args,
    what: &str,
    seed: u64,
) -> anyhow::Result<Retrieved> {
    let g = kv.g;
    let hit = store.lookup(hashes)?;
    let n = hit.hits() as u32;
    let mut phase = Phase { blocks: n, ..Default::default() };
    if n == 0 {
        store.unpin(hit.pin)?;
        return Ok(Retrieved { hits: 0, phase });
    }
    let dst: Vec<u32> = (0..n).map(|i| slot(i, n)).collect();
    let bar = byte_bar(n as u64 * g.file_bytes(), what, args.json);
    phase.start_mono_ns = monotonic_ns();
    let t = Instant::now();
    let job = store.submit_load(&hit.files, &dst, 0..g.layers)?;
    for layer in 0..g.layers {
        let st = store.wait_layer(job, layer, args.wait())?;
        if !st.layer_is_done(layer) {
            bail!("layer {layer} did not load within {} s (--timeout)", args.timeout);
        }
        bar.inc(n as u64 * 2 * g.object_bytes());
    }
    let st = store.release(job)?;
    phase.seconds = t.elapsed().as_secs_f64();
    phase.end_mono_ns = monotonic_ns();
    bar.finish_and_clear();
    store.unpin(hit.pin)?;
    if st.failed > 0 {
        bail!("{} blocks failed to load: {}", st.failed, st.first_error.unwrap_or_default());
    }
    phase.bytes = n as u64 * g.file_bytes();
    phase.nvme_commands = st.commands;
    phase.host_calls_per_layer = st.host_calls as f64;
    phase.host_built_per_layer = st.host_built as f64;
    phase.host_submit_us_per_layer = st.submit_ns as f64 / 1e3;
    phase.host_setup_us_per_layer = st.setup_ns as f64 / 1e3;
    finish_phase(&mut phase, g.layers);
    for_blocks(n, |i| kv.verify(seed, i, dst[i as usize]))?;
    phase.verified_bytes = phase.bytes;
    Ok(Retrieved { hits: n as usize, phase })
}

fn finish_phase(p: &mut Phase, layers: u32) {
    p.gib_per_sec = p.bytes as f64 / p.seconds.max(1e-9) / (1u64 << 30) as f64;
    p.commands_per_layer = p.nvme_commands as f64 / layers as f64;
    p.host_calls_per_layer /= layers as f64;
    p.host_built_per_layer /= layers as f64;
    p.host_submit_us_per_layer /= layers as f64;
    p.host_setup_us_per_layer /= layers as f64;
}
