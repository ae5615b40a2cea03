//! `tutti bench retrieve` at small sizes: every method delivers the stored
//! bytes into the right block slots and moves the same data, and the report
//! carries what a reader needs. Never speed.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../tests/support/skip.rs"]
mod skip;

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

const OBJECT: u64 = 16 * 128 * 2; // 16 tokens × 1 KV head × head dim 128 × bf16
const METHODS: [&str; 4] = ["tutti", "io_uring", "pread", "memcpy"];

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tutti-bench-retrieve-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The io_uring baseline needs io_uring; some sandboxes forbid it.
fn io_uring_available() -> bool {
    match io_uring::IoUring::new(2) {
        Ok(_) => true,
        Err(e) => {
            skip::skip(format!("io_uring is not available here ({e})"));
            false
        }
    }
}

fn bench(extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tutti"))
        .args(["bench", "retrieve", "--kv-heads", "1", "--head-dim", "128", "--emulated", "2"])
        .args(extra)
        .output()
        .unwrap()
}

/// The runs of one scenario: each method once, in order, verified, same bytes.
fn check_runs(s: &Value, blocks: u64, layers: u64) {
    let runs = s["runs"].as_array().unwrap();
    let names: Vec<&str> = runs.iter().map(|r| r["method"].as_str().unwrap()).collect();
    assert_eq!(names, METHODS);
    let want = blocks * layers * 2 * OBJECT;
    assert_eq!(s["bytes_per_method"].as_u64(), Some(blocks * layers * 2 * OBJECT));
    for r in runs {
        let m = r["method"].as_str().unwrap();
        assert_eq!(r["verified"], Value::Bool(true), "{m} did not verify: {r}");
        assert_eq!(r["bytes"].as_u64(), Some(want), "{m} moved other data");
        assert_eq!(r["verified_bytes"].as_u64(), Some(want), "{m} verified other data");
        assert_eq!(r["layer_calls"].as_u64(), Some(layers), "{m}: one call per layer");
        assert!(r["reps"].as_u64().is_some_and(|n| (1..=2).contains(&n)), "{m}: --reps 2 gives 1 or 2 runs");
        for field in [
            "seconds",
            "gb_per_s",
            "host_cpu_us_per_layer_call",
            "host_cpu_ns_per_block",
            "setup_cpu_us_per_request",
            "host_cpu_us_per_layer_with_setup",
            "process_cpu_s",
            "process_cpu_us_per_layer",
            "process_cpu_ns_per_block",
        ] {
            let v = r[field].as_f64().unwrap_or_else(|| panic!("{m}: no {field}"));
            assert!(v.is_finite() && v >= 0.0, "{m}: {field} = {v}");
        }
        assert!(r["gb_per_s"].as_f64().unwrap() > 0.0);
        // The setup, spread over the layers, plus the per-layer figure.
        let (per_layer, setup) = (
            r["host_cpu_us_per_layer_call"].as_f64().unwrap(),
            r["setup_cpu_us_per_request"].as_f64().unwrap(),
        );
        let with = r["host_cpu_us_per_layer_with_setup"].as_f64().unwrap();
        assert!((with - (per_layer + setup / layers as f64)).abs() <= 1e-6 * with.max(1.0), "{m}: {r}");
        // Process CPU (every thread) is reported per layer beside the calling thread's.
        let process = r["process_cpu_us_per_layer"].as_f64().unwrap();
        let total = r["process_cpu_s"].as_f64().unwrap();
        assert!((process - total * 1e6 / layers as f64).abs() <= 1e-6 * process.max(1.0), "{m}: {r}");
        let per_block = r["process_cpu_ns_per_block"].as_f64().unwrap();
        assert!((per_block - process * 1e3 / blocks as f64).abs() <= 1e-6 * per_block.max(1.0), "{m}: {r}");
        if m == "tutti" {
            assert!(setup > 0.0, "tutti's submit_load costs something: {r}");
            // The emulated drives copy every byte on their own threads: the process pays for it.
            assert!(process > 0.0, "tutti's process CPU misses its lanes and drives: {r}");
        } else {
            assert_eq!(setup, 0.0, "{m} has no per-request setup");
        }
    }
    let ratios = s["ratios"].as_array().unwrap();
    let baselines: Vec<&str> = ratios.iter().map(|r| r["baseline"].as_str().unwrap()).collect();
    assert_eq!(baselines, METHODS[1..]);
    for r in ratios {
        for f in ["bandwidth", "host_cpu", "process_cpu"] {
            let v = r[f].as_f64().unwrap();
            assert!(v.is_finite() && v > 0.0, "{f} ratio {v}");
        }
    }
    // One command per 4 KiB object, built by the executor from the layer table.
    let t = &s["tutti_per_layer"];
    assert_eq!(t["nvme_commands"].as_f64(), Some((2 * blocks) as f64));
    assert_eq!(t["host_calls"].as_f64(), Some(1.0));
    // The pairs went to the executor once, at submit_load; no layer copied them.
    assert_eq!(t["pairs_registered"], Value::Bool(true));
    assert_eq!(t["host_pairs"].as_f64(), Some(0.0));
}

