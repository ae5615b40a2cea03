//! A cubin built elsewhere (`tutti kernels --cubin`, `scripts/gpu-check --bundle`)
//! runs the executor on a machine without NVRTC 12, and is checked before the
//! driver sees it: the device's architecture, every entry point and the
//! parameter tables the launches pass.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod executor_common;

use executor_common::*;
use tutti_gio_uring::{CudaExecutor, CudaExecutorConfig, ExecMode};

#[test]
fn a_prebuilt_cubin_runs_and_a_wrong_one_is_refused_naming_why() {
    let _g = serial();
    let Some((s, path)) = standin() else { return };
    let dir = std::env::temp_dir().join(format!("tutti-cubin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("gio_sm_90.cubin");
    let image = tutti_kernels::nvrtc::compile_gio("sm_90").unwrap().cubin;
    std::fs::write(&good, &image).unwrap();
    let cfg = CudaExecutorConfig { cubin: Some(good.clone()), ..config(&path, ExecMode::Launch) };
    let rig = rig(cfg.clone(), opts());
    round_trip(&rig, 16, 3);
    drop(rig);

    let refused = |file: &std::path::Path| match CudaExecutor::new(CudaExecutorConfig {
        cubin: Some(file.to_path_buf()),
        ..cfg.clone()
    }) {
        Ok(_) => panic!("{} was accepted", file.display()),
        Err(e) => e.to_string(),
    };
    let other_arch = dir.join("gio_sm_80.cubin");
    std::fs::write(&other_arch, tutti_kernels::nvrtc::compile_gio("sm_80").unwrap().cubin).unwrap();
    let e = refused(&other_arch);
    assert!(e.contains("sm_80") && e.contains("sm_90") && e.contains("gio_sm_80.cubin"), "{e}");
    let truncated = dir.join("truncated.cubin");
    std::fs::write(&truncated, &image[..image.len() / 3]).unwrap();
    let e = refused(&truncated);
    assert!(e.contains("truncated.cubin"), "{e}");
    let e = refused(&dir.join("missing.cubin"));
    assert!(e.contains("missing.cubin"), "{e}");
    // Another program's cubin: valid, but without the I/O kernels.
    let other = dir.join("other.cubin");
    let k = r#"extern "C" __global__ void k(int* p) { p[0] = 1; }"#;
    std::fs::write(&other, tutti_kernels::nvrtc::compile(k, "k.cu", "sm_90").unwrap().cubin).unwrap();
    let e = refused(&other);
    assert!(e.contains("no entry point tt_gio_issue"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
    let v = s.violations();
    assert!(v.is_empty(), "stand-in violations: {v:?}");
}
