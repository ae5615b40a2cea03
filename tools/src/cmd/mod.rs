//! One module per subcommand; each has a clap `Args` and `run(&Args)`.

pub mod admin;
pub mod bench;
pub mod demo;
pub mod identify;
pub mod kernels;
pub mod profile;
pub mod selftest;
pub mod serve;
pub mod simulate;
pub mod status;

/// `--executor`: how gio_uring's host executor runs the CUDA kernel source.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum ExecFlag {
    Persistent,
    Launch,
    /// Host executor only: lanes run on the calling thread (issue submits, waits reap).
    Inline,
}

impl ExecFlag {
    pub fn mode(self) -> tutti_gio_uring::ExecMode {
        match self {
            ExecFlag::Persistent => tutti_gio_uring::ExecMode::Persistent,
            ExecFlag::Launch => tutti_gio_uring::ExecMode::Launch,
            ExecFlag::Inline => tutti_gio_uring::ExecMode::Inline,
        }
    }
}
