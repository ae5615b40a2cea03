//! `tutti simulate`: the layer-wise prefill/decode pipeline model, sweeping the cache hit rate.

use std::path::PathBuf;

use anyhow::{bail, Context};
use tutti_scheduler::sim::{self, PolicyKind, SimConfig, SsdConfig, SweepReport, Workload};
use tutti_scheduler::{ComputeModel, GpuModel, ModelGeometry, OnlineConfig, Profiler, SlackTable, TableGrid};

/// Model and GPU the compute times come from (defaults: Llama-3-8B on an H100-class GPU).
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// Model name; slack tables are tied to it.
    #[arg(long, default_value_t = ModelGeometry::llama3_8b().name)]
    pub model: String,
    #[arg(long, default_value_t = ModelGeometry::llama3_8b().layers)]
    pub layers: u32,
    #[arg(long, default_value_t = ModelGeometry::llama3_8b().hidden)]
    pub hidden: u32,
    /// Query heads.
    #[arg(long, default_value_t = ModelGeometry::llama3_8b().heads)]
    pub heads: u32,
    #[arg(long, default_value_t = ModelGeometry::llama3_8b().kv_heads)]
    pub kv_heads: u32,
    #[arg(long, default_value_t = ModelGeometry::llama3_8b().head_dim)]
    pub head_dim: u32,
    /// FFN intermediate size.
    #[arg(long, default_value_t = ModelGeometry::llama3_8b().ffn)]
    pub ffn: u32,
    #[arg(long, default_value_t = ModelGeometry::llama3_8b().vocab)]
    pub vocab: u32,
    /// Bytes per KV element (2 for BF16).
    #[arg(long, default_value_t = ModelGeometry::llama3_8b().dtype_bytes)]
    pub dtype_bytes: u32,
    /// Tokens per KV block; one IOCB moves the K or V of one block in one layer.
    #[arg(long, default_value_t = ModelGeometry::llama3_8b().block_tokens)]
    pub block_tokens: u32,
    /// GPU name; slack tables are tied to it.
    #[arg(long, default_value_t = GpuModel::h100_class().name)]
    pub gpu: String,
    /// Achieved TFLOP/s of the projection/FFN GEMMs.
    #[arg(long, default_value_t = GpuModel::h100_class().linear_tflops)]
    pub tflops: f64,
    /// Achieved TFLOP/s of attention [default: --tflops].
    #[arg(long)]
    pub attention_tflops: Option<f64>,
    /// Achieved HBM bandwidth, GB/s (decode steps).
    #[arg(long, default_value_t = GpuModel::h100_class().hbm_gbps)]
    pub hbm_gbps: f64,
    /// Fixed cost per layer (launches, norms, small operators), microseconds.
    #[arg(long, default_value_t = GpuModel::h100_class().layer_overhead_ns as f64 / 1000.0)]
    pub layer_overhead_us: f64,
    /// SMs reserved for the I/O kernel (the SM budget).
    #[arg(long, default_value_t = GpuModel::h100_class().io_sms)]
    pub io_sms: u32,
    /// IOCBs one I/O SM issues and reaps per microsecond.
    #[arg(long, default_value_t = GpuModel::h100_class().iocbs_per_sm_per_us)]
    pub iocbs_per_sm_per_us: f64,
}

impl ModelArgs {
    pub fn compute_model(&self) -> anyhow::Result<ComputeModel> {
        if !(self.layer_overhead_us.is_finite() && self.layer_overhead_us >= 0.0) {
            bail!("--layer-overhead-us must be >= 0, got {}", self.layer_overhead_us);
        }
        let geometry = ModelGeometry {
            name: self.model.clone(),
            layers: self.layers,
            hidden: self.hidden,
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            ffn: self.ffn,
            vocab: self.vocab,
            dtype_bytes: self.dtype_bytes,
            block_tokens: self.block_tokens,
        };
        let gpu = GpuModel {
            name: self.gpu.clone(),
            linear_tflops: self.tflops,
            attention_tflops: self.attention_tflops.unwrap_or(self.tflops),
            hbm_gbps: self.hbm_gbps,
            layer_overhead_ns: (self.layer_overhead_us * 1000.0).round() as u64,
            io_sms: self.io_sms,
            iocbs_per_sm_per_us: self.iocbs_per_sm_per_us,
        };
        Ok(ComputeModel::new(geometry, gpu)?)
    }
}

