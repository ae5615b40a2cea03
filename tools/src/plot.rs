//! Output of every report with a picture: one hand-written SVG chart (one or more panels side by
//! side, linear or log axes, optional reference line and marks) and a plain-text table.

use std::fmt::Write;

/// One curve of a chart, drawn in every panel over the part of its x range the panel shows.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// Drawn dashed (to tell apart curves that may lie on top of each other).
    pub dashed: bool,
    /// Points marked with a larger dot (for example where a curve crosses a threshold).
    pub marks: Vec<(f64, f64)>,
}

impl Series {
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
        Series { name: name.into(), points, dashed: false, marks: Vec::new() }
    }
}

/// One axis of a panel.
#[derive(Debug, Clone, Default)]
pub struct Axis {
    pub label: String,
    /// log10 scale.
    pub log: bool,
    /// Shown range; `None` fits the data (a linear y axis then starts at zero). On a log y axis,
    /// values outside the range are drawn at its edge (a floor for "negligible").
    pub range: Option<(f64, f64)>,
    /// Distance between ticks of a linear axis; `None` picks a round one.
    pub step: Option<f64>,
}

impl Axis {
    pub fn new(label: impl Into<String>) -> Axis {
        Axis { label: label.into(), ..Axis::default() }
    }
}

/// One frame of a chart.
#[derive(Debug, Clone)]
pub struct Panel {
    pub title: String,
    pub x: Axis,
    pub y: Axis,
    /// A dotted horizontal reference line at this y.
    pub hline: Option<f64>,
}

/// A chart: a title, an optional subtitle, panels side by side, and the series every panel draws.
pub struct Chart<'a> {
    pub title: &'a str,
    pub subtitle: Option<&'a str>,
    pub panels: &'a [Panel],
    pub series: &'a [Series],
}

const WIDTH: f64 = 920.0;
const HEIGHT: f64 = 460.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 620.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 390.0;
/// Several panels: legend in a row under the title instead of a column on the right.
const WIDE: f64 = 980.0;
const WIDE_HEIGHT: f64 = 480.0;
const WIDE_TOP: f64 = 100.0;
const WIDE_BOTTOM: f64 = 412.0;
const COLORS: [&str; 8] =
    ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];

/// An SVG line chart in one panel (one curve per series, legend, axis ticks, optional log10 x).
///
/// The y axis starts at zero; points with a non-finite coordinate, or a non-positive x on a log
/// axis, are left out rather than drawn at a made-up place.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, log_x: bool, series: &[Series]) -> String {
    let panel = Panel {
        title: String::new(),
        x: Axis { log: log_x, ..Axis::new(x_label) },
        y: Axis::new(y_label),
        hline: None,
    };
    render(&Chart { title, subtitle: None, panels: &[panel], series })
}

/// A scale from data to page coordinates along one axis.
struct Scale {
    log: bool,
    lo: f64,
    hi: f64,
    from: f64,
    to: f64,
}

impl Scale {
    fn f(&self, v: f64) -> f64 {
        if self.log {
            v.log10()
        } else {
            v
        }
    }
    fn at(&self, v: f64) -> f64 {
        self.from + (self.f(v) - self.lo) / (self.hi - self.lo) * (self.to - self.from)
    }
}

