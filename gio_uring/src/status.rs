//! The status an executor writes into each IOCTX, decoded.

use tutti_driver::spec::Status;
use tutti_kernels::abi;

/// Why a command was not submitted or did not finish.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IoStatus {
    Success,
    /// Not finished yet.
    Pending,
    /// The controller completed the command with this status.
    Nvme(Status),
    /// Submitted, but no completion arrived within the command timeout.
    CompletionTimeout,
    /// No submission slot became free within the submit timeout (the queue is now dead).
    SubmitTimeout,
    /// A staged command found no free staging slot within the submit timeout;
    /// it was never sent.
    StagingTimeout,
    /// The IOCTX (or a layer table) named something that does not exist.
    Translation(Translation),
    /// The command was malformed; it was never sent.
    Invalid(Invalid),
    /// The queue it was for failed earlier; it was never sent.
    QueueDead {
        queue: u32,
    },
    /// The host was recovering the queue it was for (`GioUring::recover_drive`);
    /// it was never sent.
    QueueRecovering {
        queue: u32,
    },
    /// A value this version does not know.
    Unknown(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Translation {
    Drive,
    Table,
    Layer,
    File,
    Block,
    Index,
    EmptyEntry,
    EntryLength,
    /// A layer IOCB named a pair list that is not registered.
    PairList,
    /// A layer IOCB named pairs beyond the end of its pair list.
    PairRange,
    /// A drive's LBA size does not fit the layer table's units.
    Unit,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Invalid {
    Opcode,
    Length,
    DataPointer,
    SglLength,
    NoSgl,
    SglAlignment,
}

impl IoStatus {
    /// Decodes a `tt_ioctx.status` word.
    pub fn from_raw(raw: u32) -> Self {
        if raw == abi::STATUS_SUCCESS {
            return IoStatus::Success;
        }
        if raw == abi::STATUS_PENDING {
            return IoStatus::Pending;
        }
        let detail = raw & 0xFF_FFFF;
        let unknown = IoStatus::Unknown(raw);
        match raw >> abi::STATUS_KIND_SHIFT {
            abi::KIND_NVME => IoStatus::Nvme(Status::from_field(detail as u16)),
            abi::KIND_TIMEOUT => match detail {
                abi::TIMEOUT_COMPLETION => IoStatus::CompletionTimeout,
                abi::TIMEOUT_SUBMIT => IoStatus::SubmitTimeout,
                abi::TIMEOUT_STAGING => IoStatus::StagingTimeout,
                _ => unknown,
            },
            abi::KIND_TRANSLATION => IoStatus::Translation(match detail {
                abi::XLATE_DRIVE => Translation::Drive,
                abi::XLATE_TABLE => Translation::Table,
                abi::XLATE_LAYER => Translation::Layer,
                abi::XLATE_FILE => Translation::File,
                abi::XLATE_BLOCK => Translation::Block,
                abi::XLATE_INDEX => Translation::Index,
                abi::XLATE_EMPTY => Translation::EmptyEntry,
                abi::XLATE_LENGTH => Translation::EntryLength,
                abi::XLATE_PAIR_LIST => Translation::PairList,
                abi::XLATE_PAIR_RANGE => Translation::PairRange,
                abi::XLATE_UNIT => Translation::Unit,
                _ => return unknown,
            }),
            abi::KIND_INVALID => IoStatus::Invalid(match detail {
                abi::INVALID_OPCODE => Invalid::Opcode,
                abi::INVALID_LENGTH => Invalid::Length,
                abi::INVALID_DPTR => Invalid::DataPointer,
                abi::INVALID_SGL_LENGTH => Invalid::SglLength,
                abi::INVALID_NO_SGL => Invalid::NoSgl,
                abi::INVALID_SGL_ALIGN => Invalid::SglAlignment,
                _ => return unknown,
            }),
            abi::KIND_QUEUE_DEAD => IoStatus::QueueDead { queue: detail },
            abi::KIND_QUEUE_RECOVERING => IoStatus::QueueRecovering { queue: detail },
            _ => unknown,
        }
    }

    pub fn is_success(self) -> bool {
        self == IoStatus::Success
    }
    pub fn is_timeout(self) -> bool {
        matches!(self, IoStatus::CompletionTimeout | IoStatus::SubmitTimeout)
    }
}

impl std::fmt::Display for IoStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IoStatus::Success => f.write_str("success"),
            IoStatus::Pending => f.write_str("not finished"),
            IoStatus::Nvme(s) => write!(f, "NVMe {s}"),
            IoStatus::CompletionTimeout => f.write_str("timed out waiting for its completion"),
            IoStatus::SubmitTimeout => {
                f.write_str("timed out waiting for a submission slot (queue now dead)")
            }
            IoStatus::StagingTimeout => {
                f.write_str("timed out waiting for a free staging slot; not sent (more staging slots help)")
            }
            IoStatus::Translation(t) => write!(
                f,
                "translation failed: {}",
                match t {
                    Translation::Drive => "no such drive",
                    Translation::Table => "no such layer table",
                    Translation::Layer => "layer beyond the table",
                    Translation::File => "file id beyond the table",
                    Translation::Block => "block id beyond the table",
                    Translation::Index => "table index out of range",
                    Translation::EmptyEntry => "table entry never filled",
                    Translation::EntryLength => "table entry length differs from the chunk",
                    Translation::PairList => "no such registered pair list",
                    Translation::PairRange => "pairs beyond the end of the pair list",
                    Translation::Unit => "a drive's LBA size does not fit the layer table's units",
                }
            ),
            IoStatus::Invalid(i) => write!(
                f,
                "invalid command: {}",
                match i {
                    Invalid::Opcode => "only Read and Write are issued",
                    Invalid::Length => "block count is 0 or above the drive's transfer limit",
                    Invalid::DataPointer => "no (or more than one) data pointer kind",
                    Invalid::SglLength => "SGL Data Block length differs from the block count",
                    Invalid::NoSgl => "the drive does not support SGLs",
                    Invalid::SglAlignment => "the drive needs dword-aligned SGL addresses and lengths",
                }
            ),
            IoStatus::QueueDead { queue } => write!(f, "queue {queue} failed earlier"),
            IoStatus::QueueRecovering { queue } => write!(f, "queue {queue} is being recovered; not sent"),
            IoStatus::Unknown(raw) => write!(f, "unknown status {raw:#010x}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_statuses_decode() {
        assert_eq!(IoStatus::from_raw(0), IoStatus::Success);
        assert_eq!(IoStatus::from_raw(u32::MAX), IoStatus::Pending);
        let lba = abi::status(abi::KIND_NVME, Status::LBA_OUT_OF_RANGE.with_dnr(true).to_field() as u32);
        assert_eq!(IoStatus::from_raw(lba), IoStatus::Nvme(Status::LBA_OUT_OF_RANGE.with_dnr(true)));
        assert_eq!(IoStatus::from_raw(lba).to_string(), "NVMe Generic/LBA Out of Range (0x0080) [DNR]");
        assert_eq!(
            IoStatus::from_raw(abi::status(abi::KIND_TIMEOUT, abi::TIMEOUT_COMPLETION)),
            IoStatus::CompletionTimeout
        );
        assert_eq!(
            IoStatus::from_raw(abi::status(abi::KIND_TRANSLATION, abi::XLATE_FILE)),
            IoStatus::Translation(Translation::File)
        );
        assert_eq!(
            IoStatus::from_raw(abi::status(abi::KIND_TRANSLATION, abi::XLATE_PAIR_RANGE)).to_string(),
            "translation failed: pairs beyond the end of the pair list"
        );
        assert_eq!(
            IoStatus::from_raw(abi::status(abi::KIND_QUEUE_DEAD, 3)),
            IoStatus::QueueDead { queue: 3 }
        );
        assert_eq!(
            IoStatus::from_raw(abi::status(abi::KIND_QUEUE_RECOVERING, 2)),
            IoStatus::QueueRecovering { queue: 2 }
        );
        assert_eq!(
            IoStatus::from_raw(abi::status(abi::KIND_TIMEOUT, abi::TIMEOUT_STAGING)),
            IoStatus::StagingTimeout
        );
        assert_eq!(IoStatus::from_raw(0x7700_0001), IoStatus::Unknown(0x7700_0001));
    }
}
