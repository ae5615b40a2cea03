//! `tutti bench staged` through the binary, small: the geometry's chunk sizes
//! both ways, every method's bytes verified, on the host executor and on the
//! CUDA executor through the stand-in libcuda.so (whose times are host
//! threads'); bad input refused by name. Speed is never checked.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../tests/support/skip.rs"]
mod skip;

use serde_json::Value;
use std::process::{Command, Output};

fn tutti(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tutti"))
        .args(["bench", "staged"])
        .args(args)
        .output()
        .expect("run tutti")
}

fn json(args: &[&str]) -> Value {
    let out = tutti(&[args, &["--json", "--quiet"]].concat());
    assert!(
        out.status.success(),
        "tutti bench staged {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON report")
}

/// Every row verified every method's bytes: the kernel's and both baselines'.
fn check_rows(r: &Value, sizes: &[u64]) {
    let rows = r["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), sizes.len() * 2, "{r}");
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row["chunk_bytes"].as_u64(), Some(sizes[i / 2]), "{row}");
        let dir = if i % 2 == 0 { "SlotToKv" } else { "KvToSlot" };
        assert_eq!(row["direction"], dir);
        let bytes = row["bytes"].as_u64().unwrap();
        assert_eq!(bytes, row["chunk_bytes"].as_u64().unwrap() * row["chunks"].as_u64().unwrap());
        assert_eq!(row["verified_bytes"].as_u64(), Some(3 * bytes), "kernel and both baselines: {row}");
        for k in ["kernel_gbps", "baseline_gbps", "baseline_chunks_gbps", "ratio", "ratio_chunks"] {
            assert!(row[k].as_f64().is_some_and(|v| v > 0.0), "{k}: {row}");
        }
        assert_eq!(row["run"]["runs"].as_array().map(Vec::len), Some(2), "two repetitions: {row}");
    }
}

#[test]
fn the_host_executor_copies_the_demo_geometry_chunks_both_ways() {
    let r = json(&["--bytes", "2M", "--reps", "2"]);
    assert!(r["baseline"].as_str().unwrap().contains("memcpy"), "{r}");
    // Llama-3-8B's K or V of one block of 16 tokens: 32 KiB, one chunk under a 128 KiB MDTS.
    assert_eq!(r["object_bytes"].as_u64(), Some(32 << 10));
    check_rows(&r, &[32 << 10]);
}

#[test]
fn objects_over_the_max_transfer_give_two_chunk_sizes() {
    // 8 heads x 96 x 16 tokens x 2 bytes = 24 KiB, split at 16 KiB: 16 KiB and 8 KiB chunks.
    let r = json(&["--head-dim", "96", "--max-transfer", "16K", "--bytes", "1M", "--reps", "2"]);
    check_rows(&r, &[16 << 10, 8 << 10]);
}

#[test]
fn the_cuda_executor_copies_against_the_copy_engine_on_the_stand_in() {
    if let Err(e) = tutti_kernels::nvrtc::load() {
        skip::skip(format!("{e} (scripts/nvrtc-check --install installs the NVRTC wheel)"));
        return;
    }
    let driver = tutti_cuda_standin::control::library_path().expect("the stand-in libcuda.so");
    let driver = driver.to_str().unwrap();
    let r = json(&[
        "--cuda",
        "--cuda-driver",
        driver,
        "--cuda-sms",
        "1",
        "--cuda-block-threads",
        "32",
        "--cuda-blocks-per-sm",
        "2",
        "--chunk-sizes",
        "4K,32K",
        "--bytes",
        "1M",
        "--reps",
        "2",
    ]);
    assert!(r["baseline"].as_str().unwrap().contains("cuMemcpyAsync"), "{r}");
    assert!(r["clock"].as_str().unwrap().contains("CUDA events"), "{r}");
    assert!(r["executor"].as_str().unwrap().contains("cuda"), "{r}");
    check_rows(&r, &[4 << 10, 32 << 10]);
}

#[test]
fn bad_input_and_a_missing_driver_are_refused_by_name() {
    let out = tutti(&["--chunk-sizes", "100"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("multiples of 16"), "{out:?}");
    let out = tutti(&["--bytes", "0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--bytes"), "{out:?}");
    let out = tutti(&["--cuda", "--cuda-driver", "/nonexistent/libcuda.so", "--bytes", "1M"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/libcuda.so"), "the missing driver is named: {err}");
}
