//! *Beyond the paper*: online slack estimation.
//!
//! The profiled table goes stale (new driver, other batch mix, clocks). The engine reports each
//! layer's observed compute time; the estimator keeps an EWMA of `observed / profiled` per
//! (input, prefix) cell and one over all cells, and scales the profiled window by it. A cell
//! never observed uses the global ratio, so one slow layer corrects the whole request.
//!
//! The average is asymmetric: a window shorter than believed means writes overrun into the next
//! layer's reads (a bubble), a longer one only wastes slack, so estimates fall fast and rise slowly.

use std::collections::BTreeMap;

use crate::{SchedError, SlackEntry};

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OnlineConfig {
    /// EWMA weight of a sample below the current estimate.
    pub alpha_down: f64,
    /// EWMA weight of a sample above the current estimate.
    pub alpha_up: f64,
    /// Bounds on the correction ratio (a wild sample cannot zero or explode the slack).
    pub min_ratio: f64,
    pub max_ratio: f64,
}

impl Default for OnlineConfig {
    fn default() -> Self {
        OnlineConfig { alpha_down: 0.5, alpha_up: 0.1, min_ratio: 0.05, max_ratio: 2.0 }
    }
}

impl OnlineConfig {
    pub fn validate(&self) -> Result<(), SchedError> {
        let ok = |a: f64| a > 0.0 && a <= 1.0;
        if !ok(self.alpha_down) || !ok(self.alpha_up) {
            return Err(SchedError::InvalidConfig(format!(
                "online slack alphas must be in (0, 1], got down {} up {}",
                self.alpha_down, self.alpha_up
            )));
        }
        if !(self.min_ratio > 0.0
            && self.min_ratio <= 1.0
            && self.max_ratio >= 1.0
            && self.max_ratio.is_finite())
        {
            return Err(SchedError::InvalidConfig(format!(
                "online slack ratio bounds must satisfy 0 < min <= 1 <= max, got {} and {}",
                self.min_ratio, self.max_ratio
            )));
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
pub struct OnlineSlack {
    config: OnlineConfig,
    cells: BTreeMap<(usize, usize), f64>,
    global: f64,
    decode: Option<f64>,
    samples: u64,
}

impl OnlineSlack {
    pub fn new(config: OnlineConfig) -> Result<Self, SchedError> {
        config.validate()?;
        Ok(OnlineSlack { config, cells: BTreeMap::new(), global: 1.0, decode: None, samples: 0 })
    }

    fn update(&self, estimate: f64, sample: f64) -> f64 {
        let alpha = if sample < estimate { self.config.alpha_down } else { self.config.alpha_up };
        (estimate + alpha * (sample - estimate)).clamp(self.config.min_ratio, self.config.max_ratio)
    }

    fn sample(&self, profiled_ns: u64, observed_ns: u64) -> Option<f64> {
        (profiled_ns > 0).then(|| {
            (observed_ns as f64 / profiled_ns as f64).clamp(self.config.min_ratio, self.config.max_ratio)
        })
    }

    /// A prefill layer of the shape in `cell` was profiled at `profiled_ns` and took `observed_ns`.
    pub fn observe_prefill(&mut self, cell: (usize, usize), profiled_ns: u64, observed_ns: u64) {
        let Some(s) = self.sample(profiled_ns, observed_ns) else { return };
        let prior = self.cells.get(&cell).copied().unwrap_or(self.global);
        let cell_estimate = self.update(prior, s);
        self.cells.insert(cell, cell_estimate);
        self.global = self.update(self.global, s);
        self.samples += 1;
        tracing::trace!(?cell, sample = s, cell_estimate, global = self.global, "online slack sample");
    }

    /// A decode step profiled at `profiled_ns` took `observed_ns`.
    pub fn observe_decode(&mut self, profiled_ns: u64, observed_ns: u64) {
        let Some(s) = self.sample(profiled_ns, observed_ns) else { return };
        let prior = self.decode.unwrap_or(self.global);
        self.decode = Some(self.update(prior, s));
        self.samples += 1;
    }

    pub fn prefill_ratio(&self, cell: (usize, usize)) -> f64 {
        self.cells.get(&cell).copied().unwrap_or(self.global)
    }

    pub fn decode_ratio(&self) -> f64 {
        self.decode.unwrap_or(self.global)
    }

    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Scale a profiled entry's window and IOCB cap by `ratio`.
    pub fn correct(entry: SlackEntry, ratio: f64) -> SlackEntry {
        SlackEntry {
            window_ns: (entry.window_ns as f64 * ratio) as u64,
            sm_budget: entry.sm_budget,
            max_iocbs: (f64::from(entry.max_iocbs) * ratio).min(f64::from(u32::MAX)) as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converges_to_the_observed_ratio_and_falls_faster_than_it_rises() {
        let mut o = OnlineSlack::new(OnlineConfig::default()).unwrap();
        for _ in 0..3 {
            o.observe_prefill((1, 1), 1300, 1000);
        }
        let after_down = o.prefill_ratio((1, 1));
        assert!((after_down - 1000.0 / 1300.0).abs() < 0.04, "{after_down}");
        let mut up = OnlineSlack::new(OnlineConfig::default()).unwrap();
        for _ in 0..3 {
            up.observe_prefill((1, 1), 1000, 1300);
        }
        let after_up = up.prefill_ratio((1, 1));
        assert!(after_up > 1.0 && (after_up - 1.3).abs() > (after_down - 1000.0 / 1300.0).abs());
        for _ in 0..100 {
            up.observe_prefill((1, 1), 1000, 1300);
        }
        assert!((up.prefill_ratio((1, 1)) - 1.3).abs() < 1e-3);
    }

    #[test]
    fn unseen_cells_use_the_global_estimate() {
        let mut o = OnlineSlack::new(OnlineConfig::default()).unwrap();
        assert_eq!(o.prefill_ratio((0, 0)), 1.0);
        for _ in 0..20 {
            o.observe_prefill((3, 4), 1000, 500);
        }
        assert!((o.prefill_ratio((9, 9)) - 0.5).abs() < 1e-3);
        assert!((o.decode_ratio() - 0.5).abs() < 1e-3, "decode falls back to the global ratio");
        o.observe_decode(1000, 1000);
        assert!(o.decode_ratio() > 0.5);
    }

    #[test]
    fn wild_samples_are_bounded_and_zero_profiles_ignored() {
        let mut o = OnlineSlack::new(OnlineConfig::default()).unwrap();
        for _ in 0..50 {
            o.observe_prefill((0, 0), 1, 1_000_000_000);
        }
        assert!(o.prefill_ratio((0, 0)) <= 2.0);
        o.observe_prefill((0, 1), 0, 5);
        assert_eq!(o.samples(), 50);
        let bad = OnlineConfig { alpha_down: 0.0, ..OnlineConfig::default() };
        assert!(OnlineSlack::new(bad).is_err());
    }

    #[test]
    fn correct_scales_window_and_cap() {
        let e = SlackEntry { window_ns: 1000, sm_budget: 4, max_iocbs: 100 };
        assert_eq!(OnlineSlack::correct(e, 0.5), SlackEntry { window_ns: 500, sm_budget: 4, max_iocbs: 50 });
    }
}
