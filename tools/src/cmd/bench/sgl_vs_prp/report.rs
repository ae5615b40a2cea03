//! What `tutti bench sgl-vs-prp` reports: the JSON rows, the text table and the plot.

use super::scatter::Mode;
use crate::cmd::bench::common::size_label;
use crate::plot::{line_chart, table, Series};

/// One (object size, piece size, mode) configuration.
#[derive(serde::Serialize)]
pub struct Row {
    pub object_bytes: u64,
    pub piece_bytes: u64,
    pub pieces_per_object: u64,
    pub mode: Mode,
    pub label: &'static str,
    pub objects: u64,
    /// Bytes read per pass.
    pub bytes_read: u64,
    /// Bytes compared with the source, over all passes.
    pub bytes_verified: u64,
    pub source_checksum: String,
    pub read_checksum: String,
    pub pass_seconds: Vec<f64>,
    /// Median pass.
    pub seconds: f64,
    pub gb_per_sec: f64,
    /// Bandwidth over the PRP+list row of the same size and pieces.
    pub ratio_vs_prp: Option<f64>,
    pub ns_per_command: f64,
    /// Process CPU (every thread: executor lanes and emulated controllers included)
    /// over the timed passes, per 10^9 bytes read.
    pub process_cpu_s_per_gb: f64,
    pub commands_per_object: f64,
    pub descriptors_per_object: f64,
    pub desc_bytes_per_object: f64,
    pub list_bytes_per_object: f64,
    /// Objects of this size in `pool_bytes`, and the table (16 B per command plus lists) they need.
    pub pool_objects: u64,
    pub pool_table_bytes: u64,
}

#[derive(serde::Serialize)]
pub struct Report {
    pub host: crate::cmd::bench::common::Host,
    pub media: String,
    pub drives: Vec<String>,
    pub executor: String,
    /// Largest command of the slowest drive (MDTS), bytes.
    pub max_transfer: u64,
    pub page: u64,
    pub sgl_supported: bool,
    pub bytes_per_pass: u64,
    pub passes: u32,
    pub pool_bytes: u64,
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
}

fn piece_label(r: &Row) -> String {
    if r.pieces_per_object == 1 {
        "object".into()
    } else {
        format!("{} x {}", r.pieces_per_object, size_label(r.piece_bytes))
    }
}

pub fn text(r: &Report) -> String {
    let pool = size_label(r.pool_bytes);
    let headers = [
        "object",
        "pieces",
        "mode",
        "GB/s",
        "vs PRP+list",
        "CPU s/GB",
        "cmds/obj",
        "desc B/obj",
        "list B/obj",
        &format!("table, {pool} pool"),
        "verified",
    ];
    let rows: Vec<Vec<String>> = r
        .rows
        .iter()
        .map(|x| {
            vec![
                size_label(x.object_bytes),
                piece_label(x),
                x.label.to_string(),
                gbps(x.gb_per_sec),
                x.ratio_vs_prp.map_or("-".into(), |v| format!("{v:.2}x")),
                format!("{:.3}", x.process_cpu_s_per_gb),
                format!("{:.0}", x.commands_per_object),
                format!("{:.0}", x.desc_bytes_per_object),
                format!("{:.0}", x.list_bytes_per_object),
                crate::report::bytes(x.pool_table_bytes),
                crate::report::bytes(x.bytes_verified),
            ]
        })
        .collect();
    let mut out = format!(
        "sgl-vs-prp on {} ({}), {} executor; largest command {}, {} read per pass, median of {} passes; \
         host: {}\n\n",
        r.media,
        r.drives.join(", "),
        r.executor,
        size_label(r.max_transfer),
        size_label(r.bytes_per_pass),
        r.passes,
        r.host.describe()
    );
    out.push_str(&table(&headers, &rows));
    let speed = if r.media.starts_with("VFIO") {
        "through VFIO: on real drives an SSD's speed; under QEMU, QEMU's NVMe emulation, not an SSD's"
    } else {
        "emulated media: the emulated controller's copy speed on this host, not an SSD's"
    };
    out.push_str(&format!(
        "\nGB/s = 10^9 bytes/s from the drives into scattered host memory ({speed}).\n\
         CPU s/GB: process CPU seconds (every thread: executor lanes and emulated controllers included) \
         per 10^9 bytes, over the timed passes.\n\
         desc B/obj: 16 B per command (SGL1 or PRP1+PRP2) plus list entries; list B/obj: list memory as \
         allocated (SGL segments packed, PRP lists in whole pages);\ntable: 16 B per command plus list \
         memory, for every object of the pool.\n"
    ));
    for n in &r.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    out
}

pub fn plot(r: &Report) -> String {
    let mut series: Vec<Series> = Vec::new();
    for x in &r.rows {
        let name = format!(
            "{}, {}",
            x.label,
            if x.pieces_per_object == 1 {
                "objects contiguous".to_string()
            } else {
                format!("{} pieces", size_label(x.piece_bytes))
            }
        );
        match series.iter_mut().find(|s| s.name == name) {
            Some(s) => s.points.push((x.object_bytes as f64, x.gb_per_sec)),
            None => series.push(Series::new(name, vec![(x.object_bytes as f64, x.gb_per_sec)])),
        }
    }
    line_chart(
        &format!("SGL vs PRP reads into scattered memory: {}, {} executor", r.media, r.executor),
        "object size (bytes)",
        "GB/s",
        true,
        &series,
    )
}

/// Three significant digits, whatever the scale (QEMU's controller is far slower than the emulator).
fn gbps(v: f64) -> String {
    match v {
        v if v >= 10.0 => format!("{v:.1}"),
        v if v >= 0.1 => format!("{v:.2}"),
        v if v >= 0.001 => format!("{v:.4}"),
        v => format!("{v:.2e}"),
    }
}
