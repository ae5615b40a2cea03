//! tutti's userspace NVMe driver.
//!
//! - [`spec`]: the wire formats of the NVMe base specification.
//! - [`transport`]: what the driver needs from a transport ([`transport::Registers`],
//!   [`transport::DmaSpace`]); implemented by `transport::vfio` and, for machines
//!   without a drive, by the `tutti-emulator` crate's software controller.
//! - [`controller`]: bring-up, admin commands, namespaces, I/O queue pairs, shutdown.
//! - [`queue`]: submission/completion rings with phase tags and CID matching.
//! - [`command`]: command builders and PRP/SGL data pointers.
//! - [`owner`]: one owner per media file or VFIO group, and naming the holder of a busy one.

// Libraries report through return values and `tracing`, never by printing.
#![warn(clippy::print_stdout, clippy::print_stderr)]

pub mod command;
pub mod controller;
pub mod error;
pub mod futex;
pub mod memfd;
pub mod owner;
pub mod pci;
pub mod queue;
pub mod selftest;
pub mod spec;
pub mod transport;

pub use error::{DriverError, Result};
