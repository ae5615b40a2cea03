//! Completion status (§4.6.1): a status code type, a status code, and flags.
//!
//! A status always prints with its name, e.g. `Generic/Invalid Field (0x0002)`.

/// Status Code Type (§4.6.1.1).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum StatusCodeType {
    Generic,
    CommandSpecific,
    MediaDataIntegrity,
    PathRelated,
    Reserved(u8),
    VendorSpecific,
}

impl StatusCodeType {
    pub fn from_raw(v: u8) -> Self {
        match v & 0x7 {
            0 => Self::Generic,
            1 => Self::CommandSpecific,
            2 => Self::MediaDataIntegrity,
            3 => Self::PathRelated,
            7 => Self::VendorSpecific,
            v => Self::Reserved(v),
        }
    }
    pub fn raw(self) -> u8 {
        match self {
            Self::Generic => 0,
            Self::CommandSpecific => 1,
            Self::MediaDataIntegrity => 2,
            Self::PathRelated => 3,
            Self::VendorSpecific => 7,
            Self::Reserved(v) => v & 0x7,
        }
    }
    fn label(self) -> &'static str {
        match self {
            Self::Generic => "Generic",
            Self::CommandSpecific => "Command Specific",
            Self::MediaDataIntegrity => "Media",
            Self::PathRelated => "Path",
            Self::VendorSpecific => "Vendor",
            Self::Reserved(_) => "Reserved",
        }
    }
}

/// The 15-bit status field of a completion entry.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status(u16);

impl Status {
    pub const SUCCESS: Status = Status(0);

    // Generic command status (§4.6.1.2.1).
    pub const INVALID_OPCODE: Status = Status::generic(0x01);
    pub const INVALID_FIELD: Status = Status::generic(0x02);
    pub const CID_CONFLICT: Status = Status::generic(0x03);
    pub const DATA_TRANSFER_ERROR: Status = Status::generic(0x04);
    pub const INTERNAL_ERROR: Status = Status::generic(0x06);
    pub const ABORT_REQUESTED: Status = Status::generic(0x07);
    pub const ABORTED_SQ_DELETION: Status = Status::generic(0x08);
    pub const INVALID_NAMESPACE: Status = Status::generic(0x0b);
    pub const COMMAND_SEQUENCE_ERROR: Status = Status::generic(0x0c);
    pub const INVALID_SGL_SEGMENT: Status = Status::generic(0x0d);
    pub const INVALID_SGL_COUNT: Status = Status::generic(0x0e);
    pub const DATA_SGL_LENGTH_INVALID: Status = Status::generic(0x0f);
    pub const SGL_TYPE_INVALID: Status = Status::generic(0x11);
    pub const PRP_OFFSET_INVALID: Status = Status::generic(0x13);
    pub const SGL_OFFSET_INVALID: Status = Status::generic(0x16);
    pub const SGL_GRANULARITY_INVALID: Status = Status::generic(0x1e);
    pub const LBA_OUT_OF_RANGE: Status = Status::generic(0x80);
    pub const CAPACITY_EXCEEDED: Status = Status::generic(0x81);

    // Command specific status (§4.6.1.2.2).
    pub const CQ_INVALID: Status = Status::command_specific(0x00);
    pub const INVALID_QID: Status = Status::command_specific(0x01);
    pub const INVALID_QUEUE_SIZE: Status = Status::command_specific(0x02);
    pub const INVALID_QUEUE_DELETION: Status = Status::command_specific(0x0c);

    // Media and data integrity errors (§4.6.1.2.3).
    pub const WRITE_FAULT: Status = Status::media(0x80);
    pub const UNRECOVERED_READ_ERROR: Status = Status::media(0x81);

