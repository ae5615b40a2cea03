//! The kernels crate's error type.

/// What can go wrong loading, compiling or launching the I/O kernels.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("NVRTC is not available: {0}")]
    NvrtcUnavailable(String),

    #[error("NVRTC failed to compile {program} for {arch} ({call}: {code}):\n{log}")]
    Compile { program: String, arch: String, call: &'static str, code: String, log: String },

    #[error("malformed cubin: {0}")]
    Cubin(String),

    #[error("SASS check: {0}")]
    Sass(String),

    #[error("host kernel launch of {kernel} ({grid} x {block} lanes) failed: {reason}")]
    HostLaunch { kernel: &'static str, grid: u32, block: u32, reason: String },
}
