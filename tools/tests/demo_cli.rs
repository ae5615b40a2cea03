//! `tutti demo` end to end through the binary, at small sizes: stores a
//! request's KV, retrieves it into other slots, verifies every byte, reopens
//! the pool; with `--dir` the cache survives into a second process.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

fn tutti(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tutti")).arg("demo").args(args).output().expect("run tutti")
}

fn json(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = tutti(&all);
    assert!(out.status.success(), "tutti demo {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON report")
}

const SMALL: [&str; 6] = ["--tokens", "640", "--layers", "4", "--capacity-mib", "16"];

#[test]
fn small_request_round_trips_and_survives_reopen() {
    let r = json(&SMALL);
    assert_eq!(r["request_blocks"], 40);
    let file = 2 * 4 * 8 * 128 * 16 * 2; // K,V × layers × heads × dim × tokens × bf16
    assert_eq!(r["request_bytes"], 40 * file);
    assert_eq!(r["pool"]["drives"].as_array().map(Vec::len), Some(4));
    for phase in ["store", "retrieve"] {
        assert_eq!(r[phase]["bytes"], 40 * file, "{phase}");
        assert_eq!(r[phase]["commands_per_layer"], 80.0, "{phase}: 40 blocks × K,V, one command each");
    }
    assert_eq!(r["retrieve"]["verified_bytes"], 40 * file);
    assert_eq!(r["reopen"]["hits"], 40);
    assert_eq!(r["reopen"]["verified_bytes"], 40 * file);
    // 40 × 4 × 2 descriptors of 16 bytes; PRP: 32 KiB objects span 8 pages, a 7-entry list each.
    assert_eq!(r["tables"]["descriptors"], 320);
    assert_eq!(r["tables"]["sgl_bytes"], 320 * 16 * r["tables"]["tables"].as_u64().unwrap_or(0));
    assert_eq!(r["tables"]["prp_entry_bytes"], 320 * 7 * 8 * r["tables"]["tables"].as_u64().unwrap_or(0));
}

