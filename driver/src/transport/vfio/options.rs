//! How to open a device through VFIO: the IOMMU mode and where DMA memory comes from.

use std::path::PathBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum IommuMode {
    /// Type1 v2 IOMMU: DMA translated and confined to what we mapped.
    Type1,
    /// vfio's unsafe no-IOMMU mode: DMA untranslated, to physical addresses.
    NoIommu,
}

impl IommuMode {
    pub fn label(self) -> &'static str {
        match self {
            IommuMode::Type1 => "type1",
            IommuMode::NoIommu => "noiommu",
        }
    }
}

/// Where DMA memory comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum HugepagePolicy {
    /// Hugepages for allocations of 2 MiB or more when the pool has them,
    /// locked 4 KiB pages otherwise (no-IOMMU mode always uses hugepages).
    #[default]
    Auto,
    /// Every allocation from hugepages; fail when there are none.
    Always,
    /// Never hugepages (not allowed in no-IOMMU mode).
    Never,
}

#[derive(Clone, Debug)]
pub struct VfioOptions {
    pub mode: IommuMode,
    pub hugepages: HugepagePolicy,
    /// Root of the `sys/` and `dev/` trees (`/` on a real machine).
    pub root: PathBuf,
}

impl Default for VfioOptions {
    fn default() -> Self {
        VfioOptions { mode: IommuMode::Type1, hugepages: HugepagePolicy::Auto, root: PathBuf::from("/") }
    }
}
