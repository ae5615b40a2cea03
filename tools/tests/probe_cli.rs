//! The conformance probes of `tutti selftest --probe` against the emulated
//! controller: every edge-case command must get the status the NVMe spec
//! requires. The same probes run against QEMU's controller in the VFIO harness
//! (tests/tests/qemu_vfio.rs), which is how differences between the two show up.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn probe(extra: &[&str]) -> Vec<serde_json::Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_tutti"))
        .args(["selftest", "--probe", "--emulated", "--json"])
        .args(extra)
        .output()
        .expect("running tutti");
    assert!(out.status.success(), "tutti selftest failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON probe report")
}

fn assert_all_conform(extra: &[&str], min_probes: usize) {
    let results = probe(extra);
    assert!(results.len() >= min_probes, "{extra:?}: only {} probes ran", results.len());
    let diffs: Vec<String> = results
        .iter()
        .filter(|r| r["conforms"] != serde_json::Value::Bool(true))
        .map(|r| format!("{}: got {}, spec wants {} ({})", r["name"], r["got"], r["expected"], r["rule"]))
        .collect();
    assert!(
        diffs.is_empty(),
        "{extra:?}: the emulated controller differs from the spec:\n{}",
        diffs.join("\n")
    );
}

#[test]
fn emulated_controller_answers_edge_cases_as_the_spec_requires() {
    assert_all_conform(&["--lba-size", "512", "--mdts", "3"], 28);
    assert_all_conform(&["--lba-size", "4096", "--mdts", "5", "--sgl", "dword"], 26);
    // Without SGL support only the PRP and admin probes run.
    assert_all_conform(&["--sgl", "off"], 18);
}

#[test]
fn emulated_only_goes_with_probe() {
    let out = Command::new(env!("CARGO_BIN_EXE_tutti"))
        .args(["selftest", "--emulated"])
        .output()
        .expect("running tutti");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--emulated only goes with --probe"));
}
