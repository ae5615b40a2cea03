//! Hand-written SVG plot of bubble time vs hit rate: one curve per policy, log-scale bubble, a
//! full-range panel next to a zoom on the high hit rates where the policies part ways.

use std::fmt::Write;

use crate::sim::{PolicyKind, SweepReport};

const WIDTH: f64 = 980.0;
const HEIGHT: f64 = 480.0;
const TOP: f64 = 100.0;
const BOTTOM: f64 = 412.0;
/// Bubbles below this (percent of compute) are drawn on the floor of the log axis.
const FLOOR_PCT: f64 = 0.1;

fn style(p: PolicyKind) -> (&'static str, &'static str) {
    match p {
        PolicyKind::LoadAll => ("#d62728", ""),
        PolicyKind::Interleaved => ("#ff7f0e", ""),
        PolicyKind::SlackAware => ("#1f77b4", ""),
        PolicyKind::SlackOnline => ("#2ca02c", " stroke-dasharray=\"6 4\""),
    }
}

struct Panel {
    left: f64,
    right: f64,
    x_min: f64,
    x_max: f64,
    y_max_pct: f64,
}

impl Panel {
    fn x(&self, h: f64) -> f64 {
        self.left + (h - self.x_min) / (self.x_max - self.x_min) * (self.right - self.left)
    }

    fn y(&self, pct: f64) -> f64 {
        let (lo, hi) = (FLOOR_PCT.log10(), self.y_max_pct.log10());
        let v = pct.max(FLOOR_PCT).min(self.y_max_pct).log10();
        BOTTOM - (v - lo) / (hi - lo) * (BOTTOM - TOP)
    }

    fn draw(&self, out: &mut String, report: &SweepReport, title: &str, x_step: f64) {
        let _ = writeln!(
            out,
            r##"<rect x="{:.1}" y="{TOP}" width="{:.1}" height="{:.1}" fill="none" stroke="#444"/>"##,
            self.left,
            self.right - self.left,
            BOTTOM - TOP
        );
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="13">{title}</text>"#,
            (self.left + self.right) / 2.0,
            TOP - 8.0
        );
        let mut decade = FLOOR_PCT;
        while decade <= self.y_max_pct * 1.0001 {
            let y = self.y(decade);
            let _ = writeln!(
                out,
                r##"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end" font-size="11">{}%</text>"##,
                self.left,
                self.right,
                self.left - 4.0,
                y + 4.0,
                trim(decade)
            );
            decade *= 10.0;
        }
        let ticks = ((self.x_max - self.x_min) / x_step).round() as usize;
        for i in 0..=ticks {
            let h = self.x_min + i as f64 * x_step;
            let x = self.x(h);
            let _ = writeln!(
                out,
                r##"<line x1="{x:.1}" y1="{BOTTOM}" x2="{x:.1}" y2="{:.1}" stroke="#444"/><text x="{x:.1}" y="{:.1}" text-anchor="middle" font-size="11">{}</text>"##,
                BOTTOM + 4.0,
                BOTTOM + 17.0,
                trim((h * 100.0).round() / 100.0)
            );
        }
        let threshold = report.config.crossover_threshold_pct;
        let ty = self.y(threshold);
        let _ = writeln!(
            out,
            r##"<line x1="{:.1}" y1="{ty:.1}" x2="{:.1}" y2="{ty:.1}" stroke="#888" stroke-dasharray="2 3"/>"##,
            self.left, self.right
        );
        for &p in &report.policies {
            let (color, dash) = style(p);
            let points: Vec<String> = report
                .series(p)
                .iter()
                .filter(|m| m.hit_rate >= self.x_min - 1e-9 && m.hit_rate <= self.x_max + 1e-9)
                .map(|m| format!("{:.1},{:.1}", self.x(m.hit_rate), self.y(m.bubble_pct)))
                .collect();
            let _ = writeln!(
                out,
                r#"<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{}"/>"#,
                points.join(" ")
            );
            if let Some(h) = report.crossover(p).and_then(|c| c.hit_rate) {
                if h >= self.x_min && h <= self.x_max {
                    let _ =
                        writeln!(out, r#"<circle cx="{:.1}" cy="{ty:.1}" r="4" fill="{color}"/>"#, self.x(h));
                }
            }
        }
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The plot as a standalone SVG document.
pub fn render(report: &SweepReport) -> String {
    let max_pct =
        report.runs.iter().map(|r| r.bubble_pct).fold(report.config.crossover_threshold_pct, f64::max);
    let y_max_pct = 10f64.powf(max_pct.log10().ceil()).max(10.0);
    let full = Panel { left: 70.0, right: 470.0, x_min: 0.0, x_max: 1.0, y_max_pct };
    let zoom = Panel { left: 540.0, right: 940.0, x_min: 0.85, x_max: 1.0, y_max_pct };
    let cfg = &report.config;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let optimism = if cfg.profile_optimism != 0.0 {
        format!(", profile {:+.0}% slack", cfg.profile_optimism * 100.0)
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="22" text-anchor="middle" font-size="16">GPU bubble (% of prefill compute) vs cache hit rate</text>"#,
        WIDTH / 2.0
    );
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="42" text-anchor="middle" font-size="12">{} on {}, {}K-token requests, {} SSDs at {}/{}/{} GB/s read/write/mixed{}</text>"#,
        WIDTH / 2.0,
        cfg.model.geometry.name,
        cfg.model.gpu.name,
        cfg.workload.context_tokens / 1024,
        cfg.ssd.drives,
        cfg.ssd.read_gbps,
        cfg.ssd.write_gbps,
        cfg.ssd.mixed_gbps,
        optimism
    );
    full.draw(&mut out, report, "all hit rates", 0.1);
    zoom.draw(&mut out, report, "zoom: 0.85 – 1.0", 0.05);
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="12">cache hit rate (dotted line: {}% crossover threshold; dots: crossover)</text>"#,
        WIDTH / 2.0,
        BOTTOM + 38.0,
        trim(cfg.crossover_threshold_pct)
    );
    for (i, &p) in report.policies.iter().enumerate() {
        let (color, dash) = style(p);
        let x = 30.0 + 235.0 * i as f64;
        let crossover = match report.crossover(p) {
            Some(c) => match (c.hit_rate, c.beyond_sweep) {
                (Some(h), false) => format!("{:.1}%", h * 100.0),
                (Some(h), true) => format!("> {:.0}%", h * 100.0),
                (None, _) => "none".into(),
            },
            None => "n/a".into(),
        };
        let _ = writeln!(
            out,
            r#"<line x1="{x:.1}" y1="66" x2="{:.1}" y2="66" stroke="{color}" stroke-width="2"{dash}/><text x="{:.1}" y="70" font-size="12">{} (crossover {crossover})</text>"#,
            x + 24.0,
            x + 30.0,
            p.label()
        );
    }
    out.push_str("</svg>\n");
    out
}
