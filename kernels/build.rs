//! Builds the kernels twice from one source:
//! - `gio_bundle.cu` in OUT_DIR: cuda/gio.cu with our quoted includes inlined
//!   (with #line directives), the single string NVRTC compiles at run time;
//! - a static library of the same source compiled as C++20 by the system
//!   compiler for the host executor (host/gio_host.cpp includes cuda/gio.cu).

use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let env = |name: &str| {
        std::env::var(name).map_err(|e| format!("{name}: {e} (cargo sets it for build scripts)"))
    };
    let root = PathBuf::from(env("CARGO_MANIFEST_DIR")?);
    let out = PathBuf::from(env("OUT_DIR")?);
    for dir in ["cuda", "include", "host"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }

    let search = [root.join("cuda"), root.join("include")];
    let mut seen = HashSet::new();
    let mut bundle = String::new();
    inline(&root.join("cuda/gio.cu"), &search, &mut seen, &mut bundle);
    let bundle_path = out.join("gio_bundle.cu");
    std::fs::write(&bundle_path, bundle).map_err(|e| format!("writing {}: {e}", bundle_path.display()))?;

    cc::Build::new()
        .cpp(true)
        .std("c++20")
        .include(root.join("include"))
        .include(root.join("cuda"))
        .file(root.join("host/runtime.cpp"))
        .file(root.join("host/gio_host.cpp"))
        .opt_level(2)
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("tutti_gio_host");
    Ok(())
}

/// Appends `file` to `out`, replacing each `#include "x"` that resolves to one of
/// our files (next to the includer, then in `search`) with its text, once.
fn inline(file: &Path, search: &[PathBuf], seen: &mut HashSet<PathBuf>, out: &mut String) {
    let canonical = file.canonicalize().unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    if !seen.insert(canonical.clone()) {
        return;
    }
    let text = std::fs::read_to_string(&canonical).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let _ = writeln!(out, "#line 1 \"{}\"", canonical.display());
    for (n, line) in text.lines().enumerate() {
        let quoted = line.trim_start().strip_prefix("#include \"").and_then(|r| r.split('"').next());
        let target = quoted.and_then(|name| {
            let here = canonical.parent().map(|p| p.join(name));
            here.into_iter().chain(search.iter().map(|d| d.join(name))).find(|p| p.is_file())
        });
        match target {
            Some(path) => {
                inline(&path, search, seen, out);
                let _ = writeln!(out, "#line {} \"{}\"", n + 2, canonical.display());
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
}
