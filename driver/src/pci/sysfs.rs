//! Reading and writing sysfs attributes, with errors that name the file.

use crate::error::{DriverError, Result};
use std::io::{ErrorKind, Write};
use std::path::Path;

pub fn read_trimmed(path: &Path) -> Result<String> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|e| DriverError::io(format!("reading {}", path.display()), e))
}

/// The attribute's text, or `None` when it does not exist or cannot be read.
pub fn read_optional(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// The last component of a symlink's target (`driver` → `nvme`), if it is one.
pub fn link_name(path: &Path) -> Option<String> {
    let target = std::fs::read_link(path).ok()?;
    target.file_name().map(|n| n.to_string_lossy().into_owned())
}

/// Names in a directory; a missing directory has none.
pub fn entries(dir: &Path) -> Result<Vec<String>> {
    match std::fs::read_dir(dir) {
        Ok(rd) => {
            let mut names = Vec::new();
            for entry in rd {
                let entry = entry.map_err(|e| DriverError::io(format!("listing {}", dir.display()), e))?;
                names.push(entry.file_name().to_string_lossy().into_owned());
            }
            names.sort();
            Ok(names)
        }
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(DriverError::io(format!("listing {}", dir.display()), e)),
    }
}

/// One write of `value` to an existing attribute. Sysfs takes an attribute in
/// a single write; the kernel's answer (e.g. `ENODEV` from `bind`) is the error.
pub fn write(path: &Path, value: &str) -> Result<()> {
    let denied = |e: std::io::Error| {
        if matches!(e.kind(), ErrorKind::PermissionDenied) || e.raw_os_error() == Some(libc::EPERM) {
            DriverError::Vfio(format!(
                "permission denied writing {}: binding and unbinding drivers needs root \
                 (run the command with sudo)",
                path.display()
            ))
        } else {
            DriverError::io(format!("writing {value:?} to {}", path.display()), e)
        }
    };
    let mut file = std::fs::OpenOptions::new().write(true).open(path).map_err(denied)?;
    let written = file.write(value.as_bytes()).map_err(denied)?;
    if written != value.len() {
        return Err(DriverError::Vfio(format!(
            "short write to {}: {written} of {} bytes of {value:?} accepted",
            path.display(),
            value.len()
        )));
    }
    Ok(())
}
