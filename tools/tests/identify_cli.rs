//! `tutti identify --emulated`: the LBA format in use and the command set of
//! each namespace, in text and JSON.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

/// `tutti identify --emulated ARGS`, run to its end.
fn run_identify(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tutti"))
        .arg("identify")
        .arg("--emulated")
        .args(args)
        .output()
        .expect("run tutti")
}

fn identify(args: &[&str]) -> (bool, String) {
    let out = run_identify(args);
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn the_lba_format_and_command_set_are_shown() {
    let (ok, text) = identify(&["--emu-namespaces", "2"]);
    assert!(ok);
    assert!(text.contains("NVM command set; LBA format 0: 512 B data, no metadata"), "{text}");
    assert!(!text.contains("not usable"), "{text}");

    let (ok, text) = identify(&["--emu-metadata", "8", "--lba-size", "4096"]);
    assert!(ok);
    assert!(text.contains("4096 B data + 8 B metadata (separate buffer)"), "{text}");
    assert!(text.contains("not usable by tutti"), "{text}");

    let (ok, json) = identify(&["--emu-zoned", "--json"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    let ns = &v["namespaces"][0];
    assert_eq!(ns["command_set"], "zoned", "{ns}");
    assert_eq!(ns["format"]["data_size"], 512);
    assert_eq!(ns["format"]["metadata_size"], 0);
    assert_eq!(ns["format"]["extended"], false);
    assert_eq!(ns["format"]["pi_type"], 0);

    let (ok, json) = identify(&["--emu-metadata", "16", "--json"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(v["namespaces"][0]["format"]["metadata_size"], 16);
    assert_eq!(v["namespaces"][0]["command_set"], "nvm");
}

fn identify_err(args: &[&str]) -> String {
    let out = run_identify(args);
    assert!(!out.status.success(), "{args:?} should be refused");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn the_bandwidth_flags_reach_the_emulated_controller() {
    let (ok, json) = identify(&[
        "--emu-read-gbps",
        "6",
        "--emu-write-gbps",
        "2.5",
        "--emu-latency-us",
        "10",
        "--emu-read-latency-us",
        "80",
        "--emu-write-latency-us",
        "20",
        "--emu-mixed-efficiency",
        "0.4",
        "--emu-mixed-read-share",
        "0.75",
        "--json",
    ]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    let c = &v["cost_model"];
    assert_eq!(c["read_gbps"], 6.0, "{c}");
    assert_eq!(c["write_gbps"], 2.5, "{c}");
    assert_eq!(c["latency_us"], 10.0, "{c}");
    assert_eq!(c["read_latency_us"], 80.0, "{c}");
    assert_eq!(c["write_latency_us"], 20.0, "{c}");
    assert_eq!(c["mixed_efficiency"], 0.4, "{c}");
    assert_eq!(c["mixed_read_share"], 0.75, "{c}");
    // The identity itself is still there, flattened.
    assert!(v["namespaces"].is_array(), "{v}");

    let (ok, json) = identify(&["--emu-write-gbps", "1", "--emu-mixed-efficiency", "0.5", "--json"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(v["cost_model"]["read_gbps"], serde_json::Value::Null);
    assert_eq!(v["cost_model"]["mixed_read_share"], 0.5, "default share");

    let (ok, text) = identify(&["--emu-read-gbps", "3"]);
    assert!(ok);
    assert!(text.contains("cost model    read 3 GB/s, write unpaced"), "{text}");
    assert!(text.contains("mixed: no collapse"), "{text}");
}

#[test]
fn bad_bandwidth_flags_are_refused_by_name() {
    assert!(identify_err(&["--emu-read-gbps", "0"]).contains("--emu-read-gbps"));
    assert!(identify_err(&["--emu-write-gbps", "nan"]).contains("--emu-write-gbps"));
    assert!(identify_err(&["--emu-read-gbps", "1", "--emu-mixed-efficiency", "1.5"])
        .contains("--emu-mixed-efficiency"));
    assert!(identify_err(&["--emu-read-gbps", "1", "--emu-mixed-efficiency", "0"])
        .contains("--emu-mixed-efficiency"));
    let e = identify_err(&["--emu-mixed-efficiency", "0.4"]);
    assert!(e.contains("needs --emu-read-gbps or --emu-write-gbps"), "{e}");
    let e = identify_err(&["--emu-read-gbps", "1", "--emu-mixed-read-share", "0.5"]);
    assert!(e.contains("--emu-mixed-read-share needs --emu-mixed-efficiency"), "{e}");
    let e = identify_err(&[
        "--emu-read-gbps",
        "1",
        "--emu-mixed-efficiency",
        "0.4",
        "--emu-mixed-read-share",
        "1",
    ]);
    assert!(e.contains("not below 1"), "{e}");
    assert!(identify_err(&["--emu-latency-us", "10000001"]).contains("--emu-latency-us"));
}
