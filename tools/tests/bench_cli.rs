//! `tutti bench sgl-vs-prp` and `tutti bench commands` through the binary at
//! small sizes: what the reports say about correctness (bytes read are the
//! bytes stored, every mode moved the same data, command counts follow the
//! sizes and the transfer limit). Speed is never checked.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use std::process::{Command, Output};

fn tutti(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tutti")).arg("bench").args(args).output().expect("run tutti")
}

fn json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["--json", "--quiet"]);
    let out = tutti(&all);
    assert!(out.status.success(), "tutti bench {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON report")
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("{v} is not an unsigned integer"))
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("{v} is not a number"))
}

/// Two drives, 32K largest command (MDTS 3), two sizes on both sides of it, both layouts.
const SMALL: [&str; 16] = [
    "sgl-vs-prp",
    "--sizes",
    "16K,128K",
    "--pieces",
    "object,4K",
    "--bytes",
    "1M",
    "--passes",
    "2",
    "--emulated",
    "2",
    "--mdts",
    "3",
    "--capacity-mib",
    "4",
    "--pool-bytes",
];

#[test]
fn sgl_and_prp_read_the_same_verified_bytes_with_the_expected_commands() {
    let mut args = SMALL.to_vec();
    args.push("1G");
    let r = json(&args);
    assert_eq!(u(&r["max_transfer"]), 32 << 10);
    assert_eq!(r["drives"].as_array().map(Vec::len), Some(2));
    let rows = r["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2 * 2 * 3, "sizes x layouts x modes");
    for row in rows {
        let (size, mode) = (u(&row["object_bytes"]), row["mode"].as_str().unwrap_or(""));
        let what = format!("{size} {} {mode}", u(&row["piece_bytes"]));
        let objects = u(&row["objects"]);
        assert_eq!(objects, (1 << 20) / size, "{what}");
        assert_eq!(u(&row["bytes_read"]), objects * size, "{what}");
        assert_eq!(u(&row["bytes_verified"]), 2 * objects * size, "{what}: both passes compared in full");
        assert_eq!(row["read_checksum"], row["source_checksum"], "{what}");
        assert_eq!(row["pass_seconds"].as_array().map(Vec::len), Some(2));
        let per_command = if mode == "prp-inline" { 8 << 10 } else { 32 << 10 };
        assert_eq!(f(&row["commands_per_object"]), size.div_ceil(per_command) as f64, "{what}");
        assert_eq!(u(&row["pool_objects"]), (1 << 30) / size);
        assert!(f(&row["gb_per_sec"]) > 0.0);
        assert!(f(&row["process_cpu_s_per_gb"]) > 0.0, "{what}: process CPU per GB is measured");
    }
    // Within one (size, layout) every mode read the same bytes as every other.
    for group in rows.chunks(3) {
        let first = &group[0];
        for row in group {
            assert_eq!(row["object_bytes"], first["object_bytes"]);
            assert_eq!(row["piece_bytes"], first["piece_bytes"]);
            assert_eq!(row["bytes_read"], first["bytes_read"]);
            assert_eq!(row["read_checksum"], first["read_checksum"]);
        }
        let modes: Vec<&str> = group.iter().filter_map(|r| r["mode"].as_str()).collect();
        assert_eq!(modes, ["sgl", "prp", "prp-inline"]);
        assert_eq!(f(&group[1]["ratio_vs_prp"]), 1.0, "PRP with lists is the baseline");
    }
    // Contiguous 128K objects: SGL is one 16-byte Data Block per command and needs no list;
    // PRP needs a list page per command (8 pages each).
    let find = |size: u64, piece: u64, mode: &str| {
        rows.iter()
            .find(|r| u(&r["object_bytes"]) == size && u(&r["piece_bytes"]) == piece && r["mode"] == mode)
            .unwrap_or_else(|| panic!("no row {size} {piece} {mode}"))
    };
    let sgl = find(128 << 10, 128 << 10, "sgl");
    assert_eq!(f(&sgl["desc_bytes_per_object"]), 4.0 * 16.0);
    assert_eq!(f(&sgl["list_bytes_per_object"]), 0.0);
    assert_eq!(u(&sgl["pool_table_bytes"]), 8192 * 4 * 16);
    let prp = find(128 << 10, 128 << 10, "prp");
    assert_eq!(f(&prp["desc_bytes_per_object"]), 4.0 * (16.0 + 7.0 * 8.0));
    assert_eq!(u(&prp["pool_table_bytes"]), 8192 * 4 * (16 + 4096));
    // 4K pieces: every page is its own Data Block, in a list.
    let scattered = find(16 << 10, 4096, "sgl");
    assert_eq!(u(&scattered["pieces_per_object"]), 4);
    assert_eq!(f(&scattered["descriptors_per_object"]), 4.0);
    assert_eq!(f(&scattered["list_bytes_per_object"]), 64.0);
}

#[test]
fn drives_without_sgl_leave_the_sgl_rows_out_and_say_so() {
    let r = json(&[
        "sgl-vs-prp",
        "--sizes",
        "8K",
        "--bytes",
        "256K",
        "--passes",
        "1",
        "--sgl",
        "off",
        "--capacity-mib",
        "4",
    ]);
    assert_eq!(r["sgl_supported"], false);
    let rows = r["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2 * 2, "layouts x the two PRP modes");
    assert!(rows.iter().all(|row| row["mode"] != "sgl" && row["read_checksum"] == row["source_checksum"]));
    assert!(r["notes"][0].as_str().unwrap_or("").contains("SGL"));
}

#[test]
fn the_svg_has_one_curve_per_mode_and_layout() {
    let path = std::env::temp_dir().join(format!("tutti-bench-{}.svg", std::process::id()));
    let p = path.to_str().expect("utf-8 temp path");
    let out = tutti(&[
        "sgl-vs-prp",
        "--sizes",
        "8K,16K",
        "--pieces",
        "object",
        "--bytes",
        "256K",
        "--passes",
        "1",
        "--quiet",
        "--capacity-mib",
        "4",
        "--svg",
        p,
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("PRP+list") && text.contains("vs PRP+list"), "{text}");
    let svg = std::fs::read_to_string(&path).expect("SVG written");
    let _ = std::fs::remove_file(&path);
    assert_eq!(svg.matches("<polyline").count(), 3);
    assert!(svg.contains("SGL, objects contiguous"));
}

#[test]
fn bad_sizes_are_refused_with_the_reason() {
    for (args, says) in [
        (vec!["sgl-vs-prp", "--sizes", "6000"], "multiple of 4K"),
        (vec!["sgl-vs-prp", "--sizes", "32K", "--pieces", "12K", "--bytes", "64K"], "divides"),
        (vec!["sgl-vs-prp", "--sizes", "2M", "--bytes", "1M"], "less than one object"),
        (vec!["sgl-vs-prp", "--sizes", "32Q"], "unknown unit"),
        (vec!["commands", "--read-bytes", "100"], "multiple of 512"),
    ] {
        let out = tutti(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

#[test]
fn command_rates_cover_every_path_and_batch_and_the_reads_are_checked() {
    let r = json(&["commands", "--batches", "1,8", "--seconds", "0.05", "--capacity-mib", "4"]);
    assert_eq!(u(&r["read_bytes"]), 4096);
    assert_eq!(r["data_pointer"], "SGL");
    // The read buffer (8 reads of 4K) is checked after the queue pair and each gio mode.
    assert_eq!(u(&r["bytes_verified"]), 4 * 8 * 4096);
    let results = r["results"].as_array().expect("results");
    let nop_ok = r["io_uring_unavailable"].is_null();
    for path in ["IoQueuePair", "gio launch", "gio persistent", "gio inline"] {
        for batch in [1u64, 8] {
            let m = results
                .iter()
                .find(|m| m["path"] == path && u(&m["batch"]) == batch)
                .unwrap_or_else(|| panic!("no {path} at batch {batch}"));
            let n = u(&m["commands"]);
            assert!(n >= 3 * batch && n.is_multiple_of(batch), "{path} {batch}: {n} commands");
            assert_eq!(
                m["ratio_vs_nop"].is_null(),
                !nop_ok,
                "{path}: a ratio exactly when there is a baseline"
            );
        }
    }
    if nop_ok {
        assert_eq!(results.iter().filter(|m| m["path"] == "io_uring NOP").count(), 2);
    } else {
        eprintln!("io_uring is not available here: {}", r["io_uring_unavailable"]);
    }
}

#[test]
fn command_breakdown_times_every_stage_and_the_copy_and_null_media_rows_are_there() {
    let r =
        json(&["commands", "--batches", "1,8", "--seconds", "0.05", "--capacity-mib", "4", "--breakdown"]);
    let stages = r["breakdown"].as_array().expect("breakdown");
    for (path, n) in [("IoQueuePair", 4), ("gio persistent", 6)] {
        for batch in [1u64, 8] {
            let got: Vec<_> =
                stages.iter().filter(|s| s["path"] == path && u(&s["batch"]) == batch).collect();
            assert_eq!(got.len(), n, "{path} batch {batch}: {n} stages");
            for s in got {
                // Every traced batch is counted (a span the controller did not see is dropped).
                assert!(u(&s["batches"]) > 0, "{path} {batch} {}: no traced batch", s["stage"]);
                assert!(s["median_ns"].is_i64(), "{s}");
            }
        }
    }
    let results = r["results"].as_array().expect("results");
    for path in ["memcpy", "IoQueuePair null media"] {
        for batch in [1u64, 8] {
            let m = results
                .iter()
                .find(|m| m["path"] == path && u(&m["batch"]) == batch)
                .unwrap_or_else(|| panic!("no {path} at batch {batch}"));
            assert!(u(&m["commands"]) >= 3 * batch, "{path} {batch}");
        }
    }
    // Only the four real-media paths are verified: null media moves nothing.
    assert_eq!(u(&r["bytes_verified"]), 4 * 8 * 4096);
    // Without --breakdown nothing is traced.
    let plain = json(&["commands", "--batches", "1", "--seconds", "0.05", "--capacity-mib", "4"]);
    assert_eq!(plain["breakdown"].as_array().map(Vec::len), Some(0));
}

#[test]
fn client_and_in_process_loads_report_process_cpu_per_gb() {
    let r = json(&["client", "--blocks", "4", "--layers", "4", "--loads", "3", "--lookups", "10"]);
    for side in ["in_process", "client"] {
        let cpu = f(&r[side]["process_cpu_s_per_gb"]);
        assert!(cpu > 0.0 && cpu.is_finite(), "{side}: process CPU per GB loaded: {cpu}");
    }
    let ratio = f(&r["ratio_cpu_per_gb"]);
    let expect = f(&r["client"]["process_cpu_s_per_gb"]) / f(&r["in_process"]["process_cpu_s_per_gb"]);
    assert!((ratio - expect).abs() <= 1e-9 * expect, "ratio {ratio} is client / in-process {expect}");
}
