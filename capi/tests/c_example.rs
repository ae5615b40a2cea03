//! Compiles capi/examples/kv_roundtrip.c with the system C compiler against
//! include/tutti.h and the libtutti.so of this build, and runs it: on RAM
//! media, on file media, under valgrind and with AddressSanitizer (each
//! skipped with a printed reason when the tool is missing).

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../tests/support/skip.rs"]
mod skip;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const EXAMPLE: &str = "examples/kv_roundtrip.c";

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn have(tool: &str) -> bool {
    Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success())
}

/// The directory holding the libtutti.so built with this test. Cargo builds
/// the library's cdylib and rlib in one go, so it sits in `deps/` next to
/// this executable (and is uplifted to the profile directory).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps dir").to_path_buf();
    let candidates = [deps.clone(), deps.parent().expect("profile dir").to_path_buf()];
    // `cargo build -p tutti-capi` without the feature writes a library of the
    // same name: take only one that has the fault-injection calls the example uses.
    if let Some(d) = candidates.iter().find(|d| has_fault_injection(&d.join("libtutti.so"))) {
        return d.clone();
    }
    // Not built (an unusual cargo invocation): build it into a target dir of
    // its own, since this cargo process holds the lock on ours.
    let target = deps.parent().and_then(Path::parent).expect("target dir").join("capi-cdylib");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = Command::new(cargo)
        .args(["build", "-p", "tutti-capi", "--lib", "--features", "fault-injection", "--target-dir"])
        .arg(&target)
        .current_dir(manifest())
        .status()
        .expect("run cargo build");
    assert!(st.success(), "building libtutti.so failed");
    target.join("debug")
}

/// Whether `lib` exists and exports the fault-injection calls (their names
/// are in its dynamic symbol table only when the feature built them).
fn has_fault_injection(lib: &Path) -> bool {
    let name = b"tutti_emulated_fail_next";
    std::fs::read(lib).is_ok_and(|b| b.windows(name.len()).any(|w| w == name))
}

