//! Sweeping the cache hit rate and finding each policy's crossover.

use crate::sim::{simulate, PolicyKind, RunMetrics, SimConfig};
use crate::table::SlackTable;
use crate::SchedError;

/// Bisection steps refining a crossover between two swept hit rates.
const BISECT_STEPS: u32 = 12;

/// Highest hit rate at which a policy's bubble stays under the threshold.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Crossover {
    pub policy: PolicyKind,
    /// `None`: the bubble exceeds the threshold even at the lowest hit rate swept.
    pub hit_rate: Option<f64>,
    /// The bubble never reached the threshold: the crossover lies above the highest hit rate swept.
    pub beyond_sweep: bool,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SweepReport {
    pub config: SimConfig,
    /// Where the profile given to (c) and (d) came from.
    pub table_source: String,
    pub hit_rates: Vec<f64>,
    pub policies: Vec<PolicyKind>,
    /// One run per policy and swept hit rate, policy-major.
    pub runs: Vec<RunMetrics>,
    pub crossovers: Vec<Crossover>,
}

impl SweepReport {
    /// The runs of one policy in hit-rate order.
    pub fn series(&self, policy: PolicyKind) -> Vec<&RunMetrics> {
        self.runs.iter().filter(|r| r.policy == policy).collect()
    }

    pub fn crossover(&self, policy: PolicyKind) -> Option<&Crossover> {
        self.crossovers.iter().find(|c| c.policy == policy)
    }

    /// Sum of per-request prefill bubble over the swept hit rates.
    pub fn total_bubble_ms(&self, policy: PolicyKind) -> f64 {
        self.series(policy).iter().map(|r| r.bubble_ms).sum()
    }
}

/// Coarse where little changes, fine near the top where the policies part ways.
pub fn default_hit_rates() -> Vec<f64> {
    vec![0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99]
}

/// Run every policy at every hit rate. `table` is the true profile of `cfg.model`; (c) and (d)
/// receive it scaled by `1 + cfg.profile_optimism`. `progress(done, total)` is called per run.
pub fn sweep(
    cfg: &SimConfig,
    policies: &[PolicyKind],
    hit_rates: &[f64],
    table: &SlackTable,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<SweepReport, SchedError> {
    cfg.validate()?;
    if policies.is_empty() || hit_rates.is_empty() {
        return Err(SchedError::Sim("nothing to sweep: no policies or no hit rates".into()));
    }
    if let Some(h) = hit_rates.iter().find(|h| !(0.0..=1.0).contains(*h)) {
        return Err(SchedError::Sim(format!("hit rate {h} is outside [0, 1]")));
    }
    if hit_rates.windows(2).any(|w| w[0] >= w[1]) {
        return Err(SchedError::Sim("hit rates must be strictly ascending".into()));
    }
    let profile = if cfg.profile_optimism != 0.0 {
        table.with_window_scale(1.0 + cfg.profile_optimism)?
    } else {
        table.clone()
    };
    let total = (policies.len() * (hit_rates.len() + BISECT_STEPS as usize)) as u64;
    let mut done = 0u64;
    let mut runs = Vec::with_capacity(policies.len() * hit_rates.len());
    let mut crossovers = Vec::with_capacity(policies.len());
    let threshold = cfg.crossover_threshold_pct;
    for &policy in policies {
        let mut series = Vec::with_capacity(hit_rates.len());
        for &h in hit_rates {
            series.push(simulate(cfg, policy, h, &profile)?);
            done += 1;
            progress(done, total);
        }
        let first_bad = series.iter().position(|r| r.bubble_pct >= threshold);
        let crossover = match first_bad {
            None => Crossover { policy, hit_rate: hit_rates.last().copied(), beyond_sweep: true },
            Some(0) => Crossover { policy, hit_rate: None, beyond_sweep: false },
            Some(i) => {
                let (mut lo, mut hi) = (hit_rates[i - 1], hit_rates[i]);
                for _ in 0..BISECT_STEPS {
                    let mid = (lo + hi) / 2.0;
                    if simulate(cfg, policy, mid, &profile)?.bubble_pct < threshold {
                        lo = mid;
                    } else {
                        hi = mid;
                    }
                    done += 1;
                    progress(done, total);
                }
                Crossover { policy, hit_rate: Some(lo), beyond_sweep: false }
            }
        };
        if !matches!(first_bad, Some(i) if i > 0) {
            // No bisection was needed: count its share of the total as done.
            done += u64::from(BISECT_STEPS);
            progress(done, total);
        }
        crossovers.push(crossover);
        runs.extend(series);
    }
    Ok(SweepReport {
        config: cfg.clone(),
        table_source: profile.source().to_string(),
        hit_rates: hit_rates.to_vec(),
        policies: policies.to_vec(),
        runs,
        crossovers,
    })
}
