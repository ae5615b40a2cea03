//! `tutti demo --cuda`: the main job with gio_uring's kernels on the CUDA
//! executor, here through the workspace's stand-in libcuda.so (the kernels
//! run as host threads behind CUDA's driver API): KV memory in CUDA memory
//! moves on the staged path, KV memory in host memory on the direct path,
//! every byte verified by the demo. `scripts/gpu-check` runs the same on a GPU.
//! Skips (with the reason; under CI=true fails) without NVRTC.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../tests/support/skip.rs"]
mod skip;

use std::process::Command;

fn demo(kv_memory: &str, extra: &[&str]) -> Option<serde_json::Value> {
    if let Err(e) = tutti_kernels::nvrtc::load() {
        skip::skip(format!("{e} (scripts/nvrtc-check --install installs the NVRTC wheel)"));
        return None;
    }
    let driver = tutti_cuda_standin::control::library_path().expect("the stand-in libcuda.so");
    let out = Command::new(env!("CARGO_BIN_EXE_tutti"))
        .args(["demo", "--cuda", "--cuda-driver"])
        .arg(&driver)
        .args(["--cuda-sms", "2", "--cuda-block-threads", "32", "--cuda-blocks-per-sm", "1"])
        .args(["--kv-memory", kv_memory, "--tokens", "512", "--layers", "4", "--kv-heads", "2"])
        .args(["--head-dim", "128", "--timeout", "60", "--json"])
        .args(extra)
        .output()
        .expect("run tutti");
    assert!(out.status.success(), "tutti demo failed:\n{}", String::from_utf8_lossy(&out.stderr));
    Some(serde_json::from_slice(&out.stdout).expect("JSON report"))
}

fn verified(r: &serde_json::Value) {
    let want = r["request_bytes"].as_u64().unwrap();
    assert!(want > 0);
    assert_eq!(r["retrieve"]["verified_bytes"].as_u64(), Some(want), "{r}");
    assert_eq!(r["reopen"]["verified_bytes"].as_u64(), Some(want), "{r}");
    assert_eq!(r["retrieve"]["failed_blocks"].as_u64(), Some(0), "{r}");
}

#[test]
fn cuda_kv_memory_moves_on_the_staged_path() {
    let Some(r) = demo("cuda", &[]) else { return };
    verified(&r);
    let path = &r["pool"]["data_path"];
    assert_eq!(path["mode"], "staged", "{path}");
    assert_eq!(path["memory"], "cuda", "{path}");
    assert!(path["p2p_missing"].as_str().unwrap().contains("CUDA memory"), "{path}");
    // Every byte stored and loaded went through the staging slots: twice the request at least.
    let staged = path["staging"]["staged_bytes"].as_u64().unwrap();
    assert!(staged >= 2 * r["request_bytes"].as_u64().unwrap(), "{path}");
    assert!(r["pool"]["io_mode"].as_str().unwrap().contains("cuda"), "{}", r["pool"]["io_mode"]);
}

#[test]
fn host_kv_memory_moves_on_the_direct_path_in_launch_mode_too() {
    let Some(r) = demo("host", &["--executor", "launch"]) else { return };
    verified(&r);
    assert_eq!(r["pool"]["data_path"]["mode"], "direct");
    assert!(r["pool"]["io_mode"].as_str().unwrap().contains("Launch"), "{}", r["pool"]["io_mode"]);
}

#[test]
fn cuda_kv_memory_without_the_cuda_executor_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_tutti"))
        .args(["demo", "--kv-memory", "cuda", "--tokens", "64", "--layers", "2"])
        .output()
        .expect("run tutti");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--kv-memory cuda needs --cuda"));
    // The driver variables alone change nothing without --cuda.
    let out = Command::new(env!("CARGO_BIN_EXE_tutti"))
        .args(["demo", "--tokens", "64", "--layers", "2", "--no-reopen"])
        .env("TUTTI_CUDA_DRIVER", "/nonexistent/libcuda.so")
        .env("TUTTI_GIO_CUBIN", "/nonexistent/gio.cubin")
        .output()
        .expect("run tutti");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