    pub const fn new(sct: u8, sc: u8) -> Status {
        Status(((sct as u16 & 0x7) << 8) | sc as u16)
    }
    pub const fn generic(sc: u8) -> Status {
        Status::new(0, sc)
    }
    pub const fn command_specific(sc: u8) -> Status {
        Status::new(1, sc)
    }
    pub const fn media(sc: u8) -> Status {
        Status::new(2, sc)
    }
    /// Decodes the 15-bit field from DW3\[31:17\].
    pub const fn from_field(field: u16) -> Status {
        Status(field & 0x7fff)
    }
    /// The 15-bit field as it is written into DW3\[31:17\].
    pub const fn to_field(self) -> u16 {
        self.0
    }
    pub fn sct(self) -> StatusCodeType {
        StatusCodeType::from_raw(((self.0 >> 8) & 0x7) as u8)
    }
    pub fn sc(self) -> u8 {
        self.0 as u8
    }
    /// SCT << 8 | SC: the number printed next to the name.
    pub fn code(self) -> u16 {
        self.0 & 0x7ff
    }
    pub fn more(self) -> bool {
        self.0 & (1 << 13) != 0
    }
    /// Do Not Retry.
    pub fn dnr(self) -> bool {
        self.0 & (1 << 14) != 0
    }
    pub fn with_dnr(self, dnr: bool) -> Status {
        Status((self.0 & !(1 << 14)) | (dnr as u16) << 14)
    }
    pub fn is_success(self) -> bool {
        self.code() == 0
    }
    /// The spec's name for this status, if it is one we know.
    pub fn name(self) -> Option<&'static str> {
        let sc = self.sc();
        Some(match self.sct() {
            StatusCodeType::Generic => match sc {
                0x00 => "Successful Completion",
                0x01 => "Invalid Command Opcode",
                0x02 => "Invalid Field",
                0x03 => "Command ID Conflict",
                0x04 => "Data Transfer Error",
                0x05 => "Aborted: Power Loss",
                0x06 => "Internal Error",
                0x07 => "Command Abort Requested",
                0x08 => "Aborted: SQ Deletion",
                0x09 => "Aborted: Failed Fused Command",
                0x0a => "Aborted: Missing Fused Command",
                0x0b => "Invalid Namespace or Format",
                0x0c => "Command Sequence Error",
                0x0d => "Invalid SGL Segment Descriptor",
                0x0e => "Invalid Number of SGL Descriptors",
                0x0f => "Data SGL Length Invalid",
                0x10 => "Metadata SGL Length Invalid",
                0x11 => "SGL Descriptor Type Invalid",
                0x12 => "Invalid Use of Controller Memory Buffer",
                0x13 => "PRP Offset Invalid",
                0x14 => "Atomic Write Unit Exceeded",
                0x15 => "Operation Denied",
                0x16 => "SGL Offset Invalid",
                0x18 => "Host Identifier Inconsistent Format",
                0x19 => "Keep Alive Timer Expired",
                0x1a => "Keep Alive Timeout Invalid",
                0x1b => "Aborted: Preempt and Abort",
                0x1c => "Sanitize Failed",
                0x1d => "Sanitize In Progress",
                0x1e => "SGL Data Block Granularity Invalid",
                0x1f => "Command Not Supported for Queue in CMB",
                0x20 => "Namespace is Write Protected",
                0x21 => "Command Interrupted",
                0x22 => "Transient Transport Error",
                0x23 => "Command Prohibited by Command and Feature Lockdown",
                0x24 => "Admin Command Media Not Ready",
                // NVM Command Set.
                0x80 => "LBA Out of Range",
                0x81 => "Capacity Exceeded",
                0x82 => "Namespace Not Ready",
                0x83 => "Reservation Conflict",
                0x84 => "Format In Progress",
                _ => return None,
            },
            StatusCodeType::CommandSpecific => match sc {
                0x00 => "Completion Queue Invalid",
                0x01 => "Invalid Queue Identifier",
                0x02 => "Invalid Queue Size",
                0x03 => "Abort Command Limit Exceeded",
                0x05 => "Asynchronous Event Request Limit Exceeded",
                0x06 => "Invalid Firmware Slot",
                0x07 => "Invalid Firmware Image",
                0x08 => "Invalid Interrupt Vector",
                0x09 => "Invalid Log Page",
                0x0a => "Invalid Format",
                0x0b => "Firmware Activation Requires Conventional Reset",
                0x0c => "Invalid Queue Deletion",
                0x0d => "Feature Identifier Not Saveable",
                0x0e => "Feature Not Changeable",
                0x0f => "Feature Not Namespace Specific",
                0x10 => "Firmware Activation Requires NVM Subsystem Reset",
                0x11 => "Firmware Activation Requires Controller Level Reset",
                0x12 => "Firmware Activation Requires Maximum Time Violation",
                0x13 => "Firmware Activation Prohibited",
                0x14 => "Overlapping Range",
                0x15 => "Namespace Insufficient Capacity",
                0x16 => "Namespace Identifier Unavailable",
                0x18 => "Namespace Already Attached",
                0x19 => "Namespace Is Private",
                0x1a => "Namespace Not Attached",
                0x1b => "Thin Provisioning Not Supported",
                0x1c => "Controller List Invalid",
                0x1d => "Device Self-test In Progress",
                0x1e => "Boot Partition Write Prohibited",
                0x1f => "Invalid Controller Identifier",
                0x20 => "Invalid Secondary Controller State",
                0x21 => "Invalid Number of Controller Resources",
                0x22 => "Invalid Resource Identifier",
                0x23 => "Sanitize Prohibited While Persistent Memory Region is Enabled",
                0x24 => "ANA Group Identifier Invalid",
                0x25 => "ANA Attach Failed",
                0x26 => "Insufficient Capacity",
                0x27 => "Namespace Attachment Limit Exceeded",
                0x28 => "Prohibition of Command Execution Not Supported",
                0x29 => "I/O Command Set Not Supported",
                0x2a => "I/O Command Set Not Enabled",
                0x2b => "I/O Command Set Combination Rejected",
                0x2c => "Invalid I/O Command Set",
                0x2d => "Identifier Unavailable",
                // NVM Command Set.
                0x80 => "Conflicting Attributes",
                0x81 => "Invalid Protection Information",
                0x82 => "Attempted Write to Read Only Range",
                0x83 => "Command Size Limit Exceeded",
                // Zoned Namespace Command Set.
                0xb8 => "Zone Boundary Error",
                0xb9 => "Zone Is Full",
                0xba => "Zone Is Read Only",
                0xbb => "Zone Is Offline",
                0xbc => "Zone Invalid Write",
                0xbd => "Too Many Active Zones",
                0xbe => "Too Many Open Zones",
                0xbf => "Invalid Zone State Transition",
                _ => return None,
            },
            StatusCodeType::MediaDataIntegrity => match sc {
                0x80 => "Write Fault",
                0x81 => "Unrecovered Read Error",
                0x82 => "End-to-end Guard Check Error",
                0x83 => "End-to-end Application Tag Check Error",
                0x84 => "End-to-end Reference Tag Check Error",
                0x85 => "Compare Failure",
                0x86 => "Access Denied",
                0x87 => "Deallocated or Unwritten Logical Block",
                0x88 => "End-to-End Storage Tag Check Error",
                _ => return None,
            },
            StatusCodeType::PathRelated => match sc {
                0x00 => "Internal Path Error",
                0x01 => "Asymmetric Access Persistent Loss",
                0x02 => "Asymmetric Access Inaccessible",
                0x03 => "Asymmetric Access Transition",
                0x60 => "Controller Pathing Error",
                0x70 => "Host Pathing Error",
                0x71 => "Command Aborted By Host",
                _ => return None,
            },
            _ => return None,
        })
    }
}