/// The chart as a standalone SVG document.
pub fn render(c: &Chart<'_>) -> String {
    let wide = c.panels.len() > 1;
    let (width, height, top, bottom) =
        if wide { (WIDE, WIDE_HEIGHT, WIDE_TOP, WIDE_BOTTOM) } else { (WIDTH, HEIGHT, TOP, BOTTOM) };
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="24" text-anchor="middle" font-size="15">{}</text>"#,
        width / 2.0,
        escape(c.title)
    );
    if let Some(sub) = c.subtitle {
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="42" text-anchor="middle" font-size="12">{}</text>"#,
            width / 2.0,
            escape(sub)
        );
    }
    let n = c.panels.len().max(1) as f64;
    let (first, gap) = if wide { (70.0, 70.0) } else { (LEFT, 0.0) };
    let span = if wide { (WIDE - 40.0 - first - gap * (n - 1.0)) / n } else { RIGHT - LEFT };
    for (i, p) in c.panels.iter().enumerate() {
        let left = first + i as f64 * (span + gap);
        draw_panel(&mut out, p, c.series, left, left + span, top, bottom);
    }
    for (i, s) in c.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let (x, ly) = if wide {
            (30.0 + (WIDE - 60.0) / c.series.len().max(1) as f64 * i as f64, 66.0)
        } else {
            (RIGHT + 15.0, TOP + 10.0 + i as f64 * 20.0)
        };
        let _ = writeln!(
            out,
            r#"<line x1="{x:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"{}/><text x="{:.1}" y="{:.1}" font-size="12">{}</text>"#,
            x + 25.0,
            dash(s),
            x + 31.0,
            ly + 4.0,
            escape(&s.name)
        );
    }
    out.push_str("</svg>\n");
    out
}

fn dash(s: &Series) -> &'static str {
    if s.dashed {
        r#" stroke-dasharray="6 4""#
    } else {
        ""
    }
}

