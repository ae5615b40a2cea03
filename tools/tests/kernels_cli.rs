//! `tutti kernels`: the NVRTC build of the I/O kernels, its resource report,
//! the cubin it writes, and the SASS fence check's verdict in the exit status.
//! Skips (with the reason; under CI=true fails) without NVRTC or nvdisasm
//! (`scripts/nvrtc-check --install` installs both).

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../tests/support/skip.rs"]
mod skip;

use std::process::Command;

fn kernels(args: &[&str]) -> (bool, String, String) {
    let out =
        Command::new(env!("CARGO_BIN_EXE_tutti")).arg("kernels").args(args).output().expect("run tutti");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_report_and_the_cubin_match_the_launchers() {
    if let Err(e) = tutti_kernels::nvrtc::load() {
        skip::skip(format!("{e} (scripts/nvrtc-check --install installs the NVRTC wheel)"));
        return;
    }
    let dir = std::env::temp_dir().join(format!("tutti-kernels-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cubin = dir.join("gio.cubin");
    let (ok, json, err) = kernels(&["--json", "--cubin", cubin.to_str().unwrap()]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["arch"], "sm_90");
    for (name, sizes) in tutti_kernels::KERNEL_PARAMS {
        let k = v["kernels"]
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["name"] == name)
            .unwrap_or_else(|| panic!("{name}: {v}"));
        let got: Vec<u32> =
            k["param_bytes"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        assert_eq!(got, sizes, "{name}");
        assert!(k["registers"].as_u64().unwrap() > 0);
    }
    let image = std::fs::read(&cubin).unwrap();
    assert_eq!(v["cubin_bytes"].as_u64().unwrap() as usize, image.len());
    assert_eq!(tutti_kernels::cubin::parse(&image).unwrap().sm, 90);
    std::fs::remove_dir_all(&dir).unwrap();

    let (ok, _, err) = kernels(&["--arch", "sm_1"]);
    assert!(!ok, "an unknown architecture compiled");
    assert!(err.contains("sm_1"), "the error names the architecture: {err}");
}

#[test]
fn the_sass_check_passes_and_says_what_it_checked() {
    if let Err(e) = tutti_kernels::nvrtc::load()
        .map(|_| ())
        .and_then(|()| tutti_kernels::sass::find_nvdisasm().map(|_| ()))
    {
        skip::skip(format!("{e}"));
        return;
    }
    let (ok, text, err) = kernels(&["--sass"]);
    assert!(ok, "the SASS check failed:\n{text}\n{err}");
    assert!(text.contains("doorbell stores, 0 unfenced"), "{text}");
    // The staged copy of each kernel that has one: 8 loads of 128 bits before the first store.
    let copies: Vec<&str> = text.lines().filter(|l| l.starts_with("staged copy")).collect();
    assert_eq!(copies.len(), 3, "tt_gio_issue, tt_gio_persistent, tt_gio_copy:\n{text}");
    for l in copies {
        assert!(
            l.contains("8 loads in flight") && l.contains("LDG.E.128.STRONG.SYS") && l.contains("STG.E.128"),
            "{l}"
        );
        assert!(!l.contains("NOT as required"), "{l}");
    }
}
