//! `tutti selftest --emulated --gio`: the gio_uring host-executor round trip the
//! QEMU guest runs on vfio-bound drives, here on two emulated controllers.

use std::process::Command;

fn tutti(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tutti")).args(args).output().expect("running tutti")
}

#[test]
fn gio_round_trip_covers_sgl_prp_and_both_executor_modes() {
    let out = tutti(&["selftest", "--emulated", "--gio", "--gio-ioctx", "256", "--json"]);
    assert!(out.status.success(), "selftest failed: {}", String::from_utf8_lossy(&out.stderr));
    let passes: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let passes = passes.as_array().expect("a list of passes");
    assert_eq!(passes.len(), 3);
    let mut modes = Vec::new();
    for p in passes {
        let r = &p["report"];
        let force_prp = p["force_prp"].as_bool().expect("force_prp");
        let want = if force_prp { "PRP" } else { "SGL" };
        let pointers = r["data_pointers"].as_array().expect("data_pointers");
        assert_eq!(pointers.len(), 2, "both emulated drives take part: {r}");
        assert!(pointers.iter().all(|d| d == want), "{want} pass used {pointers:?}");
        // Two IOCBs of 256 IOCTXs, written then read: 1024 commands of 4 KiB, half of them reads.
        assert_eq!(r["commands"], 1024);
        assert_eq!(r["bytes_verified"], 512 * 4096);
        assert!(r["min_queue_wraps"].as_u64().expect("wraps") >= 1, "the queues never wrapped: {r}");
        modes.push(p["mode"].as_str().expect("mode").to_string());
    }
    assert!(modes.contains(&"launch".to_string()) && modes.contains(&"persistent".to_string()));
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
