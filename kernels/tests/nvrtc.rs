//! Compiles every I/O kernel with NVRTC for sm_90 and fails on any error or
//! warning; prints ptxas' per-kernel resource report (registers, spills).
//!
//! Skips (with the reason; under CI=true fails) when libnvrtc cannot be found; `scripts/nvrtc-check`
//! installs the pip wheel and runs this test.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../tests/support/skip.rs"]
mod skip;

use tutti_kernels::nvrtc::{self, Compiled};
use tutti_kernels::{GPU_BLOCK_THREADS, KERNELS, KERNEL_ISSUE, KERNEL_PERSISTENT};

fn nvrtc_or_skip() -> bool {
    match nvrtc::load() {
        Ok(from) => {
            let (major, minor) = nvrtc::version().expect("nvrtcVersion");
            eprintln!("NVRTC {major}.{minor} ({from})");
            true
        }
        Err(e) => {
            skip::skip(format!("{e} (scripts/nvrtc-check installs the NVRTC wheel)"));
            false
        }
    }
}

fn report(c: &Compiled) {
    println!("kernels for {} (registers from ptxas -v, run by NVRTC with -Xptxas -v):", c.arch);
    println!(
        "  {:<20} {:>9} {:>8} {:>10} {:>11} {:>12} {:>11}",
        "kernel", "registers", "barriers", "smem (B)", "stack (B)", "spill st (B)", "spill ld (B)"
    );
    for k in &c.kernels {
        println!(
            "  {:<20} {:>9} {:>8} {:>10} {:>11} {:>12} {:>11}",
            k.name, k.registers, k.barriers, k.shared_bytes, k.stack_frame, k.spill_stores, k.spill_loads
        );
    }
    println!("  cubin: {} bytes", c.cubin.len());
}

#[test]
fn every_kernel_compiles_for_sm_90_without_warnings() {
    if !nvrtc_or_skip() {
        return;
    }
    let c = nvrtc::compile_gio("sm_90").unwrap_or_else(|e| panic!("{e}"));
    report(&c);
    let warnings = c.warnings();
    assert!(warnings.is_empty(), "NVRTC/ptxas warnings:\n{}", warnings.join("\n"));
    assert_eq!(&c.cubin[..4], b"\x7fELF", "NVRTC did not return an ELF cubin");
    for name in KERNELS {
        let k = c.kernels.iter().find(|k| k.name == name);
        let k = k.unwrap_or_else(|| panic!("ptxas reported nothing for {name}:\n{}", c.log));
        assert!(k.registers > 0, "{name}: no register count in\n{}", c.log);
    }
    // __launch_bounds__(512, 2): two blocks per SM leave 64 registers a thread.
    let cap = 65536 / (2 * GPU_BLOCK_THREADS);
    for name in [KERNEL_ISSUE, KERNEL_PERSISTENT] {
        let k = c.kernels.iter().find(|k| k.name == name).unwrap();
        assert!(k.registers <= cap, "{name} uses {} registers, more than {cap}", k.registers);
    }
}

#[test]
fn warnings_and_errors_are_reported() {
    if !nvrtc_or_skip() {
        return;
    }
    let unused = r#"extern "C" __global__ void k(int* p) { int unused_local = 3; p[0] = 1; }"#;
    let c = nvrtc::compile(unused, "warns.cu", "sm_90").unwrap_or_else(|e| panic!("{e}"));
    assert!(!c.warnings().is_empty(), "an unused variable produced no warning:\n{}", c.log);

    let broken = r#"extern "C" __global__ void k() { undeclared_name = 1; }"#;
    let err = nvrtc::compile(broken, "broken.cu", "sm_90").expect_err("broken source compiled");
    let msg = err.to_string();
    assert!(msg.contains("broken.cu") && msg.contains("undeclared_name"), "unhelpful error: {msg}");
}