/// Compiles the example with `extra` flags into a fresh directory.
fn compile(name: &str, extra: &[&str]) -> Option<PathBuf> {
    let out_dir = std::env::temp_dir().join(format!("tutti-capi-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&out_dir).unwrap();
    let exe = out_dir.join(name);
    let lib = lib_dir();
    let out = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-g"])
        // The tests' library has the fault-injection calls (the crate's dev-dependency on itself).
        .arg("-DTUTTI_FAULT_INJECTION")
        .args(extra)
        .arg("-I")
        .arg(manifest().join("include"))
        .arg(manifest().join(EXAMPLE))
        .arg("-L")
        .arg(&lib)
        .arg("-ltutti")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        // DT_RPATH, searched before LD_LIBRARY_PATH (which cargo points at its own directories).
        .arg("-Wl,--disable-new-dtags")
        .arg("-o")
        .arg(&exe)
        .output()
        .ok()?;
    assert!(
        out.status.success(),
        "compiling {EXAMPLE} with {extra:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(exe)
}

fn check(what: &str, out: &Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("--- {what}: {}\n{stdout}{stderr}", out.status);
    assert!(out.status.success(), "{what} failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("verified 131072 bytes loaded back"), "{what}: {stdout}");
    assert!(stdout.contains("kv_roundtrip: all checks passed"), "{what}: {stdout}");
}

#[test]
fn c_example_round_trips_on_ram_and_file_media() {
    if !have("cc") {
        return skip::skip("no system C compiler (cc)");
    }
    let exe = compile("kv_roundtrip", &[]).expect("cc runs");
    check("kv_roundtrip (RAM media)", &Command::new(&exe).output().unwrap());
    let media = std::env::temp_dir().join(format!("tutti-capi-media-{}", std::process::id()));
    let out = Command::new(&exe).arg(&media).output().unwrap();
    let images: Vec<_> =
        std::fs::read_dir(&media).map(|d| d.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&media);
    check("kv_roundtrip (file media)", &out);
    assert_eq!(images.len(), 2, "one media file per emulated drive: {images:?}");
    remove(&exe);
}

/// Removes a compiled example and its directory.
fn remove(exe: &Path) {
    if let Some(dir) = exe.parent() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn c_example_is_clean_under_valgrind() {
    if !have("cc") || !have("valgrind") {
        return skip::skip("valgrind or cc is not installed (scripts/test installs valgrind)");
    }
    let exe = compile("kv_roundtrip_vg", &[]).expect("cc runs");
    // No suppressions: every handle is destroyed, and the library frees its
    // handle tables when they empty, so nothing of ours is left at exit.
    let out = Command::new("valgrind")
        .args(["--error-exitcode=1", "--leak-check=full", "--errors-for-leak-kinds=definite,possible"])
        .arg(&exe)
        .output()
        .unwrap();
    check("kv_roundtrip under valgrind", &out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("ERROR SUMMARY: 0 errors"), "{stderr}");
    remove(&exe);
}

#[test]
fn c_example_is_clean_under_address_sanitizer() {
    if !have("cc") {
        return skip::skip("no system C compiler (cc)");
    }
    let probe = compile("asan_probe", &["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]);
    let Some(exe) = probe else {
        return skip::skip("cc could not be run with -fsanitize=address");
    };
    let out = Command::new(&exe)
        .env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0:exitcode=23")
        .env("UBSAN_OPTIONS", "halt_on_error=1:print_stacktrace=1")
        .output()
        .unwrap();
    check("kv_roundtrip with ASan/UBSan", &out);
    remove(&exe);
}

/// The C compiler lays every struct of tutti.h out as Rust does.
#[test]
fn c_and_rust_agree_on_struct_layouts() {
    if !have("cc") {
        return skip::skip("no system C compiler (cc)");
    }
    use std::mem::{offset_of, size_of};
    use tutti::*;
    let rust: Vec<(&str, usize)> = vec![
        ("tutti_hash_t", size_of::<tutti_hash_t>()),
        ("tutti_geometry_t", size_of::<tutti_geometry_t>()),
        ("tutti_runtime_config_t", size_of::<tutti_runtime_config_t>()),
        ("tutti_kv_layout_t", size_of::<tutti_kv_layout_t>()),
        ("tutti_table_sizes_t", size_of::<tutti_table_sizes_t>()),
        ("tutti_runtime_info_t", size_of::<tutti_runtime_info_t>()),
        ("tutti_job_status_t", size_of::<tutti_job_status_t>()),
        ("tutti_store_report_t", size_of::<tutti_store_report_t>()),
        ("tutti_stats_t", size_of::<tutti_stats_t>()),
        ("offsetof(tutti_runtime_config_t, geometry)", offset_of!(tutti_runtime_config_t, geometry)),
        (
            "offsetof(tutti_runtime_config_t, host_lane_blocks)",
            offset_of!(tutti_runtime_config_t, host_lane_blocks),
        ),
        ("offsetof(tutti_runtime_config_t, cuda_device)", offset_of!(tutti_runtime_config_t, cuda_device)),
        ("offsetof(tutti_runtime_config_t, cuda_driver)", offset_of!(tutti_runtime_config_t, cuda_driver)),
        ("tutti_data_path_t", size_of::<tutti_data_path_t>()),
        ("offsetof(tutti_data_path_t, p2p_missing)", offset_of!(tutti_data_path_t, p2p_missing)),
        ("offsetof(tutti_kv_layout_t, model)", offset_of!(tutti_kv_layout_t, model)),
        ("offsetof(tutti_kv_layout_t, tenant_salt_len)", offset_of!(tutti_kv_layout_t, tenant_salt_len)),
        ("offsetof(tutti_job_status_t, failed_bitmap)", offset_of!(tutti_job_status_t, failed_bitmap)),
        ("offsetof(tutti_job_status_t, bytes)", offset_of!(tutti_job_status_t, bytes)),
        ("offsetof(tutti_runtime_info_t, pool_id)", offset_of!(tutti_runtime_info_t, pool_id)),
        (
            "offsetof(tutti_store_report_t, failed_bitmap_words)",
            offset_of!(tutti_store_report_t, failed_bitmap_words),
        ),
        ("offsetof(tutti_stats_t, stores_open)", offset_of!(tutti_stats_t, stores_open)),
        ("offsetof(tutti_stats_t, host_calls)", offset_of!(tutti_stats_t, host_calls)),
        ("offsetof(tutti_stats_t, submit_ns)", offset_of!(tutti_stats_t, submit_ns)),
        ("offsetof(tutti_job_status_t, host_calls)", offset_of!(tutti_job_status_t, host_calls)),
        ("offsetof(tutti_job_status_t, pairs_registered)", offset_of!(tutti_job_status_t, pairs_registered)),
        ("offsetof(tutti_job_status_t, layer_submit_ns)", offset_of!(tutti_job_status_t, layer_submit_ns)),
    ];
    let mut src =
        String::from("#include \"tutti.h\"\n#include <stdio.h>\n#include <stddef.h>\nint main(void) {\n");
    for (expr, _) in &rust {
        let e = if expr.starts_with("offsetof") { expr.to_string() } else { format!("sizeof({expr})") };
        src += &format!("    printf(\"%zu\\n\", (size_t){e});\n");
    }
    src += "    return 0;\n}\n";
    let dir = std::env::temp_dir().join(format!("tutti-capi-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("layout.c"), src).unwrap();
    let exe = dir.join("layout");
    let out = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Werror", "-I"])
        .arg(manifest().join("include"))
        .arg(dir.join("layout.c"))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed = String::from_utf8(Command::new(&exe).output().unwrap().stdout).unwrap();
    let c: Vec<usize> = printed.lines().map(|l| l.parse().unwrap()).collect();
    for ((what, r), c) in rust.iter().zip(&c) {
        assert_eq!(r, c, "{what}: Rust {r}, C {c}");
    }
    assert_eq!(c.len(), rust.len());
    let _ = std::fs::remove_dir_all(&dir);
}
