//! gio_uring's error type.

use crate::handle::IocbId;
use std::time::Duration;

/// Everything gio_uring can report.
#[derive(Debug, thiserror::Error)]
pub enum GioError {
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    #[error("IOCB pool exhausted: asked for {wanted}, {free} of {depth} free")]
    PoolExhausted { wanted: usize, free: usize, depth: u32 },

    #[error("{id} is {state}, not {expected}")]
    WrongState { id: IocbId, state: &'static str, expected: &'static str },

    #[error("waited {waited:?} for {} IOCB(s); still in flight: {}", pending.len(), list(pending))]
    WaitTimeout { pending: Vec<IocbId>, waited: Duration },

    #[error("{id}: {failed} of {count} IOCTXs failed; first: IOCTX {index}: {status}")]
    IoFailed { id: IocbId, count: u32, failed: u32, index: u32, status: crate::IoStatus },

    #[error("layer table: {0}")]
    Table(String),

    #[error("pair list: {0}")]
    PairList(String),

    #[error("all {slots} pair list slots are in use (GioOptions::max_pair_lists)")]
    PairListsFull { slots: u32 },

    #[error("executor {executor}: {what}")]
    Executor { executor: String, what: String },

    #[error("no CUDA: {0}")]
    NoCuda(String),

    #[error("CUDA {call} failed: {code}")]
    Cuda { call: &'static str, code: String },

    #[error("drive {drive} ({name}): recovery gave up after {waited:?}: {users} command(s) still in flight on its queues; nothing was changed")]
    RecoveryBusy { drive: u16, name: String, users: u32, waited: Duration },

    #[error("drive {drive} ({name}) failed: {what}; its queues stay closed until the controller is reset")]
    DriveFailed {
        drive: u16,
        name: String,
        what: String,
        #[source]
        source: Option<Box<tutti_driver::DriverError>>,
    },

    #[error(transparent)]
    Kernel(#[from] tutti_kernels::KernelError),

    #[error(transparent)]
    Driver(#[from] tutti_driver::DriverError),
}

fn list(ids: &[IocbId]) -> String {
    let shown: Vec<String> = ids.iter().take(8).map(|i| i.to_string()).collect();
    let more = if ids.len() > 8 { format!(" and {} more", ids.len() - 8) } else { String::new() };
    format!("{}{more}", shown.join(", "))
}

impl GioError {
    pub(crate) fn invalid(what: impl Into<String>) -> Self {
        GioError::InvalidArgument(what.into())
    }
    pub(crate) fn table(what: impl Into<String>) -> Self {
        GioError::Table(what.into())
    }
    pub(crate) fn pair_list(what: impl Into<String>) -> Self {
        GioError::PairList(what.into())
    }
}

pub type Result<T, E = GioError> = std::result::Result<T, E>;