impl core::fmt::Display for Status {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let label = self.sct().label();
        match self.name() {
            Some(name) => write!(f, "{label}/{name} ({:#06x})", self.code()),
            None => write!(f, "{label}/Unknown Status ({:#06x})", self.code()),
        }?;
        if self.dnr() {
            f.write_str(" [DNR]")?;
        }
        Ok(())
    }
}

impl core::fmt::Debug for Status {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_print_with_names() {
        assert_eq!(Status::INVALID_FIELD.to_string(), "Generic/Invalid Field (0x0002)");
        assert_eq!(Status::LBA_OUT_OF_RANGE.to_string(), "Generic/LBA Out of Range (0x0080)");
        assert_eq!(Status::PRP_OFFSET_INVALID.to_string(), "Generic/PRP Offset Invalid (0x0013)");
        assert_eq!(Status::INVALID_QUEUE_SIZE.to_string(), "Command Specific/Invalid Queue Size (0x0102)");
        assert_eq!(Status::UNRECOVERED_READ_ERROR.to_string(), "Media/Unrecovered Read Error (0x0281)");
        assert_eq!(Status::new(0, 0x7f).to_string(), "Generic/Unknown Status (0x007f)");
        assert_eq!(Status::INVALID_FIELD.with_dnr(true).to_string(), "Generic/Invalid Field (0x0002) [DNR]");
    }