#[test]
fn every_method_delivers_the_stored_bytes_and_the_report_says_what_was_measured() {
    if !io_uring_available() {
        return;
    }
    let dir = scratch("json");
    let svg = dir.join("cpu.svg");
    let gbps = dir.join("gbps.svg");
    let out = bench(&[
        "--request-blocks",
        "24",
        "--layers",
        "3",
        "--blocks",
        "16,8",
        "--sweep-layers",
        "2",
        "--reps",
        "2",
        "--file-dir",
        dir.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
        "--bandwidth-svg",
        gbps.to_str().unwrap(),
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {stderr}");
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();

    assert_eq!(r["all_verified"], Value::Bool(true));
    assert_eq!(r["object_bytes"].as_u64(), Some(OBJECT));
    assert_eq!(r["geometry"]["layers"].as_u64(), Some(3));
    assert_eq!(r["drives"].as_u64(), Some(2));
    assert!(r["media"].as_str().unwrap().contains("emulated"));
    assert!(r["io_mode"].as_str().unwrap().contains("gio_uring"));
    let methods: Vec<&str> =
        r["methods"].as_array().unwrap().iter().map(|m| m["method"].as_str().unwrap()).collect();
    assert_eq!(methods, METHODS);
    assert!(r["methods"].as_array().unwrap().iter().all(|m| !m["description"].as_str().unwrap().is_empty()));
    assert!(r["notes"].as_array().unwrap().len() >= 3, "the caveats travel with the figures");

    let q = &r["request"];
    assert_eq!(q["blocks"].as_u64(), Some(24));
    assert_eq!(q["tokens"].as_u64(), Some(24 * 16));
    check_runs(q, 24, 3);

    let s = &r["sweep"];
    assert_eq!(s["layers"].as_u64(), Some(2));
    assert!(!s["why_fewer_layers"].as_str().unwrap().is_empty());
    let points = s["points"].as_array().unwrap();
    let blocks: Vec<u64> = points.iter().map(|p| p["blocks"].as_u64().unwrap()).collect();
    assert_eq!(blocks, [8, 16], "sweep points in increasing order");
    for p in points {
        check_runs(p, p["blocks"].as_u64().unwrap(), 2);
    }

    for (path, axis) in [(&svg, "host CPU ms per layer call"), (&gbps, "GB/s")] {
        let plot = std::fs::read_to_string(path).unwrap();
        assert!(plot.starts_with("<svg") && plot.contains(axis));
        let curves: Vec<&str> = plot.lines().filter(|l| l.starts_with("<polyline")).collect();
        assert_eq!(curves.len(), 4, "one curve per method");
        assert!(curves.iter().all(|c| c.matches(',').count() == 2), "one point per sweep size");
        for m in METHODS {
            assert!(plot.contains(&format!(">{m}<")), "legend lacks {m}");
        }
    }
    let mut left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    left.sort();
    assert_eq!(left, ["cpu.svg", "gbps.svg"], "the baseline file is removed");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_table_names_each_method_with_its_ratio() {
    if !io_uring_available() {
        return;
    }
    let dir = scratch("text");
    let out = bench(&[
        "--request-blocks",
        "8",
        "--layers",
        "2",
        "--no-sweep",
        "--file-dir",
        dir.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    for m in METHODS {
        assert!(text.lines().any(|l| l.starts_with(m)), "no row for {m}:\n{text}");
    }
    assert!(text.contains("tutti÷this") && text.contains("host CPU µs/layer"), "{text}");
    assert!(
        text.contains("process CPU µs/layer") && text.contains("this÷tutti process CPU"),
        "process CPU is not beside host CPU:\n{text}"
    );
    assert!(
        text.contains("setup µs/request") && text.contains("pairs registered once per request"),
        "{text}"
    );
    assert!(text.contains("every byte verified"), "{text}");
    assert!(!text.contains("as the request grows"), "--no-sweep still swept:\n{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_sizes_are_refused_with_the_flag_named() {
    let out = bench(&["--request-blocks", "0", "--no-sweep"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--request-blocks"), "{err}");

    let out = bench(&["--request-blocks", "4", "--blocks", "4,0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--blocks"));

    let out = bench(&["--dtype", "bf17", "--no-sweep"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bf17"));

    let out = bench(&["--request-blocks", "100000000", "--no-sweep"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("memory available"));

    // 3 tokens × 1 head × 128 × bf16 = 768 bytes: not whole 512-byte blocks.
    let out = bench(&["--block-tokens", "3", "--no-sweep"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("512-byte"));
}
