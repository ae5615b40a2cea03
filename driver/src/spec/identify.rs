//! Identify data structures (§5.15.2): controller and namespace.
//!
//! Only the fields the driver uses are named; the rest are reserved byte
//! arrays so that each struct is exactly the 4096 bytes the controller writes.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Identify Controller data structure (CNS 01h), 4096 bytes.
#[repr(C)]
#[derive(Clone, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct IdentifyController {
    pub vid: u16,
    pub ssvid: u16,
    pub sn: [u8; 20],
    pub mn: [u8; 40],
    pub fr: [u8; 8],
    pub rab: u8,
    pub ieee: [u8; 3],
    pub cmic: u8,
    /// Maximum Data Transfer Size, as a power of two of CAP.MPSMIN pages; 0 = no limit.
    pub mdts: u8,
    pub cntlid: u16,
    pub ver: u32,
    pub rsvd84: [u8; 428],
    /// Submission Queue Entry Size: required \[3:0\], maximum \[7:4\], log2 bytes.
    pub sqes: u8,
    /// Completion Queue Entry Size: required \[3:0\], maximum \[7:4\], log2 bytes.
    pub cqes: u8,
    pub maxcmd: u16,
    /// Number of Namespaces (the largest valid NSID).
    pub nn: u32,
    /// Optional NVM Command Support: bit 2 Dataset Management, bit 3 Write Zeroes.
    pub oncs: u16,
    pub fuses: u16,
    pub fna: u8,
    /// Volatile Write Cache: bit 0 present.
    pub vwc: u8,
    pub awun: u16,
    pub awupf: u16,
    pub nvscc: u8,
    pub nwpc: u8,
    pub acwu: u16,
    pub rsvd534: [u8; 2],
    /// SGL Support: bits 1:0 = 00 none, 01 supported, 10 supported with dword alignment.
    pub sgls: u32,
    pub mnan: u32,
    pub rsvd544: [u8; 3552],
}

const _: () = assert!(core::mem::size_of::<IdentifyController>() == 4096);
const _: () = assert!(core::mem::offset_of!(IdentifyController, mdts) == 77);
const _: () = assert!(core::mem::offset_of!(IdentifyController, sqes) == 512);
const _: () = assert!(core::mem::offset_of!(IdentifyController, nn) == 516);
const _: () = assert!(core::mem::offset_of!(IdentifyController, oncs) == 520);
const _: () = assert!(core::mem::offset_of!(IdentifyController, vwc) == 525);
const _: () = assert!(core::mem::offset_of!(IdentifyController, sgls) == 536);

/// Whether and how a controller accepts SGLs for NVM commands (SGLS bits 1:0).
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub enum SglSupport {
    /// SGLs are not supported: PRP only.
    None,
    /// SGLs supported, no alignment requirement.
    Supported,
    /// SGLs supported; Data Block addresses and lengths must be dword aligned.
    DwordAligned,
}

impl SglSupport {
    pub fn from_sgls(sgls: u32) -> Self {
        match sgls & 0x3 {
            1 => SglSupport::Supported,
            2 => SglSupport::DwordAligned,
            _ => SglSupport::None,
        }
    }
    pub fn to_sgls(self) -> u32 {
        match self {
            SglSupport::None => 0,
            SglSupport::Supported => 1,
            SglSupport::DwordAligned => 2,
        }
    }
    pub fn available(self) -> bool {
        self != SglSupport::None
    }
}

/// ONCS bits (§5.15.2.1).
pub mod oncs {
    pub const DATASET_MANAGEMENT: u16 = 1 << 2;
    pub const WRITE_ZEROES: u16 = 1 << 3;
}

fn ascii_field(b: &[u8]) -> String {
    String::from_utf8_lossy(b).trim_end_matches([' ', '\0']).trim().to_string()
}

/// Writes `s` into an ASCII field padded with spaces, as the spec requires.
pub fn set_ascii_field(dst: &mut [u8], s: &str) {
    dst.fill(b' ');
    let n = s.len().min(dst.len());
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
}

