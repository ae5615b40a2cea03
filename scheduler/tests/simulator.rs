//! What the pipeline model says with its defaults (Llama-3-8B-like, H100-class, the paper's
//! two-drive array). Every expectation is a relation between outputs computed here.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tutti_scheduler::sim::{
    default_hit_rates, simulate, sweep, PolicyKind, SimConfig, SsdConfig, SweepReport,
};
use tutti_scheduler::{Profiler, SlackTable, TableGrid};

fn table(cfg: &SimConfig) -> SlackTable {
    Profiler::from_model(&cfg.model, TableGrid::standard().unwrap()).unwrap()
}

fn run(cfg: &SimConfig) -> SweepReport {
    sweep(cfg, &PolicyKind::ALL, &default_hit_rates(), &table(cfg), &mut |_, _| {}).unwrap()
}

fn crossover(r: &SweepReport, p: PolicyKind) -> f64 {
    r.crossover(p).and_then(|c| c.hit_rate).unwrap_or_else(|| panic!("{} has no crossover", p.label()))
}

#[test]
fn slack_aware_crosses_over_later_than_layerwise_and_layerwise_later_than_load_all() {
    let r = run(&SimConfig::default());
    let [a, b, c, d] = PolicyKind::ALL.map(|p| crossover(&r, p));
    assert!(b > a, "layer-wise {b} vs load-all {a}");
    assert!(c > b, "slack-aware {c} vs layer-wise {b}");
    assert!(d > b, "slack-aware+online {d} vs layer-wise {b}");
    for p in PolicyKind::ALL {
        assert!(!r.crossover(p).unwrap().beyond_sweep, "{} never crossed over", p.label());
    }
}

#[test]
fn online_slack_beats_a_profile_made_30_percent_too_optimistic() {
    let cfg = SimConfig { profile_optimism: 0.3, ..SimConfig::default() };
    let r = run(&cfg);
    let (c, d) = (r.total_bubble_ms(PolicyKind::SlackAware), r.total_bubble_ms(PolicyKind::SlackOnline));
    assert!(d < c, "online {d} ms vs stale profile {c} ms");
    assert!(crossover(&r, PolicyKind::SlackOnline) >= crossover(&r, PolicyKind::SlackAware));
    // Per hit rate, correcting the profile never makes things worse.
    for (rc, rd) in r.series(PolicyKind::SlackAware).iter().zip(r.series(PolicyKind::SlackOnline)) {
        assert!(
            rd.bubble_ms <= rc.bubble_ms + 1e-6,
            "h={}: {} > {}",
            rc.hit_rate,
            rd.bubble_ms,
            rc.bubble_ms
        );
    }
    // And the stale profile does hurt (c) relative to an accurate one.
    let accurate = run(&SimConfig::default());
    assert!(c > accurate.total_bubble_ms(PolicyKind::SlackAware));
}

#[test]
fn slack_aware_never_mixes_reads_and_writes_on_a_drive_but_layerwise_does() {
    let r = run(&SimConfig::default());
    for p in [PolicyKind::SlackAware, PolicyKind::SlackOnline] {
        for m in r.series(p) {
            assert_eq!(m.mixed_ms, 0.0, "{} mixed at h={}", p.label(), m.hit_rate);
        }
    }
    let b = r.series(PolicyKind::Interleaved);
    assert!(b.iter().any(|m| m.mixed_ms > 0.0));
    // Mixing shows as a lower achieved read bandwidth than the reads-only policies get.
    let mid = |p| r.series(p).into_iter().find(|m| (m.hit_rate - 0.5).abs() < 1e-9).unwrap().read_gbps;
    assert!(mid(PolicyKind::Interleaved) < mid(PolicyKind::SlackAware));
}

