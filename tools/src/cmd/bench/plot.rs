//! Output shared by the benchmarks: a hand-written SVG line chart and a plain-text table.

use std::fmt::Write;

/// One curve of a line chart.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

const WIDTH: f64 = 920.0;
const HEIGHT: f64 = 460.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 620.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 390.0;
const COLORS: [&str; 8] =
    ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];

/// An SVG line chart (one curve per series, legend, axis ticks, optional log10 x axis).
///
/// The y axis starts at zero; points with a non-finite coordinate, or a non-positive x on a log
/// axis, are left out rather than drawn at a made-up place.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, log_x: bool, series: &[Series]) -> String {
    let usable = |&(x, y): &(f64, f64)| x.is_finite() && y.is_finite() && (!log_x || x > 0.0);
    let points = || series.iter().flat_map(|s| s.points.iter().copied()).filter(usable);
    let fx = |x: f64| if log_x { x.log10() } else { x };
    let (mut x_lo, mut x_hi) =
        points().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), (x, _)| (lo.min(fx(x)), hi.max(fx(x))));
    if !x_lo.is_finite() {
        (x_lo, x_hi) = (0.0, 1.0);
    }
    if x_hi - x_lo < 1e-12 {
        (x_lo, x_hi) = (x_lo - 0.5, x_hi + 0.5);
    }
    let y_max = points().map(|(_, y)| y).fold(0.0f64, f64::max);
    let (y_step, y_top) = nice_axis(if y_max > 0.0 { y_max } else { 1.0 });
    let px = |x: f64| LEFT + (fx(x) - x_lo) / (x_hi - x_lo) * (RIGHT - LEFT);
    let py = |y: f64| BOTTOM - y.max(0.0) / y_top * (BOTTOM - TOP);

    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="28" text-anchor="middle" font-size="14">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    );
    let _ = writeln!(
        out,
        r##"<rect x="{LEFT}" y="{TOP}" width="{:.1}" height="{:.1}" fill="none" stroke="#444"/>"##,
        RIGHT - LEFT,
        BOTTOM - TOP
    );
    let mut y = 0.0;
    while y <= y_top * (1.0 + 1e-9) {
        let v = py(y);
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{v:.1}" x2="{RIGHT}" y2="{v:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end" font-size="11">{}</text>"##,
            LEFT - 5.0,
            v + 4.0,
            number(y)
        );
        y += y_step;
    }
    for x in x_ticks(x_lo, x_hi, log_x) {
        let h = px(x);
        let _ = writeln!(
            out,
            r##"<line x1="{h:.1}" y1="{BOTTOM}" x2="{h:.1}" y2="{:.1}" stroke="#444"/><text x="{h:.1}" y="{:.1}" text-anchor="middle" font-size="11">{}</text>"##,
            BOTTOM + 4.0,
            BOTTOM + 18.0,
            number(x)
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="12">{}</text>"#,
        (LEFT + RIGHT) / 2.0,
        BOTTOM + 40.0,
        escape(x_label)
    );
    let _ = writeln!(
        out,
        r#"<text x="20" y="{:.1}" text-anchor="middle" font-size="12" transform="rotate(-90 20 {:.1})">{}</text>"#,
        (TOP + BOTTOM) / 2.0,
        (TOP + BOTTOM) / 2.0,
        escape(y_label)
    );
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<String> = s
            .points
            .iter()
            .filter(|p| usable(p))
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            pts.join(" ")
        );
        for p in s.points.iter().filter(|p| usable(p)) {
            let _ =
                writeln!(out, r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"/>"#, px(p.0), py(p.1));
        }
        let ly = TOP + 10.0 + i as f64 * 20.0;
        let _ = writeln!(
            out,
            r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"/><text x="{:.1}" y="{:.1}" font-size="12">{}</text>"#,
            RIGHT + 15.0,
            RIGHT + 40.0,
            RIGHT + 46.0,
            ly + 4.0,
            escape(&s.name)
        );
    }
    out.push_str("</svg>\n");
    out
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
            Series { name: "SGL".into(), points: vec![(4096.0, 1.0), (65536.0, 3.0), (2097152.0, 4.0)] },
            Series { name: "PRP <list>".into(), points: vec![(4096.0, 0.5), (2097152.0, 2.0)] },
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
        let series = [Series { name: "a".into(), points: vec![(0.0, 1.0), (10.0, f64::NAN), (100.0, 2.0)] }];
        let lines = polyline_points(&line_chart("t", "x", "y", true, &series));
        assert_eq!(lines[0].len(), 1, "x = 0 on a log axis and a NaN y are not drawn");
        let empty = line_chart("t", "x", "y", false, &[]);
        assert!(empty.contains("</svg>"));
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