/// Compare load-all, layer-wise, slack-aware and slack-aware+online policies over a hit-rate sweep.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Drives in the SSD array (data striped evenly).
    #[arg(long, default_value_t = SsdConfig::default().drives)]
    pub drives: usize,
    /// Array read bandwidth with no writes in flight, GB/s.
    #[arg(long, default_value_t = SsdConfig::default().read_gbps)]
    pub read_gbps: f64,
    /// Array write bandwidth with no reads in flight, GB/s.
    #[arg(long, default_value_t = SsdConfig::default().write_gbps)]
    pub write_gbps: f64,
    /// Array bandwidth while reads and writes share the drives, GB/s (the collapse).
    #[arg(long, default_value_t = SsdConfig::default().mixed_gbps)]
    pub mixed_gbps: f64,
    /// Share of the mixed bandwidth reads get.
    #[arg(long, default_value_t = SsdConfig::default().mixed_read_share)]
    pub mixed_read_share: f64,
    /// Per-batch command latency, microseconds.
    #[arg(long, default_value_t = SsdConfig::default().command_latency_us)]
    pub latency_us: f64,
    /// Tokens per request (cached prefix + new input).
    #[arg(long, default_value_t = Workload::default().context_tokens)]
    pub context: u32,
    /// Requests run back to back at each hit rate.
    #[arg(long, default_value_t = Workload::default().requests)]
    pub requests: u32,
    /// Decode steps after each prefill.
    #[arg(long, default_value_t = Workload::default().decode_steps)]
    pub decode_steps: u32,
    /// HBM that may hold KV not yet written, MiB.
    #[arg(long, default_value_t = SimConfig::default().backlog_mib)]
    pub backlog_mib: u64,
    /// Overstate every profiled slack window by this fraction (0.3 = a profile 30% too optimistic).
    #[arg(long, default_value_t = 0.0)]
    pub profile_optimism: f64,
    /// Fraction of each window the scheduler keeps free of writes.
    #[arg(long, default_value_t = SimConfig::default().write_guard)]
    pub write_guard: f64,
    /// Bubble (% of prefill compute) under which a hit rate counts as hidden.
    #[arg(long, default_value_t = SimConfig::default().crossover_threshold_pct)]
    pub threshold_pct: f64,
    /// Slack table (from `tutti profile`) for policies c and d [default: profile the compute model].
    #[arg(long)]
    pub table: Option<PathBuf>,
    /// Hit rates to sweep, comma-separated, ascending [default: 0 to 0.99, finer near the top].
    #[arg(long, value_delimiter = ',')]
    pub hit_rates: Option<Vec<f64>>,
    /// Policies to compare: any of a, b, c, d.
    #[arg(long, value_delimiter = ',', default_value = "a,b,c,d")]
    pub policies: Vec<char>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also write a plot of bubble time vs hit rate as SVG.
    #[arg(long)]
    pub svg: Option<PathBuf>,
}

