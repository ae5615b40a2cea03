//! Where pip put an NVIDIA wheel (`nvidia-cuda-nvrtc-cu12`, `nvidia-cuda-nvdisasm`):
//! the directory of its Python package, asked of `python3`.

use std::path::PathBuf;

/// The directory of Python package `module` (e.g. `nvidia.cuda_nvrtc`), or `None` when
/// `python3` is missing or cannot import it.
pub(crate) fn package_dir(module: &str) -> Option<PathBuf> {
    let out = std::process::Command::new("python3")
        .args(["-c", &format!("import {module} as m; print(list(m.__path__)[0])")])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let dir = String::from_utf8(out.stdout).ok()?;
    let dir = dir.trim();
    (out.status.success() && !dir.is_empty()).then(|| PathBuf::from(dir))
}
