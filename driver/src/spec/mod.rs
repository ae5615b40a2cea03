//! NVMe wire formats: the bytes a controller and its host exchange.
//!
//! Every type here is `#[repr(C)]` with a compile-time size check, so a layout
//! mistake fails the build instead of corrupting a queue. Section numbers refer
//! to the NVMe Base Specification 1.4.

pub mod entry;
pub mod identify;
pub mod opcode;
pub mod registers;
pub mod sgl;
pub mod status;

pub use entry::{CompletionEntry, Psdt, SubmissionEntry};
pub use identify::{CommandSet, IdentifyController, IdentifyNamespace, LbaFormat, SglSupport};
pub use opcode::{AdminOpcode, IoOpcode};
pub use registers::{Aqa, Cap, Cc, Csts, ShutdownStatus, Version};
pub use sgl::{SglDescriptor, SglKind};
pub use status::Status;

/// Size of one submission queue entry (§4.2).
pub const SQE_SIZE: usize = 64;
/// Size of one completion queue entry (§4.6).
pub const CQE_SIZE: usize = 16;