    /// Every status the base specification, the NVM Command Set and the
    /// Zoned Namespace Command Set define, as (SCT, SC), written out apart
    /// from the name table.
    const DEFINED: &[(u8, std::ops::RangeInclusive<u8>)] = &[
        (0, 0x00..=0x16),
        (0, 0x18..=0x24),
        (0, 0x80..=0x84),
        (1, 0x00..=0x03),
        (1, 0x05..=0x16),
        (1, 0x18..=0x2d),
        (1, 0x80..=0x83),
        (1, 0xb8..=0xbf),
        (2, 0x80..=0x88),
        (3, 0x00..=0x03),
        (3, 0x60..=0x60),
        (3, 0x70..=0x71),
    ];

    #[test]
    fn every_defined_status_prints_with_its_name() {
        let mut n = 0;
        for (sct, scs) in DEFINED {
            for sc in scs.clone() {
                let s = Status::new(*sct, sc);
                let text = s.to_string();
                assert!(
                    s.name().is_some() && !text.contains("Unknown"),
                    "{sct}/{sc:#04x} prints bare: {text}"
                );
                assert!(text.ends_with(&format!("({:#06x})", (*sct as u16) << 8 | sc as u16)), "{text}");
                n += 1;
            }
        }
        assert_eq!(n, 23 + 13 + 5 + 4 + 18 + 22 + 4 + 8 + 9 + 4 + 1 + 2);
        // The one seen unnamed from a zoned namespace.
        assert_eq!(Status::from_field(0x01bc).to_string(), "Command Specific/Zone Invalid Write (0x01bc)");
        assert_eq!(Status::new(1, 0xba).to_string(), "Command Specific/Zone Is Read Only (0x01ba)");
        assert_eq!(Status::new(2, 0x88).to_string(), "Media/End-to-End Storage Tag Check Error (0x0288)");
        assert_eq!(Status::new(1, 0x83).to_string(), "Command Specific/Command Size Limit Exceeded (0x0183)");
        // Reserved values still print their number.
        assert_eq!(Status::new(0, 0x17).to_string(), "Generic/Unknown Status (0x0017)");
        assert_eq!(Status::new(1, 0xc0).to_string(), "Command Specific/Unknown Status (0x01c0)");
    }

    #[test]
    fn field_round_trips() {
        let s = Status::SGL_TYPE_INVALID.with_dnr(true);
        assert_eq!(Status::from_field(s.to_field()), s);
        assert_eq!(s.sct(), StatusCodeType::Generic);
        assert_eq!(s.sc(), 0x11);
        assert!(s.dnr());
        assert!(!s.is_success());
        assert!(Status::SUCCESS.is_success());
        assert_eq!(Status::command_specific(2).sct(), StatusCodeType::CommandSpecific);
    }
}
