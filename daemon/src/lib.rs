//! tuttid's socket layer: the transport between the daemon and its clients.
//!
//! - [`wire`]: frames (a 4-byte little-endian length, a JSON body, up to 8 file descriptors
//!   by SCM_RIGHTS), each read against a deadline;
//! - [`peer`]: SO_PEERCRED and the access policy;
//! - [`server`]: binding the socket file safely and serving one thread per client through a
//!   [`Handler`];
//! - [`client`]: a [`Connection`] that makes one call at a time.
//!
//! The daemon's operations (their request and reply types) are built on top of this layer.

// Libraries report through return values and `tracing`, never by printing.
#![warn(clippy::print_stdout, clippy::print_stderr)]

pub mod client;
pub mod error;
pub mod peer;
pub mod server;
pub mod wire;

pub use client::Connection;
pub use error::{DaemonError, Result};
pub use peer::{AccessPolicy, PeerCred};
pub use server::{Handler, Server, SocketMode};
pub use wire::{recv_frame, send_frame, Hello, MAX_FDS, MAX_FRAME};