#[test]
fn prefaulted_ram_media_round_trips_and_is_refused_with_dir() {
    let mut args = SMALL.to_vec();
    args.extend_from_slice(&["--emu-prefault", "--no-reopen"]);
    let r = json(&args);
    assert_eq!(r["store"]["bytes"], r["request_bytes"]);
    assert_eq!(r["retrieve"]["verified_bytes"], r["request_bytes"]);
    let out = tutti(&["--emu-prefault", "--dir", "/nonexistent-tutti-dir"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--emu-prefault") && err.contains("--dir"), "{err}");
}

#[test]
fn both_executor_modes_verify_and_the_host_builds_nothing() {
    for mode in ["launch", "persistent"] {
        let mut args = SMALL.to_vec();
        args.extend_from_slice(&["--executor", mode, "--no-reopen"]);
        let r = json(&args);
        assert_eq!(r["retrieve"]["verified_bytes"], r["retrieve"]["bytes"], "{mode}");
        for phase in ["store", "retrieve"] {
            let p = &r[phase];
            assert_eq!(p["host_calls_per_layer"], 1.0, "{mode} {phase}: one submission per layer");
            assert_eq!(p["host_built_per_layer"], 0.0, "{mode} {phase}: the executor builds the commands");
            let cpu = p["host_submit_us_per_layer"].as_f64().unwrap_or(-1.0);
            assert!(cpu > 0.0, "{mode} {phase}: host CPU of the submissions is measured: {p}");
            assert!(p["host_setup_us_per_layer"].as_f64().unwrap_or(-1.0) > 0.0, "{mode} {phase}: {p}");
        }
    }
    let out = tutti(&["--executor", "gpu"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--executor"));
}

#[test]
fn geometry_layout_lba_size_and_backend_flags() {
    let r = json(&[
        "--tokens",
        "256",
        "--layers",
        "3",
        "--kv-heads",
        "4",
        "--head-dim",
        "64",
        "--block-tokens",
        "32",
        "--dtype",
        "f16",
        "--layout",
        "contiguous",
        "--lba-size",
        "4096",
        "--emulated",
        "3",
        "--backend",
        "direct",
        "--capacity-mib",
        "16",
        "--no-reopen",
    ]);
    assert_eq!(r["request_blocks"], 8);
    assert_eq!(r["layout"], "contiguous");
    assert_eq!(r["pool"]["object_bytes"], 32 * 4 * 64 * 2);
    assert_eq!(r["pool"]["backend"], "direct");
    assert!(r["pool"]["drives"]
        .as_array()
        .is_some_and(|d| d.len() == 3 && d.iter().all(|d| d["lba_size"] == 4096)));
    assert!(r["reopen"].is_null());
    // The CPU-driven path builds every command on the host.
    assert_eq!(r["retrieve"]["host_built_per_layer"], r["retrieve"]["commands_per_layer"]);
}

#[test]
fn file_media_cache_survives_into_another_process() {
    let dir = std::env::temp_dir().join(format!("tutti-demo-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_string_lossy().to_string();
    let mut args = SMALL.to_vec();
    args.extend_from_slice(&["--dir", &d, "--emulated", "2"]);
    let first = json(&args);
    assert_eq!(first["hits_before_store"], 0);
    assert_eq!(
        first["reopen"]["controllers_restarted"], true,
        "file media: controllers restarted from their files"
    );
    // A second process opens the pool the first one left on the files.
    args.push("--reuse");
    let second = json(&args);
    assert_eq!(second["pool"]["pool"], first["pool"]["pool"], "the same pool");
    assert_eq!(second["hits_before_store"], 40, "every block was found before storing");
    assert_eq!(second["store"]["bytes"], 0, "nothing needed storing again");
    assert_eq!(second["retrieve"]["verified_bytes"], first["retrieve"]["verified_bytes"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_flags_are_clear_errors() {
    let cases: [(&[&str], &str); 6] = [
        (&["--dtype", "f64"], "dtype"),
        (&["--tokens", "8"], "less than one block"),
        (&["--tokens", "64", "--head-dim", "1"], "LBA"),
        (&["--tokens", "64", "--layers", "0"], "layers"),
        (&["--tokens", "64", "--timeout", "0"], "--timeout"),
        (&["--tokens", "64", "--timeout", "3601"], "--timeout"),
    ];
    for (args, want) in cases {
        let out = tutti(args);
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn a_controller_granting_one_queue_pair_runs_on_both_backends() {
    for backend in ["gio", "direct"] {
        let mut args = SMALL.to_vec();
        args.extend_from_slice(&["--emulated", "2", "--emu-queue-pairs", "1", "--backend", backend]);
        let r = json(&args);
        assert_eq!(r["retrieve"]["verified_bytes"], r["retrieve"]["bytes"], "{backend}");
        assert_eq!(r["reopen"]["hits"], 40, "{backend}");
        // The executor cannot have a pair of its own; the host drives the shared one.
        assert_eq!(r["pool"]["backend"], "direct", "{backend}: {}", r["pool"]);
    }
}

#[test]
fn every_namespace_of_each_controller_is_a_pool_drive() {
    let mut args = SMALL.to_vec();
    args.extend_from_slice(&["--emulated", "2", "--emu-namespaces", "2"]);
    let r = json(&args);
    assert_eq!(r["pool"]["drives"].as_array().map(Vec::len), Some(4), "{}", r["pool"]);
    assert_eq!(r["retrieve"]["verified_bytes"], r["retrieve"]["bytes"]);
    assert_eq!(r["reopen"]["hits"], 40);
}

#[test]
fn namespaces_with_metadata_or_zones_are_refused_by_name() {
    for (flag, want) in [(["--emu-metadata", "8"], "8 B metadata"), (["--emu-zoned", ""], "Zoned Namespace")]
    {
        let mut args = SMALL.to_vec();
        args.extend(flag.iter().filter(|a| !a.is_empty()));
        let out = tutti(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag:?}");
        assert!(err.contains("emu0") && err.contains("namespace 1") && err.contains(want), "{flag:?}: {err}");
        assert!(err.contains("reformat") || err.contains("NVM command set"), "{flag:?}: a remedy: {err}");
    }
}

#[test]
fn host_kv_memory_moves_on_the_staged_path_with_host_staged() {
    // Both executor modes: the lanes copy every chunk between its staging slot and KV memory.
    for mode in ["persistent", "launch"] {
        let r = json(&[&SMALL[..], &["--kv-memory", "host-staged", "--executor", mode]].concat());
        assert_eq!(r["pool"]["data_path"]["mode"], "staged", "{mode}: {}", r["pool"]["data_path"]);
        let want = r["request_bytes"].as_u64().unwrap();
        assert_eq!(r["retrieve"]["verified_bytes"].as_u64(), Some(want), "{mode}");
        assert_eq!(r["reopen"]["verified_bytes"].as_u64(), Some(want), "{mode}");
        let staging = &r["pool"]["data_path"]["staging"];
        assert_eq!(staging["withheld"].as_u64(), Some(0), "{mode}: {staging}");
        assert!(
            staging["staged_bytes"].as_u64().unwrap() >= 2 * want,
            "{mode}: stored and retrieved through slots: {staging}"
        );
    }
}