#[test]
fn every_kv_byte_is_read_and_written_exactly_once_and_ttft_is_compute_plus_bubble() {
    let cfg = SimConfig::default();
    let t = table(&cfg);
    let g = &cfg.model.geometry;
    let w = cfg.workload;
    for p in PolicyKind::ALL {
        for h in [0.0, 0.37, 0.9, 0.99] {
            let m = simulate(&cfg, p, h, &t).unwrap();
            let req = f64::from(w.requests);
            let kv_layer = g.kv_bytes_per_token_layer() as f64 / (1024.0 * 1024.0);
            let reads = req * f64::from(g.layers) * f64::from(m.prefix_tokens) * kv_layer;
            let new_blocks = f64::from(m.input_tokens.div_ceil(g.block_tokens));
            let decode_blocks = f64::from(w.decode_steps / g.block_tokens);
            let block_mib = f64::from(g.block_tokens) * kv_layer * f64::from(g.layers);
            let writes = req * (new_blocks + decode_blocks) * block_mib;
            assert!((m.read_mib - reads).abs() < 1e-3, "{} h={h}: read {} vs {reads}", p.label(), m.read_mib);
            assert!(
                (m.written_mib - writes).abs() < 1e-3,
                "{} h={h}: wrote {} vs {writes}",
                p.label(),
                m.written_mib
            );
            assert!((m.ttft_ms - m.prefill_compute_ms - m.bubble_ms).abs() < 1e-6, "{m:?}");
            assert_eq!(m.prefix_tokens + m.input_tokens, w.context_tokens);
        }
    }
}

#[test]
fn load_all_bubble_is_the_whole_read_at_read_bandwidth() {
    let cfg = SimConfig::default();
    let m = simulate(&cfg, PolicyKind::LoadAll, 0.5, &table(&cfg)).unwrap();
    let read_ms = m.read_mib * 1024.0 * 1024.0 / f64::from(cfg.workload.requests) / (cfg.ssd.read_gbps * 1e6);
    assert!(m.bubble_ms >= read_ms, "{} < {read_ms}", m.bubble_ms);
    assert!(m.bubble_ms < read_ms * 1.05, "{} vs {read_ms}", m.bubble_ms);
}

#[test]
fn a_small_backlog_stalls_visibly_and_is_never_exceeded() {
    // Writes four times slower than compute produces KV, and room for two layers of it.
    let cfg = SimConfig {
        ssd: SsdConfig { write_gbps: 1.0, mixed_gbps: 1.0, ..SsdConfig::default() },
        workload: tutti_scheduler::sim::Workload { context_tokens: 4096, requests: 2, decode_steps: 32 },
        backlog_mib: 32,
        ..SimConfig::default()
    };
    let t = table(&cfg);
    for p in PolicyKind::ALL {
        let m = simulate(&cfg, p, 0.0, &t).unwrap();
        assert!(m.stall_ms > 0.0, "{}: no stall with a full backlog", p.label());
        assert!(m.backlog_peak_mib <= 32.0, "{}: peak {} MiB", p.label(), m.backlog_peak_mib);
        assert!((m.bubble_ms - m.stall_ms).abs() < 1e-9, "at 0% hit rate every bubble is a stall");
    }
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let cfg = SimConfig::default();
    let t = table(&cfg);
    assert!(simulate(&cfg, PolicyKind::SlackAware, 1.5, &t).unwrap_err().to_string().contains("1.5"));
    let mut other = cfg.clone();
    other.model.geometry.layers = 80;
    let e = simulate(&other, PolicyKind::SlackAware, 0.5, &t).unwrap_err().to_string();
    assert!(e.contains("32 layers (expected 80)"), "{e}");
    let tiny = SimConfig { backlog_mib: 1, ..SimConfig::default() };
    assert!(simulate(&tiny, PolicyKind::LoadAll, 0.5, &t).unwrap_err().to_string().contains("backlog"));
    let e = sweep(&cfg, &PolicyKind::ALL, &[0.5, 0.2], &t, &mut |_, _| {}).unwrap_err().to_string();
    assert!(e.contains("ascending"), "{e}");
}

#[test]
fn progress_reaches_its_total() {
    let cfg = SimConfig::default();
    // The first sweep bisects both crossovers; in the second neither policy ever crosses over.
    for hit_rates in [&[0.0, 0.5, 0.99][..], &[0.0, 0.1][..]] {
        let (mut last, mut total) = (0, 0);
        let policies = [PolicyKind::Interleaved, PolicyKind::SlackAware];
        sweep(&cfg, &policies, hit_rates, &table(&cfg), &mut |d, t| {
            assert!(d >= last && d <= t);
            (last, total) = (d, t);
        })
        .unwrap();
        assert_eq!(last, total);
    }
}
