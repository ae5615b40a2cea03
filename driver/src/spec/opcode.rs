//! Command opcodes used by the driver (§5 admin, §6 NVM command set).

/// Admin command opcodes (§5).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum AdminOpcode {
    DeleteIoSq = 0x00,
    CreateIoSq = 0x01,
    GetLogPage = 0x02,
    DeleteIoCq = 0x04,
    CreateIoCq = 0x05,
    Identify = 0x06,
    Abort = 0x08,
    SetFeatures = 0x09,
    GetFeatures = 0x0a,
}

impl AdminOpcode {
    pub fn from_raw(v: u8) -> Option<Self> {
        Some(match v {
            0x00 => Self::DeleteIoSq,
            0x01 => Self::CreateIoSq,
            0x02 => Self::GetLogPage,
            0x04 => Self::DeleteIoCq,
            0x05 => Self::CreateIoCq,
            0x06 => Self::Identify,
            0x08 => Self::Abort,
            0x09 => Self::SetFeatures,
            0x0a => Self::GetFeatures,
            _ => return None,
        })
    }
}

/// NVM command set I/O opcodes (§6).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum IoOpcode {
    Flush = 0x00,
    Write = 0x01,
    Read = 0x02,
    WriteZeroes = 0x08,
    DatasetManagement = 0x09,
}

impl IoOpcode {
    pub fn from_raw(v: u8) -> Option<Self> {
        Some(match v {
            0x00 => Self::Flush,
            0x01 => Self::Write,
            0x02 => Self::Read,
            0x08 => Self::WriteZeroes,
            0x09 => Self::DatasetManagement,
            _ => return None,
        })
    }
    /// Whether the command moves data from host to controller.
    pub fn is_write(self) -> bool {
        matches!(self, Self::Write | Self::DatasetManagement)
    }
}

/// Identify CNS values (§5.15).
pub mod cns {
    pub const NAMESPACE: u8 = 0x00;
    pub const CONTROLLER: u8 = 0x01;
    pub const ACTIVE_NAMESPACES: u8 = 0x02;
    /// Namespace Identification Descriptor list (§5.15.2.3).
    pub const NAMESPACE_DESCRIPTORS: u8 = 0x03;
}

/// Feature identifiers (§5.21).
pub mod feature {
    pub const NUMBER_OF_QUEUES: u8 = 0x07;
    pub const VOLATILE_WRITE_CACHE: u8 = 0x06;
}
