//! The committed include/tutti.h is exactly what the cbindgen CLI makes of
//! the current sources (regenerate with scripts/gen-header).

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../tests/support/skip.rs"]
mod skip;

use std::path::PathBuf;
use std::process::Command;

#[test]
fn committed_header_matches_cbindgen_output() {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if !Command::new("cbindgen").arg("--version").output().is_ok_and(|o| o.status.success()) {
        return skip::skip(
            "the cbindgen CLI is not installed (scripts/test installs it: apt-get install cbindgen)",
        );
    }
    let out = std::env::temp_dir().join(format!("tutti-header-{}.h", std::process::id()));
    let st = Command::new("cbindgen")
        .arg("--quiet")
        .arg("--config")
        .arg(manifest.join("cbindgen.toml"))
        .args(["--crate", "tutti-capi", "--output"])
        .arg(&out)
        .arg(&manifest)
        .output()
        .expect("run cbindgen");
    assert!(st.status.success(), "cbindgen failed:\n{}", String::from_utf8_lossy(&st.stderr));
    let generated = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    let committed = std::fs::read_to_string(manifest.join("include/tutti.h")).unwrap();
    if generated != committed {
        let first = generated.lines().zip(committed.lines()).position(|(a, b)| a != b);
        panic!(
            "capi/include/tutti.h is stale (first differing line: {:?}); run scripts/gen-header and commit it",
            first.map(|i| i + 1)
        );
    }
    for name in ["tutti_runtime_open", "tutti_job_wait_layer", "TUTTI_E_PANIC", "# Safety"] {
        assert!(committed.contains(name), "the header lacks {name}");
    }
    // The fault-injection calls are declared only for a library built with them.
    let mut guarded = false;
    for line in committed.lines() {
        match line.trim() {
            "#if defined(TUTTI_FAULT_INJECTION)" => guarded = true,
            "#endif" => guarded = false,
            l if (l.contains("tutti_emulated_") || l.contains("TUTTI_MAX_EMULATED"))
                && !l.starts_with("//")
                && !l.starts_with('*') =>
            {
                assert!(guarded, "{l:?} is declared outside #if defined(TUTTI_FAULT_INJECTION)")
            }
            _ => {}
        }
    }
    assert!(committed.contains("tutti_emulated_fail_next"), "the header lacks the fault-injection calls");
}