fn policies(letters: &[char]) -> anyhow::Result<Vec<PolicyKind>> {
    let mut out = Vec::new();
    for &c in letters {
        let p = PolicyKind::ALL.into_iter().find(|p| p.letter() == c.to_ascii_lowercase()).with_context(
            || format!("unknown policy '{c}': use a (load-all), b (layer-wise), c (slack), d (slack+online)"),
        )?;
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

impl Args {
    fn config(&self) -> anyhow::Result<SimConfig> {
        Ok(SimConfig {
            model: self.model.compute_model()?,
            ssd: SsdConfig {
                drives: self.drives,
                read_gbps: self.read_gbps,
                write_gbps: self.write_gbps,
                mixed_gbps: self.mixed_gbps,
                mixed_read_share: self.mixed_read_share,
                command_latency_us: self.latency_us,
            },
            workload: Workload {
                context_tokens: self.context,
                requests: self.requests,
                decode_steps: self.decode_steps,
            },
            backlog_mib: self.backlog_mib,
            profile_optimism: self.profile_optimism,
            online: OnlineConfig::default(),
            write_guard: self.write_guard,
            crossover_threshold_pct: self.threshold_pct,
        })
    }
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let cfg = args.config()?;
    let policies = policies(&args.policies)?;
    let hit_rates = args.hit_rates.clone().unwrap_or_else(sim::default_hit_rates);
    let table = match &args.table {
        Some(path) => SlackTable::load(path, &cfg.model.identity())?,
        None => Profiler::from_model(&cfg.model, TableGrid::standard()?)?,
    };
    let bar = crate::progress::count_bar(0, "simulate", args.json);
    let report = sim::sweep(&cfg, &policies, &hit_rates, &table, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    if let Some(path) = &args.svg {
        std::fs::write(path, bubble_chart(&report)).with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        return crate::report::print_json(&report);
    }
    print_table(&report);
    if let Some(path) = &args.svg {
        println!("plot written to {}", path.display());
    }
    Ok(())
}

/// Bubble time against hit rate, one curve per policy, log-scale bubble: all hit rates next to a
/// zoom on the high ones where the policies part ways; dots where each crosses the threshold.
fn bubble_chart(r: &SweepReport) -> String {
    use crate::plot::{render, Axis, Chart, Panel, Series};
    let c = &r.config;
    let threshold = c.crossover_threshold_pct;
    let max_pct = r.runs.iter().map(|x| x.bubble_pct).fold(threshold, f64::max);
    let y = Axis {
        log: true,
        range: Some((0.1, 10f64.powf(max_pct.log10().ceil()).max(10.0))),
        ..Axis::new("GPU bubble, % of prefill compute")
    };
    let panel = |title: &str, lo: f64, step: f64| Panel {
        title: title.into(),
        x: Axis { range: Some((lo, 1.0)), step: Some(step), ..Axis::new("cache hit rate") },
        y: y.clone(),
        hline: Some(threshold),
    };
    let panels = [panel("all hit rates", 0.0, 0.1), panel("zoom: 0.85 – 1.0", 0.85, 0.05)];
    let series: Vec<Series> = r
        .policies
        .iter()
        .map(|&p| {
            let crossover = r.crossover(p);
            let label = match crossover.map(|x| (x.hit_rate, x.beyond_sweep)) {
                Some((Some(h), false)) => format!("{:.1}%", h * 100.0),
                Some((Some(h), true)) => format!("> {:.0}%", h * 100.0),
                Some((None, _)) => "none".into(),
                None => "n/a".into(),
            };
            Series {
                dashed: p == PolicyKind::SlackOnline,
                marks: crossover.and_then(|x| x.hit_rate).map(|h| (h, threshold)).into_iter().collect(),
                ..Series::new(
                    format!("{} (crossover {label})", p.label()),
                    r.series(p).iter().map(|m| (m.hit_rate, m.bubble_pct)).collect(),
                )
            }
        })
        .collect();
    let optimism = if c.profile_optimism != 0.0 {
        format!(", profile {:+.0}% slack", c.profile_optimism * 100.0)
    } else {
        String::new()
    };
    let subtitle = format!(
        "{} on {}, {}K-token requests, {} SSDs at {}/{}/{} GB/s read/write/mixed{optimism}; dotted line: {}% threshold, dots: crossover",
        c.model.geometry.name,
        c.model.gpu.name,
        c.workload.context_tokens / 1024,
        c.ssd.drives,
        c.ssd.read_gbps,
        c.ssd.write_gbps,
        c.ssd.mixed_gbps,
        threshold
    );
    render(&Chart {
        title: "GPU bubble (% of prefill compute) vs cache hit rate",
        subtitle: Some(&subtitle),
        panels: &panels,
        series: &series,
    })
}

fn print_table(r: &SweepReport) {
    let c = &r.config;
    let g = &c.model.geometry;
    println!(
        "{} on {}: {} layers, {} KiB KV/token; {}K-token requests x{}, {} decode steps; {} SSDs {}/{}/{} GB/s read/write/mixed",
        g.name,
        c.model.gpu.name,
        g.layers,
        g.kv_bytes_per_token() / 1024,
        c.workload.context_tokens / 1024,
        c.workload.requests,
        c.workload.decode_steps,
        c.ssd.drives,
        c.ssd.read_gbps,
        c.ssd.write_gbps,
        c.ssd.mixed_gbps
    );
    println!("slack profile for c/d: {}", r.table_source);
    println!();
    println!(
        "{:>6}  {:<15} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9}",
        "hit",
        "policy",
        "TTFT ms",
        "bubble ms",
        "bubble%",
        "stall ms",
        "read GB/s",
        "wr GB/s",
        "peak MiB",
        "defer MiB"
    );
    for &h in &r.hit_rates {
        for m in r.runs.iter().filter(|m| m.hit_rate == h) {
            println!(
                "{:>6.2}  {:<15} {:>9.1} {:>9.2} {:>8.1} {:>8.2} {:>8.1} {:>8.1} {:>9.0} {:>9.0}",
                m.hit_rate,
                m.policy.label(),
                m.ttft_ms,
                m.bubble_ms,
                m.bubble_pct,
                m.stall_ms,
                m.read_gbps,
                m.write_gbps,
                m.backlog_peak_mib,
                m.deferred_mib
            );
        }
    }
    println!();
    println!("crossover (highest hit rate with bubble < {}% of prefill compute):", c.crossover_threshold_pct);
    for x in &r.crossovers {
        let v = match (x.hit_rate, x.beyond_sweep) {
            (Some(h), false) => format!("{:.1}%", h * 100.0),
            (Some(h), true) => format!("above {:.1}% (the highest swept)", h * 100.0),
            (None, _) => "none (bubble over the threshold at every hit rate)".into(),
        };
        println!("  {:<15} {v}", x.policy.label());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_letters_parse_and_reject_unknowns() {
        assert_eq!(policies(&['d', 'a', 'D']).unwrap(), vec![PolicyKind::LoadAll, PolicyKind::SlackOnline]);
        assert!(policies(&['x']).unwrap_err().to_string().contains("unknown policy 'x'"));
    }

    #[test]
    fn model_flags_default_to_the_library_model() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            model: ModelArgs,
        }
        let cli = Cli::parse_from(["t"]);
        assert_eq!(cli.model.compute_model().unwrap(), ComputeModel::llama3_8b_h100());
    }
}