impl IdentifyController {
    pub fn new_zeroed() -> Self {
        <Self as zerocopy::FromZeros>::new_zeroed()
    }
    pub fn serial(&self) -> String {
        ascii_field(&self.sn)
    }
    pub fn model(&self) -> String {
        ascii_field(&self.mn)
    }
    pub fn firmware(&self) -> String {
        ascii_field(&self.fr)
    }
    pub fn sgl_support(&self) -> SglSupport {
        SglSupport::from_sgls(self.sgls)
    }
    /// Maximum transfer in bytes for a controller with minimum page size `2^mps_min_shift`;
    /// `None` when MDTS is 0 (no limit).
    pub fn max_transfer_bytes(&self, mps_min_shift: u32) -> Option<u64> {
        if self.mdts == 0 {
            None
        } else {
            1u64.checked_shl(self.mdts as u32 + mps_min_shift)
        }
    }
    /// Required SQ entry size (log2 bytes).
    pub fn sqes_required(&self) -> u8 {
        self.sqes & 0xf
    }
    /// Required CQ entry size (log2 bytes).
    pub fn cqes_required(&self) -> u8 {
        self.cqes & 0xf
    }
    pub fn sqes_max(&self) -> u8 {
        self.sqes >> 4
    }
    pub fn cqes_max(&self) -> u8 {
        self.cqes >> 4
    }
    pub fn volatile_write_cache(&self) -> bool {
        self.vwc & 1 != 0
    }
    pub fn supports_write_zeroes(&self) -> bool {
        self.oncs & oncs::WRITE_ZEROES != 0
    }
    pub fn supports_dataset_management(&self) -> bool {
        self.oncs & oncs::DATASET_MANAGEMENT != 0
    }
}

/// One LBA Format descriptor (§5.15.2.2, LBAF0..15).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct LbaFormat(pub u32);

impl LbaFormat {
    pub fn new(lbads: u8, ms: u16) -> Self {
        LbaFormat(ms as u32 | (lbads as u32) << 16)
    }
    /// Metadata size per LBA in bytes.
    pub fn metadata_size(self) -> u16 {
        self.0 as u16
    }
    /// LBA data size as log2 of bytes.
    pub fn lbads(self) -> u8 {
        (self.0 >> 16) as u8
    }
    pub fn relative_performance(self) -> u8 {
        ((self.0 >> 24) & 0x3) as u8
    }
}

/// Identify Namespace data structure (CNS 00h), 4096 bytes.
#[repr(C)]
#[derive(Clone, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct IdentifyNamespace {
    /// Namespace Size in logical blocks.
    pub nsze: u64,
    /// Namespace Capacity in logical blocks.
    pub ncap: u64,
    pub nuse: u64,
    pub nsfeat: u8,
    /// Number of LBA formats (0-based).
    pub nlbaf: u8,
    /// Formatted LBA Size: bits 3:0 index the LBA format in use.
    pub flbas: u8,
    pub mc: u8,
    pub dpc: u8,
    pub dps: u8,
    pub nmic: u8,
    pub rescap: u8,
    pub fpi: u8,
    pub dlfeat: u8,
    pub rsvd34: [u8; 94],
    pub lbaf: [u32; 16],
    pub rsvd192: [u8; 3904],
}

const _: () = assert!(core::mem::size_of::<IdentifyNamespace>() == 4096);
const _: () = assert!(core::mem::offset_of!(IdentifyNamespace, flbas) == 26);
const _: () = assert!(core::mem::offset_of!(IdentifyNamespace, lbaf) == 128);

