//! tuttid's socket layer: the transport between the daemon and its clients.
//!
//! - [`wire`]: frames (a 4-byte little-endian length, a JSON body, up to 8 file descriptors
//!   by SCM_RIGHTS), each read against a deadline;
//! - [`peer`]: SO_PEERCRED and the access policy;
//! - [`server`]: binding the socket file safely and serving one thread per client through a
//!   [`Handler`];
//! - [`client`]: a [`Connection`] that makes one call at a time.
//!
//! On top of it, the daemon's operations:
//! - [`proto`]: the requests and replies;
//! - [`Daemon`]: opens the drives and the pool and serves them (`service.rs`: the daemon's
//!   side of every request, and what each client holds until it goes);
//! - [`remote`]: an engine process's side, a `KvStore` whose pool lives in the daemon;
//! - [`arbitration`]: the shared per-drive board through which the clients' schedulers keep
//!   reads and writes off one drive at once across processes.

// Libraries report through return values and `tracing`, never by printing.
#![warn(clippy::print_stdout, clippy::print_stderr)]

pub mod arbitration;
pub mod client;
mod conn;
mod daemon;
pub mod error;
mod handler;
pub mod metrics;
pub mod peer;
pub mod proto;
pub mod remote;
pub mod server;
mod service;
pub mod wire;

pub use client::Connection;
pub use daemon::{Daemon, DaemonConfig, DriveSource, MetricsSource};
pub use error::{DaemonError, Result};
pub use peer::{AccessPolicy, PeerCred};
pub use server::{Handler, Server, SocketMode};
pub use wire::{recv_frame, send_frame, Hello, MAX_FDS, MAX_FRAME};
