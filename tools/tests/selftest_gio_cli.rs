//! `tutti selftest --emulated --gio`: the gio_uring host-executor round trip the
//! QEMU guest runs on vfio-bound drives, here on two emulated controllers.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn tutti(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tutti")).args(args).output().expect("running tutti")
}

/// Two IOCBs of 256 IOCTXs, written then read: 1024 commands of 4 KiB, half of them reads.
fn assert_verified(r: &serde_json::Value, want_pointers: &str) {
    let pointers = r["data_pointers"].as_array().expect("data_pointers");
    assert_eq!(pointers.len(), 2, "both emulated drives take part: {r}");
    assert!(pointers.iter().all(|d| d == want_pointers), "{want_pointers} pass used {pointers:?}");
    assert_eq!(r["commands"], 1024, "{r}");
    assert_eq!(r["bytes_verified"], 512 * 4096, "{r}");
    assert!(r["min_queue_wraps"].as_u64().expect("wraps") >= 1, "the queues never wrapped: {r}");
}

#[test]
fn gio_round_trip_covers_sgl_prp_and_both_executor_modes() {
    let out = tutti(&["selftest", "--emulated", "--gio", "--gio-ioctx", "256", "--json"]);
    assert!(out.status.success(), "selftest failed: {}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let passes = report["passes"].as_array().expect("a list of passes");
    assert_eq!(passes.len(), 3);
    let mut modes = Vec::new();
    for p in passes {
        let force_prp = p["force_prp"].as_bool().expect("force_prp");
        assert_verified(&p["report"], if force_prp { "PRP" } else { "SGL" });
        modes.push(p["mode"].as_str().expect("mode").to_string());
    }
    assert!(modes.contains(&"launch".to_string()) && modes.contains(&"persistent".to_string()));
}

#[test]
fn gio_selftest_recovers_every_drive_and_verifies_a_pass_on_the_recreated_queues() {
    let out = tutti(&["selftest", "--emulated", "--gio", "--gio-ioctx", "256", "--json"]);
    assert!(out.status.success(), "selftest failed: {}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let rec = &report["recovery"];
    assert_eq!(rec["mode"], "persistent", "the last pass's ring is recovered: {rec}");
    let drives = rec["drives"].as_array().expect("recovered drives");
    let names: Vec<&str> = drives.iter().map(|d| d["drive"].as_str().expect("drive name")).collect();
    assert_eq!(names, ["emu0 ns 1", "emu1 ns 1"], "every drive of the ring, in order");
    for d in drives {
        // Two queue pairs per drive, each deleted and created again.
        let qids: Vec<u64> =
            d["qids"].as_array().expect("qids").iter().map(|q| q.as_u64().expect("qid")).collect();
        assert_eq!(qids.len(), 2, "{d}");
        assert!(qids.iter().all(|&q| q >= 1), "I/O queue ids, never the admin queue: {d}");
        assert!(d["elapsed_us"].as_u64().expect("elapsed_us") > 0, "{d}");
        assert_eq!(d["expired_commands"], 0, "nothing expired in a clean run: {d}");
        assert_eq!(d["dead_queues"], 0, "{d}");
    }
    // The pass after recovery moved and compared the same bytes as the others, on the same drives.
    assert_verified(&rec["pass"], "SGL");
    assert_eq!(rec["pass"]["drives"], report["passes"][2]["report"]["drives"]);

    let out = tutti(&["selftest", "--emulated", "--gio", "--gio-ioctx", "256"]);
    assert!(out.status.success(), "selftest failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    for drive in ["emu0 ns 1", "emu1 ns 1"] {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("selftest gio recovery: {drive}: ")))
            .unwrap_or_else(|| panic!("no recovery line for {drive}:\n{text}"));
        assert!(
            line.contains("2 queue pair(s) (qid ") && line.contains(" deleted and created again in "),
            "{line}"
        );
    }
    let after = text
        .lines()
        .find(|l| l.starts_with("selftest gio recovery: after recovery: "))
        .unwrap_or_else(|| panic!("no post-recovery pass:\n{text}"));
    assert!(after.contains("1024 commands, 2097152 bytes verified on emu0 ns 1, emu1 ns 1"), "{after}");
}

#[test]
fn gio_flags_are_validated() {
    let out = tutti(&["selftest", "--emulated", "--gio", "--gio-ioctx", "4096"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--gio-ioctx"));
    let out = tutti(&["selftest", "--emulated"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--probe or --gio"));
}
