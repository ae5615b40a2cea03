//! One module per subcommand; each has a clap `Args` and `run(&Args)`.

pub mod admin;
pub mod bench;
pub mod demo;
pub mod identify;
pub mod profile;
pub mod selftest;
pub mod simulate;
