//! `tutti simulate` and `tutti profile` end to end, through the binary.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Output};

fn tutti(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tutti")).args(args).output().expect("run tutti")
}

fn json(args: &[&str]) -> serde_json::Value {
    let out = tutti(args);
    assert!(out.status.success(), "tutti {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("stdout is JSON")
}

fn crossover(report: &serde_json::Value, policy: &str) -> f64 {
    report["crossovers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["policy"] == policy)
        .and_then(|c| c["hit_rate"].as_f64())
        .unwrap_or_else(|| panic!("no crossover for {policy}"))
}

fn total_bubble(report: &serde_json::Value, policy: &str) -> f64 {
    report["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["policy"] == policy)
        .map(|r| r["bubble_ms"].as_f64().unwrap())
        .sum()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tutti-sim-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn simulate_json_with_defaults_orders_the_policies_by_crossover() {
    let r = json(&["simulate", "--json"]);
    let [a, b, c, d] = ["load-all", "interleaved", "slack-aware", "slack-online"].map(|p| crossover(&r, p));
    assert!(c > b && d > b, "slack-aware {c}/{d} vs layer-wise {b}");
    assert!(b > a, "layer-wise {b} vs load-all {a}");
    assert_eq!(r["runs"].as_array().unwrap().len(), 4 * r["hit_rates"].as_array().unwrap().len());
    assert_eq!(r["config"]["model"]["geometry"]["layers"], 32);
}

#[test]
fn simulate_json_with_a_30_percent_optimistic_profile_favours_online_slack() {
    let r = json(&["simulate", "--json", "--profile-optimism", "0.3", "--policies", "c,d"]);
    let (c, d) = (total_bubble(&r, "slack-aware"), total_bubble(&r, "slack-online"));
    assert!(d < c, "online {d} ms vs stale {c} ms");
}

#[test]
fn simulate_writes_an_svg_with_one_curve_per_policy_per_panel() {
    let svg = scratch("bubble.svg");
    let out = tutti(&[
        "simulate",
        "--policies",
        "a,c",
        "--hit-rates",
        "0,0.5,0.9,0.99",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("a:load-all") && text.contains("crossover"), "{text}");
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.trim_end().ends_with("</svg>"));
    assert_eq!(plot.matches("<polyline").count(), 4, "2 policies x 2 panels");
    assert!(plot.contains("c:slack"));
}

#[test]
fn profile_from_a_trace_feeds_simulate_and_a_foreign_table_is_refused() {
    let trace = scratch("trace.jsonl");
    let table = scratch("table.json");
    let made = json(&["profile", "--example-trace", trace.to_str().unwrap(), "--json"]);
    assert!(made["records"].as_u64().unwrap() > 100);
    let summary =
        json(&["profile", "--trace", trace.to_str().unwrap(), "-o", table.to_str().unwrap(), "--json"]);
    assert_eq!(summary["layers"], 32);
    assert!(summary["fit"]["max_rel_error"].as_f64().unwrap() < 1e-3);
    let r = json(&[
        "simulate",
        "--json",
        "--table",
        table.to_str().unwrap(),
        "--policies",
        "c",
        "--hit-rates",
        "0.5,0.9",
    ]);
    assert!(r["table_source"].as_str().unwrap().starts_with("trace:"));

    let out = tutti(&["simulate", "--table", table.to_str().unwrap(), "--gpu", "a100", "--hit-rates", "0.5"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("gpu 'h100-class' (expected 'a100')"), "{err}");
}

#[test]
fn bad_flags_are_clear_errors() {
    let out = tutti(&["simulate", "--policies", "z"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown policy 'z'"));
    let out = tutti(&["simulate", "--hit-rates", "0.9,0.1"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("ascending"));
    let out = tutti(&["simulate", "--kv-heads", "5"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("multiple"));
    let bad = scratch("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"kind\":\"request\",\"request\":1,\"input_tokens\":8,\"prefix_tokens\":0}\nnot json\n",
    )
    .unwrap();
    let out =
        tutti(&["profile", "--trace", bad.to_str().unwrap(), "-o", scratch("x.json").to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("trace line 2"));
}