impl IdentifyNamespace {
    pub fn new_zeroed() -> Self {
        <Self as zerocopy::FromZeros>::new_zeroed()
    }
    /// Index of the LBA format in use: FLBAS bits 3:0, and bits 6:5 as the
    /// upper bits when the namespace has more than 16 formats (NLBAF > 15).
    pub fn format_index(&self) -> u8 {
        let low = self.flbas & 0xf;
        if self.nlbaf > 15 {
            low | ((self.flbas >> 5) & 0x3) << 4
        } else {
            low
        }
    }
    /// LBA format descriptor `i` (0..64: LBAF0..15 here, LBAF16..63 right after).
    pub fn lba_format(&self, i: u8) -> LbaFormat {
        match i {
            0..=15 => LbaFormat(self.lbaf[i as usize]),
            16..=63 => {
                let at = (i as usize - 16) * 4;
                let b = &self.rsvd192[at..at + 4];
                LbaFormat(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            }
            _ => LbaFormat(0),
        }
    }
    /// The LBA format in use.
    pub fn active_format(&self) -> LbaFormat {
        self.lba_format(self.format_index())
    }
    /// FLBAS bit 4: metadata travels at the end of each block's data
    /// (extended LBA) rather than in a separate buffer.
    pub fn metadata_extended(&self) -> bool {
        self.flbas & 0x10 != 0
    }
    /// DPS bits 2:0: end-to-end protection information type (0 = none, 1..=3).
    pub fn pi_type(&self) -> u8 {
        self.dps & 0x7
    }
    /// DPS bit 3: protection information is the first (not the last) bytes of metadata.
    pub fn pi_first(&self) -> bool {
        self.dps & 0x8 != 0
    }
    /// Logical block size in bytes; `None` if the format is outside what a
    /// driver can use (below 512 B or above 64 KiB).
    pub fn lba_size(&self) -> Option<u32> {
        let lbads = self.active_format().lbads();
        (9..=16).contains(&lbads).then(|| 1u32 << lbads)
    }
}

/// I/O Command Set of a namespace (Command Set Identifier, CSI).
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommandSet {
    /// NVM Command Set (CSI 00h): plain logical blocks.
    Nvm,
    /// Key Value Command Set (CSI 01h).
    KeyValue,
    /// Zoned Namespace Command Set (CSI 02h).
    Zoned,
    /// Any other identifier.
    Other(u8),
}

impl CommandSet {
    pub fn from_csi(csi: u8) -> Self {
        match csi {
            0 => CommandSet::Nvm,
            1 => CommandSet::KeyValue,
            2 => CommandSet::Zoned,
            v => CommandSet::Other(v),
        }
    }
    pub fn csi(self) -> u8 {
        match self {
            CommandSet::Nvm => 0,
            CommandSet::KeyValue => 1,
            CommandSet::Zoned => 2,
            CommandSet::Other(v) => v,
        }
    }
}

impl std::fmt::Display for CommandSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CommandSet::Nvm => f.write_str("NVM"),
            CommandSet::KeyValue => f.write_str("Key Value"),
            CommandSet::Zoned => f.write_str("Zoned Namespace"),
            CommandSet::Other(v) => write!(f, "command set {v:#04x}"),
        }
    }
}

/// Namespace Identification Descriptor types (§5.15.2.3).
pub mod nidt {
    pub const EUI64: u8 = 1;
    pub const NGUID: u8 = 2;
    pub const UUID: u8 = 3;
    pub const CSI: u8 = 4;
}

/// The Command Set Identifier in a Namespace Identification Descriptor list
/// (CNS 03h), if the list has one. Walks at most the 4096-byte page; a
/// descriptor that runs past it is an error.
pub fn descriptor_csi(page: &[u8]) -> Result<Option<u8>, String> {
    let mut at = 0usize;
    while at + 4 <= page.len() {
        let (kind, len) = (page[at], page[at + 1] as usize);
        if kind == 0 {
            return Ok(None);
        }
        let end = at + 4 + len;
        if end > page.len() {
            return Err(format!("descriptor type {kind} at byte {at} runs {len} bytes past the page"));
        }
        if kind == nidt::CSI {
            if len != 1 {
                return Err(format!("Command Set Identifier descriptor of length {len} (1 expected)"));
            }
            return Ok(Some(page[at + 4]));
        }
        at = end;
    }
    Ok(None)
}