fn draw_panel(out: &mut String, p: &Panel, series: &[Series], left: f64, right: f64, top: f64, bottom: f64) {
    let in_x = |x: f64| p.x.range.is_none_or(|(lo, hi)| x >= lo - 1e-9 && x <= hi + 1e-9);
    let usable = |&(x, y): &(f64, f64)| {
        // A log y axis with a given range draws what is below it (zero included) on its floor.
        let y_ok = !p.y.log || y > 0.0 || p.y.range.is_some();
        x.is_finite() && y.is_finite() && (!p.x.log || x > 0.0) && y_ok && in_x(x)
    };
    let points = || series.iter().flat_map(|s| s.points.iter().copied()).filter(usable);
    let fx = |x: f64| if p.x.log { x.log10() } else { x };
    let (x_lo, x_hi) = match p.x.range {
        Some((lo, hi)) => (fx(lo), fx(hi)),
        None => {
            let (mut lo, mut hi) = points()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), (x, _)| (lo.min(fx(x)), hi.max(fx(x))));
            if !lo.is_finite() {
                (lo, hi) = (0.0, 1.0);
            }
            if hi - lo < 1e-12 {
                (lo, hi) = (lo - 0.5, hi + 0.5);
            }
            (lo, hi)
        }
    };
    let y_data_max = points().map(|(_, y)| y).fold(0.0f64, f64::max).max(p.hline.unwrap_or(0.0));
    let (y_lo, y_hi, y_ticks) = if p.y.log {
        let (lo, hi) = p.y.range.unwrap_or_else(|| {
            let min = points().map(|(_, y)| y).fold(f64::INFINITY, f64::min);
            let min = if min.is_finite() { min } else { 1.0 };
            (10f64.powf(min.log10().floor()), 10f64.powf(y_data_max.max(min).log10().ceil()).max(10.0 * min))
        });
        let (lo, hi) = (lo.log10(), hi.log10());
        let ticks = (lo.floor() as i32..=hi.ceil() as i32)
            .map(|d| 10f64.powi(d))
            .filter(|v| v.log10() >= lo - 1e-9 && v.log10() <= hi + 1e-9)
            .collect::<Vec<_>>();
        (lo, hi, ticks)
    } else {
        let (lo, hi) = p.y.range.unwrap_or((0.0, y_data_max));
        let (step, top_v) = nice_axis(if hi - lo > 0.0 { hi - lo } else { 1.0 });
        let step = p.y.step.unwrap_or(step);
        let hi = if p.y.range.is_some() { hi } else { lo + top_v };
        let ticks = (0..).map(|i| lo + i as f64 * step).take_while(|y| *y <= hi * (1.0 + 1e-9)).collect();
        (lo, hi, ticks)
    };
    let sx = Scale { log: p.x.log, lo: x_lo, hi: x_hi, from: left, to: right };
    let sy = Scale { log: p.y.log, lo: y_lo, hi: y_hi, from: bottom, to: top };
    // Values outside a log y range sit on its edge; a linear axis keeps its zero floor.
    let py = |y: f64| {
        if p.y.log {
            sy.at(y.clamp(10f64.powf(y_lo), 10f64.powf(y_hi)))
        } else {
            sy.at(y.max(y_lo))
        }
    };

    let _ = writeln!(
        out,
        r##"<rect x="{left:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="none" stroke="#444"/>"##,
        right - left,
        bottom - top
    );
    if !p.title.is_empty() {
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="13">{}</text>"#,
            (left + right) / 2.0,
            top - 8.0,
            escape(&p.title)
        );
    }
    for y in y_ticks {
        let v = py(y);
        let _ = writeln!(
            out,
            r##"<line x1="{left:.1}" y1="{v:.1}" x2="{right:.1}" y2="{v:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end" font-size="11">{}</text>"##,
            left - 5.0,
            v + 4.0,
            number(y)
        );
    }
    let x_ticks = match p.x.step.filter(|_| !p.x.log) {
        Some(step) => {
            let count = ((x_hi - x_lo) / step).round().max(0.0) as usize;
            (0..=count).map(|i| x_lo + i as f64 * step).collect()
        }
        None => x_ticks(x_lo, x_hi, p.x.log),
    };
    for x in x_ticks {
        let h = sx.at(x);
        let _ = writeln!(
            out,
            r##"<line x1="{h:.1}" y1="{bottom:.1}" x2="{h:.1}" y2="{:.1}" stroke="#444"/><text x="{h:.1}" y="{:.1}" text-anchor="middle" font-size="11">{}</text>"##,
            bottom + 4.0,
            bottom + 18.0,
            number((x * 1e6).round() / 1e6)
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="12">{}</text>"#,
        (left + right) / 2.0,
        bottom + 40.0,
        escape(&p.x.label)
    );
    let lx = left - 55.0;
    let _ = writeln!(
        out,
        r#"<text x="{lx:.1}" y="{:.1}" text-anchor="middle" font-size="12" transform="rotate(-90 {lx:.1} {:.1})">{}</text>"#,
        (top + bottom) / 2.0,
        (top + bottom) / 2.0,
        escape(&p.y.label)
    );
    if let Some(h) = p.hline {
        let v = py(h);
        let _ = writeln!(
            out,
            r##"<line x1="{left:.1}" y1="{v:.1}" x2="{right:.1}" y2="{v:.1}" stroke="#888" stroke-dasharray="2 3"/>"##
        );
    }
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<(f64, f64)> = s.points.iter().copied().filter(|p| usable(p)).collect();
        let line: Vec<String> = pts.iter().map(|&(x, y)| format!("{:.1},{:.1}", sx.at(x), py(y))).collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2"{} points="{}"/>"#,
            dash(s),
            line.join(" ")
        );
        for &(x, y) in &pts {
            let _ = writeln!(out, r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"/>"#, sx.at(x), py(y));
        }
        for &(x, y) in s.marks.iter().filter(|p| usable(p)) {
            let _ = writeln!(out, r#"<circle cx="{:.1}" cy="{:.1}" r="5" fill="{color}"/>"#, sx.at(x), py(y));
        }
    }
}

/// A step of 1, 2 or 5 times a power of ten giving about five intervals, and the top it reaches.
fn nice_axis(max: f64) -> (f64, f64) {
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
    (step, (max / step).ceil() * step)
}

/// Tick positions in data units: decades (with 2 and 5 when there are few) on a log axis.
fn x_ticks(lo: f64, hi: f64, log_x: bool) -> Vec<f64> {
    if !log_x {
        let (step, _) = nice_axis(hi - lo);
        let first = (lo / step).ceil() * step;
        return (0..).map(|i| first + i as f64 * step).take_while(|x| *x <= hi + step * 1e-9).collect();
    }
    let mults: &[f64] = if hi - lo < 3.0 { &[1.0, 2.0, 5.0] } else { &[1.0] };
    let mut ticks = Vec::new();
    for d in lo.floor() as i32..=hi.ceil() as i32 {
        for m in mults {
            let v = m * 10f64.powi(d);
            if v.log10() >= lo - 1e-9 && v.log10() <= hi + 1e-9 {
                ticks.push(v);
            }
        }
    }
    ticks
}

