//! IOCTX builders and what a finished IOCB reports.

use crate::error::GioError;
use crate::handle::{IocbId, TableId};
use crate::status::IoStatus;
use std::time::Duration;
use tutti_driver::command::DataPtr;
use tutti_driver::spec::SglDescriptor;
use tutti_kernels::abi::{self, IoCtx};

/// The NVMe I/O opcode an IOCTX carries: the driver's [`IoOpcode`](tutti_driver::spec::IoOpcode), one
/// enum for both. An IOCTX is a Read or a Write; the executors refuse any
/// other opcode with [`Invalid::Opcode`](crate::status::Invalid::Opcode) (`tt_check_rw`).
pub use tutti_driver::spec::IoOpcode as Op;

/// Where an IOCTX's data is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataRef {
    /// One SGL descriptor (the drive must support SGLs).
    Sgl(SglDescriptor),
    /// PRP1 and PRP2 (PRP2 a list pointer when the transfer spans more than two pages).
    Prp { prp1: u64, prp2: u64 },
    /// Entry `index` of a registered layer table.
    Table { table: TableId, index: u32 },
}

impl TryFrom<DataPtr> for DataRef {
    type Error = GioError;
    fn try_from(p: DataPtr) -> Result<Self, GioError> {
        match p {
            DataPtr::Sgl(d) => Ok(DataRef::Sgl(d)),
            DataPtr::Prp { prp1, prp2 } => Ok(DataRef::Prp { prp1, prp2 }),
            DataPtr::None => Err(GioError::invalid("reads and writes need a data pointer")),
        }
    }
}

/// An IOCTX for `op` of `nlb` blocks at `slba` on drive `drive` (its index in the `GioUring`).
pub fn ioctx(op: Op, drive: u16, slba: u64, nlb: u32, data: DataRef) -> IoCtx {
    let (dptr, flags, table, table_index) = match data {
        DataRef::Sgl(d) => (d.to_words(), abi::IOCTX_SGL, 0, 0),
        DataRef::Prp { prp1, prp2 } => ([prp1, prp2], abi::IOCTX_PRP, 0, 0),
        DataRef::Table { table, index } => ([0, 0], abi::IOCTX_TABLE, table.0, index),
    };
    IoCtx {
        dptr,
        slba,
        nlb,
        table_index,
        drive,
        opcode: op as u8,
        flags,
        status: abi::STATUS_PENDING,
        table,
        ..Default::default()
    }
}

/// One IOCTX that did not succeed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoctxFailure {
    pub index: u32,
    pub status: IoStatus,
    pub drive: u16,
    pub opcode: u8,
    pub slba: u64,
    pub nlb: u32,
    /// Executor queue index (meaningful once the command was submitted).
    pub queue: u32,
}

impl std::fmt::Display for IoctxFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let op = tutti_driver::command::io_opcode_name(self.opcode);
        write!(
            f,
            "IOCTX {}: {op} drive {} LBA {} x {}: {}",
            self.index, self.drive, self.slba, self.nlb, self.status
        )
    }
}

/// What a finished IOCB reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IocbResult {
    pub id: IocbId,
    /// IOCTXs in the IOCB.
    pub count: u32,
    /// IOCTXs the executor finished (equals `count`).
    pub completed: u32,
    pub failed: u32,
    /// The first IOCTX to fail, in time, and its status.
    pub first_error: Option<(u32, IoStatus)>,
    /// Every failed IOCTX, by index.
    pub failures: Vec<IoctxFailure>,
    /// From the first part starting to the completion being posted.
    pub elapsed: Duration,
    /// When the first part started and when the completion was posted, on the
    /// executor's clock (CLOCK_MONOTONIC ns for the host executor, the GPU's
    /// global timer for CUDA): for breaking a round trip down into stages.
    pub started_ns: u64,
    pub done_ns: u64,
}

impl IocbResult {
    pub fn is_ok(&self) -> bool {
        self.failed == 0 && self.completed == self.count
    }

    /// `Ok(self)` if every IOCTX succeeded, else an error naming the first failure.
    pub fn check(self) -> Result<Self, GioError> {
        if self.is_ok() {
            return Ok(self);
        }
        let (index, status) = self.first_error.unwrap_or((0, IoStatus::Pending));
        Err(GioError::IoFailed { id: self.id, count: self.count, failed: self.failed, index, status })
    }
}
