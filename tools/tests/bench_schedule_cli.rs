//! `tutti bench schedule` through the binary, small: every policy is measured and predicted,
//! the scheduled policies never put reads and writes on one drive at once and hold writes for
//! slack, and the SVG has a measured and a simulated curve per policy. Speed is never checked.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use std::process::Command;

const SMALL: &[&str] = &[
    "bench",
    "schedule",
    "--layers",
    "4",
    "--context-tokens",
    "256",
    "--requests",
    "2",
    "--decode-steps",
    "2",
    "--read-mbps",
    "100",
    "--write-mbps",
    "50",
];

#[test]
fn every_policy_is_measured_beside_the_simulator_and_the_scheduled_ones_never_mix() {
    let svg = std::env::temp_dir().join(format!("tutti-bench-schedule-{}.svg", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_tutti"))
        .args(SMALL)
        .args(["--json", "--quiet", "--svg", svg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    let policies: Vec<&str> = rows.iter().map(|r| r["policy"].as_str().unwrap()).collect();
    assert_eq!(policies, ["load-all", "interleaved", "slack-aware", "slack-online"]);
    for r in rows {
        let m = &r["measured"];
        assert_eq!(m["per_request"].as_array().unwrap().len(), 2);
        assert!(m["ttft_ms"].as_f64().unwrap() > 0.0 && r["predicted"]["ttft_ms"].as_f64().unwrap() > 0.0);
        assert_eq!(m["bytes_dropped"].as_u64(), Some(0));
        // Moving bytes costs the process some CPU: the field is measured, not a placeholder.
        assert!(m["process_cpu_s_per_gb"].as_f64().unwrap() > 0.0, "{r}");
        if r["policy"].as_str().unwrap().starts_with("slack") {
            assert_eq!(m["mixed_issues"].as_u64(), Some(0), "{r}");
            assert!(m["writes_held_for_slack"].as_u64().unwrap() > 0, "{r}");
            assert!(m["backlog_peak_mib"].as_f64().unwrap() > 0.0, "{r}");
        }
    }
    let text = std::fs::read_to_string(&svg).unwrap();
    for r in rows {
        let label = r["label"].as_str().unwrap();
        assert!(text.contains(&format!("{label} measured")), "{label}");
        assert!(text.contains(&format!("{label} simulated")), "{label}");
    }
    let _ = std::fs::remove_file(&svg);
}

#[test]
fn bad_flags_are_refused_with_the_reason() {
    let out = Command::new(env!("CARGO_BIN_EXE_tutti"))
        .args(SMALL)
        .args(["--mixed-efficiency", "1.5"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--mixed-efficiency"));
}