/// A tick label: integers without decimals, large values with k/M/G, small ones with few digits.
fn number(v: f64) -> String {
    let a = v.abs();
    let (scaled, suffix) = if a >= 1e9 {
        (v / 1e9, "G")
    } else if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let s = if (scaled - scaled.round()).abs() < 1e-9 {
        format!("{:.0}", scaled)
    } else {
        format!("{scaled:.2}")
    };
    let s = if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s };
    format!("{s}{suffix}")
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn cell(row: &[String], c: usize) -> &str {
    row.get(c).map(String::as_str).unwrap_or("")
}

/// A plain-text table with right-aligned numeric columns.
///
/// A column is numeric when every non-empty cell in it starts with a digit, a sign or a dot;
/// other columns are left-aligned. Short rows are padded with empty cells.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let cols = headers.len().max(rows.iter().map(Vec::len).max().unwrap_or(0));
    let mut width: Vec<usize> = (0..cols).map(|c| headers.get(c).map_or(0, |h| h.chars().count())).collect();
    for r in rows {
        for (c, w) in width.iter_mut().enumerate() {
            *w = (*w).max(cell(r, c).chars().count());
        }
    }
    let numeric: Vec<bool> = (0..cols)
        .map(|c| {
            rows.iter()
                .map(|r| cell(r, c))
                .filter(|s| !s.is_empty())
                .all(|s| s.starts_with(|ch: char| ch.is_ascii_digit() || ch == '-' || ch == '+' || ch == '.'))
        })
        .collect();
    let line = |cells: Vec<&str>| {
        let parts: Vec<String> =
            cells
                .iter()
                .enumerate()
                .map(|(c, s)| {
                    if numeric[c] {
                        format!("{s:>w$}", w = width[c])
                    } else {
                        format!("{s:<w$}", w = width[c])
                    }
                })
                .collect();
        parts.join("  ").trim_end().to_string()
    };
    let mut out = String::new();
    out.push_str(&line((0..cols).map(|c| headers.get(c).copied().unwrap_or("")).collect()));
    out.push('\n');
    out.push_str(&width.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>().join("  "));
    out.push('\n');
    for r in rows {
        out.push_str(&line((0..cols).map(|c| cell(r, c)).collect()));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn polyline_points(svg: &str) -> Vec<Vec<(f64, f64)>> {
        svg.lines()
            .filter(|l| l.starts_with("<polyline"))
            .map(|l| {
                let pts = l.split("points=\"").nth(1).unwrap().split('"').next().unwrap();
                pts.split_whitespace()
                    .map(|p| {
                        let (x, y) = p.split_once(',').unwrap();
                        (x.parse().unwrap(), y.parse().unwrap())
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn line_chart_draws_each_series_inside_the_frame_in_order() {
        let series = [
            Series::new("SGL", vec![(4096.0, 1.0), (65536.0, 3.0), (2097152.0, 4.0)]),
            Series::new("PRP <list>", vec![(4096.0, 0.5), (2097152.0, 2.0)]),
        ];
        let svg = line_chart("bandwidth", "object size (B)", "GB/s", true, &series);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains(">SGL<") && svg.contains("PRP &lt;list&gt;"), "legend names, escaped");
        let lines = polyline_points(&svg);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].len(), 3);
        for (x, y) in lines.iter().flatten() {
            assert!((LEFT..=RIGHT).contains(x) && (TOP..=BOTTOM).contains(y), "({x}, {y}) outside the frame");
        }
        // Log x: 64 KiB sits at (log 65536 - log 4096) / (log 2M - log 4096) = 4/9 of the width.
        let expect = LEFT + 4.0 / 9.0 * (RIGHT - LEFT);
        assert!((lines[0][1].0 - expect).abs() < 0.2, "{} vs {expect}", lines[0][1].0);
        // Larger y is higher on the page.
        assert!(lines[0][2].1 < lines[0][1].1 && lines[0][1].1 < lines[0][0].1);
        assert!(svg.contains(">1M<") || svg.contains(">2M<"), "log ticks labelled with units");
    }

    #[test]
    fn line_chart_leaves_out_unplottable_points() {
        let series = [Series::new("a", vec![(0.0, 1.0), (10.0, f64::NAN), (100.0, 2.0)])];
        let lines = polyline_points(&line_chart("t", "x", "y", true, &series));
        assert_eq!(lines[0].len(), 1, "x = 0 on a log axis and a NaN y are not drawn");
        let empty = line_chart("t", "x", "y", false, &[]);
        assert!(empty.contains("</svg>"));
    }

    #[test]
    fn panels_show_their_x_range_and_a_log_y_axis_keeps_small_values_on_its_floor() {
        let mut s = Series::new("c:slack", vec![(0.0, 0.0), (0.5, 0.01), (0.9, 2.0), (0.95, 40.0)]);
        s.dashed = true;
        s.marks = vec![(0.92, 5.0)];
        let y = Axis { log: true, range: Some((0.1, 100.0)), ..Axis::new("bubble %") };
        let panel = |lo: f64| Panel {
            title: format!("from {lo}"),
            x: Axis { range: Some((lo, 1.0)), step: Some(0.05), ..Axis::new("hit rate") },
            y: y.clone(),
            hline: Some(5.0),
        };
        let svg = render(&Chart {
            title: "t",
            subtitle: Some("sub"),
            panels: &[panel(0.0), panel(0.85)],
            series: &[s],
        });
        let lines = polyline_points(&svg);
        assert_eq!(lines.len(), 2, "one curve per panel");
        // The zoom shows only the points at 0.85 and above.
        assert_eq!(lines[0].len(), 4);
        assert_eq!(lines[1].len(), 2);
        // 0 and 0.01 lie below the 0.1 floor: drawn on it, the bottom of the frame.
        assert!((lines[0][0].1 - WIDE_BOTTOM).abs() < 0.05, "{:?}", lines[0]);
        assert!((lines[0][1].1 - WIDE_BOTTOM).abs() < 0.05, "{:?}", lines[0]);
        // Decades 0.1 .. 100 span the frame: 2 is log 2 - log 0.1 = 1.301 of 3 decades above the floor.
        let expect = WIDE_BOTTOM - 1.301 / 3.0 * (WIDE_BOTTOM - WIDE_TOP);
        assert!((lines[0][2].1 - expect).abs() < 0.2, "{} vs {expect}", lines[0][2].1);
        assert_eq!(svg.matches("stroke-dasharray=\"2 3\"").count(), 2, "the threshold in each panel");
        assert_eq!(svg.matches(r#"r="5""#).count(), 2, "the mark in each panel");
        assert!(svg.contains(">c:slack<") && svg.contains("6 4"), "dashed legend entry");
    }

    #[test]
    fn nice_axis_covers_the_maximum_with_round_steps() {
        assert_eq!(nice_axis(4.3), (1.0, 5.0));
        assert_eq!(nice_axis(37.0), (10.0, 40.0));
        assert_eq!(nice_axis(0.9), (0.2, 1.0));
    }

    #[test]
    fn table_aligns_numbers_right_and_text_left() {
        let t = table(
            &["mode", "GB/s", "cmds"],
            &[vec!["SGL".into(), "12.5".into(), "1".into()], vec!["PRP".into(), "3.25".into(), "128".into()]],
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0], "mode  GB/s  cmds");
        assert_eq!(lines[1], "----  ----  ----");
        assert_eq!(lines[2], "SGL   12.5     1");
        assert_eq!(lines[3], "PRP   3.25   128");
    }
}