/// Appends a descriptor to a descriptor list page at `at`; returns the next offset.
pub fn put_descriptor(page: &mut [u8], at: usize, kind: u8, id: &[u8]) -> usize {
    let end = at + 4 + id.len();
    if end <= page.len() {
        page[at] = kind;
        page[at + 1] = id.len() as u8;
        page[at + 4..end].copy_from_slice(id);
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::IntoBytes;

    #[test]
    fn controller_fields_land_at_spec_offsets() {
        let mut id = IdentifyController::new_zeroed();
        id.vid = 0x1b36;
        set_ascii_field(&mut id.sn, "tutti0");
        set_ascii_field(&mut id.mn, "QEMU NVMe Ctrl");
        set_ascii_field(&mut id.fr, "10.0.2");
        id.mdts = 7;
        id.sqes = 0x66;
        id.cqes = 0x44;
        id.nn = 256;
        id.oncs = oncs::WRITE_ZEROES | oncs::DATASET_MANAGEMENT;
        id.vwc = 1;
        id.sgls = 1;
        let b = id.as_bytes();
        assert_eq!(&b[0..2], &[0x36, 0x1b]);
        assert_eq!(&b[4..10], b"tutti0");
        assert_eq!(b[10], b' ');
        assert_eq!(&b[24..38], b"QEMU NVMe Ctrl");
        assert_eq!(b[77], 7);
        assert_eq!(b[512], 0x66);
        assert_eq!(&b[516..520], &256u32.to_le_bytes());
        assert_eq!(&b[536..540], &1u32.to_le_bytes());
        let back = IdentifyController::read_from_bytes(b).map_err(|_| ()).unwrap_or_else(|_| panic!());
        assert_eq!(back.serial(), "tutti0");
        assert_eq!(back.model(), "QEMU NVMe Ctrl");
        assert_eq!(back.firmware(), "10.0.2");
        assert_eq!(back.max_transfer_bytes(12), Some(512 * 1024));
        assert_eq!(back.sgl_support(), SglSupport::Supported);
        assert_eq!(back.sqes_required(), 6);
        assert_eq!(back.cqes_max(), 4);
        assert!(back.volatile_write_cache());
        assert!(back.supports_write_zeroes());
        assert!(back.supports_dataset_management());
    }

    #[test]
    fn mdts_zero_means_no_limit() {
        let id = IdentifyController::new_zeroed();
        assert_eq!(id.max_transfer_bytes(12), None);
    }

    #[test]
    fn sgls_decodes() {
        assert_eq!(SglSupport::from_sgls(0), SglSupport::None);
        assert_eq!(SglSupport::from_sgls(0x0001_0001), SglSupport::Supported);
        assert_eq!(SglSupport::from_sgls(2), SglSupport::DwordAligned);
        assert_eq!(SglSupport::from_sgls(3), SglSupport::None);
    }

    #[test]
    fn namespace_lba_size_from_active_format() {
        let mut ns = IdentifyNamespace::new_zeroed();
        ns.nsze = 1 << 20;
        ns.nlbaf = 1;
        ns.lbaf[0] = LbaFormat::new(9, 0).0;
        ns.lbaf[1] = LbaFormat::new(12, 0).0;
        ns.flbas = 1;
        assert_eq!(ns.lba_size(), Some(4096));
        ns.flbas = 0;
        assert_eq!(ns.lba_size(), Some(512));
        let b = ns.as_bytes();
        assert_eq!(b[26], 0);
        assert_eq!(&b[132..136], &LbaFormat::new(12, 0).0.to_le_bytes());
        ns.lbaf[0] = LbaFormat::new(3, 0).0;
        assert_eq!(ns.lba_size(), None);
    }

    #[test]
    fn metadata_protection_and_high_format_indices_decode() {
        let mut ns = IdentifyNamespace::new_zeroed();
        ns.lbaf[1] = LbaFormat::new(9, 8).0;
        ns.flbas = 0x11;
        ns.dps = 0x9;
        assert_eq!(ns.active_format().metadata_size(), 8);
        assert!(ns.metadata_extended() && ns.pi_first());
        assert_eq!(ns.pi_type(), 1);
        // Format 17 (NLBAF > 15): FLBAS bits 6:5 are the upper index bits.
        ns.nlbaf = 20;
        ns.flbas = 0x21;
        ns.rsvd192[4..8].copy_from_slice(&LbaFormat::new(12, 16).0.to_le_bytes());
        assert_eq!(ns.format_index(), 17);
        assert_eq!((ns.lba_size(), ns.active_format().metadata_size()), (Some(4096), 16));
        assert!(!ns.metadata_extended());
    }

    #[test]
    fn descriptor_lists_yield_the_command_set() {
        let mut page = [0u8; 4096];
        let at = put_descriptor(&mut page, 0, nidt::EUI64, &[1; 8]);
        put_descriptor(&mut page, at, nidt::CSI, &[2]);
        assert_eq!(descriptor_csi(&page), Ok(Some(2)));
        assert_eq!(CommandSet::from_csi(2), CommandSet::Zoned);
        assert_eq!(descriptor_csi(&[0u8; 4096]), Ok(None));
        let mut bad = [0u8; 16];
        bad[0] = nidt::NGUID;
        bad[1] = 200;
        assert!(descriptor_csi(&bad).is_err());
    }
}
